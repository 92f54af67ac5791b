//! Splitting past the device's limits (calls on arrays only: a call on tensors past them is
//! an error). A call whose buffers fit runs whole; a call on Q, K, V (the `sdpa_*` path)
//! that does not is split into halves of the batch, then of the K/V heads (each with its
//! group of query heads), then of the query rows, and the parts' outputs joined back in place.
//! A call on X (the `forward_*` path) that does not fit is projected on the CPU and split the
//! same way: one path, Q, K, V's, for both. What cannot be split small enough is the limit's
//! error.

use ndarray::{Array4, ArrayD, ArrayView4, ArrayViewD, Axis, IxDyn};

use super::projections::Projections;
use super::shape::Dims;
use super::{Attention, Output};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::gpu::buffer;
use crate::gpu::upload::Values;
use crate::modifiers::Modifiers;

impl Attention {
    /// Runs an SDPA call whole when its buffers fit the device, else in halves of the
    /// batch, then of the heads, then of the query rows, joined back in place; what cannot
    /// be split small enough is the limit's error. With `check`, Q, K and V's values are
    /// checked (NaN/Inf unless passed through, f16's range under f16): while uploading
    /// when the call runs whole, before splitting otherwise (so an error names the index in
    /// the caller's arrays).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn sdpa_in_parts(
        &self,
        ctx: &Context,
        q: ArrayView4<'_, f32>,
        k: ArrayView4<'_, f32>,
        v: ArrayView4<'_, f32>,
        bias: Option<ArrayView4<'_, f32>>,
        mods: Option<&Modifiers>,
        check: bool,
    ) -> Result<Output> {
        let (batch, heads, l, _) = q.dim();
        let Err(too_big) = self.sdpa_fits(ctx, [q.shape(), k.shape(), v.shape()], bias.as_ref())
        else {
            let values = [q, k, v].map(|a| Values::Array(a.into_dyn()));
            return self.sdpa_whole(ctx, values, bias, mods, check).await;
        };
        if check {
            let inputs = [
                ("Q", q.into_dyn()),
                ("K", k.into_dyn()),
                ("V", v.into_dyn()),
            ];
            self.check_values(ctx, &inputs)?;
        }
        let kv_heads = k.dim().1;
        let axis = match (batch, kv_heads) {
            (b, _) if b > 1 => Axis(0),
            (_, h) if h > 1 => Axis(1),
            _ if l > 1 => {
                return Box::pin(self.sdpa_row_blocks(ctx, q, k, v, (bias, mods), &too_big)).await
            }
            _ => return Err(too_big),
        };
        // Along the heads, split the K/V heads; each keeps its group of Q heads.
        let q_per_kv = if axis == Axis(1) { heads / kv_heads } else { 1 };
        log::info!(
            "{too_big}: splitting axis {} of the sdpa call",
            axis.index()
        );
        let half = k.len_of(axis) / 2;
        let mut joined = Joined::new(axis, q.len_of(axis));
        for (part, kv, qs) in [
            (0, (..half).into(), (..half * q_per_kv).into()),
            (1, (half..).into(), (half * q_per_kv..).into()),
        ] {
            let (kv, qs): (ndarray::Slice, ndarray::Slice) = (kv, qs);
            // The second half's modifiers see the whole call's batch or head indices.
            let at = match axis {
                Axis(0) => [part * half, 0, 0],
                _ => [0, part * half * q_per_kv, 0],
            };
            let shifted = mods.map(|m| m.shifted(at));
            joined.add(
                Box::pin(self.sdpa_in_parts(
                    ctx,
                    q.slice_axis(axis, qs),
                    k.slice_axis(axis, kv),
                    v.slice_axis(axis, kv),
                    slice_bias(&bias, axis, qs),
                    shifted.as_ref(),
                    false,
                ))
                .await?,
            )?;
        }
        joined.finish()
    }

    /// Whether a call on Q, K, V of these (4-d, checked) shapes fits the device whole: else
    /// the first limit it exceeds.
    pub(super) fn sdpa_fits(
        &self,
        ctx: &Context,
        [q, k, v]: [&[usize]; 3],
        bias: Option<&ArrayView4<'_, f32>>,
    ) -> Result<()> {
        let side = |s: &[usize], i: usize| s.get(i).copied().unwrap_or(0);
        let (batch, heads, l, e) = (side(q, 0), side(q, 1), side(q, 2), side(q, 3));
        let (s_len, e_v) = (side(k, 2), side(v, 3));
        let (bh, bkv) = (batch * heads, batch * side(k, 1));
        let named = [
            ("Q (batch·heads·L·E)", bh * l * e),
            ("K (batch·kv_heads·S·E)", bkv * s_len * e),
            ("V (batch·kv_heads·S·E_v)", bkv * s_len * e_v),
            ("context (batch·heads·L·E_v)", bh * l * e_v),
        ];
        let weights = self.return_weights.then_some(bh * l * s_len);
        fits(ctx, &named, weights, bias)
    }

    /// One head of one sequence too large for the device: the query rows in two halves, each
    /// against every key (rows are independent). Causal becomes part of each half's mask,
    /// offset to where its rows start, so the kernels need no row offset; modifiers get the
    /// offset as their origin.
    async fn sdpa_row_blocks(
        &self,
        ctx: &Context,
        q: ArrayView4<'_, f32>,
        k: ArrayView4<'_, f32>,
        v: ArrayView4<'_, f32>,
        (bias, mods): (Option<ArrayView4<'_, f32>>, Option<&Modifiers>),
        too_big: &Error,
    ) -> Result<Output> {
        let (l, s_len) = (q.dim().2, k.dim().2);
        // Every block needs all of K and V: no split helps when they do not fit.
        buffer::check_len(ctx, "K (S·E)", k.len())?;
        buffer::check_len(ctx, "V (S·E_v)", v.len())?;
        log::info!("{too_big}: splitting the {l} query rows");
        let half = l / 2;
        let mut joined = Joined::new(Axis(2), l);
        for (start, end) in [(0, half), (half, l)] {
            let rows: ndarray::Slice = (start..end).into();
            let part = slice_bias(&bias, Axis(2), rows);
            // Causal, offset to the block's first row, added to the block's mask (-inf where
            // either hides a key); ndarray broadcasts the two together.
            let causal = self.causal.then(|| {
                let hidden =
                    ndarray::Array4::from_shape_fn((1, 1, end - start, s_len), |(_, _, i, j)| {
                        if j > start + i {
                            crate::mask::MASKED
                        } else {
                            0.0
                        }
                    });
                match &part {
                    Some(p) => &hidden + p,
                    None => hidden,
                }
            });
            let part = causal.as_ref().map(|c| c.view()).or(part);
            let op = self.causal(false);
            let shifted = mods.map(|m| m.shifted([0, 0, start]));
            let q_rows = q.slice_axis(Axis(2), rows);
            let block = op.sdpa_in_parts(ctx, q_rows, k, v, part, shifted.as_ref(), false);
            joined.add(Box::pin(block).await?)?;
        }
        joined.finish()
    }

    /// A checked call on X too large for the device: Q, K and V projected on the CPU
    /// (matrixmultiply, f32 accumulation) into the layout of a call on Q, K, V, attended by
    /// [`Attention::sdpa_in_parts`], the output projection applied to the joined context
    /// (modifiers as there: each part sees the whole call's indices). In the call's dtype:
    /// under [`crate::Dtype::F16`], X, the weights and the biases are rounded to f16 first, as
    /// the whole call stores them on the device (and Q, K, V are, as its projections write
    /// them, when the parts upload them), so its numbers do not change with its size beyond
    /// the order of the sums. A warning says that the call was projected on the CPU and why.
    pub(super) async fn forward_in_parts(
        &self,
        ctx: &Context,
        dims: &Dims,
        x: ArrayViewD<'_, f32>,
        proj: Option<&Projections<'_>>,
        (bias, mods): (Option<ArrayView4<'_, f32>>, Option<&Modifiers>),
        too_big: &Error,
    ) -> Result<Output> {
        log::warn!(
            "{too_big}: X is projected on the CPU ({}, f32 sums), then the attention split as \
             sdpa splits it",
            match self.f16() {
                true => "its operands rounded to f16 as the device stores them",
                false => "f32",
            }
        );
        let shape = |e: ndarray::ShapeError| Error::shape(e.to_string());
        let (batch, n, heads) = (dims.batch, dims.n, dims.heads);
        let x2 = x.to_shape((batch * n, dims.d)).map_err(shape)?;
        let x2 = self.as_stored(x2.view());
        // (batch·n, heads·width) → (batch, heads, n, width).
        let to_heads = |a: ndarray::Array2<f32>, heads: usize| -> Result<Array4<f32>> {
            let width = a.ncols() / heads;
            let a = a
                .into_shape_with_order((batch, n, heads, width))
                .map_err(shape)?;
            Ok(a.permuted_axes([0, 2, 1, 3])
                .as_standard_layout()
                .into_owned())
        };
        let project = |w: &ndarray::ArrayView2<'_, f32>,
                       b: Option<&ndarray::ArrayView1<'_, f32>>,
                       heads: usize| {
            let mut out = x2.dot(&self.as_stored(w.view()));
            if let Some(b) = b {
                out += &self.as_stored(b.view());
            }
            to_heads(out, heads)
        };
        let kv_heads = dims.kv_heads;
        let (q, k, v) = match proj {
            Some(p) => (
                project(&p.w_q, p.b_q.as_ref(), heads)?,
                project(&p.w_k, p.b_k.as_ref(), kv_heads)?,
                project(&p.w_v, p.b_v.as_ref(), kv_heads)?,
            ),
            None => {
                let qkv = to_heads(x2.to_owned(), heads)?;
                (qkv.clone(), qkv.clone(), qkv)
            }
        };
        let op = self.scale(dims.scale);
        let out = op
            .sdpa_in_parts(ctx, q.view(), k.view(), v.view(), bias, mods, false)
            .await?;
        // (batch, heads, n, width) → (batch·n, d_v), then the output projection.
        let context = out
            .context
            .permuted_axes(IxDyn(&[0, 2, 1, 3]))
            .as_standard_layout()
            .into_owned()
            .into_shape_with_order((batch * n, dims.d_v))
            .map_err(shape)?;
        let context = match proj.and_then(|p| p.w_o.map(|w| (w, p.b_o))) {
            None => context,
            Some((w_o, b_o)) => {
                let mut out = context.dot(&self.as_stored(w_o));
                if let Some(b) = b_o {
                    out += &self.as_stored(b);
                }
                out
            }
        };
        Ok(Output::new(
            context
                .into_shape_with_order(IxDyn(&dims.context_shape()))
                .map_err(shape)?,
            out.weights
                .map(|w| w.into_shape_with_order(IxDyn(&dims.weights_shape())))
                .transpose()
                .map_err(shape)?,
        ))
    }
}

impl Attention {
    /// `a` as the device stores it under this op's dtype: rounded to f16 under
    /// [`crate::Dtype::F16`], as it is otherwise.
    fn as_stored<'a, D: ndarray::Dimension>(
        &self,
        a: ndarray::ArrayView<'a, f32, D>,
    ) -> ndarray::CowArray<'a, f32, D> {
        match self.f16() {
            true => a.mapv(|v| half::f16::from_f32(v).to_f32()).into(),
            false => a.into(),
        }
    }
}

