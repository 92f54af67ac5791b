//! Q, K and V from one matmul: a [`super::Layer`] packs `W_Q | W_K | W_V` (and their biases)
//! into one `(d, d_q + d_k + d_v)` weight when it is built, and each call computes
//! `X·[W_Q W_K W_V]` in one dispatch (X read once) whose columns land in three buffers, the
//! Q, K and V the attention kernels read. For lavapipe's subgroup matmul the weights (and
//! `W_O`) are also packed into its texture layout once, so a call packs only X.
//!
//! The products are those of the three separate projections, element for element: the same
//! kernels' arithmetic per output (an `fma` chain along the inner dimension, then the bias).
//!
//! The packed copies follow the weights through training: an Adam step writes each new value
//! of `W_Q`, `W_K`, `W_V` and their biases into the packed weight as well
//! ([`DeviceWeights::mirror`]), and the textures are packed again from the buffers on the
//! device ([`DeviceWeights::record_repack`]), in the same encoder.

use super::plan::Plan;
use super::projections::Projections;
use super::weights::{DeviceWeights, Linear};
use crate::context::Context;
use crate::error::Result;
use crate::kernels::adam::Mirror;
use crate::kernels::matmul::Matmul;
use crate::kernels::matmul_blocked;
use crate::kernels::matmul_subgroup::{self, Epilogue, Operands};
use crate::kernels::pack::{Pack, Packed};
use crate::kernels::Strides;
use crate::variant::MatmulVariant;

/// `values` as the device holds them: rounded to f16 under `f16`.
fn as_stored(values: impl Iterator<Item = f32>, f16: bool) -> Vec<f32> {
    values
        .map(|v| match f16 {
            true => half::f16::from_f32(v).to_f32(),
            false => v,
        })
        .collect()
}

/// A row-major `(rows, cols)` host matrix packed into the subgroup matmul's texture layout,
/// or `None` where the adapter has no fixed subgroup size or the texture does not fit (the
/// call then packs it, as the array API does).
fn packed(ctx: &Context, what: &str, host: &[f32], (rows, cols): (usize, usize)) -> Option<Packed> {
    ctx.subgroup_size()?;
    weight_pack((rows, cols), false)
        .upload(ctx, what, host)
        .ok()
}

/// The pack of a row-major `(rows, cols)` weight (f16 when `f16`) into one texture.
fn weight_pack((rows, cols): (usize, usize), f16: bool) -> Pack {
    Pack {
        batch: 1,
        heads: 1,
        rows,
        width: cols,
        src: Strides::row_major(cols as u32, 0, 0),
        f16,
    }
}

impl DeviceWeights {
    /// [`DeviceWeights::upload`], and for a layer that keeps them: `W_Q | W_K | W_V` packed
    /// into one weight (biases likewise, zero where one is absent), and, with subgroups,
    /// that weight and `W_O` in the subgroup matmul's texture layout.
    ///
    /// # Errors
    /// Buffer limits and GPU errors.
    pub(super) fn upload_resident(ctx: &Context, p: &Projections<'_>, f16: bool) -> Result<Self> {
        let mut w = Self::upload(ctx, p, f16)?;
        let _upload = ctx.phases.enter(crate::phases::Phase::Upload);
        let d = p.w_q.nrows();
        let widths = [p.w_q.ncols(), p.w_k.ncols(), p.w_v.ncols()];
        let total: usize = widths.iter().sum();
        let ws = [&p.w_q, &p.w_k, &p.w_v];
        let host = as_stored(
            (0..d).flat_map(|r| ws.iter().flat_map(move |w| w.row(r).into_iter().copied())),
            f16,
        );
        let biases = [p.b_q, p.b_k, p.b_v];
        let bias = biases.iter().any(Option::is_some).then(|| {
            let all = biases.iter().zip(widths).flat_map(|(b, n)| match b {
                Some(b) => b.to_vec(),
                None => vec![0.0; n],
            });
            ndarray::Array1::from_iter(all)
        });
        let matrix = ndarray::ArrayView2::from_shape((d, total), &host)
            .map_err(|e| crate::error::Error::shape(e.to_string()))?;
        let bias = bias.as_ref().map(|b| b.view());
        let mut qkv = Linear::upload(ctx, "W_QKV", &matrix, bias.as_ref(), f16)?;
        qkv.packed = packed(ctx, "W_QKV", &host, (d, total));
        w.qkv = Some(qkv);
        if let (Some(o), Some(w_o)) = (w.o.as_mut(), p.w_o) {
            let host = as_stored(w_o.rows().into_iter().flatten().copied(), f16);
            o.packed = packed(ctx, "W_O", &host, w_o.dim());
        }
        Ok(w)
    }

