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
use crate::error::{Error, Result};
use crate::mask::Mask;
use crate::tensor::{Recorder, Tensor};
use crate::variant::Kernels;

/// What an operation on tensors returns: tensors on the device.
pub(crate) type TensorOutput = super::Output<Tensor>;

impl Attention {
    /// Q, K, V tensors in the rows layout, with a mask, recorded into `rec`.
    pub(crate) fn sdpa_record(
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

    /// Records the forward on tensor `x` with a mask, projected by `layer`'s weights (on the
    /// device) when given, else Q = K = V = X.
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
        crate::attention::refuse_modifiers(ctx, mask, "device tensors")?;
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
        self.prepare_pipelines(ctx, &plan, dims, shape, source, (bias.as_ref(), None))?;
        let run = |rec: &mut Recorder<'_>, op: &Attention, plan| {
            ctx.scoped(|| {
                op.record_call(
                    ctx,
                    rec.encoder(),
                    plan,
                    dims,
                    shape,
                    source,
                    (bias.as_ref(), None),
                )
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
            saved: None,
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
    /// The layer's forward on a tensor X with a mask, recorded into `rec`.
    pub(crate) fn record_masked(
        &self,
        rec: &mut Recorder<'_>,
        x: &Tensor,
        mask: &Mask<'_>,
    ) -> Result<TensorOutput> {
        self.check_context(rec.ctx)?;
        self.op().record_forward(rec, x, Some(self), mask)
    }
}
