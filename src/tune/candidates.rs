//! What the tuner chooses among: each family's default variant, the candidates of the fused
//! kernel and of the matmul on a device for a call's widths and dtype, and which of them keep
//! the call's numerics (the tensor-core kernels' f16 inputs).

use crate::context::Context;
use crate::dtype::Dtype;
use crate::gpu::hardware::Decisions;
use crate::gpu::Gpu;
use crate::kernels::flash::{self, Caps, Fused};
use crate::variant::{FlashVariant, Kernels, MatmulVariant};

/// The fused kernel's default variant in `family` (used when measuring is off) on `ctx`,
/// for per-head widths in vec4s: see [`default_flash_on`].
pub fn default_flash(ctx: &Context, family: Kernels, widths4: (u32, u32)) -> FlashVariant {
    default_flash_on(&ctx.hardware().decide, ctx.limits(), family, widths4)
}

/// The fused kernel's default variant in `family` on a device of type `device` with
/// `limits`, for per-head widths `(dk4, dv4)` in vec4s: the subgroup family's, or the
/// storage family's of [`storage_flash`].
pub(crate) fn default_flash_on(
    decide: &Decisions,
    limits: &wgpu::Limits,
    family: Kernels,
    widths4: (u32, u32),
) -> FlashVariant {
    match family {
        Kernels::Subgroup => FlashVariant::Subgroup { rows_per_lane: 2 },
        _ => storage_flash(decide, limits, widths4).0,
    }
}

/// The storage family's fused-kernel variants on a device of type `device` with `limits`,
/// for per-head widths `(dk4, dv4)` in vec4s: the default and the tuner's candidates.
///
/// On a CPU adapter (lavapipe): `flash_tiled` (32 keys per tile by default, the tile sizes
/// whose memory fits as candidates). On anything else: `flash_blocked` alone, whose every
/// variant compiles without spills for RDNA3 where `flash_tiled` spills hundreds of
/// registers (README, "What a real GPU compiler says"); the default is the first of
/// [`flash::BLOCKED_SHAPES`] that fits the workgroup memory, the threads and the output registers
/// per thread. Only when none fits (a head wider than 256, a small device) is `flash_tiled`
/// used there, and a log line says so once per width.
pub(crate) fn storage_flash(
    decide: &Decisions,
    limits: &wgpu::Limits,
    (dk4, dv4): (u32, u32),
) -> (FlashVariant, Vec<FlashVariant>) {
    const TILED: FlashVariant = FlashVariant::Tiled { keys: 32 };
    if decide.flash_blocked {
        let blocked = blocked_candidates(limits, dk4, dv4);
        if let Some(&first) = blocked.first() {
            return (first, blocked);
        }
        static WARNED: std::sync::Mutex<Vec<(u32, u32)>> = std::sync::Mutex::new(Vec::new());
        let mut warned = WARNED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !warned.contains(&(dk4, dv4)) {
            warned.push((dk4, dv4));
            log::warn!(
                "no flash_blocked variant fits d_k = {}, d_v = {} on this GPU \
                 (workgroup memory {} bytes, {} threads): using flash_tiled, which may \
                 spill registers",
                4 * dk4,
                4 * dv4,
                limits.max_compute_workgroup_storage_size,
                limits.max_compute_invocations_per_workgroup,
            );
        }
    }
    (TILED, tiled_candidates(limits, dk4, dv4))
}

/// See [`default_flash`].
pub fn default_matmul(family: Kernels) -> MatmulVariant {
    match family {
        Kernels::Subgroup => MatmulVariant::Subgroup { rows_per_lane: 2 },
        _ => MatmulVariant::Tiled,
    }
}

/// `flash_tiled.wgsl`'s candidates whose tiles fit `limits`.
pub(crate) fn tiled_candidates(limits: &wgpu::Limits, dk4: u32, dv4: u32) -> Vec<FlashVariant> {
    flash::Tiled.variants(&Caps::limits(limits), (dk4, dv4))
}