/// Every buffer of a call fits the device's limits, or the first that does not: `named`
/// lengths in f32s, and the attention weights `(batch·heads·n_q·n_kv)` when returned.
pub(super) fn fits(
    ctx: &Context,
    named: &[(&str, usize)],
    weights: Option<usize>,
    bias: Option<&ArrayView4<'_, f32>>,
) -> Result<()> {
    if let Some(b) = bias {
        buffer::check_len(ctx, "mask", b.len())?;
    }
    for (name, len) in named {
        buffer::check_len(ctx, name, *len)?;
    }
    if let Some(len) = weights {
        buffer::check_len(ctx, "attention weights (batch·heads·n_q·n_kv)", len)?;
    }
    Ok(())
}

/// The part of a mask that goes with `range` along `axis` of the problem: the same mask when
/// it is broadcast along that axis.
fn slice_bias<'a>(
    bias: &Option<ArrayView4<'a, f32>>,
    axis: Axis,
    range: ndarray::Slice,
) -> Option<ArrayView4<'a, f32>> {
    bias.map(|b| {
        if b.len_of(axis) == 1 {
            b
        } else {
            b.slice_axis_move(axis, range)
        }
    })
}

/// A split call's outputs, filled part by part along `axis` (of `len` in all): each part's
/// context and weights are copied into their place as soon as the part is back, and the
/// part dropped, so at most one part's outputs exist beside the whole's.
struct Joined {
    axis: Axis,
    len: usize,
    at: usize,
    context: Option<ArrayD<f32>>,
    weights: Option<ArrayD<f32>>,
}

