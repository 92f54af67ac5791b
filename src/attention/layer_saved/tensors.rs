//! The saved forward and the backward of a layer on [`Tensor`]s: X goes in as a tensor, the
//! output and every gradient come out as tensors on the device, and nothing is read back.
//! Both can be recorded into one [`Recorder`] with the rest of a training step (a loss, an
//! optimiser's update: see [`crate::Adam`]) and submitted together. [`Attention::record`] and
//! [`Layer::record`] (and `run` on tensors) with [`Attention::save_for_backward`] on come
//! here, and [`crate::Saved::backward`] on a tensor `dO` and [`crate::Saved::record_backward`].

use super::{DeviceGrads, LayerSaved, SavedParts};
use crate::attention::upload::MaskBuffer;
use crate::attention::{Attention, Dtype, Layer, TensorOutput};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::add;
use crate::mask::Mask;
use crate::tensor::{Recorder, Tensor};

/// The gradients of [`LayerSaved::backward_tensor`]: [`LayerGradients`]' fields as f32
/// tensors on the device, of the same shapes (X's, `(d, d_k)`, `(d_k,)`, …), `Some` exactly
/// where [`LayerGradients`] has them. They become a [`crate::Gradients<Tensor>`], whose
/// [`crate::Gradients::to_arrays`] reads them back.
///
/// [`LayerGradients`]: crate::attention::LayerGradients
///
/// Unlike [`LayerSaved::backward`], the values are not checked for overflow (reading them
/// back checks).
#[derive(Debug, Clone)]
pub(crate) struct TensorGradients {
    /// `∂ℓ/∂X`.
    pub x: Tensor,
    /// `∂ℓ/∂W_Q`.
    pub w_q: Option<Tensor>,
    /// `∂ℓ/∂W_K`.
    pub w_k: Option<Tensor>,
    /// `∂ℓ/∂W_V`.
    pub w_v: Option<Tensor>,
    /// `∂ℓ/∂b_Q`.
    pub b_q: Option<Tensor>,
    /// `∂ℓ/∂b_K`.
    pub b_k: Option<Tensor>,
    /// `∂ℓ/∂b_V`.
    pub b_v: Option<Tensor>,
    /// `∂ℓ/∂W_O`.
    pub w_o: Option<Tensor>,
    /// `∂ℓ/∂b_O`.
    pub b_o: Option<Tensor>,
    /// `∂ℓ/∂table` of a relative bias among the modifiers, `(buckets, heads)`.
    pub relative_bias: Option<Tensor>,
}

impl Attention {
    /// [`Attention::forward_saved`] on a tensor `x` (`(n, d)` or `(batch, n, d)`, of the
    /// op's dtype), recorded into `rec`, projected by `layer`'s weights when given, else
    /// Q = K = V = X: the output is a tensor of `rec`, and the [`LayerSaved`] can record its
    /// backward into `rec` too ([`LayerSaved::record_backward`]). Publicly: [`Attention::record`]
    /// and [`Layer::record`] with the op saving for the backward.
    ///
    /// # Errors
    /// As [`Attention::forward_saved`], and a tensor of another context, of another dtype
    /// than the op's, or not yet written.
    pub(crate) fn record_saved(
        &self,
        rec: &mut Recorder<'_>,
        x: &Tensor,
        layer: Option<&Layer>,
        mask: &Mask<'_>,
    ) -> Result<(TensorOutput, LayerSaved)> {
        let ctx = rec.ctx;
        let op = self.return_weights(false).propagate_non_finite(false);
        let proj = layer.map(Layer::projections);
        let dims = op.dims(x.shape(), proj.as_ref())?;
        if layer.is_none() {
            op.check_tensor_dtype(x, "X")?;
        } else if x.dtype() == Dtype::F16 || op.f16() {
            ctx.require_f16()?;
        }
        x.input(rec, "X")?;
        ctx.check_alive()?;
        if let Some(m) = mask.modifiers() {
            m.check_differentiable()?;
        }
        let bias = mask.bias([dims.batch, dims.heads, dims.n, dims.n])?;
        let bias = bias.as_ref().map(|b| b.view());
        op.check_saved_fits(ctx, &dims, bias.as_ref())?;
        let wrap = rec.wrapper();
        let (projected, saved) = ctx.scoped(|| {
            let parts = SavedParts {
                x: x.clone(),
                weights: layer.map(|l| l.device().clone()),
                mask: MaskBuffer::upload(ctx, bias.as_ref(), mask.modifiers())?,
            };
            op.record_saved_into(ctx, rec.encoder(), &dims, parts, &wrap)
        })?;
        let saved = match layer {
            Some(l) => saved.of_version(l.version()),
            None => saved,
        };
        let context = match projected {
            Some(y) => wrap(y, saved.out_shape.clone()),
            None => saved.context.clone(),
        };
        Ok((TensorOutput::new(context, None), saved))
    }
}