/// `flash_blocked.wgsl`'s candidates (of [`flash::BLOCKED_SHAPES`]) that fit `limits`.
pub(crate) fn blocked_candidates(limits: &wgpu::Limits, dk4: u32, dv4: u32) -> Vec<FlashVariant> {
    flash::Blocked.variants(&Caps::limits(limits), (dk4, dv4))
}

/// The candidates of the fused kernel in `families`, for per-head widths in vec4s: each
/// kernel's of the fused family (`kernels::flash::FAMILY`) that `ctx` can run, in the family's
/// order, where its family is asked for: the subgroup kernel's; of the storage kernels, those
/// `storage_flash` offers on this device (`flash_blocked` on GPUs, `flash_tiled` on CPU
/// adapters); tensor cores where the device has them (with the storage family or alone),
/// timed like the others and kept if faster.
pub fn flash_candidates(
    ctx: &Gpu,
    families: &[Kernels],
    dk4: u32,
    dv4: u32,
    dtype: Dtype,
) -> Vec<FlashVariant> {
    let storage = match families.contains(&Kernels::Storage) {
        true => storage_flash(&ctx.hardware().decide, ctx.limits(), (dk4, dv4)).1,
        false => Vec::new(),
    };
    let caps = Caps::of(ctx);
    let coop = same_numerics(ctx, dtype)
        && (families.contains(&Kernels::Storage) || families.contains(&Kernels::Coop));
    let wanted = |v: &FlashVariant| match v.family() {
        Kernels::Subgroup => families.contains(&Kernels::Subgroup),
        Kernels::Storage => storage.contains(v),
        Kernels::Coop => coop,
        Kernels::Auto => false,
    };
    flash::FAMILY
        .iter()
        .flat_map(|kernel| kernel.variants(&caps, (dk4, dv4)))
        .filter(wanted)
        .collect()
}

pub use crate::gpu::hardware::COOP_TUNED;

/// Whether the cooperative-matrix kernels are candidates for a `dtype` call: with f16 inputs
/// (the tensor cores' usual shape) they round an f32 call's operands to f16, so they are
/// candidates for f16 calls only; with f32 inputs, for both; never where the device's
/// decisions do not trust them (nowhere while [`COOP_TUNED`] is off).
pub(crate) fn same_numerics(ctx: &Gpu, dtype: Dtype) -> bool {
    match ctx.coop_shape() {
        Some(shape) => {
            ctx.hardware().decide.coop_tuned && (dtype == Dtype::F16 || !shape.f16_inputs)
        }
        None => false,
    }
}

/// The candidates of the matmul in `families` for operands of `dtype`.
pub fn matmul_candidates(ctx: &Context, families: &[Kernels], dtype: Dtype) -> Vec<MatmulVariant> {
    let mut v = Vec::new();
    if families.contains(&Kernels::Subgroup) && ctx.subgroup_size().is_some() {
        v.extend([1, 2, 4].map(|t| MatmulVariant::Subgroup { rows_per_lane: t }));
    }
    let coop = families.contains(&Kernels::Coop);
    if families.contains(&Kernels::Storage) || coop {
        v.push(MatmulVariant::Tiled);
        // The register-blocked kernel is for GPUs (on a CPU adapter its extra work per
        // workgroup-memory load buys nothing).
        if ctx.hardware().decide.matmul_blocked {
            v.extend(MATMUL_BLOCKED.map(|per_thread| MatmulVariant::Blocked { per_thread }));
        }
        // Tensor cores where the device has them and they keep the call's numerics: timed
        // like the others, kept if faster.
        if same_numerics(ctx, dtype) {
            v.push(MatmulVariant::Coop);
        }
    }
    v
}

/// The outputs per thread (each side) of `matmul_blocked.wgsl` the tuner tries on GPUs.
pub const MATMUL_BLOCKED: [u32; 2] = [4, 8];
