//! The fused forward kernels: `softmax(scale·Q·Kᵀ + mask)·V` in one pass per (batch, head),
//! one file each, as in the rest of `kernels/`: [`flash_tiled`] (storage buffers, any
//! adapter), [`flash_blocked`] (storage buffers, for GPUs; [`flash_combine`] merges its key
//! split), [`flash_subgroup`] (textures and subgroup shuffles) and [`flash_coop`]
//! (cooperative matrices). They share the problem ([`Flash`]) and its uniform.
//!
//! Each kernel is one [`Fused`] of [`FAMILY`], which says which [`FlashVariant`]s are its,
//! which of them a device can run, and records one. The tuner takes its candidates from the
//! family, the dispatcher records a variant through its kernel there, and `shaders --out`
//! records each kernel's variants on dry-run devices: one code path for all three.

pub(crate) mod flash_blocked;
pub(crate) mod flash_combine;
pub(crate) mod flash_coop;
pub(crate) mod flash_subgroup;
pub(crate) mod flash_tiled;

use crate::error::Result;
use crate::gpu::coop::CoopShape;
use crate::gpu::Gpu;
use crate::kernels::{KernelId, MaskArg};
use flash_blocked::{BlockedOptions, FlashBlockedConsts};
use flash_tiled::{Flash, FlashOut};

/// How the fused pass is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum FlashVariant {
    /// `flash_tiled.wgsl`: one query row per thread, K/V tiles of `keys` rows in workgroup
    /// memory.
    Tiled {
        /// Keys per tile.
        keys: u32,
    },
    /// `flash_blocked.wgsl`, for GPUs: a workgroup owns `rows` query rows and walks the keys
    /// in tiles of `keys`; each thread computes 4 × 4 scores and 4 rows of a slice of the
    /// output in registers (FlashAttention-2's loop order). Both multiples of 4.
    Blocked {
        /// Query rows per workgroup.
        rows: u32,
        /// Keys per tile.
        keys: u32,
    },
    /// `flash_subgroup.wgsl`: one subgroup per workgroup, `rows_per_lane` query rows per
    /// lane, K/V from textures.
    Subgroup {
        /// Query rows each lane owns.
        rows_per_lane: u32,
    },
    /// `flash_coop.wgsl`: `Q·Kᵀ` and `P·V` on cooperative matrices (tensor cores), blocks of
    /// 32 or 16 query rows sized to the workgroup memory; only where
    /// [`crate::Context::coop_shape`] is `Some`. Calls passing NaN/Inf through
    /// (`propagate_non_finite`) run `flash_blocked` instead.
    Coop,
}

impl std::fmt::Display for FlashVariant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FlashVariant::Tiled { keys } => write!(f, "flash-tiled(bk={keys})"),
            FlashVariant::Blocked { rows, keys } => write!(f, "flash-blocked({rows}x{keys})"),
            FlashVariant::Subgroup { rows_per_lane } => {
                write!(f, "flash-subgroup(r={rows_per_lane})")
            }
            FlashVariant::Coop => write!(f, "flash-coop"),
        }
    }
}

/// The block shapes (query rows × keys) of `flash_blocked.wgsl` offered on a device, best
/// first. 128 × 32 (256 threads) reads each key tile for twice the rows of 64 × 32, at the
/// same registers per thread: the tuner measures whether that pays on the device.
pub(crate) const BLOCKED_SHAPES: [(u32, u32); 4] = [(64, 64), (64, 32), (32, 64), (128, 32)];

/// The keys per tile of `flash_tiled.wgsl` offered on a device.
pub(crate) const TILED_KEYS: [u32; 3] = [16, 32, 64];

/// What decides which variants a device can run: its limits, its subgroup size (fixed, or
/// none) and its cooperative-matrix shape.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caps<'a> {
    pub limits: &'a wgpu::Limits,
    pub subgroup_size: Option<u32>,
    pub coop: Option<CoopShape>,
}

impl<'a> Caps<'a> {
    /// What `dev` offers.
    pub fn of(dev: &'a Gpu) -> Self {
        Caps {
            limits: dev.limits(),
            subgroup_size: dev.subgroup_size(),
            coop: dev.coop_shape(),
        }
    }

