//! Splitting past the device's limits (calls on arrays only: a call on tensors past them is
//! an error). A call whose buffers fit runs whole; a call on Q, K, V (the `sdpa_*` path)
//! that does not is split into halves of the batch, then of the K/V heads (each with its
//! group of query heads), then of the query rows, and the parts' outputs joined back in place.
//! A call on X (the `forward_*` path) that does not fit is projected on the device in blocks
//! of rows, split the same way, and its output projection applied on the device in blocks of
//! rows: one path, Q, K, V's, for both, on the device in the call's dtype with the whole
//! call's plan, so a call's numbers do not change with its size. What cannot be split small
//! enough is the limit's error.

use ndarray::{s, Array2, Array4, ArrayD, ArrayView2, ArrayView4, ArrayViewD, Axis, IxDyn};

use super::call::Given;
use super::plan::Plan;
use super::projections::Projections;
use super::shape::Dims;
use super::upload::{stored, Source};
use super::weights::DeviceWeights;
use super::{Attention, Output};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::gpu::upload::{self, Values};
use crate::gpu::{buffer, readback, timing};
use crate::kernels::flash::flash_combine;
use crate::modifiers::Modifiers;
use crate::values::overflow_at;
use crate::variant::{FlashVariant, KeySplit};

impl Attention {
    /// Runs a checked SDPA call whole when its buffers fit the device, else in halves of the
    /// batch, then of the heads, then of the query rows, joined back in place, every part
    /// with `plan` (the whole call's); what cannot be split small enough is the limit's error.
    pub(super) async fn sdpa_in_parts(
        &self,
        ctx: &Context,
        q: ArrayView4<'_, f32>,
        k: ArrayView4<'_, f32>,
        v: ArrayView4<'_, f32>,
        (bias, mods): (Option<ArrayView4<'_, f32>>, Option<&Modifiers>),
        plan: Plan,
    ) -> Result<Output> {
        let (batch, heads, l, _) = q.dim();
        let shapes = [q.shape(), k.shape(), v.shape()];
        let Err(too_big) = self
            .sdpa_fits(ctx, shapes, bias.as_ref())
            .and_then(|()| self.partials_fit(ctx, shapes, &plan))
        else {
            let dims = self.sdpa_dims(q.shape(), k.shape(), v.shape())?;
            let values = [q, k, v].map(|a| Values::Array(a.into_dyn()));
            let source = Source::Qkv {
                values,
                check: false,
            };
            return self
                .run_whole(ctx, &dims, source, (bias, mods), Some(plan))
                .await;
        };
        let kv_heads = k.dim().1;
        let axis = match (batch, kv_heads) {
            (b, _) if b > 1 => Axis(0),
            (_, h) if h > 1 => Axis(1),
            _ if l > 1 => {
                let masking = (bias, mods);
                let rows = self.sdpa_row_blocks(ctx, [q, k, v], masking, plan, &too_big);
                return Box::pin(rows).await;
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
                    (slice_bias(&bias, axis, qs), shifted.as_ref()),
                    plan,
                ))
                .await?,
            )?;
        }
        joined.finish()
    }

    /// `self` with the key split its parts take: the one the whole call would take on a
    /// device it fits ([`KeySplit::Auto`] resolved from the whole call's workgroups). A part
    /// has fewer query blocks than the whole call, so left automatic it could split its keys
    /// where the whole call does not (on GPUs): its sums would then run in another order and,
    /// under f16 arithmetic, P would round against another row maximum, and the call's numbers
    /// would change with its size.
    pub(super) fn whole_key_split(
        &self,
        ctx: &Context,
        dims: &Dims,
        n_kv: usize,
        plan: &Plan,
    ) -> Self {
        let FlashVariant::Blocked { rows, keys } = plan.flash else {
            return *self;
        };
        if self.key_split != KeySplit::Auto || !plan.fused {
            return *self;
        }
        let workgroups = dims.batch * dims.heads * dims.n.div_ceil(rows.max(1) as usize);
        let cpu = !ctx.hardware().decide.split_keys_to_fill;
        let whole = flash_combine::key_ranges(KeySplit::Auto, cpu, workgroups, n_kv, keys as usize);
        let mut op = *self;
        op.key_split = match whole {
            // `Ranges(splits)` cuts the same ranges: `splits` ranges of as many whole tiles.
            Some(r) => KeySplit::Ranges(u32::try_from(r.splits).unwrap_or(u32::MAX)),
            None => KeySplit::Off,
        };
        op
    }

    /// Whether a part of these (4-d) shapes holds the partial outputs of the key split it
    /// runs with (see [`Attention::whole_key_split`]): one vec4 a query row, key range and
    /// 4 columns of V.
    fn partials_fit(&self, ctx: &Context, [q, _, v]: [&[usize]; 3], plan: &Plan) -> Result<()> {
        let blocked = matches!(plan.flash, FlashVariant::Blocked { .. });
        let KeySplit::Ranges(splits) = self.key_split else {
            return Ok(());
        };
        if !(plan.fused && blocked) {
            return Ok(());
        }
        let rows = q.iter().take(3).product::<usize>();
        let width = v.get(3).copied().unwrap_or(0).div_ceil(4) * 4;
        let floats = rows * splits as usize * width;
        buffer::check_len(ctx, "split partial outputs", floats).map(|_| ())
    }

    /// Whether a call on Q, K, V of these (4-d, checked) shapes fits the device whole: else
    /// the first limit it exceeds.
    pub(super) fn sdpa_fits(
        &self,
        ctx: &Context,
        [q, k, v]: [&[usize]; 3],
        bias: Option<&ArrayView4<'_, f32>>,
    ) -> Result<()> {
        let named = sdpa_buffers([q, k, v]);
        let weights = self.return_weights.then_some(sdpa_weights([q, k]));
        fits(ctx, &named, weights, bias)
    }

    /// One head of one sequence too large for the device: the query rows in two halves, each
    /// against every key (rows are independent). Causal becomes part of each half's mask,
    /// offset to where its rows start, so the kernels need no row offset; modifiers get the
    /// offset as their origin.
    async fn sdpa_row_blocks(
        &self,
        ctx: &Context,
        [q, k, v]: [ArrayView4<'_, f32>; 3],
        (bias, mods): (Option<ArrayView4<'_, f32>>, Option<&Modifiers>),
        plan: Plan,
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
            let masking = (part, shifted.as_ref());
            let block = op.sdpa_in_parts(ctx, q_rows, k, v, masking, plan);
            joined.add(Box::pin(block).await?)?;
        }
        joined.finish()
    }

    /// A checked call on X too large for the device, split on the device in the call's
    /// dtype: Q, K and V projected in blocks of X's rows (rows are independent), attended by
    /// [`Attention::sdpa_in_parts`] (modifiers as there: each part sees the whole call's
    /// indices), the output projection applied to the joined context in blocks of rows. Each
    /// step runs the kernels of the whole call's `plan` on operands stored as the whole call
    /// stores them (X, the weights, Q, K and V in the call's dtype; the context in f32), so a
    /// call's numbers do not change with its size.
    pub(super) async fn forward_in_parts(
        &self,
        ctx: &Context,
        dims: &Dims,
        (x, proj, weights): (
            ArrayViewD<'_, f32>,
            Option<&Projections<'_>>,
            Option<&DeviceWeights>,
        ),
        plan: Plan,
        (bias, mods): (Option<ArrayView4<'_, f32>>, Option<&Modifiers>),
        too_big: &Error,
    ) -> Result<Output> {
        log::info!("{too_big}: the call on X is split on the device, as sdpa splits it");
        let shape = |e: ndarray::ShapeError| Error::shape(e.to_string());
        let (batch, n, heads) = (dims.batch, dims.n, dims.heads);
        let x2 = x.to_shape((batch * n, dims.d)).map_err(shape)?;
        // (batch·n, heads·width) → (batch, heads, n, width).
        let to_heads = |a: Array2<f32>, heads: usize| -> Result<Array4<f32>> {
            let width = a.ncols() / heads;
            let a = a
                .into_shape_with_order((batch, n, heads, width))
                .map_err(shape)?;
            Ok(a.permuted_axes([0, 2, 1, 3])
                .as_standard_layout()
                .into_owned())
        };
        // The projections' weights: the layer's, on the device already, or uploaded now.
        let uploaded;
        let device_weights = match (weights, proj) {
            (Some(w), _) => Some(w),
            (None, Some(p)) => {
                uploaded = DeviceWeights::upload(ctx, p, self.f16())?;
                Some(&uploaded)
            }
            (None, None) => None,
        };
        let (q, k, v) = match device_weights {
            Some(w) => {
                let [q, k, v] = self.project_rows(ctx, &plan, x2.view(), w).await?;
                let kv_heads = dims.kv_heads;
                (
                    to_heads(q, heads)?,
                    to_heads(k, kv_heads)?,
                    to_heads(v, kv_heads)?,
                )
            }
            None => {
                // Q = K = V = X, as the device stores it.
                let qkv = to_heads(self.as_stored(x2.view()).into_owned(), heads)?;
                (qkv.clone(), qkv.clone(), qkv)
            }
        };
        let op = self.scale(dims.scale);
        let out = op
            .sdpa_in_parts(ctx, q.view(), k.view(), v.view(), (bias, mods), plan)
            .await?;
        // (batch, heads, n, width) → (batch·n, d_v), then the output projection.
        let context = out
            .context
            .permuted_axes(IxDyn(&[0, 2, 1, 3]))
            .as_standard_layout()
            .into_owned()
            .into_shape_with_order((batch * n, dims.d_v))
            .map_err(shape)?;
        let context = match device_weights.filter(|w| w.o.is_some()) {
            Some(w) => self.output_rows(ctx, &plan, context.view(), w).await?,
            None => context,
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

    /// `X·W_Q (+b_Q)`, `X·W_K (+b_K)`, `X·W_V (+b_V)` on the device in blocks of X's rows
    /// that fit, each as the whole call computes it (`plan`'s matmul, stored in the call's
    /// dtype) and read back.
    async fn project_rows(
        &self,
        ctx: &Context,
        plan: &Plan,
        x: ArrayView2<'_, f32>,
        w: &DeviceWeights,
    ) -> Result<[Array2<f32>; 3]> {
        let (f16, d) = (self.f16(), x.ncols());
        let widths = [w.q.cols, w.k.cols, w.v.cols];
        let rows = Rows {
            name: "X",
            a: x,
            f16: (f16, f16),
            widths: &widths,
        };
        let (out, _) = rows
            .run(ctx, |encoder, x, m| {
                let qkv = (x, f16);
                let (q, k, v) = self.record_projections(ctx, encoder, plan, (m, d), qkv, w)?;
                Ok(vec![q, k, v])
            })
            .await?;
        let [q, k, v]: [Array2<f32>; 3] = out
            .try_into()
            .map_err(|_| Error::invalid("split", "internal: Q, K, V missing"))?;
        Ok([q, k, v])
    }

    /// `context·W_O (+b_O)` on the device in blocks of rows that fit, each as the whole call
    /// computes it (`plan`'s matmul on the f32 context), checked for overflow as its output.
    async fn output_rows(
        &self,
        ctx: &Context,
        plan: &Plan,
        context: ArrayView2<'_, f32>,
        w: &DeviceWeights,
    ) -> Result<Array2<f32>> {
        let d_v = context.ncols();
        let d_out = w.o.as_ref().map_or(d_v, |o| o.cols);
        let rows = Rows {
            name: "context",
            a: context,
            f16: (false, false),
            widths: &[d_out],
        };
        let (mut out, bad) = rows
            .run(ctx, |encoder, c, m| {
                let o = self.record_output_projection(ctx, encoder, plan, (m, d_v), c, Some(w))?;
                let (o, _) =
                    o.ok_or_else(|| Error::invalid("split", "internal: no output projection"))?;
                Ok(vec![o])
            })
            .await?;
        if !self.propagate {
            overflow_at("context", self.dtype, bad)?;
        }
        out.pop()
            .ok_or_else(|| Error::invalid("split", "internal: no output"))
    }
}

/// A step of a call past the device's limits that runs on blocks of rows: `a` (named `name`,
/// uploaded as f16 when `f16.0`) in, outputs `widths` wide (f16 when `f16.1`) out.
struct Rows<'a, 'w> {
    name: &'static str,
    a: ArrayView2<'a, f32>,
    f16: (bool, bool),
    widths: &'w [usize],
}

impl Rows<'_, '_> {
    /// `record` (an encoder, the block's input buffer and its rows: its outputs) on blocks of
    /// rows that fit the device, each in its own encoder inside the error scopes, its outputs
    /// read back into place; with the index of the first NaN or infinity in the first output.
    async fn run(
        &self,
        ctx: &Context,
        record: impl Fn(&mut wgpu::CommandEncoder, &wgpu::Buffer, usize) -> Result<Vec<buffer::Buf>>,
    ) -> Result<(Vec<Array2<f32>>, Option<usize>)> {
        let (rows, width) = self.a.dim();
        let widest = self.widths.iter().copied().fold(width, usize::max);
        let block = rows_per_block(ctx, "one row of a split call's operand", widest)?;
        let mut out: Vec<_> = self
            .widths
            .iter()
            .map(|&c| Array2::zeros((rows, c)))
            .collect();
        let mut bad = None;
        for start in (0..rows).step_by(block) {
            let part = self.a.slice(s![start..(start + block).min(rows), ..]);
            let m = part.nrows();
            let read = ctx.scoped_async(async {
                // Declared first, dropped last: the buffers are reused only after the block.
                let _open = ctx.pool.open();
                let mut encoder = ctx.device.create_command_encoder(&Default::default());
                let how = stored(self.f16.0, false);
                let input = upload::array(ctx, self.name, &part.into_dyn(), how)?;
                let outputs = record(&mut encoder, &input, m)?;
                let pending = outputs
                    .iter()
                    .zip(self.widths)
                    .map(|(buf, cols)| {
                        readback::copy_out_as(ctx, &mut encoder, buf, m * cols, self.f16.1)
                    })
                    .collect();
                timing::submit_and_read_scanned_async(ctx, encoder, pending).await
            });
            for (i, ((whole, (values, first)), &cols)) in
                out.iter_mut().zip(read.await?).zip(self.widths).enumerate()
            {
                if i == 0 && bad.is_none() {
                    bad = first.map(|at| start * cols + at);
                }
                let values = ArrayView2::from_shape((m, cols), &values)
                    .map_err(|e| Error::shape(e.to_string()))?;
                whole.slice_mut(s![start..start + m, ..]).assign(&values);
            }
        }
        Ok((out, bad))
    }
}

/// How many rows of `width` f32s a storage buffer may hold on this device (at least one,
/// else the limit's error naming `what`).
fn rows_per_block(ctx: &Context, what: &str, width: usize) -> Result<usize> {
    buffer::check_len(ctx, what, width)?;
    let limits = ctx.limits();
    let bytes = limits
        .max_storage_buffer_binding_size
        .min(limits.max_buffer_size);
    Ok(((bytes / 4) as usize / width.max(1)).max(1))
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

/// Whether a (checked) call fits the device whole, else the first limit it exceeds: every
/// buffer it makes there (its operands when they come from the host, the projected Q, K and
/// V, the context and the output, a saved forward's row statistics) and the weights when
/// they are returned.
pub(super) fn call_fits(
    ctx: &Context,
    op: &Attention,
    dims: &Dims,
    given: &Given<'_, '_>,
    bias: Option<&ArrayView4<'_, f32>>,
) -> Result<()> {
    let rows = dims.batch * dims.n;
    let mut named = match given {
        Given::X { .. } => x_buffers(dims).to_vec(),
        // X is on the device already.
        Given::TensorX { .. } => x_buffers(dims)[1..].to_vec(),
        Given::Qkv(qkv) => sdpa_buffers([qkv[0].shape(), qkv[1].shape(), qkv[2].shape()]).to_vec(),
        // Q, K and V are on the device already.
        Given::TensorQkv(_) => vec![("context (batch·heads·L·E_v)", rows * dims.d_v)],
    };
    if op.save {
        named.push(("row statistics (2·batch·heads·L)", 2 * rows * dims.heads));
    }
    let n_kv = given.n_kv(dims);
    let weights = op
        .return_weights
        .then_some(dims.batch * dims.heads * dims.n * n_kv);
    fits(ctx, &named, weights, bias)
}

/// The buffers of a call on X on the device, named, and their lengths in f32s.
pub(super) fn x_buffers(dims: &Dims) -> [(&'static str, usize); 4] {
    let rows = dims.batch * dims.n;
    [
        ("X (batch·n·d)", rows * dims.d),
        ("Q, K (batch·n·d_k)", rows * dims.d_k),
        ("V, context (batch·n·d_v)", rows * dims.d_v),
        ("output (batch·n·d_out)", rows * dims.d_out),
    ]
}

/// The buffers of a call on Q, K, V of these (4-d) shapes, named, and their lengths.
fn sdpa_buffers([q, k, v]: [&[usize]; 3]) -> [(&'static str, usize); 4] {
    let side = |s: &[usize], i: usize| s.get(i).copied().unwrap_or(0);
    let (batch, heads, l, e) = (side(q, 0), side(q, 1), side(q, 2), side(q, 3));
    let (s_len, e_v) = (side(k, 2), side(v, 3));
    let (bh, bkv) = (batch * heads, batch * side(k, 1));
    [
        ("Q (batch·heads·L·E)", bh * l * e),
        ("K (batch·kv_heads·S·E)", bkv * s_len * e),
        ("V (batch·kv_heads·S·E_v)", bkv * s_len * e_v),
        ("context (batch·heads·L·E_v)", bh * l * e_v),
    ]
}

/// The length of the weights of a call on Q, K of these shapes, `batch·heads·L·S`.
fn sdpa_weights([q, k]: [&[usize]; 2]) -> usize {
    q.iter().take(3).product::<usize>() * k.get(2).copied().unwrap_or(0)
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
