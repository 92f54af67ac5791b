//! The dispatch sequence of one call, recorded into one encoder: the projections' matmuls,
//! then the attention proper (fused, or scores → softmax → weighted sum, or the fused context
//! with the weights from the subgroup matmul's statistics and softmax epilogues), then the
//! output projection.

use super::plan::Plan;
use super::upload::{MaskBuffer, Uploaded};
use super::weights::{DeviceWeights, Linear};
use super::Attention;
use crate::context::Context;
use crate::error::Result;
use crate::gpu::buffer::{self, Buf};
use crate::kernels::flash_tiled::Flash;
use crate::kernels::matmul::{Matmul, F16_A, F16_B, F16_C, SKIP_UPPER};
use crate::kernels::matmul_subgroup::{self, Epilogue, Operands};
use crate::kernels::weighted_sum::WeightedSum;
use crate::kernels::{row_stats, softmax, u32_of, MaskArg, Strides};
use crate::variant::{self, MatmulVariant};

/// The sizes of the attention proper: Q `(batch, n_q, d_k)`, K `(batch, n_kv, d_k·kv/H)`,
/// V `(batch, n_kv, d_v·kv/H)`, the context `(batch, n_q, d_v)`; widths over every head.
#[derive(Debug, Clone, Copy)]
pub(super) struct Shape {
    pub batch: usize,
    pub heads: usize,
    /// K/V heads: `heads` divides by it (grouped-query attention when fewer).
    pub kv_heads: usize,
    pub n_q: usize,
    pub n_kv: usize,
    pub d_k: usize,
    pub d_v: usize,
    /// Q, K, V and the context are laid out heads-first, `(batch, heads, rows, width)`
    /// (PyTorch's SDPA layout, read and written in place through the kernels' strides);
    /// else `(batch, rows, heads·width)`.
    pub heads_first: bool,
}

impl Shape {
    /// Scaled dot-product attention's: `batch·heads` groups of `n_q` queries against
    /// `kv_heads` groups of `n_kv` keys, at the widths of `dims`.
    pub(super) fn sdpa(
        dims: &super::Dims,
        [batch, heads, kv_heads, n_q, n_kv]: [usize; 5],
    ) -> Self {
        Shape {
            batch,
            heads,
            kv_heads,
            n_q,
            n_kv,
            d_k: dims.d_k,
            d_v: dims.d_v,
            heads_first: false,
        }
    }

    /// This shape with Q, K, V and the context heads-first, `(batch, heads, rows, width)`.
    pub(super) fn heads_first(self) -> Self {
        Shape {
            heads_first: true,
            ..self
        }
    }

    /// Self-attention's: the keys are the queries' rows.
    pub(super) fn self_attention(dims: &super::Dims) -> Self {
        Shape {
            batch: dims.batch,
            heads: dims.heads,
            kv_heads: dims.kv_heads,
            n_q: dims.n,
            n_kv: dims.n,
            d_k: dims.d_k,
            d_v: dims.d_v,
            heads_first: false,
        }
    }

    /// The fused kernels' problem for this shape, Q, K, V and the context laid out
    /// `(batch, rows, heads·width)` (head `h` in columns `h·width..`) or heads-first, K and
    /// V with `kv_heads` heads.
    ///
    /// # Errors
    /// A size past u32 indexing.
    pub(super) fn flash(
        &self,
        causal: bool,
        scale: f32,
        f16: bool,
        skip_zero: bool,
    ) -> Result<Flash> {
        let Shape {
            batch,
            heads,
            kv_heads,
            n_q,
            n_kv,
            d_k,
            d_v,
            heads_first,
        } = *self;
        let u = |what: &str, v: usize| u32_of(what, v);
        let (dk_h, dv_h) = (d_k / heads, d_v / heads);
        // One operand of `groups` heads of `rows` rows, `width` values each.
        let layout = |name: &str, groups: usize, rows: usize, width: usize| -> Result<Strides> {
            let what = |part: &str| format!("{name} {part}");
            Ok(if heads_first {
                Strides::row_major(
                    u(&what("width"), width)?,
                    u(&what("rows·width"), rows * width)?,
                    u(&what("heads·rows·width"), groups * rows * width)?,
                )
            } else {
                Strides::row_major(
                    u(&what("heads·width"), groups * width)?,
                    u(&what("width"), width)?,
                    u(&what("rows·heads·width"), rows * groups * width)?,
                )
            })
        };
        let k = layout("K", kv_heads, n_kv, dk_h)?;
        let v = layout("V", kv_heads, n_kv, dv_h)?;
        Ok(Flash {
            batch,
            heads,
            n_q,
            n_kv,
            dk_h,
            dv_h,
            q: layout("Q", heads, n_q, dk_h)?,
            k,
            v,
            o: layout("context", heads, n_q, dv_h)?,
            causal,
            scale,
            kv_ratio: heads / kv_heads,
            f16,
            key_split: crate::variant::KeySplit::Auto,
            skip_zero,
        })
    }
}