impl Layer {
    /// The saved forward of the layer on a tensor X, recorded into `rec`.
    pub(crate) fn record_saved(
        &self,
        rec: &mut Recorder<'_>,
        x: &Tensor,
        mask: &Mask<'_>,
    ) -> Result<(TensorOutput, LayerSaved)> {
        self.check_context(rec.ctx)?;
        self.op().record_saved(rec, x, Some(self), mask)
    }
}

impl LayerSaved {
    /// [`LayerSaved::backward`] on a tensor `d_out` (f32, the output's shape): every gradient
    /// is left on the device as a tensor ([`TensorGradients`]); nothing is uploaded or read
    /// back. The same kernels in the same order as [`LayerSaved::backward`], so the values
    /// are its values bit for bit. Recorded and submitted at once;
    /// [`LayerSaved::record_backward`] records it into a [`Recorder`].
    ///
    /// # Errors
    /// As [`LayerSaved::backward`] (but `d_out` is not scanned for NaN/Inf, and the results
    /// are not checked for overflow), an f16 `d_out`, a tensor of another context or not yet
    /// written.
    pub(crate) fn backward_tensor(&self, ctx: &Context, d_out: &Tensor) -> Result<TensorGradients> {
        let mut rec = Recorder::new(ctx);
        let grads = self.record_backward(&mut rec, d_out)?;
        rec.submit()?;
        Ok(grads)
    }

    /// [`LayerSaved::backward_tensor`] recorded into `rec` (which may hold the forward
    /// itself, earlier).
    ///
    /// # Errors
    /// As [`LayerSaved::backward_tensor`].
    pub(crate) fn record_backward(
        &self,
        rec: &mut Recorder<'_>,
        d_out: &Tensor,
    ) -> Result<TensorGradients> {
        let ctx = rec.ctx;
        self.check_matching(ctx, d_out.shape())?;
        if d_out.dtype() != Dtype::F32 {
            return Err(Error::invalid(
                "dO",
                format!(
                    "the gradient must be an f32 tensor, got {}: make it with Dtype::F32",
                    d_out.dtype()
                ),
            ));
        }
        let d_y = d_out.input(rec, "dO")?;
        self.context.input(rec, "the saved forward")?;
        ctx.check_alive()?;
        let rows = self.dims.batch * self.dims.n;
        let wrap = rec.wrapper();
        let grads = ctx.scoped(|| {
            let encoder = rec.encoder();
            let DeviceGrads { x, linear, table } =
                self.record_backward_into(ctx, encoder, rows, d_y)?;
            let mut x = x.into_iter();
            let Some((dx, len)) = x.next() else {
                return Err(Error::invalid("backward", "internal: no dX"));
            };
            // Without projections, dX = dQ + dK + dV, added in the host backward's order.
            for (part, _) in x {
                add::dispatch(ctx, encoder, len, &part, &dx)?;
            }
            Ok((dx, linear, table))
        })?;
        let (dx, linear, table) = grads;
        let mut g = TensorGradients {
            x: wrap(dx, self.x_shape.clone()),
            w_q: None,
            w_k: None,
            w_v: None,
            b_q: None,
            b_k: None,
            b_v: None,
            w_o: None,
            b_o: None,
            relative_bias: table.map(|(t, shape)| wrap(t, shape.to_vec())),
        };
        for (name, lin, (r, c)) in linear {
            let (wf, bf) = match name {
                "W_Q" => (&mut g.w_q, &mut g.b_q),
                "W_K" => (&mut g.w_k, &mut g.b_k),
                "W_V" => (&mut g.w_v, &mut g.b_v),
                _ => (&mut g.w_o, &mut g.b_o),
            };
            *wf = Some(wrap(lin.dw, vec![r, c]));
            *bf = lin.db.map(|db| wrap(db, vec![c]));
        }
        Ok(g)
    }
}
