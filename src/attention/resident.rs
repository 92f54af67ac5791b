//! The op on device-resident [`Tensor`]s: the same plan and dispatch sequence as a whole
//! call (`whole.rs`), recorded into a [`Recorder`]'s encoder, with the results left on the
//! device as tensors instead of read back.

use super::dispatch::Shape;
use super::shape::Dims;
use super::split::fits;
use super::upload::Source;
use super::weights::Layer;
use super::whole::Recorded;
use super::{Attention, Dtype};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::mask::Mask;
use crate::tensor::{Recorder, Tensor};
use crate::variant::Kernels;

/// What an operation on tensors returns: tensors on the device, read back only when asked.
#[derive(Debug, Clone)]
pub struct TensorOutput {
    /// The context vectors (f32): `(n, d_out)` or `(batch, n, d_out)` for a layer,
    /// `(batch, L, heads, E_v)` for [`Attention::sdpa_tensor`].
    pub context: Tensor,
    /// The attention weights `(batch, heads, n_q, n_kv)` (f32), unless the op does not
    /// return them.
    pub weights: Option<Tensor>,
}

impl Attention {
    /// [`Attention::sdpa`] on tensors in the rows layout the kernels read, FlashAttention's:
    /// `q` is `(batch, L, heads, E)`, `k` is `(batch, S, kv_heads, E)`, `v` is
    /// `(batch, S, kv_heads, E_v)` (PyTorch's layout with the heads and rows axes swapped;
    /// GQA when `kv_heads < heads`). The context comes back as `(batch, L, heads, E_v)`, so it
    /// reshapes to `(batch, L, heads·E_v)` for free. Recorded and submitted at once.
    ///
    /// Unlike the array API, a call past the device's limits is an error, not split, and the
    /// results are not checked for overflow (read them back to check).
    ///
    /// # Errors
    /// As [`Attention::sdpa`], and tensors of another context, of a dtype other than the
    /// op's, or not yet written.
    pub fn sdpa_tensor(
        &self,
        ctx: &Context,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<TensorOutput> {
        let mut rec = Recorder::new(ctx);
        let out = self.sdpa_record(&mut rec, q, k, v, &Mask::none())?;
        rec.submit()?;
        Ok(out)
    }

    /// [`Attention::sdpa_tensor`] with a mask (as [`Attention::sdpa_masked`] takes it),
    /// recorded into `rec`.
    ///
    /// # Errors
    /// As [`Attention::sdpa_tensor`], and the mask's errors.
    pub fn sdpa_record(
        &self,
        rec: &mut Recorder<'_>,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: &Mask<'_>,
    ) -> Result<TensorOutput> {
        let heads_first = |t: &Tensor, name: &str| match *t.shape() {
            [b, l, h, e] => Ok([b, h, l, e]),
            ref s => Err(Error::shape(format!(
                "{name} must be (batch, rows, heads, width) on the device, got {s:?}"
            ))),
        };
        let (qs, ks, vs) = (
            heads_first(q, "Q")?,
            heads_first(k, "K")?,
            heads_first(v, "V")?,
        );
        let dims = self.sdpa_dims(&qs, &ks, &vs)?;
        for (t, name) in [(q, "Q"), (k, "K"), (v, "V")] {
            self.check_tensor_dtype(t, name)?;
        }
        let buffers = [q.input(rec, "Q")?, k.input(rec, "K")?, v.input(rec, "V")?];
        let [b, h, l, _] = qs;
        let shape = Shape::sdpa(&dims, [b, h, ks[1], l, ks[2]]);
        let out = self.record_resident(rec, &dims, shape, &Source::DeviceQkv(buffers), mask)?;
        let e_v = vs[3];
        Ok(self.tensors(rec, out, vec![b, l, h, e_v], [b, h, l, ks[2]]))
    }

    /// [`Attention::forward`] without projections (Q = K = V = X) on a tensor `x`,
    /// `(n, d)` or `(batch, n, d)` of the op's dtype; recorded and submitted at once. For
    /// projections, build a [`Layer`] and call [`Layer::forward_tensor`].
    ///
    /// # Errors
    /// As [`Attention::sdpa_tensor`].
    pub fn forward_tensor(&self, ctx: &Context, x: &Tensor) -> Result<TensorOutput> {
        let mut rec = Recorder::new(ctx);
        let out = self.forward_record(&mut rec, x, &Mask::none())?;
        rec.submit()?;
        Ok(out)
    }

    /// [`Attention::forward_tensor`] with a mask, recorded into `rec`.
    ///
    /// # Errors
    /// As [`Attention::forward_tensor`], and the mask's errors.
    pub fn forward_record(
        &self,
        rec: &mut Recorder<'_>,
        x: &Tensor,
        mask: &Mask<'_>,
    ) -> Result<TensorOutput> {
        self.record_forward(rec, x, None, mask)
    }

    /// Records `forward` on tensor `x` with the projections on the device, if any.
    pub(super) fn record_forward(
        &self,
        rec: &mut Recorder<'_>,
        x: &Tensor,
        layer: Option<&Layer>,
        mask: &Mask<'_>,
    ) -> Result<TensorOutput> {
        let proj = layer.map(Layer::projections);
        let dims = self.dims(x.shape(), proj.as_ref())?;
        // Without projections the kernels read X as Q, K and V, in the op's type; a matmul
        // reads either type.
        if layer.is_none() {
            self.check_tensor_dtype(x, "X")?;
        } else if x.dtype() == Dtype::F16 || self.f16() {
            rec.ctx.require_f16()?;
        }
        let source = Source::DeviceX {
            x: x.input(rec, "X")?,
            x_f16: x.dtype() == Dtype::F16,
            weights: layer.map(Layer::device),
        };
        let shape = Shape::self_attention(&dims);
        let out = self.record_resident(rec, &dims, shape, &source, mask)?;
        let weights = [dims.batch, dims.heads, dims.n, dims.n];
        let context = dims.context_shape();
        Ok(self.tensors(rec, out, context, weights))
    }

    /// Plans and records one call into `rec` (whole: a call past the device's limits is an
    /// error here).
    fn record_resident(
        &self,
        rec: &mut Recorder<'_>,
        dims: &Dims,
        shape: Shape,
        source: &Source<'_, '_>,
        mask: &Mask<'_>,
    ) -> Result<Recorded> {
        let ctx = rec.ctx;
        ctx.check_alive()?;
        let bias = mask.bias([shape.batch, shape.heads, shape.n_q, shape.n_kv])?;
        let bias = bias.as_ref().map(|b| b.view());
        let rows = shape.batch * shape.n_q;
        let named = [
            ("Q, K (batch·n·d_k)", rows * dims.d_k),
            ("V, context (batch·n·d_v)", rows * dims.d_v),
            ("output (batch·n·d_out)", rows * dims.d_out),
        ];
        let weights = self
            .return_weights
            .then_some(shape.batch * shape.heads * shape.n_q * shape.n_kv);
        fits(ctx, &named, weights, bias.as_ref())?;
        let plan = self.plan(ctx, dims)?;
        self.prepare_pipelines(ctx, &plan, dims, shape, source, bias.as_ref())?;
        let run = |rec: &mut Recorder<'_>, op: &Attention, plan| {
            ctx.scoped(|| {
                op.record_call(ctx, rec.encoder(), plan, dims, shape, source, bias.as_ref())
            })
        };
        let result = run(rec, self, &plan);
        if self.retries_on_storage(&plan, &result) {
            // As a whole call does (what was recorded before the check only repeats work).
            let op = self.kernels(Kernels::Storage);
            let plan = op.plan(ctx, dims)?;
            return run(rec, &op, &plan);
        }
        result
    }

