//! The graphics APIs an adapter can be chosen by: [`Backend`] and the `WGPU_BACKEND` list.

use std::fmt;

use crate::error::{Error, Result};

/// A graphics API wgpu can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// Vulkan (Linux, Windows, Android; lavapipe is a software Vulkan driver).
    Vulkan,
    /// Metal (macOS, iOS).
    Metal,
    /// Direct3D 12 (Windows).
    Dx12,
    /// OpenGL / OpenGL ES.
    Gl,
}

impl Backend {
    /// The wgpu backend set for this backend.
    pub fn backends(self) -> wgpu::Backends {
        match self {
            Backend::Vulkan => wgpu::Backends::VULKAN,
            Backend::Metal => wgpu::Backends::METAL,
            Backend::Dx12 => wgpu::Backends::DX12,
            Backend::Gl => wgpu::Backends::GL,
        }
    }
}

/// The backend names [`Backend`]'s `FromStr` and `WGPU_BACKEND` accept, for messages.
const BACKEND_NAMES: &str = "vulkan (vk), metal (mtl), dx12 (d3d12), gl (gles, opengl)";

impl std::str::FromStr for Backend {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "vulkan" | "vk" => Ok(Backend::Vulkan),
            "metal" | "mtl" => Ok(Backend::Metal),
            "dx12" | "d3d12" => Ok(Backend::Dx12),
            "gl" | "gles" | "opengl" => Ok(Backend::Gl),
            _ => Err(Error::invalid(
                "backend",
                format!("unknown backend {s:?}; expected one of {BACKEND_NAMES}"),
            )),
        }
    }
}

/// The backends a `WGPU_BACKEND` value names: a comma list of [`Backend`] names; a blank
/// value means every backend.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the first unknown name and the valid ones.
pub(crate) fn parse_backend_list(list: &str) -> Result<wgpu::Backends> {
    if list.trim().is_empty() {
        return Ok(wgpu::Backends::all());
    }
    let mut set = wgpu::Backends::empty();
    for name in list.split(',').filter(|n| !n.trim().is_empty()) {
        let backend = name.parse::<Backend>().map_err(|_| {
            Error::invalid(
                "WGPU_BACKEND",
                format!(
                    "unknown backend {:?} in WGPU_BACKEND={list:?}; expected one of \
                     {BACKEND_NAMES}, or a comma list of them such as vulkan,gl (or unset it)",
                    name.trim()
                ),
            )
        })?;
        set |= backend.backends();
    }
    Ok(set)
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Vulkan => "vulkan",
            Backend::Metal => "metal",
            Backend::Dx12 => "dx12",
            Backend::Gl => "gl",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_names_parse_and_an_unknown_one_is_named() {
        assert_eq!("Vulkan".parse::<Backend>().unwrap(), Backend::Vulkan);
        assert_eq!(" d3d12 ".parse::<Backend>().unwrap(), Backend::Dx12);
        let e = "bogus".parse::<Backend>().unwrap_err().to_string();
        assert!(e.contains("unknown backend \"bogus\""), "{e}");
        assert!(e.contains("vulkan") && e.contains("gl"), "{e}");
    }

    #[test]
    fn wgpu_backend_lists_parse_and_a_typo_is_named_as_such() {
        assert_eq!(
            parse_backend_list("vulkan, gl").unwrap(),
            wgpu::Backends::VULKAN | wgpu::Backends::GL
        );
        assert_eq!(parse_backend_list(" ").unwrap(), wgpu::Backends::all());
        assert_eq!(parse_backend_list("vk,").unwrap(), wgpu::Backends::VULKAN);
        let e = parse_backend_list("vulkan,bogus").unwrap_err().to_string();
        assert!(
            e.contains("unknown backend \"bogus\" in WGPU_BACKEND"),
            "{e}"
        );
        assert!(e.contains("expected one of vulkan"), "{e}");
    }
}
