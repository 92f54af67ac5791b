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
use crate::gpu::Device;
use crate::kernels::{KernelId, MaskArg};
use flash_blocked::{BlockedOptions, FlashBlockedConsts};
use flash_tiled::{Flash, FlashOut};

/// How the fused pass is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
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
    pub fn of(dev: &'a Device) -> Self {
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
    /// Records `variant` (one of this kernel's) of `op`; `flash_blocked` runs its inner loop
    /// as `opts` say.
    ///
    /// # Errors
    /// As the kernel's dispatch: size limits, a device without what the variant needs.
    fn record(
        &self,
        dev: &Device,
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

/// Records `variant` of `op` with its kernel (see [`Fused::record`]).
///
/// # Errors
/// As [`Fused::record`].
pub(crate) fn record(
    dev: &Device,
    encoder: &mut wgpu::CommandEncoder,
    op: &Flash,
    variant: FlashVariant,
    opts: BlockedOptions,
    io: FusedIo<'_>,
) -> Result<()> {
    let result = kernel_of(variant).record(dev, encoder, op, variant, opts, io);
    match &result {
        Err(crate::error::Error::LimitExceeded { limit_name, .. })
            if *limit_name == crate::kernels::loops::LIMIT_NAME
                && !matches!(variant, FlashVariant::Blocked { .. }) =>
        {
            // Past the device's loop cap (llvmpipe, see `kernels::loops`): only
            // `flash_blocked` splits its keys into ranges short enough to fit. Nothing was
            // recorded for the refused kernel (the cap is checked first).
            let fallback = blocked_fallback(dev, op)?;
            if !matches!(fallback, FlashVariant::Blocked { .. }) {
                return result;
            }
            log::warn!(
                "{variant} over {} keys would pass this adapter's loop cap ({} iterations per \
                 invocation, past which llvmpipe silently stops loops): {fallback} with its keys \
                 split runs instead",
                op.n_kv,
                dev.hardware().loop_cap.unwrap_or_default()
            );
            record(dev, encoder, op, fallback, opts, io)
        }
        _ => result,
    }
}

/// The `flash_blocked` shape a call falls back to (the cooperative kernel's modifiers and
/// non-finite values, the loop cap): the first that fits the device, else `flash_tiled`.
fn blocked_fallback(dev: &Device, op: &Flash) -> Result<FlashVariant> {
    let widths = op.widths4()?;
    let blocked = [(64, 64), (64, 32), (32, 64), (32, 32)]
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

    fn record(
        &self,
        dev: &Device,
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

    fn record(
        &self,
        dev: &Device,
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

    fn record(
        &self,
        dev: &Device,
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

    fn record(
        &self,
        dev: &Device,
        encoder: &mut wgpu::CommandEncoder,
        op: &Flash,
        _variant: FlashVariant,
        opts: BlockedOptions,
        io: FusedIo<'_>,
    ) -> Result<()> {
        // Keys of weight 0 are not skipped in a cooperative P·V (a NaN there would reach the
        // row): calls passing non-finite values through take flash_blocked, and so do calls
        // with score or mask modifiers, which the cooperative kernel does not apply yet.
        if op.skip_zero || MaskArg::mods(io.mask).is_some() {
            return record(dev, encoder, op, blocked_fallback(dev, op)?, opts, io);
        }
        let qkv = (io.q, io.k, io.v);
        flash_coop::dispatch(dev, encoder, op, qkv, io.out, io.mask)
    }
}