    /// A device with `limits`, no subgroup size and no cooperative matrices.
    pub fn limits(limits: &'a wgpu::Limits) -> Self {
        Caps {
            limits,
            subgroup_size: None,
            coop: None,
        }
    }
}

/// What a fused kernel reads and writes in one dispatch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FusedIo<'a> {
    pub q: &'a wgpu::Buffer,
    pub k: &'a wgpu::Buffer,
    pub v: &'a wgpu::Buffer,
    pub out: FlashOut<'a>,
    pub mask: Option<MaskArg<'a>>,
    /// The contents of K = V when they are one host array (the subgroup kernel then packs
    /// them on the CPU).
    pub host: Option<&'a [f32]>,
}

/// One fused kernel of the family.
pub(crate) trait Fused: Sync {
    /// The kernel (its WGSL file, the label of its pipelines).
    fn kernel(&self) -> KernelId;
    /// Whether `variant` is one of this kernel's.
    fn runs(&self, variant: FlashVariant) -> bool;
    /// This kernel's variants a device with `caps` can run at per-head widths `widths4`
    /// (in vec4s), in the order the tuner tries them.
    fn variants(&self, caps: &Caps<'_>, widths4: (u32, u32)) -> Vec<FlashVariant>;
    /// The loop iterations of the busiest invocation of `variant` (one of this kernel's)
    /// over `op`'s keys on `dev`; `None` for `flash_blocked`, which splits its keys into
    /// ranges within the adapter's loop cap.
    ///
    /// # Errors
    /// Sizes past u32; a device without what the variant needs.
    fn loops(&self, dev: &Gpu, op: &Flash, variant: FlashVariant) -> Result<Option<u64>>;
    /// Records `variant` (one of this kernel's) of `op`; `flash_blocked` runs its inner loop
    /// as `opts` say.
    ///
    /// # Errors
    /// As the kernel's dispatch: size limits, a device without what the variant needs.
    fn record(
        &self,
        dev: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        op: &Flash,
        variant: FlashVariant,
        opts: BlockedOptions,
        io: FusedIo<'_>,
    ) -> Result<()>;
}

/// `flash_tiled.wgsl`: one query row per thread, K/V tiles in workgroup memory.
pub(crate) struct Tiled;
/// `flash_blocked.wgsl`: FlashAttention-2's loop order, for GPUs.
pub(crate) struct Blocked;
/// `flash_subgroup.wgsl`: K/V from textures, keys handed between lanes.
pub(crate) struct Subgroup;
/// `flash_coop.wgsl`: the products on cooperative matrices.
pub(crate) struct Coop;

/// The family, in the order the tuner lists candidates: the subgroup kernel, the storage
/// kernels (GPUs' first), the cooperative-matrix kernel.
pub(crate) static FAMILY: [&dyn Fused; 4] = [&Subgroup, &Blocked, &Tiled, &Coop];

/// The kernel of `variant` in [`FAMILY`].
pub(crate) fn kernel_of(variant: FlashVariant) -> &'static dyn Fused {
    FAMILY
        .into_iter()
        .find(|k| k.runs(variant))
        .expect("every FlashVariant belongs to a kernel of FAMILY")
}

/// Why a fused call runs another kernel than the one its plan names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fallback {
    /// `flash_coop` on a call that lets NaN/Inf through: a cooperative `P·V` does not leave
    /// keys of weight 0 out, so a NaN there would reach the row.
    CoopNonFinite,
    /// `flash_coop` on a call with score or mask modifiers, which it does not apply.
    CoopModifiers,
    /// The variant over the call's keys would pass the adapter's loop cap (llvmpipe: see
    /// `kernels::loops`); `flash_blocked` splits its keys into ranges short enough.
    LoopCap {
        /// The loop iterations of the asked variant's busiest invocation.
        iterations: u64,
        /// The adapter's cap.
        cap: u64,
    },
}

