//! `shaders/bias_grad.wgsl`: the gradient of a relative position bias table (T5's, a
//! [`crate::modifiers::Preset::RelativeBias`]) in the fused backward, as sums along the score
//! matrix's diagonals; `shaders/bias_grad_reduce.wgsl` ([`super::bias_grad_reduce`]) then
//! sums each bucket's diagonals into the table's gradient. Same [`Flash`] problem and
//! uniform as the fused forward; no float atomics.

use super::bias_grad_reduce::{self, ReduceParams};
use super::flash_tiled::{Flash, FlashParams};
use super::loops::{run, Build};
use super::mods::ModsBind;
use super::wgsl::constants;
use super::{record, record_with, u32_of, Dim, Kernel, KernelId, MaskArg, Slot};
use crate::error::{Error, Result};
use crate::gpu::Gpu;

/// The kernel.
pub(crate) struct Shader;

/// Diagonals per workgroup (the shader's `@workgroup_size`).
const DIAGONALS: usize = 64;

constants! {
    /// Specialisation of `bias_grad.wgsl`.
    pub(crate) struct BiasGradConsts {
        /// 1 when a mask is bound.
        mask => "MASK",
        /// `d_k` per head: the q·k loop's length, unrolled.
        dk => "DK",
        /// `d_v` per head: the dO·v loop's length, unrolled.
        dv => "DV",
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::BiasGrad;
    const WORKGROUP: [Dim; 3] = [Dim::Fixed(DIAGONALS as u32), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[
        Slot::Read("q_buf"),
        Slot::Read("k_buf"),
        Slot::Read("v_buf"),
        Slot::Read("do_buf"),
        Slot::Read("stats"),
        Slot::ReadWrite("diag"),
        Slot::Read("mask"),
    ];
    /// Bit 0: Q is f16; bit 1: K and V are f16.
    const DTYPES: &'static [&'static str] = &["Q_T", "KV_T"];
    type Consts = BiasGradConsts;
    type Params = FlashParams;

    /// The loop over the diagonal's rows (at most `min(n_q, n_kv)`); per row the loops over
    /// the `d_k` columns of q·k and the `d_v` of dO·v are unrolled (host constants), except
    /// in builds that keep `// unroll` loops (the stand-in's), which count them.
    fn loops(c: &BiasGradConsts, p: &FlashParams, build: Build) -> u64 {
        let rows = u64::from(p.n_q.min(p.n_kv));
        run(rows) + rows * (build.marked(u64::from(c.dk)) + build.marked(u64::from(c.dv)))
    }
}

/// The relative bias whose table's gradient [`Flash::dispatch_bias_grad`] records: its
/// bucket per diagonal of the score matrix, and the table's shape.
#[derive(Debug, Clone)]
pub(crate) struct TableGrad {
    /// The bucket of each diagonal `d = t − (n_q − 1)`, `t` from 0 to `n_q + n_kv − 2`.
    pub bucket_of: Vec<u32>,
    /// Rows of the table.
    pub buckets: u32,
}

impl Flash {
    /// Records the gradient of the relative bias table `table` (`(buckets, heads)` f32s,
    /// written whole) from Q, K, V, dO (laid out as [`Flash::o`]) and `stats` (each row's
    /// log-sum-exp, then its `D`, as the dQ pass reads them), with the modifiers of `mask`
    /// (which must hold the relative bias).
    ///
    /// # Errors
    /// No modifiers in `mask`; a size that does not fit the grid; GPU errors.
    #[allow(clippy::too_many_arguments)]
    pub fn dispatch_bias_grad(
        &self,
        ctx: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        (q, k, v): (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
        (d_o, stats): (&wgpu::Buffer, &wgpu::Buffer),
        mask: Option<MaskArg<'_>>,
        grad: &TableGrad,
        table: &wgpu::Buffer,
    ) -> Result<()> {
        let upload = MaskArg::mods(mask).ok_or_else(|| {
            Error::invalid("relative bias gradient", "internal: no modifiers bound")
        })?;
        let (mask, mask_strides, has_mask) = MaskArg::bias_parts(ctx, mask);
        let diags = self.n_q + self.n_kv - 1;
        if grad.bucket_of.len() != diags {
            return Err(Error::invalid(
                "relative bias gradient",
                format!(
                    "internal: {} buckets for {diags} diagonals",
                    grad.bucket_of.len()
                ),
            ));
        }
        let (mut params, _) = self.params(1, mask_strides)?;
        let per_group = diags.div_ceil(DIAGONALS);
        params.blocks = u32_of("diagonal blocks", per_group)?;
        let groups = self.batch * self.heads;
        let partial = crate::gpu::buffer::output(ctx, "bias diagonals", groups * diags, false)?;
        record_with::<Shader>(
            ctx,
            encoder,
            (
                &BiasGradConsts {
                    mask: has_mask,
                    dk: u32_of("d_k", self.dk_h)?,
                    dv: u32_of("d_v", self.dv_h)?,
                },
                self.f16_bits(),
            ),
            &params,
            &[
                q.into(),
                k.into(),
                v.into(),
                d_o.into(),
                stats.into(),
                (&partial).into(),
                mask.into(),
            ],
            Some(ModsBind { upload, map: None }),
            (groups * per_group) as u64,
        )?;
        let bucket_of = crate::gpu::buffer::upload(
            ctx,
            "bias buckets",
            bytemuck::cast_slice::<u32, f32>(&grad.bucket_of),
        )?;
        let cells = grad.buckets as usize * self.heads;
        let reduce = ReduceParams {
            batch: u32_of("batch", self.batch)?,
            heads: u32_of("heads", self.heads)?,
            diags: u32_of("diagonals", diags)?,
            buckets: grad.buckets,
        };
        record::<bias_grad_reduce::Shader>(
            ctx,
            encoder,
            &super::wgsl::NoConstants,
            0,
            &reduce,
            &[(&partial).into(), (&bucket_of).into(), table.into()],
            (cells as u64).div_ceil(bias_grad_reduce::THREADS),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loops_count_the_diagonal_and_both_widths_per_row() {
        let p = |n_q, n_kv| FlashParams {
            n_q,
            n_kv,
            dk_h: 64,
            dv_h: 64,
            ..Default::default()
        };
        let consts = BiasGradConsts {
            mask: 0,
            dk: 64,
            dv: 64,
        };
        let build = Build::of(crate::gpu::hardware::Emulation::default());
        // The longest diagonal's 3 rows (4); the widths' loops unrolled.
        assert_eq!(Shader::loops(&consts, &p(3, 100), build), 4);
        // 65,534 rows fit lavapipe's cap at any width.
        assert!(Shader::loops(&consts, &p(65_534, 65_534), build) <= 65_535);
        // Builds that keep the loops (the stand-in's) count 65 + 65 per row.
        let kept = Build {
            unrolled: false,
            ..build
        };
        assert_eq!(Shader::loops(&consts, &p(3, 100), kept), 394);
        let r = bias_grad_reduce::ReduceParams {
            batch: 2,
            heads: 1,
            diags: 9,
            buckets: 4,
        };
        assert_eq!(
            bias_grad_reduce::Shader::loops(&super::super::wgsl::NoConstants, &r, build),
            3 + 2 * 10
        );
    }
}
