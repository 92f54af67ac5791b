//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong, with what a caller needs to act on it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No adapter matched the request (or none exists at all).
    #[error("no GPU adapter found{wanted}. {hint}")]
    NoAdapter {
        /// What was asked for (backend, name filter), already formatted.
        wanted: String,
        /// How to fix it.
        hint: String,
    },

    /// The adapter refused to create a device.
    #[error("could not create a device on adapter {adapter:?}: {message}")]
    RequestDevice {
        /// The adapter's name.
        adapter: String,
        /// wgpu's message.
        message: String,
    },

    /// An option had a value the library cannot use.
    #[error("invalid {what}: {message}")]
    InvalidArgument {
        /// The argument or option.
        what: String,
        /// What is wrong with it.
        message: String,
    },

    /// Two arrays whose shapes must agree do not.
    #[error("shape mismatch: {message}")]
    ShapeMismatch {
        /// Both shapes and the rule they break.
        message: String,
    },

    /// An input held NaN or infinity.
    #[error("{array} holds a non-finite value ({value}) at index {index:?}")]
    NonFinite {
        /// Which array.
        array: String,
        /// Its first non-finite value.
        value: f32,
        /// Where it is.
        index: Vec<usize>,
    },

    /// A buffer or dispatch would exceed a limit of the device.
    #[error("{what} needs {needed} but the device allows at most {limit} ({limit_name})")]
    LimitExceeded {
        /// The buffer or dispatch.
        what: String,
        /// What it needs (with unit).
        needed: String,
        /// The device limit (same unit).
        limit: String,
        /// The wgpu limit's name.
        limit_name: &'static str,
    },

    /// wgpu reported a validation error.
    #[error("GPU validation error: {0}")]
    Validation(String),

    /// The device ran out of memory.
    #[error("GPU out of memory: {0}")]
    OutOfMemory(String),

    /// The device was lost (driver reset, GPU removed); make a new [`crate::Context`].
    #[error("GPU device lost: {0}; create a new Context")]
    DeviceLost(String),

    /// Waiting for the GPU failed or timed out.
    #[error("waiting for the GPU failed: {0}")]
    Poll(String),

    /// Mapping a buffer for readback failed.
    #[error("reading results back from the GPU failed: {0}")]
    Readback(String),

    /// A file could not be read or written.
    #[error("{}: {message}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An [`Error::InvalidArgument`].
    pub fn invalid(what: impl Into<String>, message: impl Into<String>) -> Self {
        Error::InvalidArgument {
            what: what.into(),
            message: message.into(),
        }
    }

    /// An [`Error::ShapeMismatch`].
    pub fn shape(message: impl Into<String>) -> Self {
        Error::ShapeMismatch {
            message: message.into(),
        }
    }

    /// An [`Error::Io`].
    pub fn io(path: impl Into<PathBuf>, message: impl std::fmt::Display) -> Self {
        Error::Io {
            path: path.into(),
            message: message.to_string(),
        }
    }
}

impl From<wgpu::Error> for Error {
    fn from(e: wgpu::Error) -> Self {
        match e {
            wgpu::Error::OutOfMemory { .. } => Error::OutOfMemory(e.to_string()),
            wgpu::Error::Validation { description, .. } => Error::Validation(description),
            other => Error::Validation(other.to_string()),
        }
    }
}