impl Attention {
    /// Records `X·W (+ b)` for each projection of `w`, reading X from `x` (f16 when `x_f16`),
    /// into new buffers `(batch·n, width)`, f16 under [`crate::Dtype::F16`].
    pub(super) fn record_projections(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        plan: &Plan,
        (rows, d): (usize, usize),
        (x, x_f16): (&wgpu::Buffer, bool),
        w: &DeviceWeights,
    ) -> Result<(Buf, Buf, Buf)> {
        let f16 = self.f16();
        let types = if f16 { F16_B | F16_C } else { 0 } | if x_f16 { F16_A } else { 0 };
        let alloc = |name: &str, width: usize| -> Result<Buf> {
            if f16 {
                buffer::output_f16(ctx, name, rows * width)
            } else {
                buffer::output(ctx, name, rows * width, false)
            }
        };
        if let Some(qkv) = &w.qkv {
            // One matmul X·[W_Q W_K W_V], its columns split into Q, K and V (qkv.rs).
            let (dq, dk) = (w.q.cols, w.k.cols);
            let (q, k, v) = (alloc("Q", dq)?, alloc("K", dk)?, alloc("V", w.v.cols)?);
            let mm = Matmul::plain(rows, qkv.cols, d, qkv.b.is_some(), types)?;
            let split = Some((dq, dq + dk));
            if qkv.record_split(ctx, encoder, plan, &mm, x, (&q, &k, &v), split)? {
                return Ok((q, k, v));
            }
        }
        let mut project = |name: &str, linear: &Linear| -> Result<Buf> {
            let width = linear.cols;
            let out = alloc(name, width)?;
            let mm = Matmul::plain(rows, width, d, linear.b.is_some(), types)?;
            linear.record(ctx, encoder, plan, &mm, x, &out)?;
            Ok(out)
        };
        Ok((
            project("Q", &w.q)?,
            project("K", &w.k)?,
            project("V", &w.v)?,
        ))
    }

    /// Records `out = context·W_O + b_O` into a new buffer, with its width; `None` without an
    /// output projection.
    pub(super) fn record_output_projection(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        plan: &Plan,
        (rows, d_v): (usize, usize),
        context: &wgpu::Buffer,
        weights: Option<&DeviceWeights>,
    ) -> Result<Option<(Buf, usize)>> {
        let Some(o) = weights.and_then(|w| w.o.as_ref()) else {
            return Ok(None);
        };
        let d_out = o.cols;
        let out = buffer::output(ctx, "output", rows * d_out, self.nan_fill)?;
        let types = if self.f16() { F16_B } else { 0 };
        let mm = Matmul::plain(rows, d_out, d_v, o.b.is_some(), types)?;
        o.record(ctx, encoder, plan, &mm, context, &out)?;
        Ok(Some((out, d_out)))
    }

    /// The fused pass's problem of a call of `shape` at `scale`: this op's causal flag,
    /// dtype, NaN/Inf pass-through and key split.
    ///
    /// # Errors
    /// Sizes past u32 indexing.
    pub(super) fn fused_op(&self, shape: Shape, scale: f32) -> Result<Flash> {
        let mut op = shape.flash(self.causal, scale, self.f16(), self.propagate)?;
        op.key_split = self.key_split;
        Ok(op)
    }