impl std::fmt::Display for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fallback::CoopNonFinite => f.write_str(
                "the call lets NaN/Inf through (propagate_non_finite) and a cooperative P·V \
                 does not leave keys of weight 0 out",
            ),
            Fallback::CoopModifiers => {
                f.write_str("the call has score or mask modifiers, which flash_coop does not apply")
            }
            Fallback::LoopCap { iterations, cap } => write!(
                f,
                "one invocation would run {iterations} loop iterations, past this adapter's loop \
                 cap of {cap} (past which llvmpipe silently stops loops); flash_blocked splits \
                 its keys into ranges within it"
            ),
        }
    }
}

/// The variant that runs when `variant` of `op` is asked for (`mods`: the call has score or
/// mask modifiers), and why it is another: `variant` itself, or `flash_blocked` (else
/// `flash_tiled`) where `flash_coop` cannot take the call or where `variant` would pass the
/// adapter's loop cap. Where no variant fits the cap, `variant` stays and recording it is
/// refused ([`crate::error::Limit::LoopIterations`]).
///
/// # Errors
/// Sizes past u32; a variant the device cannot run.
pub(crate) fn runs_as(
    dev: &Gpu,
    op: &Flash,
    variant: FlashVariant,
    mods: bool,
) -> Result<(FlashVariant, Option<Fallback>)> {
    let (mut ran, mut why) = (variant, None);
    if variant == FlashVariant::Coop && (op.skip_zero || mods) {
        ran = blocked_fallback(dev, op)?;
        why = Some(match op.skip_zero {
            true => Fallback::CoopNonFinite,
            false => Fallback::CoopModifiers,
        });
    }
    let Some(cap) = dev.hardware().loop_cap else {
        return Ok((ran, why));
    };
    match kernel_of(ran).loops(dev, op, ran)? {
        Some(iterations) if iterations > cap => {
            let fallback = blocked_fallback(dev, op)?;
            if matches!(fallback, FlashVariant::Blocked { .. }) {
                return Ok((fallback, Some(Fallback::LoopCap { iterations, cap })));
            }
            Ok((ran, why))
        }
        _ => Ok((ran, why)),
    }
}

/// [`runs_as`], with a warning naming why when the variant that runs is not `variant`: what
/// a call's plan and its recording both take, so the plan names the kernel that ran.
///
/// # Errors
/// As [`runs_as`].
pub(crate) fn resolve(
    dev: &Gpu,
    op: &Flash,
    variant: FlashVariant,
    mods: bool,
) -> Result<FlashVariant> {
    let (ran, why) = runs_as(dev, op, variant, mods)?;
    if let Some(why) = why {
        log::warn!(
            "{variant} over {} keys does not run: {why}; {ran} runs instead",
            op.n_kv
        );
    }
    Ok(ran)
}

/// Records `variant` of `op` with its kernel (see [`Fused::record`]), or the variant that
/// runs in its place ([`resolve`]); returns the variant recorded.
///
/// # Errors
/// As [`Fused::record`].
pub(crate) fn record(
    dev: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    op: &Flash,
    variant: FlashVariant,
    opts: BlockedOptions,
    io: FusedIo<'_>,
) -> Result<FlashVariant> {
    let ran = resolve(dev, op, variant, MaskArg::mods(io.mask).is_some())?;
    kernel_of(ran).record(dev, encoder, op, ran, opts, io)?;
    Ok(ran)
}

/// The `flash_blocked` shape a call falls back to (the cooperative kernel's modifiers and
/// non-finite values, the loop cap): the first of [`BLOCKED_SHAPES`] that fits the device
/// (the shapes the tuner offers and `shaders --out` writes), else `flash_tiled`.
fn blocked_fallback(dev: &Gpu, op: &Flash) -> Result<FlashVariant> {
    let widths = op.widths4()?;
    let blocked = BLOCKED_SHAPES
        .into_iter()
        .find(|&s| FlashBlockedConsts::new(dev.limits(), s, widths).is_ok());
    Ok(match blocked {
        Some((rows, keys)) => FlashVariant::Blocked { rows, keys },
        None => FlashVariant::Tiled { keys: 16 },
    })
}

impl Fused for Tiled {
    fn kernel(&self) -> KernelId {
        KernelId::FlashTiled
    }

