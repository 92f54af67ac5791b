//! Which adapter to open: the options, the ranking, the listing (`wgpu-attention devices`)
//! and the hint when there is none.

use std::fmt;

use super::backend::parse_backend_list;
use super::Backend;
use crate::error::Result;
use crate::gpu::coop;

/// Which adapter to open.
///
/// Unset fields fall back to the environment: `WGPU_BACKEND` (a comma list such as
/// `vulkan,gl`) and `WGPU_ADAPTER_NAME` (a case-insensitive substring of the adapter's name).
/// Among the adapters left, the best device type wins: discrete GPU, then integrated,
/// virtual, software (CPU), other; ties go to Vulkan/Metal/DX12 over GL.
///
/// Built from [`ContextOptions::default`] with one method per field:
///
/// ```
/// use wgpu_attention::{Backend, ContextOptions};
/// let options = ContextOptions::default()
///     .backend(Backend::Vulkan)
///     .adapter_name("llvmpipe".to_string());
/// assert_eq!(options.adapter_name.as_deref(), Some("llvmpipe"));
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ContextOptions {
    /// Only adapters of this backend.
    pub backend: Option<Backend>,
    /// Only adapters whose name contains this (case-insensitive).
    pub adapter_name: Option<String>,
    /// Whether the adapter stands in for a GPU (default: `WGPU_ATTENTION_STAND_IN`, else
    /// off; see [`crate::gpu::hardware::StandIn`] and docs/testing.md).
    pub stand_in: Option<crate::gpu::hardware::StandIn>,
    /// Whether every dispatch runs under the WGSL sanitizer, and at which subgroup width
    /// (default: `WGPU_ATTENTION_SANITIZE`, else off; see
    /// [`crate::Context::with_sanitizer`]).
    pub sanitize: Option<crate::gpu::sanitizer::Sanitize>,
}

crate::setters::setters!(ContextOptions {
    backend: Option<Backend>,
    adapter_name: Option<String>,
    stand_in: Option<crate::gpu::hardware::StandIn>,
    sanitize: Option<crate::gpu::sanitizer::Sanitize>,
});

impl ContextOptions {
    fn backends(&self) -> Result<wgpu::Backends> {
        match (self.backend, std::env::var("WGPU_BACKEND")) {
            (Some(b), _) => Ok(b.backends()),
            (None, Ok(list)) => parse_backend_list(&list),
            (None, Err(_)) => Ok(wgpu::Backends::all()),
        }
    }

    fn name_filter(&self) -> Option<String> {
        self.adapter_name
            .clone()
            .or_else(|| std::env::var("WGPU_ADAPTER_NAME").ok())
            .filter(|s| !s.is_empty())
    }

    /// The filters in effect, for messages: ` matching backend vulkan, name containing
    /// "intel"` (options first, then `WGPU_BACKEND` and `WGPU_ADAPTER_NAME`), or empty.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        match self.backend {
            Some(b) => parts.push(format!("backend {b}")),
            None => {
                if let Ok(v) = std::env::var("WGPU_BACKEND") {
                    parts.push(format!("WGPU_BACKEND={v}"));
                }
            }
        }
        if let Some(n) = self.name_filter() {
            parts.push(format!("name containing {n:?}"));
        }
        if parts.is_empty() {
            String::new()
        } else {
            format!(" matching {}", parts.join(", "))
        }
    }
}

/// What `devices` prints about one adapter.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AdapterSummary {
    /// wgpu's adapter info (name, backend, device type, driver).
    pub info: wgpu::AdapterInfo,
    /// The adapter's limits.
    pub limits: wgpu::Limits,
    /// Whether it can do f16 and subgroup operations.
    pub features: wgpu::Features,
    /// The cooperative-matrix shapes it reports (tensor cores; empty on most adapters).
    pub coop: Vec<wgpu::CooperativeMatrixProperties>,
}

impl fmt::Display for AdapterSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.info;
        let l = &self.limits;
        writeln!(f, "{}", i.name)?;
        writeln!(
            f,
            "  backend {:?}, type {:?}, vendor 0x{:04x}, device 0x{:04x}",
            i.backend, i.device_type, i.vendor, i.device
        )?;
        writeln!(f, "  driver {} ({})", i.driver, i.driver_info)?;
        writeln!(
            f,
            "  max storage binding {} MiB, max buffer {} MiB, workgroup storage {} KiB",
            l.max_storage_buffer_binding_size >> 20,
            l.max_buffer_size >> 20,
            l.max_compute_workgroup_storage_size >> 10
        )?;
        writeln!(
            f,
            "  max invocations/workgroup {}, workgroups/dimension {}, storage buffers/stage {}, 2D texture {}",
            l.max_compute_invocations_per_workgroup,
            l.max_compute_workgroups_per_dimension,
            l.max_storage_buffers_per_shader_stage,
            l.max_texture_dimension_2d
        )?;
        let feats: Vec<&str> = [
            (wgpu::Features::SHADER_F16, "shader-f16"),
            (wgpu::Features::SUBGROUP, "subgroup"),
            (wgpu::Features::TIMESTAMP_QUERY, "timestamp-query"),
            (wgpu::Features::SHADER_F64, "shader-f64"),
            (
                wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX,
                "cooperative-matrix",
            ),
        ]
        .iter()
        .filter(|(flag, _)| self.features.contains(*flag))
        .map(|(_, name)| *name)
        .collect();
        write!(f, "  features: {}", feats.join(", "))?;
        coop::write_shapes(f, &self.coop)
    }
}

