//! The crate's one error type.

use std::fmt;
use std::path::PathBuf;

use crate::dtype::Dtype;

/// Everything that can go wrong, with what a caller needs to act on it.
///
/// Every message names what was wrong and what to do about it. `Debug` prints the same
/// message as `Display`, so `fn main() -> Result<(), wgpu_attention::Error>` reports an
/// error readably; match on the variants for the details.
#[derive(thiserror::Error)]
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
    #[error(
        "could not create a device on adapter {adapter:?}: {message}; choose another adapter \
         (ContextOptions, CLI --adapter; `wgpu-attention devices` lists them)"
    )]
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
    #[error(
        "{array} holds a non-finite value ({value}) at index {index:?}; replace it, or let \
         NaN/Inf through with Options::default().propagate_non_finite(true) (CLI --propagate-nan)"
    )]
    NonFinite {
        /// Which array.
        array: String,
        /// Its first non-finite value.
        value: f32,
        /// Where it is.
        index: Vec<usize>,
    },

    /// A buffer or dispatch would exceed a limit of the device.
    #[error(
        "{what} needs {needed} but the device allows at most {limit} ({limit_name}); {}",
        limit_name.advice()
    )]
    LimitExceeded {
        /// The buffer or dispatch.
        what: String,
        /// What it needs (with unit).
        needed: String,
        /// The device limit (same unit).
        limit: String,
        /// Which limit (its name is wgpu's where wgpu has one).
        limit_name: Limit,
    },

    /// wgpu reported a validation error.
    #[error(
        "GPU validation error: {0}; this is a bug in wgpu-attention or the driver (or in a \
         device made by the caller): please report it with the adapter `wgpu-attention \
         devices` names"
    )]
    Validation(String),

    /// The device ran out of memory.
    #[error(
        "GPU out of memory: {0}; make the problem smaller (batch, heads or rows per call), \
         skip the n × n weights with return_weights(false) (CLI --context-only), or free GPU memory"
    )]
    OutOfMemory(String),

    /// The device was lost (driver reset, GPU removed); make a new [`crate::Context`].
    #[error("GPU device lost: {0}; create a new Context")]
    DeviceLost(String),

    /// Waiting for the GPU failed or timed out.
    #[error(
        "waiting for the GPU failed: {0}; the device may be hung or lost: retry on a new Context"
    )]
    Poll(String),

    /// Mapping a buffer for readback failed.
    #[error(
        "reading results back from the GPU failed: {0}; the device may be lost: retry on a new \
         Context"
    )]
    Readback(String),

    /// The adapter lacks a feature the request needs (f16 operands, subgroup operations).
    #[error("adapter {adapter:?} does not support {feature}; {hint}")]
    Unsupported {
        /// What is missing: the operation and the wgpu feature it needs.
        feature: String,
        /// The adapter's name.
        adapter: String,
        /// What to do instead.
        hint: String,
    },

    /// A result overflowed to a non-finite value although every input was finite
    /// (products past f32's range, or f16 operands past f16's).
    #[error(
        "the {what} overflowed to a non-finite value at flat index {index}: the inputs are \
         too large for {dtype} arithmetic; scale them down{}",
        if *dtype == Dtype::F16 { " or use f32" } else { "" }
    )]
    Overflow {
        /// Which output (`context`, `weights`).
        what: String,
        /// The operand type the arithmetic ran in.
        dtype: Dtype,
        /// The first non-finite value's index in the output, flattened row-major.
        index: usize,
    },

    /// Under the WGSL sanitizer (`WGPU_ATTENTION_SANITIZE`, [`crate::Context::with_sanitizer`]):
    /// a kernel did what a GPU punishes (a data race, an index out of bounds, a read of
    /// unwritten workgroup memory, a divergent barrier, a read of an inactive lane), or the
    /// interpreter could not run it.
    #[error(
        "WGSL sanitizer, {kernel}: {message}; a GPU may answer wrong here: this is a bug in \
         wgpu-attention (or in a caller's modifier WGSL): please report it"
    )]
    Sanitizer {
        /// The kernel file and its variant (constants, f16 element types, subgroup width).
        kernel: String,
        /// What was found (kind, WGSL line:column, both invocations, the element), or why
        /// the kernel could not run.
        message: String,
    },

    /// A file could not be read or written.
    #[error("{}: {message}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}

