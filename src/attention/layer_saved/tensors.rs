//! The saved forward and the backward of a layer on [`Tensor`]s: X goes in as a tensor, the
//! output and every gradient come out as tensors on the device, and nothing is read back.
//! Both can be recorded into one [`Recorder`] with the rest of a training step (a loss, an
//! optimiser's update: see [`crate::Adam`]) and submitted together. A call on a tensor X
//! with [`crate::Attention::save_for_backward`] on ([`Call::record`]) comes here, and [`crate::Saved::backward`] on a tensor `dO` and [`crate::Saved::record_backward`].

use super::{record_into, DeviceGrads, LayerSaved, SavedParts};
use crate::attention::call::Call;
use crate::attention::upload::MaskBuffer;
use crate::attention::{Dtype, Layer, TensorOutput};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::add;
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

/// The saved forward of a checked call on a tensor X (`(n, d)` or `(batch, n, d)`), projected
/// by `layer`'s weights when given, else Q = K = V = X, recorded into `rec`: the output is a
/// tensor of `rec`, and the [`LayerSaved`] can record its backward into `rec` too
/// ([`LayerSaved::record_backward`]).
///
/// # Errors
/// A tensor from a recorder not submitted yet; GPU errors.
pub(in crate::attention) fn record(
    rec: &mut Recorder<'_>,
    call: &Call<'_, '_, '_>,
    x: &Tensor,
    layer: Option<&Layer>,
) -> Result<(TensorOutput, LayerSaved)> {
    let ctx = rec.ctx;
    x.input(rec, "X")?;
    let (bias, mods) = call.masking();
    let wrap = rec.wrapper();
    let (projected, saved) = ctx.scoped(|| {
        let parts = SavedParts {
            x: x.clone(),
            weights: layer.map(|l| l.device().clone()),
            mask: MaskBuffer::upload(ctx, bias.as_ref(), mods)?,
        };
        record_into(ctx, rec.encoder(), call, parts, &wrap)
    })?;
    let saved = saved.of(layer);
    let context = match projected {
        Some(y) => wrap(y, saved.out_shape.clone()),
        None => saved.context.clone(),
    };
    Ok((TensorOutput::new(context, None), saved))
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