    fn runs(&self, variant: FlashVariant) -> bool {
        matches!(variant, FlashVariant::Tiled { .. })
    }

    fn variants(&self, caps: &Caps<'_>, widths4: (u32, u32)) -> Vec<FlashVariant> {
        TILED_KEYS
            .into_iter()
            .filter(|&keys| flash_tiled::tiles_fit(caps.limits, keys, widths4))
            .map(|keys| FlashVariant::Tiled { keys })
            .collect()
    }

    fn loops(&self, dev: &Gpu, op: &Flash, variant: FlashVariant) -> Result<Option<u64>> {
        let FlashVariant::Tiled { keys } = variant else {
            unreachable!("{variant} is not flash_tiled's");
        };
        op.tiled_loops(dev, keys).map(Some)
    }

    fn record(
        &self,
        dev: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        op: &Flash,
        variant: FlashVariant,
        _opts: BlockedOptions,
        io: FusedIo<'_>,
    ) -> Result<()> {
        let FlashVariant::Tiled { keys } = variant else {
            unreachable!("{variant} is not flash_tiled's");
        };
        op.dispatch_tiled(dev, encoder, keys, io.q, io.k, io.v, io.out, io.mask)
    }
}

impl Fused for Blocked {
    fn kernel(&self) -> KernelId {
        KernelId::FlashBlocked
    }

    fn runs(&self, variant: FlashVariant) -> bool {
        matches!(variant, FlashVariant::Blocked { .. })
    }

    fn variants(&self, caps: &Caps<'_>, widths4: (u32, u32)) -> Vec<FlashVariant> {
        BLOCKED_SHAPES
            .into_iter()
            .filter(|&s| FlashBlockedConsts::new(caps.limits, s, widths4).is_ok())
            .map(|(rows, keys)| FlashVariant::Blocked { rows, keys })
            .collect()
    }

    fn loops(&self, _dev: &Gpu, _op: &Flash, _variant: FlashVariant) -> Result<Option<u64>> {
        Ok(None)
    }

    fn record(
        &self,
        dev: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        op: &Flash,
        variant: FlashVariant,
        opts: BlockedOptions,
        io: FusedIo<'_>,
    ) -> Result<()> {
        let FlashVariant::Blocked { rows, keys } = variant else {
            unreachable!("{variant} is not flash_blocked's");
        };
        let qkv = (io.q, io.k, io.v);
        op.dispatch_blocked(dev, encoder, (rows, keys), opts, qkv, io.out, io.mask)
    }
}

impl Fused for Subgroup {
    fn kernel(&self) -> KernelId {
        KernelId::FlashSubgroup
    }

    fn runs(&self, variant: FlashVariant) -> bool {
        matches!(variant, FlashVariant::Subgroup { .. })
    }

    /// More rows per lane share each loaded key: 4 is ~10% faster than 2 at d = 64 on
    /// lavapipe, but LLVM takes ~4–5 s to compile 3 or 4 there (once: Mesa caches it).
    fn variants(&self, caps: &Caps<'_>, _widths4: (u32, u32)) -> Vec<FlashVariant> {
        match caps.subgroup_size {
            Some(_) => (1..=4)
                .map(|rows_per_lane| FlashVariant::Subgroup { rows_per_lane })
                .collect(),
            None => Vec::new(),
        }
    }

    fn loops(&self, dev: &Gpu, op: &Flash, variant: FlashVariant) -> Result<Option<u64>> {
        let FlashVariant::Subgroup { rows_per_lane } = variant else {
            unreachable!("{variant} is not flash_subgroup's");
        };
        op.subgroup_loops(dev, rows_per_lane).map(Some)
    }

    fn record(
        &self,
        dev: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        op: &Flash,
        variant: FlashVariant,
        _opts: BlockedOptions,
        io: FusedIo<'_>,
    ) -> Result<()> {
        let FlashVariant::Subgroup { rows_per_lane } = variant else {
            unreachable!("{variant} is not flash_subgroup's");
        };
        let qkv = (io.q, io.k, io.v);
        op.dispatch_subgroup(dev, encoder, rows_per_lane, qkv, io.out, io.mask, io.host)
    }
}