/// The limit an [`Error::LimitExceeded`] names: what the call ran into, typed, so that a
/// caller (and the library's own retries) decide by the variant, never by a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Limit {
    /// `max_storage_buffer_binding_size`: one buffer a kernel binds.
    MaxStorageBufferBindingSize,
    /// `max_buffer_size`: one buffer.
    MaxBufferSize,
    /// `max_texture_dimension_2d`: a texture side (the subgroup kernels' operands).
    MaxTextureDimension2d,
    /// `max_compute_workgroup_storage_size`: a kernel's tiles in workgroup memory.
    MaxComputeWorkgroupStorageSize,
    /// `max_compute_workgroups_per_dimension`: a dispatch's grid.
    MaxComputeWorkgroupsPerDimension,
    /// `max_compute_invocations_per_workgroup`: a kernel's threads per workgroup.
    MaxComputeInvocationsPerWorkgroup,
    /// `max_storage_buffers_per_shader_stage`: a kernel's storage bindings (a caller's
    /// modifier buffers take one each).
    MaxStorageBuffersPerShaderStage,
    /// Registers per thread (not a wgpu limit: what `flash_blocked` keeps in them).
    Registers,
    /// Indices past `u32` (the kernels index in 32 bits).
    U32Indexing,
    /// The loop iterations one invocation may run (lavapipe's cap: `src/kernels/loops.rs`).
    LoopIterations,
    /// A KV cache's capacity in keys.
    KvCacheCapacity,
}

