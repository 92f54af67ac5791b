//! A checked call on device-resident [`Tensor`]s ([`Call::record`]): the same plan and
//! dispatch sequence as a whole call (`whole.rs`), recorded into a [`Recorder`]'s encoder,
//! with the results left on the device as tensors instead of read back. Never split: a call
//! past the device's limits is an error ([`Call::new`]).

use super::call::Call;
use super::dispatch::Shape;
use super::upload::Source;
use super::weights::Layer;
use super::whole::Recorded;
use super::Dtype;
use crate::error::Result;
use crate::tensor::{Recorder, Tensor};

/// What an operation on tensors returns: tensors on the device.
pub(crate) type TensorOutput = super::Output<Tensor>;

/// Q, K, V tensors in the rows layout, recorded into `rec`.
pub(super) fn record_qkv(
    rec: &mut Recorder<'_>,
    call: &Call<'_, '_, '_>,
    [q, k, v]: [&Tensor; 3],
) -> Result<TensorOutput> {
    let buffers = [q.input(rec, "Q")?, k.input(rec, "K")?, v.input(rec, "V")?];
    let dims = &call.dims;
    let (b, h, l) = (dims.batch, dims.heads, dims.n);
    let shape = Shape::sdpa(dims, [b, h, dims.kv_heads, l, call.n_kv]);
    let out = record(rec, call, shape, &Source::DeviceQkv(buffers))?;
    let e_v = dims.d_v / h;
    Ok(tensors(
        rec,
        call,
        out,
        vec![b, l, h, e_v],
        [b, h, l, call.n_kv],
    ))
}

/// A tensor X, projected by `layer`'s weights (on the device) when given, else
/// Q = K = V = X, recorded into `rec`.
pub(super) fn record_x(
    rec: &mut Recorder<'_>,
    call: &Call<'_, '_, '_>,
    x: &Tensor,
    layer: Option<&Layer>,
) -> Result<TensorOutput> {
    let dims = &call.dims;
    let source = Source::DeviceX {
        x: x.input(rec, "X")?,
        x_f16: x.dtype() == Dtype::F16,
        weights: layer.map(Layer::device),
    };
    let out = record(rec, call, Shape::self_attention(dims), &source)?;
    let weights = [dims.batch, dims.heads, dims.n, dims.n];
    Ok(tensors(rec, call, out, dims.context_shape(), weights))
}

/// Plans and records the call into `rec` (as a whole call does, on the storage kernels past
/// the textures' limit).
fn record(
    rec: &mut Recorder<'_>,
    call: &Call<'_, '_, '_>,
    shape: Shape,
    source: &Source<'_, '_>,
) -> Result<Recorded> {
    let (ctx, op, dims) = (rec.ctx, &call.op, &call.dims);
    let (bias, mods) = call.masking();
    let masking = (bias.as_ref(), mods);
    let (mut plan, flash) = op.whole_plan(ctx, dims, shape, source, masking, None)?;
    let fallback = (dims, &flash, mods.is_some());
    op.with_storage_fallback(ctx, fallback, &mut plan, |plan| {
        ctx.scoped(|| op.record_call(ctx, rec.encoder(), plan, dims, shape, source, masking))
    })
}

/// The recorded buffers as tensors of the given shapes; the weights only when asked for.
fn tensors(
    rec: &Recorder<'_>,
    call: &Call<'_, '_, '_>,
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
            .filter(|_| call.op.return_weights)
            .map(|w| rec.tensor(w, weights.to_vec())),
    }
}
