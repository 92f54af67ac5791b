//! A call as a value: built once from the op, the context and the inputs ([`Call::new`]),
//! checked once — the shapes, the tensors' dtype and context, the mask, f16 on the device,
//! the device's limits, and the values it has at hand (the weights; X too for a saved
//! forward; the operands' values on their way to the device when the call runs whole, here
//! when it splits, so that an error names the caller's index) — and holding its sizes, its
//! operands and its mask. Saving for the backward is a mode of the call (the op's
//! [`Attention::save_for_backward`]), not another path.
//!
//! Then one step for each kind of operand: [`Call::run`] runs a call on arrays whole
//! (`whole.rs`: plan → upload → dispatch → readback), split (`split.rs`), or saved
//! (`saved.rs` on Q, K, V, `layer_saved.rs` on X); [`Call::record`] records a call on
//! tensors into a [`Recorder`] (`resident.rs`, or saved as above), with nothing checked
//! again.

use ndarray::{Array4, ArrayView4, ArrayViewD, CowArray, IxDyn};

use super::plan::Plan;
use super::projections::Projections;
use super::shape::{named_inputs, Dims};
use super::split::call_fits;
use super::upload::Source;
use super::weights::Layer;
use super::{check_finite, layer_saved, resident, saved, Attention, Dtype, Output};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::gpu::upload::Values;
use crate::mask::Mask;
use crate::modifiers::Modifiers;
use crate::tensor::{Recorder, Tensor};