fn rank(info: &wgpu::AdapterInfo) -> (u8, u8) {
    let ty = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    };
    let backend = match info.backend {
        wgpu::Backend::Vulkan | wgpu::Backend::Metal | wgpu::Backend::Dx12 => 0,
        _ => 1,
    };
    (ty, backend)
}

fn new_instance(backends: wgpu::Backends) -> wgpu::Instance {
    // Mesa's drivers use MESA_SHADER_CACHE_DIR only where it exists, and print a warning
    // per driver where it does not (this repository's .cargo/config.toml points it at
    // target/tmp, absent on a fresh clone): make it first.
    #[cfg(not(target_arch = "wasm32"))]
    if let Some(dir) = std::env::var_os("MESA_SHADER_CACHE_DIR").filter(|d| !d.is_empty()) {
        let _ = std::fs::create_dir_all(dir);
    }
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends;
    wgpu::Instance::new(desc)
}

/// How to get an adapter when there is none: part of every [`crate::Error::NoAdapter`].
pub const NO_ADAPTER_HINT: &str =
    "Install a GPU driver with Vulkan, Metal or DX12 support; with no GPU, \
install a software Vulkan driver (Debian/Ubuntu: `sudo apt-get install mesa-vulkan-drivers`). \
Run `wgpu-attention devices` to see what wgpu finds.";

/// Every adapter wgpu finds for the given options, best first.
///
/// # Errors
/// [`crate::Error::InvalidArgument`] when `WGPU_BACKEND` names an unknown backend.
pub fn list_adapters(options: &ContextOptions) -> Result<Vec<AdapterSummary>> {
    let adapters = crate::gpu::oneshot::block_on(select_from(options, true))?;
    Ok(adapters.iter().map(summary).collect())
}

/// The adapter [`crate::Context::with_options`] would open for `options`, without opening
/// it (and, as it, without starting GL where another backend has a hardware adapter);
/// `None` when there is none.
///
/// # Errors
/// As [`list_adapters`].
pub fn default_adapter(options: &ContextOptions) -> Result<Option<AdapterSummary>> {
    let adapters = crate::gpu::oneshot::block_on(select_async(options))?;
    Ok(adapters.first().map(summary))
}

fn summary(a: &wgpu::Adapter) -> AdapterSummary {
    AdapterSummary {
        info: a.get_info(),
        limits: a.limits(),
        features: a.features(),
        coop: a.cooperative_matrix_properties(),
    }
}

/// The adapters a context may open, best first. GL is initialised only as the fallback:
/// when Vulkan, Metal or DX12 offer a hardware adapter, GL (slow to start, and never ranked
/// above them) is left alone.
pub(super) async fn select_async(options: &ContextOptions) -> Result<Vec<wgpu::Adapter>> {
    select_from(options, false).await
}

/// Whether GL's adapters are enumerated too: when asked for, and for every listing
/// (`every`) or when the other backends found no hardware adapter.
fn wants_gl(backends: wgpu::Backends, found_hardware: bool, every: bool) -> bool {
    backends.contains(wgpu::Backends::GL) && (every || !found_hardware)
}

async fn select_from(options: &ContextOptions, every: bool) -> Result<Vec<wgpu::Adapter>> {
    let backends = options.backends()?;
    let keep = |mut adapters: Vec<wgpu::Adapter>| {
        if let Some(name) = options.name_filter() {
            let name = name.to_lowercase();
            adapters.retain(|a| a.get_info().name.to_lowercase().contains(&name));
        }
        adapters
    };
    let primary = backends.difference(wgpu::Backends::GL);
    let mut adapters = Vec::new();
    if !primary.is_empty() {
        adapters = keep(enumerate(&new_instance(primary), primary).await);
    }
    let hardware = adapters
        .iter()
        .any(|a| a.get_info().device_type != wgpu::DeviceType::Cpu);
    if wants_gl(backends, hardware, every) {
        let gl = wgpu::Backends::GL;
        adapters.extend(keep(enumerate(&new_instance(gl), gl).await));
    }
    adapters.sort_by_key(|a| rank(&a.get_info()));
    Ok(adapters)
}

/// Every adapter of `backends`. The browser lists none: it offers one, on request.
async fn enumerate(instance: &wgpu::Instance, backends: wgpu::Backends) -> Vec<wgpu::Adapter> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        instance.enumerate_adapters(backends).await
    }
    #[cfg(target_arch = "wasm32")]
    {
        let _ = backends;
        let options = wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        };
        instance
            .request_adapter(&options)
            .await
            .into_iter()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::wants_gl;
    use wgpu::Backends;

    #[test]
    fn gl_starts_only_as_the_fallback_or_for_a_listing() {
        // A context with a hardware Vulkan/Metal/DX12 adapter found leaves GL alone.
        assert!(!wants_gl(Backends::all(), true, false));
        // No hardware adapter (lavapipe only, or none): GL is tried too.
        assert!(wants_gl(Backends::all(), false, false));
        // `devices` lists every adapter, GL's included.
        assert!(wants_gl(Backends::all(), true, true));
        // Never when the caller's backends leave GL out.
        assert!(!wants_gl(Backends::VULKAN, false, true));
        assert!(wants_gl(Backends::GL, false, false));
    }
}