impl Joined {
    fn new(axis: Axis, len: usize) -> Self {
        Joined {
            axis,
            len,
            at: 0,
            context: None,
            weights: None,
        }
    }

    /// Copies `part` (the next along the axis) into place.
    fn add(&mut self, part: Output) -> Result<()> {
        let n = part.context.len_of(self.axis);
        let (axis, len, at) = (self.axis, self.len, self.at);
        let place = |whole: &mut Option<ArrayD<f32>>, a: &ArrayD<f32>| -> Result<()> {
            // Zeroed by the allocator: fresh pages, not a pass of ours.
            let whole = whole.get_or_insert_with(|| {
                let mut shape = a.shape().to_vec();
                shape[axis.index()] = len;
                ArrayD::zeros(shape)
            });
            let fits = at + a.len_of(axis) <= len && whole.ndim() == a.ndim();
            let mut place = match fits {
                true => whole.slice_axis_mut(axis, (at..at + a.len_of(axis)).into()),
                false => return Err(Error::shape("internal: a split call's part does not fit")),
            };
            if place.shape() != a.shape() {
                return Err(Error::shape("internal: a split call's part does not fit"));
            }
            place.assign(a);
            Ok(())
        };
        place(&mut self.context, &part.context)?;
        if let Some(w) = &part.weights {
            place(&mut self.weights, w)?;
        }
        self.at += n;
        Ok(())
    }

    /// The whole call's outputs.
    fn finish(self) -> Result<Output> {
        match (self.context, self.at == self.len) {
            (Some(context), true) => Ok(Output::new(context, self.weights)),
            _ => Err(Error::shape(
                "internal: a split call's parts do not cover it",
            )),
        }
    }
}