    /// Where parameter `name` (`W_Q`, `b_K`, …, as [`super::Layer`]'s update names them) sits
    /// in the packed `W_Q | W_K | W_V` (or its bias), for an update to write there too;
    /// `None` for `W_O`, `b_O`, or without a packed weight.
    pub(super) fn mirror(&self, name: &str) -> Option<Mirror<'_>> {
        let qkv = self.qkv.as_ref()?;
        let (i, weight) = match name {
            "W_Q" => (0, true),
            "W_K" => (1, true),
            "W_V" => (2, true),
            "b_Q" => (0, false),
            "b_K" => (1, false),
            "b_V" => (2, false),
            _ => return None,
        };
        let parts = [&self.q, &self.k, &self.v];
        let off = parts[..i].iter().map(|l| l.cols).sum();
        let cols = parts[i].cols;
        // A weight's rows lie qkv.cols apart; a bias is one row.
        let (buffer, row) = match weight {
            true => (qkv.weight(), qkv.cols),
            false => (qkv.b.as_ref()?, 0),
        };
        Some(Mirror {
            buffer,
            cols,
            row,
            off,
        })
    }

    /// Records the packing of the subgroup matmul's textures (`W_Q | W_K | W_V`'s, `W_O`'s)
    /// again from the weights on the device (f16 under `f16`), into the textures they were
    /// packed into when the layer was built: after an update, so they hold the new weights.
    ///
    /// # Errors
    /// GPU errors.
    pub(super) fn record_repack(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        f16: bool,
    ) -> Result<()> {
        for l in self.qkv.iter().chain(self.o.as_ref()) {
            if let Some(texture) = &l.packed {
                weight_pack((l.rows, l.cols), f16).dispatch_into(
                    ctx,
                    encoder,
                    l.weight(),
                    texture,
                )?;
            }
        }
        Ok(())
    }
}

impl Linear {
    /// Records `a·W (+ b)` for `mm` (this weight as B) with `plan`'s matmul, its columns split
    /// over `outs` as [`matmul_blocked::dispatch`] splits them (`split = None`: all to the
    /// first). `Ok(false)`, recording nothing, where the plan's kernel cannot: a split on the
    /// storage family with operands the blocked kernel cannot read as vec4s.
    ///
    /// # Errors
    /// Size and texture limits.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn record_split(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        plan: &Plan,
        mm: &Matmul,
        a: &wgpu::Buffer,
        outs: (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
        split: Option<(usize, usize)>,
    ) -> Result<bool> {
        let bias = self.b.as_ref().unwrap_or(ctx.stand_in());
        let tb = match plan.matmul {
            MatmulVariant::Subgroup { rows_per_lane } => {
                let ops = match &self.packed {
                    Some(b) => Operands::pack_a(ctx, encoder, mm, a, b)?,
                    None => Operands::pack(ctx, encoder, mm, a, self.weight())?,
                };
                matmul_subgroup::dispatch_split(
                    ctx,
                    encoder,
                    mm,
                    rows_per_lane,
                    &ops,
                    bias,
                    Epilogue::Plain,
                    None,
                    outs,
                    split,
                )?;
                return Ok(true);
            }
            MatmulVariant::Blocked { per_thread } => per_thread / 4,
            // The scalar kernel has no split: its fma chain is the blocked kernel's.
            MatmulVariant::Tiled => 1,
            // Tensor cores: the three projections one by one.
            MatmulVariant::Coop => return Ok(false),
        };
        let Some(consts) = matmul_blocked::eligible(mm, tb, a, self.weight()) else {
            return Ok(false);
        };
        matmul_blocked::dispatch(
            ctx,
            encoder,
            mm,
            consts,
            (a, self.weight(), bias),
            outs,
            split,
        )?;
        Ok(true)
    }
}
