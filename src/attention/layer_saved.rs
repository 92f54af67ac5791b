//! The projected layer's forward that keeps what its backward needs, and that backward, all
//! on the device: [`forward`] (arrays) and [`record`] (tensors) project X (the matmul kernels), run the fused kernel with
//! its row statistics on, and applies `W_O`; [`LayerSaved::backward`] takes `dY` and, in one
//! encoder, runs `W_O`'s backward (`dW_O = Cᵀ·dY`, `db_O`, `dC = dY·W_Oᵀ`), the fused
//! attention backward (`kernels/flash_backward_*`: dQ, dK, dV), and the projections'
//! backward (`dW = Xᵀ·dQ` …, `dX = dQ·W_Qᵀ + dK·W_Kᵀ + dV·W_Vᵀ`, summed in place). Nothing
//! comes back to the host before the gradients themselves.
//!
//! A call on X with [`Attention::save_for_backward`] on ([`Call::run`], [`Call::record`])
//! comes here; the public [`crate::Saved`] wraps the [`LayerSaved`], and
//! [`crate::Saved::backward`] runs its backward.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use ndarray::{Array1, Array2, ArrayD, ArrayView, ArrayViewD, AsArray, Dimension, IxDyn};

use super::call::Call;
use super::check_finite;
use super::dispatch::Shape;
use super::gradients::LayerGradients;
use super::linear_grad::{InputGrad, LinearGrads};
use super::plan::Plan;
use super::projections::Projections;
use super::saved::{record_table_grad, BackwardKernels};
use super::shape::Dims;
use super::upload::{upload_as, MaskBuffer};
use super::weights::{DeviceWeights, Layer};
use super::{Attention, Dtype, Output};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::gpu::buffer::{self, Buf};
use crate::gpu::oneshot::block_on;
use crate::gpu::readback;
use crate::kernels::flash_tiled::{Flash, FlashOut};
use crate::tensor::Tensor;
use crate::variant;

mod tensors;
pub(super) use tensors::record;
pub(crate) use tensors::TensorGradients;

/// What a saved forward on X ([`forward`], [`record`]) keeps on the device for [`LayerSaved::backward`]: X, the weights, the projected Q, K, V,
/// the context before `W_O`, each row's log-sum-exp and the mask.
pub(crate) struct LayerSaved {
    ctx_id: u64,
    op: Attention,
    dims: Dims,
    x_shape: Vec<usize>,
    out_shape: Vec<usize>,
    flash: Flash,
    x: Tensor,
    weights: Option<DeviceWeights>,
    qkv: Option<[Buf; 3]>,
    /// The context before `W_O`, `(batch·n·d_v)` f32 (the output too without `W_O`).
    context: Tensor,
    stats: Buf,
    mask: Option<MaskBuffer>,
    kernels: BackwardKernels,
    /// For a [`Layer`]'s forward: its weights' version counter and the version this forward
    /// read, so a backward after the weights changed is an error, not wrong gradients.
    version: Option<(Arc<AtomicU64>, u64)>,
}

impl std::fmt::Debug for LayerSaved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerSaved")
            .field("x", &self.x_shape)
            .field("output", &self.out_shape)
            .field("projections", &self.weights.is_some())
            .finish_non_exhaustive()
    }
}

/// The saved forward of a checked call on X (arrays): X uploaded, the projections' weights
/// (the layer's, on the device already, or uploaded now), the fused forward keeping what the
/// backward needs ([`record_into`]), the output read back. Never split.
///
/// # Errors
/// Overflow in the output; GPU errors.
pub(super) fn forward(
    ctx: &Context,
    call: &Call<'_, '_, '_>,
    x: ArrayViewD<'_, f32>,
    proj: Option<&Projections<'_>>,
    layer: Option<&Layer>,
) -> Result<(Output, LayerSaved)> {
    let (op, dims) = (&call.op, &call.dims);
    let f16 = op.f16();
    let weights = match (layer, proj) {
        (Some(l), _) => Some(l.device().clone()),
        (None, Some(p)) => Some(ctx.scoped(|| DeviceWeights::upload(ctx, p, f16))?),
        (None, None) => None,
    };
    let (bias, mods) = call.masking();
    let rows = dims.batch * dims.n;
    let (out, saved) = ctx.scoped(|| {
        let _open = ctx.pool.open();
        let x_buf = Buf::unpooled(upload_as(ctx, "X", x.view(), f16)?);
        let written = Arc::new(AtomicBool::new(true));
        let wrap = |buf: Buf, shape: Vec<usize>, dtype: Dtype| {
            Tensor::new(ctx, buf, shape, dtype, Arc::clone(&written))
        };
        let x_dtype = if f16 { Dtype::F16 } else { Dtype::F32 };
        let x_t = wrap(x_buf, x.shape().to_vec(), x_dtype);
        let mask_buf = MaskBuffer::upload(ctx, bias.as_ref(), mods)?;
        let mut encoder = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("attention layer (saved)"),
            });
        let parts = SavedParts {
            x: x_t,
            weights,
            mask: mask_buf,
        };
        let (projected, saved) = record_into(ctx, &mut encoder, call, parts, &|b, s| {
            wrap(b, s, Dtype::F32)
        })?;
        let (y, width) = match &projected {
            Some(y) => (y, dims.d_out),
            None => (saved.context.buf(ctx, "context")?, dims.d_v),
        };
        let (y, _) = block_on(op.read_back(ctx, encoder, y, rows * width, None))?;
        let context_out = ArrayD::from_shape_vec(IxDyn(&saved.out_shape), y)
            .map_err(|e| Error::shape(e.to_string()))?;
        Ok((Output::new(context_out, None), saved))
    })?;
    Ok((out, saved.of(layer)))
}