    /// Records the attention proper, `softmax(scale·Q_h·K_hᵀ + mask)·V_h` per (batch, head),
    /// on Q, K, V laid out `(batch, rows, heads·width)` (head `h` in columns `h·width..`),
    /// into a new context buffer of the same layout; the weights `(batch, heads, n_q, n_kv)`
    /// too unless the plan is fused.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn record_attention(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        plan: &Plan,
        shape: Shape,
        scale: f32,
        operands: &Uploaded,
        mask: Option<&MaskBuffer>,
    ) -> Result<(Buf, Option<Buf>)> {
        let Shape {
            batch,
            heads,
            kv_heads,
            n_q,
            n_kv,
            d_k: _,
            d_v,
            heads_first: _,
        } = shape;
        let (q, k, v) = operands.qkv();
        let mask = mask.map(MaskBuffer::arg);
        let u = |what: &str, v: usize| u32_of(what, v);
        // Q, K and V are f16 on the device under Dtype::F16, from the host or a projection.
        let f16 = self.f16();
        let op = self.fused_op(shape, scale)?;
        let (q_s, k_s, ratio) = (op.q, op.k, op.kv_ratio);
        let dk_h = op.dk_h;
        let context = buffer::output(ctx, "context", batch * n_q * d_v, self.nan_fill)?;
        let weights_len = batch * heads * n_q * n_kv;
        // Scores S = Q_h·K_hᵀ, one group per (batch, head).
        let scores_mm = Matmul {
            m: n_q,
            n: n_kv,
            k: dk_h,
            batch,
            heads,
            a: q_s,
            b: k_s.transposed(),
            c: Strides {
                off: 0,
                batch: u("heads·n_q·n_kv", heads * n_q * n_kv)?,
                head: u("n_q·n_kv", n_q * n_kv)?,
                row: u("n_kv", n_kv)?,
                col: 1,
            },
            flags: if self.causal { SKIP_UPPER } else { 0 },
            b_ratio: ratio,
            f16: if f16 { F16_A | F16_B } else { 0 },
        };
        if plan.fused || plan.weights_from_stats() {
            // One pass, no n × n matrix: context = softmax(scale·Q·Kᵀ)·V.
            let host = operands.host_kv();
            variant::record_flash(
                ctx,
                encoder,
                &op,
                plan.flash,
                (q, k, v),
                &context,
                mask,
                host,
            )?;
            let weights = match (plan.fused, plan.matmul) {
                (false, MatmulVariant::Subgroup { rows_per_lane }) => {
                    let weights =
                        buffer::output(ctx, "attention weights", weights_len, self.nan_fill)?;
                    let mm = &scores_mm;
                    weights_from_stats(
                        ctx,
                        encoder,
                        mm,
                        rows_per_lane,
                        (q, k),
                        scale,
                        mask,
                        &weights,
                    )?;
                    Some(weights)
                }
                _ => None,
            };
            return Ok((context, weights));
        }
        let scores = buffer::output(ctx, "attention weights", weights_len, self.nan_fill)?;
        let no_bias = ctx.stand_in();
        variant::record_matmul(
            ctx,
            encoder,
            &scores_mm,
            plan.matmul,
            q,
            k,
            no_bias,
            &scores,
        )?;
        // A = softmax(scale · S), in place.
        let rows = (batch, heads);
        softmax::dispatch(
            ctx,
            encoder,
            rows,
            (n_q, n_kv),
            scale,
            self.causal,
            &scores,
            mask,
        )?;
        // context = A·V per head, heads side by side.
        let ws = WeightedSum {
            batch,
            heads,
            kv_heads,
            n_q,
            n_kv,
            d_v,
            v: op.v,
            context: op.o,
            causal: self.causal,
            f16,
        };
        ws.dispatch(ctx, encoder, &scores, v, &context)?;
        Ok((context, Some(scores)))
    }
}

/// Records the attention weights `softmax(scale · Q·Kᵀ + mask)`, with the mask's modifiers,
/// of the score problem `mm` (A = Q, B = Kᵀ, with [`SKIP_UPPER`] for causal) into `weights`,
/// in three passes that never hold unnormalized scores: the products' per-tile softmax
/// statistics, their reduction to each row's max and sum (`row_stats.wgsl`), then the products
/// again with `exp(s − M) / L` as the epilogue. Both product passes compute each logit with the
/// same instructions.
#[allow(clippy::too_many_arguments)]
fn weights_from_stats(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    mm: &Matmul,
    rows_per_lane: u32,
    (q, k): (&wgpu::Buffer, &wgpu::Buffer),
    scale: f32,
    mask: Option<MaskArg<'_>>,
    weights: &wgpu::Buffer,
) -> Result<()> {
    let ops = Operands::pack(ctx, encoder, mm, q, k)?;
    let rows = mm.batch * mm.heads * mm.m;
    let tiles = ops.tiles_n(mm);
    let partial = buffer::output(ctx, "softmax statistics", rows * tiles * 2, false)?;
    let row_stats = buffer::output(ctx, "row max and sum", rows * 2, false)?;
    let pass = |encoder: &mut wgpu::CommandEncoder, epilogue, bias: &wgpu::Buffer, out| {
        matmul_subgroup::dispatch(
            ctx,
            encoder,
            mm,
            rows_per_lane,
            &ops,
            bias,
            epilogue,
            mask,
            out,
        )
    };
    pass(encoder, Epilogue::Stats { scale }, &row_stats, &partial)?;
    row_stats::dispatch(ctx, encoder, rows, tiles, &partial, &row_stats)?;
    let softmax = Epilogue::Softmax {
        scale,
        stats: &row_stats,
    };
    pass(encoder, softmax, &partial, weights)
}
