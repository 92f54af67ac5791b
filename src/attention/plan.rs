//! The plan of a call: which kernel family, which variant of each kernel (forced, or the
//! tuner's choice for this adapter and shape), and whether the fused path is taken.

use super::shape::Dims;
use super::Attention;
use crate::context::Context;
use crate::error::Result;
use crate::tune;
use crate::variant::{FlashVariant, Kernels, MatmulVariant};

/// What a forward pass runs, from [`Attention::plan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// One fused pass without weights, instead of materializing them.
    pub fused: bool,
    /// The matmul of the projections (and, storage family, of the scores).
    pub matmul: MatmulVariant,
    /// The fused kernel (subgroup family: also the row statistics of the weights).
    pub flash: FlashVariant,
}

impl Plan {
    /// The kernel family, the fused kernel's ([`Kernels::Storage`] or [`Kernels::Subgroup`]).
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
    /// The kernels this op runs on `ctx` for `dims`: the family (with [`Kernels::Auto`], the
    /// one whose fused kernel measured fastest), each kernel's variant (forced, or the
    /// autotuner's choice: see the README), and whether the fused path is taken (when the
    /// weights are not returned).
    ///
    /// # Errors
    /// [`crate::Error::Unsupported`] when [`Kernels::Subgroup`] is forced on an adapter
    /// without a fixed subgroup size; GPU errors while measuring.
    pub fn plan(&self, ctx: &Context, dims: &Dims) -> Result<Plan> {
        let families = match self.kernels {
            Kernels::Auto => {
                // First is the default when tuning is off: subgroup kernels where storage
                // memory is slow (CPU adapters), storage kernels on GPUs.
                let mut families = Kernels::available(ctx);
                if ctx.adapter_info().device_type == wgpu::DeviceType::Cpu {
                    families.reverse();
                }
                families
            }
            forced => vec![forced],
        };
        let head = (dims.d_k / dims.heads, dims.d_v / dims.heads);
        let flash = match self.flash {
            Some(v) => v,
            None => tune::flash(ctx, &families, head, dims.n)?,
        };
        let family = flash.family();
        let matmul = match self.matmul {
            Some(v) => v,
            None => tune::matmul(ctx, &[family], dims.batch * dims.n)?,
        };
        if family == Kernels::Subgroup || matches!(matmul, MatmulVariant::Subgroup { .. }) {
            ctx.require_subgroups()?;
        }
        Ok(Plan {
            fused: !self.return_weights,
            matmul,
            flash,
        })
    }
}