/// Records the saved forward of a checked call on X (`parts.x`, on the device) into
/// `encoder`: the projections, the fused kernel with its row statistics, and `W_O` (on the
/// storage kernels past the textures' limit: [`Attention::with_storage_fallback`]). Returns
/// the output projection's result (`None` without `W_O`: the output is the saved context)
/// and the saved state; `wrap` makes the f32 results tensors (of the caller's recorder, or
/// marked written for a caller that submits the encoder itself).
pub(super) fn record_into(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    call: &Call<'_, '_, '_>,
    parts: SavedParts,
    wrap: &dyn Fn(Buf, Vec<usize>) -> Tensor,
) -> Result<(Option<Buf>, LayerSaved)> {
    let (op, dims) = (&call.op, &call.dims);
    let SavedParts {
        x,
        weights,
        mask: mask_buf,
    } = parts;
    let shape = Shape::self_attention(dims);
    let mut flash = shape.flash(op.causal, dims.scale, op.f16(), false)?;
    flash.key_split = op.key_split;
    let mut plan = op.resolved(ctx, op.plan(ctx, dims)?, &flash, call.mods.is_some())?;
    let rows = dims.batch * dims.n;
    let heads_rows = dims.batch * dims.heads * dims.n;
    let x_buf = x.buffer(ctx, "X")?;
    let m = mask_buf.as_ref().map(MaskBuffer::arg);
    let attempt = |plan: &Plan| {
        let context = buffer::output(ctx, "context", rows * dims.d_v, op.nan_fill)?;
        let stats = buffer::output(ctx, "row statistics", 2 * heads_rows, op.nan_fill)?;
        let qkv = match &weights {
            Some(w) => {
                let x_f16 = x.dtype() == Dtype::F16;
                let (q, k, v) =
                    op.record_projections(ctx, encoder, plan, (rows, dims.d), (x_buf, x_f16), w)?;
                Some([q, k, v])
            }
            None => None,
        };
        let (q, k, v) = match &qkv {
            Some([q, k, v]) => (&**q, &**k, &**v),
            None => (x_buf, x_buf, x_buf),
        };
        let out = FlashOut {
            context: &context,
            lse: Some(&stats),
        };
        variant::record_flash(ctx, encoder, &flash, plan.flash, (q, k, v), out, m, None)?;
        let projected = op.record_output_projection(
            ctx,
            encoder,
            plan,
            (rows, dims.d_v),
            &context,
            weights.as_ref(),
        )?;
        Ok((qkv, context, stats, projected))
    };
    let fallback = (dims, &flash, call.mods.is_some());
    let (qkv, context, stats, projected) =
        op.with_storage_fallback(ctx, fallback, &mut plan, attempt)?;
    let mut context_shape = dims.context_shape();
    if let Some(last) = context_shape.last_mut() {
        *last = dims.d_v;
    }
    let saved = LayerSaved {
        ctx_id: ctx.id(),
        op: *op,
        dims: *dims,
        x_shape: x.shape().to_vec(),
        out_shape: dims.context_shape(),
        flash,
        x,
        weights,
        qkv,
        context: wrap(context, context_shape),
        stats,
        kernels: BackwardKernels::choose(ctx, plan.flash, &flash, mask_buf.as_ref()),
        mask: mask_buf,
        version: None,
    };
    Ok((projected.map(|(y, _)| y), saved))
}

/// What a saved forward starts from: X on the device, the weights (if projected) and the
/// mask's buffer.
pub(super) struct SavedParts {
    pub x: Tensor,
    pub weights: Option<DeviceWeights>,
    pub mask: Option<MaskBuffer>,
}

