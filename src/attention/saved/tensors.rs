//! [`Attention::sdpa_saved`] and [`SdpaSaved::backward`] on [`Tensor`]s in the rows layout the
//! kernels read (as [`Attention::record`] takes them in `Inputs::qkv`): the output, the saved
//! state and the gradients stay on the device, and both can be recorded into one
//! [`Recorder`]. [`Attention::record`] with [`Attention::save_for_backward`] on comes here,
//! and [`crate::Saved::backward`] on a tensor `dO` and [`crate::Saved::record_backward`].

use super::{BackwardKernels, SdpaSaved};
use crate::attention::split::fits;
use crate::attention::upload::MaskBuffer;
use crate::attention::{Attention, Dtype, TensorOutput};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::gpu::buffer;
use crate::kernels::flash_tiled::FlashOut;
use crate::mask::Mask;
use crate::tensor::{Recorder, Tensor};
use crate::variant;

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

/// `(batch, rows, heads, width)` as `(batch, heads, rows, width)`.
fn heads_first(t: &Tensor, name: &str) -> Result<[usize; 4]> {
    match *t.shape() {
        [b, l, h, e] => Ok([b, h, l, e]),
        ref s => Err(Error::shape(format!(
            "{name} must be (batch, rows, heads, width) on the device, got {s:?}"
        ))),
    }
}

impl Attention {
    /// [`Attention::sdpa_saved`] on tensors (`q` `(batch, L, heads, E)`, `k`
    /// `(batch, S, kv_heads, E)`, `v` `(batch, S, kv_heads, E_v)`, of the op's dtype),
    /// recorded into `rec`: the output `(batch, L, heads, E_v)` is a tensor of `rec`, and
    /// the [`SdpaSaved`] can record its backward into `rec` too ([`SdpaSaved::record_backward`]).
    ///
    /// # Errors
    /// As [`Attention::sdpa_saved`] (NaN/Inf are not scanned for: a tensor was checked when
    /// it was made), and tensors of another context, of another dtype than the op's, or not
    /// yet written.
    pub(crate) fn sdpa_record_saved(
        &self,
        rec: &mut Recorder<'_>,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: &Mask<'_>,
    ) -> Result<(TensorOutput, SdpaSaved)> {
        let ctx = rec.ctx;
        let op = self.return_weights(false).propagate_non_finite(false);
        let (qs, ks, vs) = (
            heads_first(q, "Q")?,
            heads_first(k, "K")?,
            heads_first(v, "V")?,
        );
        let dims = op.sdpa_dims(&qs, &ks, &vs)?;
        let mut buffers = Vec::with_capacity(3);
        for (t, name) in [(q, "Q"), (k, "K"), (v, "V")] {
            op.check_tensor_dtype(t, name)?;
            buffers.push(t.input(rec, name)?.clone());
        }
        if op.f16() {
            ctx.require_f16()?;
        }
        ctx.check_alive()?;
        let [batch, heads, l, _] = qs;
        let (kv_heads, s_len, e_v) = (ks[1], ks[2], vs[3]);
        // The backward takes the modifiers back through their derivatives: refused here,
        // before any work, when one has none.
        if let Some(m) = mask.modifiers() {
            m.check_differentiable()?;
        }
        let bias = mask.bias([batch, heads, l, s_len])?;
        let bias = bias.as_ref().map(|b| b.view());
        let rows = batch * heads * l;
        let named = [
            ("context (batch·heads·L·E_v)", rows * e_v),
            ("row statistics (2·batch·heads·L)", 2 * rows),
        ];
        fits(ctx, &named, None, bias.as_ref())?;
        let flash = op.saved_flash(&dims, [batch, heads, kv_heads, l, s_len], false)?;
        let mask_buf = ctx.scoped(|| MaskBuffer::upload(ctx, bias.as_ref(), mask.modifiers()))?;
        let o = buffer::output(ctx, "context", rows * e_v, op.nan_fill)?;
        let stats = buffer::output(ctx, "row statistics", 2 * rows, op.nan_fill)?;
        let record = |rec: &mut Recorder<'_>, plan: &crate::attention::plan::Plan| {
            ctx.scoped(|| {
                let out = FlashOut {
                    context: &o,
                    lse: Some(&stats),
                };
                let m = mask_buf.as_ref().map(MaskBuffer::arg);
                let (q, k, v) = (&buffers[0], &buffers[1], &buffers[2]);
                variant::record_flash(
                    ctx,
                    rec.encoder(),
                    &flash,
                    plan.flash,
                    (q, k, v),
                    out,
                    m,
                    None,
                )
            })
        };
        let mods = mask.modifiers().is_some();
        let mut plan = op.resolved(ctx, op.plan(ctx, &dims)?, &flash, mods)?;
        let result = record(rec, &plan);
        if op.retries_on_storage(&plan, &result) {
            // As a plain call: past the textures' limit the storage kernels take it (what
            // was recorded before the check only repeats work).
            plan = op.on_storage(ctx, &plan, &dims, &flash, mods)?;
            record(rec, &plan)?;
        } else {
            result?;
        }
        let wrap = rec.wrapper();
        let o = wrap(o, vec![batch, l, heads, e_v]);
        let [q_buf, k_buf, v_buf]: [wgpu::Buffer; 3] = buffers
            .try_into()
            .map_err(|_| Error::invalid("sdpa", "internal: three inputs"))?;
        let saved = SdpaSaved {
            ctx_id: ctx.id(),
            op,
            flash,
            out_shape: [batch, heads, l, e_v],
            k_shape: [batch, kv_heads, s_len, dims.d_k / heads],
            v_shape: [batch, kv_heads, s_len, e_v],
            qkv: [q_buf, k_buf, v_buf],
            _inputs: Some([q.clone(), k.clone(), v.clone()]),
            _uploads: Vec::new(),
            heads_first: false,
            o: o.clone(),
            stats,
            mask: mask_buf,
            kernels: BackwardKernels::choose(ctx, plan.flash, &flash),
        };
        Ok((TensorOutput::new(o, None), saved))
    }
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