/// What a call is given.
pub(super) enum Given<'a, 'p> {
    /// X `(n, d)` or `(batch, n, d)` and its projections if any; with a layer, they are the
    /// layer's, on the device already (checked when it was built).
    X {
        x: ArrayViewD<'a, f32>,
        proj: Option<&'a Projections<'p>>,
        layer: Option<&'a Layer>,
    },
    /// Q, K and V in PyTorch's layout, as arrays or opened files.
    Qkv([Values<'a>; 3]),
    /// A tensor X, projected by a layer's weights when given.
    TensorX {
        x: &'a Tensor,
        layer: Option<&'a Layer>,
    },
    /// Q, K and V tensors in the rows layout, `(batch, rows, heads, width)`.
    TensorQkv([&'a Tensor; 3]),
}

impl Given<'_, '_> {
    /// The layer whose weights project X, if any.
    fn layer(&self) -> Option<&Layer> {
        match self {
            Given::X { layer, .. } | Given::TensorX { layer, .. } => *layer,
            Given::Qkv(_) | Given::TensorQkv(_) => None,
        }
    }

    /// Whether the operands are tensors (the call is recorded, never split).
    pub(super) fn on_device(&self) -> bool {
        matches!(self, Given::TensorX { .. } | Given::TensorQkv(_))
    }

    /// The sizes of `op` on these operands, checked.
    fn dims(&self, op: &Attention) -> Result<Dims> {
        match self {
            Given::X { x, proj, .. } => op.dims(x.shape(), *proj),
            Given::Qkv([q, k, v]) => op.sdpa_dims(q.shape(), k.shape(), v.shape()),
            Given::TensorX { x, layer } => {
                let proj = layer.map(Layer::projections);
                op.dims(x.shape(), proj.as_ref())
            }
            Given::TensorQkv(qkv) => {
                let [q, k, v] = [(qkv[0], "Q"), (qkv[1], "K"), (qkv[2], "V")]
                    .map(|(t, name)| heads_first(t.shape(), name));
                op.sdpa_dims(&q?, &k?, &v?)
            }
        }
    }

    /// Keys per query row.
    pub(super) fn n_kv(&self, dims: &Dims) -> usize {
        match self {
            Given::X { .. } | Given::TensorX { .. } => dims.n,
            Given::Qkv([_, k, _]) => k.shape()[2],
            Given::TensorQkv([_, k, _]) => k.shape()[1],
        }
    }

    /// A layer and tensors of `ctx`, the tensors in the type the kernels read: the op's for
    /// Q, K, V and for X read as they are; either for X under a layer's projections (a matmul
    /// reads both).
    fn check_device(&self, ctx: &Context, op: &Attention) -> Result<()> {
        if let Some(layer) = self.layer() {
            layer.check_context(ctx)?;
        }
        let of_op = |t: &Tensor, name: &str| {
            t.buffer(ctx, name)?;
            check_tensor_dtype(op, t, name)
        };
        match self {
            Given::TensorQkv([q, k, v]) => {
                of_op(q, "Q")?;
                of_op(k, "K")?;
                of_op(v, "V")
            }
            Given::TensorX { x, layer: None } => of_op(x, "X"),
            Given::TensorX { x, layer: Some(_) } => {
                x.buffer(ctx, "X")?;
                match x.dtype() {
                    Dtype::F16 => ctx.require_f16(),
                    Dtype::F32 => Ok(()),
                }
            }
            Given::X { .. } | Given::Qkv(_) => Ok(()),
        }
    }

    /// The arrays whose values are checked when the call is built: the weights (small; a
    /// layer's were checked when it was built), and X too for a saved forward. The rest are
    /// checked on their way to the device.
    fn checked_now(&self, save: bool) -> Vec<(&'static str, ArrayViewD<'_, f32>)> {
        match self {
            Given::X { x, proj, layer } => named_inputs(x, *proj)
                .into_iter()
                .filter(|(name, _)| match *name {
                    "X" => save,
                    _ => layer.is_none(),
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// One call, checked (see the module's doc).
pub(super) struct Call<'a, 'p, 'm> {
    /// The op; a saved forward's returns no weights and passes no NaN/Inf through.
    pub op: Attention,
    pub dims: Dims,
    /// Keys per query row.
    pub n_kv: usize,
    pub given: Given<'a, 'p>,
    /// The mask resolved to one broadcast bias `(batch, heads, n_q, n_kv)`, if any.
    pub bias: Option<Array4<f32>>,
    pub mods: Option<&'m Modifiers>,
    /// Past the device's limits: the first limit the whole call exceeds. It then splits.
    too_big: Option<Error>,
    /// Q, K and V read into arrays and checked, for a call on them that splits.
    arrays: Option<[CowArray<'a, f32, IxDyn>; 3]>,
}

impl<'a, 'p, 'm> Call<'a, 'p, 'm> {
    /// The call of `op` on `given` with `mask`, checked.
    ///
    /// # Errors
    /// As [`Attention::run`]: shapes, options, a layer or tensors of another context,
    /// tensors of another dtype, the mask, modifiers the path cannot apply (tensors) or
    /// differentiate (a saved forward), f16 on an adapter without it, the values checked
    /// now, a lost device, and the device's limits where the call cannot split.
    pub(super) fn new(
        op: &Attention,
        ctx: &Context,
        given: Given<'a, 'p>,
        mask: &Mask<'m>,
    ) -> Result<Self> {
        // A saved forward always runs the fused kernel, and a gradient through NaN/Inf
        // means nothing.
        let op = match op.save {
            true => op.return_weights(false).propagate_non_finite(false),
            false => *op,
        };
        let dims = given.dims(&op)?;
        given.check_device(ctx, &op)?;
        match mask.modifiers() {
            // The backward takes them back through their derivatives: refused before any
            // work when one has none.
            Some(m) if op.save => m.check_differentiable()?,
            Some(_) if given.on_device() => {
                return Err(crate::kernels::mods::unsupported(ctx, "device tensors"))
            }
            _ => {}
        }
        let now = given.checked_now(op.save);
        if !op.propagate {
            for (name, a) in &now {
                check_finite(name, a)?;
            }
        }
        let n_kv = given.n_kv(&dims);
        let bias = mask.bias([dims.batch, dims.heads, dims.n, n_kv])?;
        // f16 on the device, and those values within its range.
        op.check_dtype(ctx, &now)?;
        ctx.check_alive()?;
        let view = bias.as_ref().map(|b| b.view());
        let too_big = match call_fits(ctx, &op, &dims, &given, view.as_ref()) {
            // Only a call on arrays that does not save splits.
            Err(e) if op.save || given.on_device() => return Err(e),
            fits => fits.err(),
        };
        if let (Some(layer), Some(_)) = (given.layer(), &too_big) {
            layer.check_host_current()?;
        }
        let mut arrays = None;
        match (&given, &too_big) {
            (Given::X { x, .. }, Some(_)) => op.check_values(ctx, &[("X", x.view())])?,
            (Given::Qkv(qkv), Some(_)) => {
                // Files read into arrays first.
                let read = [qkv[0].array()?, qkv[1].array()?, qkv[2].array()?];
                let named = [("Q", 0), ("K", 1), ("V", 2)].map(|(n, i)| (n, read[i].view()));
                op.check_values(ctx, &named)?;
                arrays = Some(read);
            }
            _ => {}
        }
        Ok(Call {
            op,
            dims,
            n_kv,
            given,
            bias,
            mods: mask.modifiers(),
            too_big,
            arrays,
        })
    }

    /// The mask's bias and modifiers, as the steps take them.
    pub(super) fn masking(&self) -> (Option<ArrayView4<'_, f32>>, Option<&'m Modifiers>) {
        (self.bias.as_ref().map(|b| b.view()), self.mods)
    }

    /// Runs a call on arrays: saved for the backward when the op says so; else whole when
    /// it fits the device, else split with the whole call's plan (its parts run the kernels
    /// the whole call would).
    ///
    /// # Errors
    /// What cannot be split small enough is the limit's error; NaN/Inf in an operand of a
    /// whole call; overflow in the results; GPU errors.
    pub(super) async fn run(&self, ctx: &Context) -> Result<Output> {
        let (op, dims) = (&self.op, &self.dims);
        let masking = self.masking();
        match (&self.given, &self.too_big) {
            (Given::X { x, proj, layer }, None) if op.save => {
                let (out, saved) = layer_saved::forward(ctx, self, x.view(), *proj, *layer)?;
                Ok(out.with_saved(saved.into()))
            }
            (Given::Qkv(values), None) if op.save => {
                let (out, saved) = saved::forward(ctx, self, values)?;
                Ok(out.with_saved(saved.into()))
            }
            (Given::X { x, proj, layer }, None) => {
                let source = Source::Projected {
                    x,
                    proj: *proj,
                    weights: layer.map(Layer::device),
                };
                op.run_whole(ctx, dims, source, masking, None).await
            }
            (Given::X { x, proj, layer }, Some(too_big)) => {
                let (op, plan) = self.split_plan(ctx)?;
                let resident = layer.map(Layer::device);
                op.forward_in_parts(
                    ctx,
                    dims,
                    (x.view(), *proj, resident),
                    plan,
                    masking,
                    too_big,
                )
                .await
            }
            (Given::Qkv(values), None) => {
                let source = Source::Qkv {
                    values: values.clone(),
                    check: true,
                };
                op.run_whole(ctx, dims, source, masking, None).await
            }
            (Given::Qkv(_), Some(_)) => {
                let Some([q, k, v]) = &self.arrays else {
                    return Err(Error::invalid("split", "internal: Q, K, V not read"));
                };
                let (op, plan) = self.split_plan(ctx)?;
                let (q, k, v) = (four(q)?, four(k)?, four(v)?);
                op.sdpa_in_parts(ctx, q, k, v, masking, plan).await
            }
            (Given::TensorX { .. } | Given::TensorQkv(_), _) => Err(Error::invalid(
                "inputs",
                "internal: a call on tensors is recorded, not run",
            )),
        }
    }

    /// The op and plan the parts of a call past the limits run with: the whole call's plan,
    /// and the key split the whole call would take ([`Attention::whole_key_split`]).
    fn split_plan(&self, ctx: &Context) -> Result<(Attention, Plan)> {
        let plan = self.op.plan(ctx, &self.dims)?;
        let op = self.op.whole_key_split(ctx, &self.dims, self.n_kv, &plan);
        Ok((op, plan))
    }

    /// Records a call on tensors into `rec` (saved for the backward when the op says so):
    /// its results are tensors, written when `rec` is submitted.
    ///
    /// # Errors
    /// Tensors from a recorder not submitted yet; GPU errors.
    pub(super) fn record(&self, rec: &mut Recorder<'_>) -> Result<Output<Tensor>> {
        match &self.given {
            Given::TensorQkv(qkv) if self.op.save => {
                let (out, saved) = saved::record(rec, self, *qkv)?;
                Ok(out.with_saved(saved.into()))
            }
            Given::TensorX { x, layer } if self.op.save => {
                let (out, saved) = layer_saved::record(rec, self, x, *layer)?;
                Ok(out.with_saved(saved.into()))
            }
            Given::TensorQkv(qkv) => resident::record_qkv(rec, self, *qkv),
            Given::TensorX { x, layer } => resident::record_x(rec, self, x, *layer),
            Given::X { .. } | Given::Qkv(_) => Err(Error::invalid(
                "inputs",
                "internal: a call on arrays is run, not recorded",
            )),
        }
    }
}

/// A tensor's `(batch, rows, heads, width)` as `(batch, heads, rows, width)`.
pub(super) fn heads_first(shape: &[usize], name: &str) -> Result<[usize; 4]> {
    match *shape {
        [b, l, h, e] => Ok([b, h, l, e]),
        ref s => Err(Error::shape(format!(
            "{name} must be (batch, rows, heads, width) on the device, got {s:?}"
        ))),
    }
}

/// `Err` unless tensor `t` is of `op`'s dtype.
fn check_tensor_dtype(op: &Attention, t: &Tensor, name: &str) -> Result<()> {
    if t.dtype() != op.dtype {
        return Err(Error::invalid(
            name,
            format!(
                "the tensor is {} but the op's dtype is {}: make it with that dtype",
                t.dtype(),
                op.dtype
            ),
        ));
    }
    Ok(())
}

/// A 4-d (checked) array as the view the split takes.
fn four<'v>(a: &'v CowArray<'_, f32, IxDyn>) -> Result<ArrayView4<'v, f32>> {
    a.view()
        .into_dimensionality()
        .map_err(|e| Error::shape(e.to_string()))
}
