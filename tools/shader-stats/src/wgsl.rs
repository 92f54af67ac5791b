//! WGSL -> SPIR-V as wgpu 30's Vulkan backend does it (wgpu-hal's `vulkan::adapter` naga
//! options, and `vulkan::device::compile_stage` for the runtime checks and the overrides).

use crate::wire::Failure;
use naga::back::spv;
use naga::proc::{BoundsCheckPolicies, BoundsCheckPolicy};

/// What the device supports that changes the SPIR-V wgpu writes for it.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    /// The SPIR-V version wgpu picks from the device's Vulkan version.
    pub spirv_version: (u8, u8),
    /// `shaderZeroInitializeWorkgroupMemory`: the driver zeroes workgroup memory (otherwise
    /// naga writes the zeroing into the shader).
    pub native_zero_init: bool,
    /// `robustBufferAccess2`: the driver bounds-checks buffer accesses, naga need not.
    pub robust_buffers: bool,
    /// `robustImageAccess2` (or `robustImageAccess`): likewise for image loads.
    pub robust_images: bool,
}

/// A resource binding's kind, as wgpu's automatic layout maps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    UniformBuffer,
    StorageBuffer,
    SampledImage,
    StorageImage,
    Sampler,
}

#[derive(Clone, Debug)]
pub struct Binding {
    pub group: u32,
    pub binding: u32,
    pub resource: Resource,
    pub count: u32,
}

/// A kernel ready for the driver.
pub struct Kernel {
    pub entry: String,
    pub spirv: Vec<u32>,
    pub bindings: Vec<Binding>,
    /// Bytes of `var<immediate>` data (Vulkan push constants), 0 when none.
    pub immediate_bytes: u32,
}

/// Parses, validates and specialises `source` (read from `path`, named in messages) and
/// writes the SPIR-V of its compute entry point `entry` (or its only one), with wgpu's runtime
/// checks (`checked`) or without them (`create_shader_module_trusted` with
/// `ShaderRuntimeChecks::unchecked()`). On failure, the second element is naga's full report
/// (several lines, with the source excerpt), for the log.
pub fn compile(
    source: &str,
    path: &str,
    entry: Option<&str>,
    checked: bool,
    target: &Target,
) -> Result<Kernel, (Failure, String)> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| {
        let report = e.emit_to_string_with_path(source, path);
        (Failure::new("WGSL", e.message()), report)
    })?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| {
        let report = e.emit_to_string_with_path(source, path);
        (Failure::new("validation", e.as_inner().to_string()), report)
    })?;

    let computes: Vec<&str> = module
        .entry_points
        .iter()
        .filter(|ep| ep.stage == naga::ShaderStage::Compute)
        .map(|ep| ep.name.as_str())
        .collect();
    let entry = match (entry, computes.as_slice()) {
        (Some(name), _) if computes.contains(&name) => name.to_string(),
        (Some(name), _) => {
            return Err(plain(
                "entry point",
                format!("no compute entry point `{name}`"),
            ))
        }
        (None, [only]) => only.to_string(),
        (None, []) => return Err(plain("entry point", "no compute entry point")),
        (None, many) => {
            let names = many.join(", ");
            return Err(plain(
                "entry point",
                format!("several compute entry points ({names}): pick one with --entry"),
            ));
        }
    };

    // No pipeline constants: wgpu-attention specialises its kernels in the source text.
    let (module, info) = naga::back::pipeline_constants::process_overrides(
        &module,
        &info,
        Some((naga::ShaderStage::Compute, &entry)),
        &Default::default(),
    )
    .map_err(|e| plain("overrides", e.to_string()))?;

    let spirv = spv::write_vec(
        &module,
        &info,
        &spirv_options(checked, target),
        Some(&spv::PipelineOptions {
            shader_stage: naga::ShaderStage::Compute,
            entry_point: entry.clone(),
        }),
    )
    .map_err(|e| plain("SPIR-V", e.to_string()))?;

    let (bindings, immediate_bytes) = resources(&module)?;
    Ok(Kernel {
        entry,
        spirv,
        bindings,
        immediate_bytes,
    })
}

fn plain(stage: &str, message: impl Into<String>) -> (Failure, String) {
    (Failure::new(stage, message), String::new())
}

/// wgpu 30's `spv::Options` for a Vulkan device like `target`, with its runtime checks on or
/// off. Unlike naga's defaults: no workgroup-memory polyfill where the driver zeroes it, no
/// bounds checks on buffers where the driver's robustness covers them, and the unchecked
/// form also drops the forced loop bounds and the integer-division checks.
fn spirv_options(checked: bool, target: &Target) -> spv::Options<'static> {
    let restrict_unless = |robust: bool| {
        if robust {
            BoundsCheckPolicy::Unchecked
        } else {
            BoundsCheckPolicy::Restrict
        }
    };
    let bounds = if checked {
        BoundsCheckPolicies {
            index: BoundsCheckPolicy::Restrict,
            buffer: restrict_unless(target.robust_buffers),
            image_load: restrict_unless(target.robust_images),
            binding_array: BoundsCheckPolicy::Unchecked,
        }
    } else {
        BoundsCheckPolicies {
            index: BoundsCheckPolicy::Unchecked,
            buffer: BoundsCheckPolicy::Unchecked,
            image_load: BoundsCheckPolicy::Unchecked,
            binding_array: BoundsCheckPolicy::Unchecked,
        }
    };
    spv::Options {
        lang_version: target.spirv_version,
        flags: spv::WriterFlags::LABEL_VARYINGS | spv::WriterFlags::FORCE_POINT_SIZE,
        // wgpu maps every binding to the same set and binding number; naga does that
        // itself for the bindings missing from its (here empty) map.
        fake_missing_bindings: true,
        bounds_check_policies: bounds,
        zero_initialize_workgroup_memory: if target.native_zero_init {
            spv::ZeroInitializeWorkgroupMemoryMode::Native
        } else {
            spv::ZeroInitializeWorkgroupMemoryMode::Polyfill
        },
        force_loop_bounding: checked,
        ray_query_initialization_tracking: checked,
        emit_int_div_checks: checked,
        mesh_shader_primitive_indices_clamp: checked,
        task_dispatch_limits: None,
        ..spv::Options::default()
    }
}