impl Limit {
    /// Its name in messages: wgpu's for wgpu's limits.
    pub fn name(self) -> &'static str {
        match self {
            Limit::MaxStorageBufferBindingSize => "max_storage_buffer_binding_size",
            Limit::MaxBufferSize => "max_buffer_size",
            Limit::MaxTextureDimension2d => "max_texture_dimension_2d",
            Limit::MaxComputeWorkgroupStorageSize => "max_compute_workgroup_storage_size",
            Limit::MaxComputeWorkgroupsPerDimension => "max_compute_workgroups_per_dimension",
            Limit::MaxComputeInvocationsPerWorkgroup => "max_compute_invocations_per_workgroup",
            Limit::MaxStorageBuffersPerShaderStage => "max_storage_buffers_per_shader_stage",
            Limit::Registers => "registers",
            Limit::U32Indexing => "u32 indexing",
            Limit::LoopIterations => "loop iterations per invocation",
            Limit::KvCacheCapacity => "KV cache capacity",
        }
    }

    /// What to do about it.
    fn advice(self) -> &'static str {
        match self {
            Limit::MaxTextureDimension2d => {
                "use the storage kernels (Kernels::Storage; CLI --kernels storage)"
            }
            Limit::LoopIterations => {
                "llvmpipe (lavapipe) silently stops an invocation's loops past that, so the call \
                 is refused rather than answered wrong: ask for the context alone (the fused \
                 pass splits its keys to fit; CLI --context-only), pass fewer keys per call, \
                 or use another adapter (`wgpu-attention devices` lists them)"
            }
            Limit::MaxComputeWorkgroupStorageSize => {
                "choose a variant with smaller tiles, or let Kernels::Auto choose"
            }
            _ => {
                "split the problem into smaller calls (fewer rows, heads or sequences per call), \
                 or use an adapter with a higher limit (`wgpu-attention devices` lists them)"
            }
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Debug for Error {
    /// The same message as `Display`: what `main() -> Result` prints on an error.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Asserts `e`'s message holds every one of `wanted` (what was wrong and what to do),
    /// is one line, and is also what `Debug` prints.
    fn says(e: Error, wanted: &[&str]) {
        let msg = e.to_string();
        for w in wanted {
            assert!(msg.contains(w), "{w:?} missing from: {msg}");
        }
        assert!(!msg.contains('\n'), "not one line: {msg}");
        assert_eq!(format!("{e:?}"), msg);
    }

    #[test]
    fn debug_is_the_message_so_main_returning_result_prints_it() {
        let e = Error::NoAdapter {
            wanted: String::new(),
            hint: "install a driver".into(),
        };
        // What `fn main() -> Result<(), Error>` prints after "Error: ".
        assert_eq!(format!("{e:?}"), "no GPU adapter found. install a driver");
        assert!(!format!("{e:?}").contains("NoAdapter {"));
    }

    #[test]
    fn no_adapter_names_the_request_and_the_fix() {
        says(
            Error::NoAdapter {
                wanted: " matching backend vulkan".into(),
                hint: crate::context::NO_ADAPTER_HINT.into(),
            },
            &["no GPU adapter", "backend vulkan", "mesa-vulkan-drivers"],
        );
    }

    #[test]
    fn request_device_names_the_adapter_and_another_choice() {
        says(
            Error::RequestDevice {
                adapter: "llvmpipe".into(),
                message: "limits too high".into(),
            },
            &["\"llvmpipe\"", "limits too high", "choose another adapter"],
        );
    }

    #[test]
    fn invalid_argument_names_the_option_and_the_rule() {
        says(
            Error::invalid("heads", "3 does not divide d_k = 8; use a divisor of 8"),
            &["invalid heads", "does not divide", "use a divisor"],
        );
    }

    #[test]
    fn shape_mismatch_says_so() {
        says(
            Error::shape("W_Q has 5 rows but X has 4 columns"),
            &["shape mismatch", "W_Q has 5 rows"],
        );
    }

    #[test]
    fn non_finite_names_array_value_index_and_the_way_through() {
        says(
            Error::NonFinite {
                array: "X".into(),
                value: f32::NAN,
                index: vec![2, 1],
            },
            &["X holds", "NaN", "[2, 1]", "--propagate-nan"],
        );
    }

    #[test]
    fn limit_exceeded_names_sizes_and_advice_by_limit() {
        let limit = |limit_name: Limit| Error::LimitExceeded {
            what: "K".into(),
            needed: "300 MiB".into(),
            limit: "128 MiB".into(),
            limit_name,
        };
        says(
            limit(Limit::MaxStorageBufferBindingSize),
            &["K needs 300 MiB", "128 MiB", "smaller calls"],
        );
        says(
            limit(Limit::MaxTextureDimension2d),
            &["max_texture_dimension_2d", "--kernels storage"],
        );
        says(
            limit(Limit::MaxComputeWorkgroupStorageSize),
            &["smaller tiles"],
        );
    }

    #[test]
    fn gpu_failures_say_what_to_do() {
        says(
            Error::Validation("bad bind".into()),
            &["bad bind", "report"],
        );
        says(
            Error::OutOfMemory("buffer".into()),
            &["out of memory", "--context-only"],
        );
        says(Error::DeviceLost("reset".into()), &["lost", "new Context"]);
        says(Error::Poll("timeout".into()), &["timeout", "new Context"]);
        says(
            Error::Readback("map".into()),
            &["reading results", "new Context"],
        );
    }

    #[test]
    fn unsupported_names_feature_adapter_and_alternative() {
        says(
            Error::Unsupported {
                feature: "f16 operands (SHADER_F16)".into(),
                adapter: "Some GPU".into(),
                hint: "use f32".into(),
            },
            &[
                "\"Some GPU\" does not support f16 operands (SHADER_F16)",
                "use f32",
            ],
        );
    }

    #[test]
    fn overflow_names_output_index_dtype_and_remedy() {
        let over = |dtype| Error::Overflow {
            what: "context".into(),
            dtype,
            index: 17,
        };
        says(
            over(Dtype::F16),
            &[
                "context overflowed",
                "index 17",
                "f16",
                "scale them down or use f32",
            ],
        );
        let f32_msg = over(Dtype::F32).to_string();
        assert!(f32_msg.contains("f32 arithmetic"), "{f32_msg}");
        assert!(!f32_msg.contains("or use f32"), "{f32_msg}");
    }

    #[test]
    fn io_names_the_file() {
        says(
            Error::io("/no/such.npy", "No such file or directory"),
            &["/no/such.npy", "No such file"],
        );
    }
}
