//! The plan of a call: which kernel family, which variant of each kernel (forced, or the
//! tuner's choice for this adapter and shape), and whether the fused path is taken.

use super::shape::Dims;
use super::Attention;
use crate::context::Context;
use crate::error::{Error, Limit, Result};
use crate::kernels::flash_tiled::Flash;
use crate::tune;
use crate::variant::{FlashVariant, Kernels, MatmulVariant};

/// What a forward pass runs, from [`Attention::plan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Plan {
    /// One fused pass without weights, instead of materializing them.
    pub fused: bool,
    /// The matmul of the projections (and, storage family, of the scores).
    pub matmul: MatmulVariant,
    /// The fused kernel (subgroup family: also the row statistics of the weights).
    pub flash: FlashVariant,
}

impl Plan {
    /// The kernel family, the fused kernel's ([`FlashVariant::family`]: storage, subgroup
    /// or coop).
    pub fn family(&self) -> Kernels {
        self.flash.family()
    }

    /// Whether the context comes from the fused kernel and the weights from the subgroup
    /// matmul's statistics and softmax epilogues, rather than scores → softmax → weighted sum.
    pub fn weights_from_stats(&self) -> bool {
        matches!(self.flash, FlashVariant::Subgroup { .. })
            && matches!(self.matmul, MatmulVariant::Subgroup { .. })
    }
}

impl std::fmt::Display for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.fused, self.weights_from_stats()) {
            (true, _) => write!(f, "{} + {}", self.matmul, self.flash),
            (false, true) => {
                write!(
                    f,
                    "{} + {}; weights: {} with stats, row_stats, again with softmax",
                    self.matmul, self.flash, self.matmul
                )
            }
            (false, _) => write!(f, "{} + softmax + weighted_sum", self.matmul),
        }
    }
}

impl Attention {
    /// The kernel families the tuner chooses among, the default first.
    pub(crate) fn families(&self, ctx: &Context) -> Vec<Kernels> {
        match self.kernels {
            Kernels::Auto => {
                // First is the default when tuning is off: subgroup kernels where storage
                // memory is slow (CPU adapters), storage kernels on GPUs.
                let mut families = Kernels::available(ctx);
                if ctx.hardware().decide.subgroup_family_first {
                    families.reverse();
                }
                families
            }
            forced => vec![forced],
        }
    }

    /// The kernels this op runs on `ctx` for `dims`: the family (with [`Kernels::Auto`], the
    /// one whose fused kernel measured fastest), each kernel's variant (forced, or the
    /// autotuner's choice: see the README), and whether the fused path is taken (when the
    /// weights are not returned). A tiny call ([`TINY_ROWS`]) under [`Kernels::Auto`] with no
    /// variant forced takes the variants cheapest to compile instead, untuned.
    ///
    /// # Errors
    /// [`crate::Error::Unsupported`] when [`Kernels::Subgroup`] is forced on an adapter
    /// without a fixed subgroup size, or [`Kernels::Coop`] / [`MatmulVariant::Coop`] on one
    /// without cooperative matrices; GPU errors while measuring.
    pub fn plan(&self, ctx: &Context, dims: &Dims) -> Result<Plan> {
        if let Some(plan) = self.tiny_plan(ctx, dims) {
            return Ok(plan);
        }
        let families = self.families(ctx);
        if self.kernels == Kernels::Coop {
            ctx.require_coop()?;
        }
        let head = (dims.d_k / dims.heads, dims.d_v / dims.heads);
        let flash = match self.flash {
            Some(v) => v,
            None if self.kernels == Kernels::Coop => FlashVariant::Coop,
            None => tune::flash(
                ctx,
                (&families, self.dtype),
                head,
                (dims.batch * dims.heads, dims.n),
            )?,
        };
        let family = flash.family();
        let matmul = match self.matmul {
            Some(v) => v,
            None if self.kernels == Kernels::Coop => MatmulVariant::Coop,
            None => tune::matmul(ctx, (&[family], self.dtype), dims.batch * dims.n)?,
        };
        if matmul == MatmulVariant::Coop || flash == FlashVariant::Coop {
            ctx.require_coop()?;
        }
        if family == Kernels::Subgroup || matches!(matmul, MatmulVariant::Subgroup { .. }) {
            ctx.require_subgroups()?;
        }
        Ok(Plan {
            fused: !self.return_weights,
            matmul,
            flash,
        })
    }

    /// `plan` with the fused kernel that runs for `op` (`mods`: the call has score or mask
    /// modifiers) when the plan runs one (fused, or the context beside the subgroup matmul's
    /// weights): the plan's, or the one put in its place, with a warning naming why
    /// ([`crate::kernels::flash::resolve`]: `flash_coop` on a call it cannot take, a variant
    /// past lavapipe's loop cap). What a call logs (`-v`) is this plan: the kernel that ran.
    ///
    /// # Errors
    /// Sizes past u32; a variant the device cannot run.
    pub(crate) fn resolved(
        &self,
        ctx: &Context,
        plan: Plan,
        op: &Flash,
        mods: bool,
    ) -> Result<Plan> {
        if !(plan.fused || plan.weights_from_stats()) {
            return Ok(plan);
        }
        let flash = crate::kernels::flash::resolve(ctx, op, plan.flash, mods)?;
        Ok(Plan { flash, ..plan })
    }