/// The module's resource bindings and the size of its immediate data.
fn resources(module: &naga::Module) -> Result<(Vec<Binding>, u32), (Failure, String)> {
    use naga::{AddressSpace, ImageClass, TypeInner};
    let mut bindings = Vec::new();
    let mut immediate_bytes = 0;
    for (_, var) in module.global_variables.iter() {
        if var.space == AddressSpace::Immediate {
            immediate_bytes = module.types[var.ty].inner.size(module.to_ctx());
            continue;
        }
        let Some(rb) = &var.binding else { continue };
        let (ty, count) = match module.types[var.ty].inner {
            TypeInner::BindingArray { base, size } => match size {
                naga::ArraySize::Constant(n) => (base, n.get()),
                _ => {
                    return Err(plain(
                        "layout",
                        "binding arrays of no fixed size are not supported",
                    ))
                }
            },
            _ => (var.ty, 1),
        };
        let resource = match (var.space, &module.types[ty].inner) {
            (AddressSpace::Uniform, _) => Resource::UniformBuffer,
            (AddressSpace::Storage { .. }, _) => Resource::StorageBuffer,
            (
                AddressSpace::Handle,
                TypeInner::Image {
                    class: ImageClass::Storage { .. },
                    ..
                },
            ) => Resource::StorageImage,
            (
                AddressSpace::Handle,
                TypeInner::Image {
                    class: ImageClass::External,
                    ..
                },
            ) => return Err(plain("layout", "external textures are not supported")),
            (AddressSpace::Handle, TypeInner::Image { .. }) => Resource::SampledImage,
            (AddressSpace::Handle, TypeInner::Sampler { .. }) => Resource::Sampler,
            (space, inner) => {
                return Err(plain(
                    "layout",
                    format!("unsupported binding: {space:?} {inner:?}"),
                ))
            }
        };
        bindings.push(Binding {
            group: rb.group,
            binding: rb.binding,
            resource,
            count,
        });
    }
    Ok((bindings, immediate_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TARGET: Target = Target {
        spirv_version: (1, 6),
        native_zero_init: true,
        robust_buffers: true,
        robust_images: true,
    };

    const KERNEL: &str = "
        @group(0) @binding(0) var<storage, read> a: array<f32>;
        @group(0) @binding(1) var<storage, read_write> b: array<f32>;
        @group(1) @binding(0) var<uniform> n: u32;
        var<workgroup> tile: array<f32, 64>;
        @compute @workgroup_size(64)
        fn main(@builtin(local_invocation_index) i: u32) {
            tile[i] = a[i];
            workgroupBarrier();
            for (var k = 0u; k < n; k++) { b[i] += tile[(i + k) % 64u] / f32(k + 1u); }
        }";

    #[test]
    fn a_kernel_and_its_layout() {
        for checked in [true, false] {
            let k = compile(KERNEL, "k.wgsl", None, checked, &TARGET)
                .map_err(|e| e.0)
                .unwrap();
            assert_eq!(k.entry, "main");
            assert_eq!(k.spirv[0], 0x0723_0203, "SPIR-V magic");
            assert_eq!(k.spirv[1], 0x0001_0600, "SPIR-V 1.6");
            let kinds: Vec<_> = k
                .bindings
                .iter()
                .map(|b| (b.group, b.binding, b.resource))
                .collect();
            assert_eq!(
                kinds,
                [
                    (0, 0, Resource::StorageBuffer),
                    (0, 1, Resource::StorageBuffer),
                    (1, 0, Resource::UniformBuffer)
                ]
            );
            assert_eq!(k.immediate_bytes, 0);
        }
        // The checked form bounds the loop and clamps the workgroup index: more code.
        let words = |checked| {
            compile(KERNEL, "k.wgsl", None, checked, &TARGET)
                .ok()
                .unwrap()
                .spirv
                .len()
        };
        assert!(words(true) > words(false));
    }

    #[test]
    fn mistakes_name_their_step() {
        let stage = |src: &str, entry: Option<&str>| {
            compile(src, "k.wgsl", entry, true, &TARGET)
                .err()
                .unwrap()
                .0
                .stage
        };
        assert_eq!(stage("fn main( {", None), "WGSL");
        assert_eq!(
            stage(
                "@compute @workgroup_size(1) fn main() { let x: u32 = 1.5; }",
                None
            ),
            "WGSL"
        );
        assert_eq!(
            stage("@compute @workgroup_size(1) fn main() {}", Some("other")),
            "entry point"
        );
        assert_eq!(stage("fn helper() {}", None), "entry point");
        assert_eq!(
            stage(
                "@compute @workgroup_size(1) fn a() {} @compute @workgroup_size(1) fn b() {}",
                None
            ),
            "entry point"
        );
        assert_eq!(
            stage(
                "override size: u32; @compute @workgroup_size(size) fn main() {}",
                None
            ),
            "overrides"
        );
    }
}