impl Fused for Coop {
    fn kernel(&self) -> KernelId {
        KernelId::FlashCoop
    }

    fn runs(&self, variant: FlashVariant) -> bool {
        variant == FlashVariant::Coop
    }

    fn variants(&self, caps: &Caps<'_>, _widths4: (u32, u32)) -> Vec<FlashVariant> {
        match caps.coop {
            Some(_) => vec![FlashVariant::Coop],
            None => Vec::new(),
        }
    }

    fn loops(&self, dev: &Gpu, op: &Flash, _variant: FlashVariant) -> Result<Option<u64>> {
        flash_coop::loops(dev, op).map(Some)
    }

    /// The calls `flash_coop` cannot take (non-finite values let through, modifiers) never
    /// reach here: [`resolve`] gives them `flash_blocked`, and the plan names it.
    fn record(
        &self,
        dev: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        op: &Flash,
        _variant: FlashVariant,
        _opts: BlockedOptions,
        io: FusedIo<'_>,
    ) -> Result<()> {
        if op.skip_zero || MaskArg::mods(io.mask).is_some() {
            return Err(crate::error::Error::invalid(
                "flash-coop",
                "internal: a call flash_coop cannot take reached it (see flash::resolve)",
            ));
        }
        let qkv = (io.q, io.k, io.v);
        flash_coop::dispatch(dev, encoder, op, qkv, io.out, io.mask)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One head of `n_q` queries against `n_kv` keys at head width `d`.
    fn problem(n_q: usize, n_kv: usize, d: usize, skip_zero: bool) -> Flash {
        Flash {
            skip_zero,
            ..Flash::one_head(n_q, n_kv, d)
        }
    }

    #[test]
    fn coop_on_a_call_it_cannot_take_runs_flash_blocked_and_says_why() {
        let dev = crate::context::test_context();
        let blocked = blocked_fallback(dev, &problem(8, 64, 64, false)).unwrap();
        assert!(matches!(blocked, FlashVariant::Blocked { .. }), "{blocked}");
        // NaN/Inf let through: no cooperative-matrix shape is needed to know it falls back.
        let ran = runs_as(dev, &problem(8, 64, 64, true), FlashVariant::Coop, false).unwrap();
        assert_eq!(ran, (blocked, Some(Fallback::CoopNonFinite)));
        let ran = runs_as(dev, &problem(8, 64, 64, false), FlashVariant::Coop, true).unwrap();
        assert_eq!(ran, (blocked, Some(Fallback::CoopModifiers)));
        assert!(Fallback::CoopModifiers.to_string().contains("modifiers"));
        assert!(Fallback::CoopNonFinite.to_string().contains("NaN/Inf"));
    }

    #[test]
    fn a_variant_past_the_loop_cap_runs_flash_blocked_and_says_why() {
        let dev = crate::context::test_context();
        let tiled = FlashVariant::Tiled { keys: 32 };
        // Within any cap: the variant itself, no reason.
        let short = problem(4, 256, 64, false);
        assert_eq!(runs_as(dev, &short, tiled, false).unwrap(), (tiled, None));
        let Some(cap) = dev.hardware().loop_cap else {
            return; // No loop cap on this adapter: nothing falls back.
        };
        // flash_tiled with 32-key tiles at d 64 passes llvmpipe's cap past 24,672 keys.
        let long = problem(4, 30_000, 64, false);
        let iterations = long.tiled_loops(dev, 32).unwrap();
        assert!(iterations > cap, "{iterations} <= {cap}");
        let (ran, why) = runs_as(dev, &long, tiled, false).unwrap();
        assert!(matches!(ran, FlashVariant::Blocked { .. }), "{ran}");
        assert_eq!(why, Some(Fallback::LoopCap { iterations, cap }));
        assert!(why.unwrap().to_string().contains("loop cap"));
        // flash_blocked splits its keys itself: it runs as asked.
        assert_eq!(runs_as(dev, &long, ran, false).unwrap(), (ran, None));
    }
}