/// A projection's gradients on the device: its name, dW and db, and W's shape.
type NamedGrads = (&'static str, LinearGrads, (usize, usize));

/// The gradients as the device holds them, before the readback.
/// What a backward read back: every value in order, how many parts dX has, the weights'
/// gradients' names and shapes, and the relative bias table's shape when it has one.
type ReadBack = (Vec<Vec<f32>>, usize, Vec<NamedGrads>, Option<[usize; 2]>);

struct DeviceGrads {
    /// dX, or (without projections) dQ, dK, dV to be summed.
    x: Vec<(Buf, usize)>,
    linear: Vec<NamedGrads>,
    /// A relative bias table's gradient among the modifiers, and its shape.
    table: Option<(Buf, [usize; 2])>,
}

impl LayerSaved {
    /// The gradients of a loss with respect to X and every weight and bias the forward was
    /// given, from `dO = ∂ℓ/∂output` (the output's shape), computed on the device (see
    /// [`LayerGradients`] for shapes and orientation).
    ///
    /// # Errors
    /// "backward without a matching forward" ([`Error::InvalidArgument`] or
    /// [`Error::ShapeMismatch`]) for another context or a `dO` not of the output's shape;
    /// NaN/Inf in `dO`; a result that overflowed; GPU errors.
    pub(crate) fn backward<'a, D: Dimension>(
        &self,
        ctx: &Context,
        d_out: impl AsArray<'a, f32, D>,
    ) -> Result<LayerGradients> {
        let d_out: ArrayView<'a, f32, D> = d_out.into();
        self.check_matching(ctx, d_out.shape())?;
        check_finite("dO", &d_out)?;
        ctx.check_alive()?;
        let rows = self.dims.batch * self.dims.n;
        let values = ctx.scoped(|| {
            let _open = ctx.pool.open();
            let d_y = Buf::unpooled(upload_as(ctx, "dO", d_out.view(), false)?);
            let mut encoder = ctx
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("attention layer backward"),
                });
            let grads = self.record_backward_into(ctx, &mut encoder, rows, &d_y)?;
            let mut pending = Vec::new();
            for (b, len) in &grads.x {
                pending.push(readback::copy_out(ctx, &mut encoder, b, *len));
            }
            for (_, g, (r, c)) in &grads.linear {
                pending.push(readback::copy_out(ctx, &mut encoder, &g.dw, r * c));
                if let Some(db) = &g.db {
                    pending.push(readback::copy_out(ctx, &mut encoder, db, *c));
                }
            }
            // The table's gradient last.
            let table = grads.table.as_ref().map(|(t, shape)| {
                pending.push(readback::copy_out(
                    ctx,
                    &mut encoder,
                    t,
                    shape[0] * shape[1],
                ));
                *shape
            });
            let submission = ctx.queue.submit([encoder.finish()]);
            let values = readback::finish(ctx, submission, pending)?;
            Ok((values, grads.x.len(), grads.linear, table))
        })?;
        self.assemble(values)
    }

    /// "backward without a matching forward" for another context, a `dO` of another shape
    /// than the output's, or a layer whose weights changed since the forward.
    fn check_matching(&self, ctx: &Context, d_out: &[usize]) -> Result<()> {
        if ctx.id() != self.ctx_id {
            return Err(Error::invalid(
                "backward",
                "backward without a matching forward: this LayerSaved was made on another \
                 Context; run the saved forward on the Context the backward runs on",
            ));
        }
        if d_out != self.out_shape.as_slice() {
            return Err(Error::shape(format!(
                "backward without a matching forward: dO has shape {:?}, the forward's output \
                 has {:?}",
                d_out, self.out_shape
            )));
        }
        if let Some((now, then)) = &self.version {
            if now.load(Ordering::Acquire) != *then {
                return Err(Error::invalid(
                    "backward",
                    "backward without a matching forward: the layer's weights were updated \
                     after this forward; run the saved forward again",
                ));
            }
        }
        Ok(())
    }

    /// Tags the state with the version of `layer`'s weights its forward read, if a layer's.
    pub(super) fn of(mut self, layer: Option<&Layer>) -> Self {
        if let Some(version) = layer.map(Layer::version) {
            self.version = Some((Arc::clone(version), version.load(Ordering::Acquire)));
        }
        self
    }

    /// Records the whole backward into `encoder`.
    fn record_backward_into(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        rows: usize,
        d_y: &wgpu::Buffer,
    ) -> Result<DeviceGrads> {
        let f = &self.flash;
        let f16 = self.op.f16();
        let dims = &self.dims;
        let x = self.x.buffer(ctx, "X")?;
        let x_f16 = self.x.dtype() == Dtype::F16;
        let context = self.context.buffer(ctx, "context")?;
        let mut linear = Vec::new();
        // W_O: dW_O = Cᵀ·dY, db_O, and dC = dY·W_Oᵀ.
        let o = self.weights.as_ref().and_then(|w| w.o.as_ref());
        let d_c_buf;
        let d_c: &wgpu::Buffer = match o {
            Some(o) => {
                d_c_buf = buffer::output(ctx, "dC", rows * dims.d_v, false)?;
                let into = InputGrad {
                    buffer: &d_c_buf,
                    accumulate: false,
                };
                let g =
                    o.record_backward(ctx, encoder, rows, (context, false), d_y, Some(into), f16)?;
                linear.push(("W_O", g, (o.rows, o.cols)));
                &d_c_buf
            }
            None => d_y,
        };
        // The fused attention backward: D = rowsum(dC ∘ C), then dK, dV, then dQ.
        let (dk_kv, dv_kv) = (f.dk_h * f.heads / f.kv_ratio, f.dv_h * f.heads / f.kv_ratio);
        let dq = buffer::output(ctx, "dQ", rows * dims.d_k, false)?;
        let dk = buffer::output(ctx, "dK", rows * dk_kv, false)?;
        let dv = buffer::output(ctx, "dV", rows * dv_kv, false)?;
        let (q, k, v) = match &self.qkv {
            Some([q, k, v]) => (&**q, &**k, &**v),
            None => (x, x, x),
        };
        let mask = self.mask.as_ref().map(MaskBuffer::arg);
        let saved = (d_c, context, &*self.stats);
        let out = (&*dq, &*dk, &*dv);
        self.kernels
            .record(ctx, encoder, f, (q, k, v), saved, out, mask)?;
        let table = record_table_grad(
            ctx,
            encoder,
            f,
            ([q, k, v], d_c, &self.stats),
            self.mask.as_ref(),
        )?;
        let Some(w) = &self.weights else {
            // Q = K = V = X: dX is the sum of the three, added up after the readback.
            return Ok(DeviceGrads {
                x: vec![
                    (dq, rows * dims.d_k),
                    (dk, rows * dk_kv),
                    (dv, rows * dv_kv),
                ],
                linear,
                table,
            });
        };
        // The projections: dW = Xᵀ·dG, db, and dX = Σ dG·Wᵀ summed in place.
        let dx = buffer::output(ctx, "dX", rows * dims.d, false)?;
        let parts = [("W_Q", &w.q, &dq), ("W_K", &w.k, &dk), ("W_V", &w.v, &dv)];
        for (i, (name, lin, d_g)) in parts.into_iter().enumerate() {
            let into = InputGrad {
                buffer: &dx,
                accumulate: i > 0,
            };
            let g = lin.record_backward(ctx, encoder, rows, (x, x_f16), d_g, Some(into), f16)?;
            linear.push((name, g, (lin.rows, lin.cols)));
        }
        Ok(DeviceGrads {
            x: vec![(dx, rows * dims.d)],
            linear,
            table,
        })
    }

    /// The read-back values as [`LayerGradients`], checked for overflow.
    fn assemble(&self, (values, x_parts, linear, table): ReadBack) -> Result<LayerGradients> {
        let mut values = values.into_iter();
        let mut next = |what: &str| -> Result<Vec<f32>> {
            let v = values.next().unwrap_or_default();
            crate::values::check_overflow(what, self.op.dtype, &v)?;
            Ok(v)
        };
        let shape_err = |e: ndarray::ShapeError| Error::shape(e.to_string());
        let mut dx = next("gradient dX")?;
        for _ in 1..x_parts {
            for (a, b) in dx.iter_mut().zip(next("gradient dX")?) {
                *a += b;
            }
        }
        let mut g = LayerGradients {
            x: ArrayD::from_shape_vec(IxDyn(&self.x_shape), dx).map_err(shape_err)?,
            w_q: None,
            w_k: None,
            w_v: None,
            b_q: None,
            b_k: None,
            b_v: None,
            w_o: None,
            b_o: None,
            relative_bias: None,
        };
        for (name, lin, (r, c)) in linear {
            let w = Array2::from_shape_vec((r, c), next(name)?).map_err(shape_err)?;
            let b = match lin.db {
                Some(_) => Some(Array1::from_vec(next(name)?)),
                None => None,
            };
            let (wf, bf) = match name {
                "W_Q" => (&mut g.w_q, &mut g.b_q),
                "W_K" => (&mut g.w_k, &mut g.b_k),
                "W_V" => (&mut g.w_v, &mut g.b_v),
                _ => (&mut g.w_o, &mut g.b_o),
            };
            *wf = Some(w);
            *bf = b;
        }
        if let Some(shape) = table {
            let values = next("gradient of the relative bias table")?;
            g.relative_bias = Some(Array2::from_shape_vec(shape, values).map_err(shape_err)?);
        }
        Ok(g)
    }
}
