//! [`SdpaSaved::backward`] on [`Tensor`]s in the rows layout the kernels read (the layout of
//! a saved forward on tensors, `saved::record`): the gradients stay on the device, and can
//! be recorded into the forward's [`Recorder`]. [`crate::Saved::backward`] on a tensor `dO`
//! and [`crate::Saved::record_backward`] come here.

use super::SdpaSaved;
use crate::attention::upload::MaskBuffer;
use crate::attention::Dtype;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::gpu::buffer;
use crate::tensor::{Recorder, Tensor};

/// The gradients of [`SdpaSaved::backward_tensor`], f32 tensors in the rows layout of the
/// forward's tensors: `q` `(batch, L, heads, E)`, `k` `(batch, S, kv_heads, E)`, `v`
/// `(batch, S, kv_heads, E_v)` (a shared K/V head's gradient sums its query heads'). Not
/// checked for overflow (reading them back does not check either: compare with
/// [`SdpaSaved::backward`] when in doubt).
#[derive(Debug, Clone)]
pub(crate) struct SdpaTensorGradients {
    /// `∂ℓ/∂Q`.
    pub q: Tensor,
    /// `∂ℓ/∂K`.
    pub k: Tensor,
    /// `∂ℓ/∂V`.
    pub v: Tensor,
    /// `∂ℓ/∂table` of a relative bias among the modifiers, `(buckets, heads)`.
    pub relative_bias: Option<Tensor>,
}

impl SdpaSaved {
    /// [`SdpaSaved::backward`] on a tensor `d_o` (f32, the output's rows layout
    /// `(batch, L, heads, E_v)`), the gradients left on the device: the same kernels as
    /// [`SdpaSaved::backward`], so the same values bit for bit. Recorded and submitted at once.
    ///
    /// # Errors
    /// As [`SdpaSaved::backward`] (but `d_o` is not scanned for NaN/Inf nor the results for
    /// overflow), an f16 `d_o`, a tensor of another context or not yet written.
    pub(crate) fn backward_tensor(
        &self,
        ctx: &Context,
        d_o: &Tensor,
    ) -> Result<SdpaTensorGradients> {
        let mut rec = Recorder::new(ctx);
        let grads = self.record_backward(&mut rec, d_o)?;
        rec.submit()?;
        Ok(grads)
    }

    /// [`SdpaSaved::backward_tensor`] recorded into `rec` (which may hold the forward, earlier).
    ///
    /// # Errors
    /// As [`SdpaSaved::backward_tensor`].
    pub(crate) fn record_backward(
        &self,
        rec: &mut Recorder<'_>,
        d_o: &Tensor,
    ) -> Result<SdpaTensorGradients> {
        let ctx = rec.ctx;
        if ctx.id() != self.ctx_id {
            return Err(Error::invalid(
                "backward",
                "backward without a matching forward: this SdpaSaved was made on another Context; \
                 run the forward on the Context the backward runs on",
            ));
        }
        let [b, h, l, e_v] = self.out_shape;
        if d_o.shape() != [b, l, h, e_v] {
            return Err(Error::shape(format!(
                "backward without a matching forward: dO has shape {:?}, the forward's output \
                 (batch, L, heads, E_v) has {:?}",
                d_o.shape(),
                [b, l, h, e_v]
            )));
        }
        if d_o.dtype() != Dtype::F32 {
            return Err(Error::invalid(
                "dO",
                "the gradient must be an f32 tensor: make it with Dtype::F32",
            ));
        }
        let d_o_buf = d_o.input(rec, "dO")?;
        let o = self.o.input(rec, "the saved forward")?;
        ctx.check_alive()?;
        let f = &self.flash;
        let [q_len, k_len, v_len] = [
            f.batch * f.heads * f.n_q * f.dk_h,
            self.k_shape.iter().product(),
            self.v_shape.iter().product::<usize>(),
        ];
        let wrap = rec.wrapper();
        let (dq, dk, dv, table) = ctx.scoped(|| {
            let nan = self.op.nan_fill;
            let dq = buffer::output(ctx, "dQ", q_len, nan)?;
            let dk = buffer::output(ctx, "dK", k_len, nan)?;
            let dv = buffer::output(ctx, "dV", v_len, nan)?;
            let [q, k, v] = &self.qkv;
            let mask = self.mask.as_ref().map(MaskBuffer::arg);
            self.kernels.record(
                ctx,
                rec.encoder(),
                f,
                (q, k, v),
                (d_o_buf, o, &*self.stats),
                (&dq, &dk, &dv),
                mask,
            )?;
            let table = self.record_table_grad(ctx, rec.encoder(), d_o_buf)?;
            Ok((dq, dk, dv, table))
        })?;
        let rows = |[b, h, n, e]: [usize; 4]| vec![b, n, h, e];
        Ok(SdpaTensorGradients {
            q: wrap(dq, vec![b, l, h, f.dk_h]),
            k: wrap(dk, rows(self.k_shape)),
            v: wrap(dv, rows(self.v_shape)),
            relative_bias: table.map(|(t, shape)| wrap(t, shape.to_vec())),
        })
    }
}