    /// The recorded buffers as tensors of the given shapes; the weights only when asked for.
    fn tensors(
        &self,
        rec: &Recorder<'_>,
        out: Recorded,
        context: Vec<usize>,
        weights: [usize; 4],
    ) -> TensorOutput {
        let Recorded {
            output, weights: w, ..
        } = out;
        TensorOutput {
            context: rec.tensor(output, context),
            weights: w
                .filter(|_| self.return_weights)
                .map(|w| rec.tensor(w, weights.to_vec())),
        }
    }

    pub(super) fn check_tensor_dtype(&self, t: &Tensor, name: &str) -> Result<()> {
        if t.dtype() != self.dtype {
            return Err(Error::invalid(
                name,
                format!(
                    "the tensor is {} but the op's dtype is {}: make it with that dtype",
                    t.dtype(),
                    self.dtype
                ),
            ));
        }
        Ok(())
    }
}

impl Layer {
    /// [`Layer::forward`] on a tensor `x` (`(n, d)` or `(batch, n, d)`, f32 or f16), the
    /// result left on the device: nothing is uploaded but nothing read back. Recorded and
    /// submitted at once; see [`Layer::record`] to chain layers in one submit.
    ///
    /// # Errors
    /// As [`Layer::forward`] and [`Attention::sdpa_tensor`].
    pub fn forward_tensor(&self, ctx: &Context, x: &Tensor) -> Result<TensorOutput> {
        let mut rec = Recorder::new(ctx);
        let out = self.record(&mut rec, x)?;
        rec.submit()?;
        Ok(out)
    }

    /// Records [`Layer::forward_tensor`] into `rec`: its output can feed the next layer
    /// recorded into the same `rec`, all submitted together.
    ///
    /// # Errors
    /// As [`Layer::forward_tensor`].
    pub fn record(&self, rec: &mut Recorder<'_>, x: &Tensor) -> Result<TensorOutput> {
        self.record_masked(rec, x, &Mask::none())
    }

    /// [`Layer::record`] with a mask.
    ///
    /// # Errors
    /// As [`Layer::record`], and the mask's errors.
    pub fn record_masked(
        &self,
        rec: &mut Recorder<'_>,
        x: &Tensor,
        mask: &Mask<'_>,
    ) -> Result<TensorOutput> {
        self.check_context(rec.ctx)?;
        self.op().record_forward(rec, x, Some(self), mask)
    }
}