    /// Whether `flash_coop` computes the context of a call of `dims` planned with `plan`
    /// (fused, or the context beside the subgroup matmul's weights), over `n_kv` keys, on Q,
    /// K and V given (`sdpa`) or X, with score or mask modifiers when `mods`: the plan's
    /// fused kernel as [`Attention::resolved`] takes it, without its warning. A call with
    /// modifiers never runs it (whatever the block-sparse choice, `flash_coop` on modifiers
    /// falls back), nor one that passes non-finite values through.
    ///
    /// # Errors
    /// Sizes past u32; a variant the device cannot run.
    pub(crate) fn runs_flash_coop(
        &self,
        ctx: &Context,
        plan: &Plan,
        dims: &Dims,
        (n_kv, sdpa): (usize, bool),
        mods: bool,
    ) -> Result<bool> {
        if !(plan.fused || plan.weights_from_stats()) || plan.flash != FlashVariant::Coop {
            return Ok(false);
        }
        let shape = match sdpa {
            true => {
                let sizes = [dims.batch, dims.heads, dims.kv_heads, dims.n, n_kv];
                super::dispatch::Shape::sdpa(dims, sizes).heads_first()
            }
            false => super::dispatch::Shape::self_attention(dims),
        };
        let op = self.fused_op(shape, dims.scale)?;
        let (ran, _) = crate::kernels::flash::runs_as(ctx, &op, plan.flash, mods)?;
        Ok(ran == FlashVariant::Coop)
    }

    /// Runs `attempt` with `plan`, and once more on the storage kernels when it failed past
    /// the textures' limit (`max_texture_dimension_2d`): texture sides bound the subgroup
    /// kernels only (the fused one, or the matmul a tiny call takes), so when the family was
    /// not forced, the storage kernels take what does not fit in a texture. `plan` is then
    /// theirs, with the fused kernel that runs for `flash` ([`Attention::resolved`]; `mods`:
    /// the call has score or mask modifiers), and a warning names what happened. Every path
    /// that plans a call (whole, recorded, saved) runs its recording through here; what was
    /// recorded before the check only repeats work.
    ///
    /// # Errors
    /// `attempt`'s; as [`Attention::plan`] and [`Attention::resolved`] for the storage plan.
    pub(super) fn with_storage_fallback<T>(
        &self,
        ctx: &Context,
        (dims, flash, mods): (&Dims, &Flash, bool),
        plan: &mut Plan,
        mut attempt: impl FnMut(&Plan) -> Result<T>,
    ) -> Result<T> {
        let result = attempt(plan);
        let past_textures = matches!(
            result,
            Err(Error::LimitExceeded {
                limit_name: Limit::MaxTextureDimension2d,
                ..
            })
        ) && self.kernels == Kernels::Auto
            && (plan.family() == Kernels::Subgroup
                || matches!(plan.matmul, MatmulVariant::Subgroup { .. }));
        if !past_textures {
            return result;
        }
        let storage = self.kernels(Kernels::Storage).plan(ctx, dims)?;
        let storage = self.resolved(ctx, storage, flash, mods)?;
        log::warn!(
            "{plan} is past the texture limit (max_texture_dimension_2d): the storage kernels \
             take the call instead: {storage}"
        );
        *plan = storage;
        attempt(plan)
    }

    /// The plan of a tiny call ([`TINY_ROWS`]) under [`Kernels::Auto`] with no variant
    /// forced: the variants cheapest to compile, never tuned nor taken from the tuning cache.
    ///
    /// On lavapipe the driver compiles a kernel with LLVM at its first dispatch, and that is
    /// nearly all of a small first call: 0.5–0.7 s for `matmul_subgroup` with one row per lane,
    /// 1.2–1.5 s with two, 3.5 s with four (the tuner's usual pick), per pipeline. A tiny call
    /// runs in milliseconds whichever it takes, so there the subgroup matmul with one row per
    /// lane computes the projections and the scores, then `softmax` and `weighted_sum` (0.1
    /// and 0.2 s to compile) the context, instead of `flash_subgroup` and, for the weights, a
    /// statistics-epilogue matmul (two more LLVM compiles), with or without the weights
    /// returned. Adapters without subgroups (and GPUs) take their storage family's defaults.
    fn tiny_plan(&self, ctx: &Context, dims: &Dims) -> Option<Plan> {
        let forced = self.kernels != Kernels::Auto || self.flash.is_some() || self.matmul.is_some();
        if forced || dims.batch * dims.n > TINY_ROWS {
            return None;
        }
        let head4 = (
            (dims.d_k / dims.heads).div_ceil(4) as u32,
            (dims.d_v / dims.heads).div_ceil(4) as u32,
        );
        let storage = tune::default_flash(ctx, Kernels::Storage, head4);
        let plan = if ctx.subgroup_size().is_some() && ctx.hardware().decide.unfused_subgroup_plan {
            // With or without the weights, the same kernels: the context is then the same
            // bit for bit, and a process that asks for both compiles them once. The weights
            // stay on the device when not asked for (a tiny call's are small).
            Plan {
                fused: false,
                matmul: MatmulVariant::Subgroup { rows_per_lane: 1 },
                // Not run: scores → softmax → weighted sum compute the context.
                flash: storage,
            }
        } else {
            Plan {
                fused: !self.return_weights,
                matmul: MatmulVariant::Tiled,
                flash: storage,
            }
        };
        log::debug!("tiny call ({} rows): {plan}", dims.batch * dims.n);
        Some(plan)
    }
}

/// Calls with at most this many query rows over the batch (`batch · n`) are tiny: they take
/// the variants cheapest to compile (see [`Attention::plan`]) instead of tuning or the tuning
/// cache's choices. The MiniLM layer (2 × 12 tokens) and `demo` (6) are tiny. Measured on
/// lavapipe with the MiniLM weights (d = 384, 12 heads, batch 2): one row per lane costs
/// 16.8 ms a call at 12 tokens against 15.7 ms with two and 13.7 ms with the tuned four,
/// while compiling four rows per lane takes ~6 s more once.
pub const TINY_ROWS: usize = 64;
