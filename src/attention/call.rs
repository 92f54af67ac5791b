//! A call on arrays as a value: built once from the op, the context and the inputs
//! ([`Call::new`]), checked once — the shapes, the mask, f16 on the device, the device's
//! limits, and the weights' values; the operands' values on their way to the device when the
//! call runs whole, here when it splits, so that an error names the caller's index — and
//! holding its sizes, its operands and its mask. [`Call::run`] then runs it whole
//! (`whole.rs`: plan → upload → dispatch → readback) or split (`split.rs`), with nothing
//! checked again.

use ndarray::{Array4, ArrayView4, ArrayViewD, CowArray, IxDyn};

use super::projections::Projections;
use super::shape::{named_inputs, Dims};
use super::split::x_fits;
use super::weights::DeviceWeights;
use super::{check_finite, Attention, Output};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::gpu::upload::Values;
use crate::mask::Mask;
use crate::modifiers::Modifiers;

/// What a call on arrays is given.
pub(super) enum Given<'a, 'p> {
    /// X `(n, d)` or `(batch, n, d)`, its projections if any, and their weights when they are
    /// on the device already (a layer's, checked when it was built).
    X {
        x: ArrayViewD<'a, f32>,
        proj: Option<&'a Projections<'p>>,
        resident: Option<&'a DeviceWeights>,
    },
    /// Q, K and V in PyTorch's layout, as arrays or opened files.
    Qkv([Values<'a>; 3]),
}

/// One call on arrays, checked (see the module's doc).
pub(super) struct Call<'a, 'p, 'm> {
    op: Attention,
    dims: Dims,
    given: Given<'a, 'p>,
    /// The mask resolved to one broadcast bias `(batch, heads, n_q, n_kv)`, if any.
    bias: Option<Array4<f32>>,
    mods: Option<&'m Modifiers>,
    /// Past the device's limits: the first limit the whole call exceeds. It then splits.
    too_big: Option<Error>,
    /// Q, K and V read into arrays and checked, for a call on them that splits.
    arrays: Option<[CowArray<'a, f32, IxDyn>; 3]>,
}

impl<'a, 'p, 'm> Call<'a, 'p, 'm> {
    /// The call of `op` on `given` with `mask`, checked.
    ///
    /// # Errors
    /// As [`Attention::run`]: shapes, options, the mask, f16 on an adapter without it, the
    /// weights' values, a lost device; the operands' values when the call splits.
    pub(super) fn new(
        op: &Attention,
        ctx: &Context,
        given: Given<'a, 'p>,
        mask: &Mask<'m>,
    ) -> Result<Self> {
        let dims = match &given {
            Given::X { x, proj, .. } => op.dims(x.shape(), *proj)?,
            Given::Qkv([q, k, v]) => op.sdpa_dims(q.shape(), k.shape(), v.shape())?,
        };
        // The weights' values (small) here; X's, Q's, K's and V's on their way to the
        // device, or below when the call splits. A layer's were checked when it was built.
        let weights: Vec<_> = match &given {
            Given::X {
                x,
                proj,
                resident: None,
            } => named_inputs(x, *proj)
                .into_iter()
                .filter(|(name, _)| *name != "X")
                .collect(),
            _ => Vec::new(),
        };
        if !op.propagate {
            for (name, a) in &weights {
                check_finite(name, a)?;
            }
        }
        let n_kv = match &given {
            Given::X { .. } => dims.n,
            Given::Qkv([_, k, _]) => k.shape()[2],
        };
        let bias = mask.bias([dims.batch, dims.heads, dims.n, n_kv])?;
        // f16 on the device, and the weights within its range.
        op.check_dtype(ctx, &weights)?;
        ctx.check_alive()?;
        let view = bias.as_ref().map(|b| b.view());
        let too_big = match &given {
            Given::X { .. } => x_fits(ctx, &dims, op.return_weights, view.as_ref()),
            Given::Qkv(qkv) => {
                let shapes = [qkv[0].shape(), qkv[1].shape(), qkv[2].shape()];
                op.sdpa_fits(ctx, shapes, view.as_ref())
            }
        }
        .err();
        let mut arrays = None;
        match (&given, &too_big) {
            (_, None) => {}
            (Given::X { x, .. }, Some(_)) => op.check_values(ctx, &[("X", x.view())])?,
            (Given::Qkv(qkv), Some(_)) => {
                // Files read into arrays first.
                let read = [qkv[0].array()?, qkv[1].array()?, qkv[2].array()?];
                let named = [("Q", 0), ("K", 1), ("V", 2)].map(|(n, i)| (n, read[i].view()));
                op.check_values(ctx, &named)?;
                arrays = Some(read);
            }
        }
        Ok(Call {
            op: *op,
            dims,
            given,
            bias,
            mods: mask.modifiers(),
            too_big,
            arrays,
        })
    }

    /// Runs the call: whole when it fits the device, else split with the whole call's plan
    /// (its parts run the kernels the whole call would).
    ///
    /// # Errors
    /// What cannot be split small enough is the limit's error; NaN/Inf in an operand of a
    /// whole call; overflow in the results; GPU errors.
    pub(super) async fn run(&self, ctx: &Context) -> Result<Output> {
        let (op, dims) = (&self.op, &self.dims);
        let masking = (self.bias.as_ref().map(|b| b.view()), self.mods);
        match (&self.given, &self.too_big) {
            (Given::X { x, proj, resident }, None) => {
                op.forward_whole(ctx, dims, x.view(), *proj, masking, *resident)
                    .await
            }
            (Given::X { x, proj, resident }, Some(too_big)) => {
                let plan = op.plan(ctx, dims)?;
                let op = op.whole_key_split(ctx, dims, dims.n, &plan);
                op.forward_in_parts(
                    ctx,
                    dims,
                    (x.view(), *proj, *resident),
                    plan,
                    masking,
                    too_big,
                )
                .await
            }
            (Given::Qkv(values), None) => {
                op.sdpa_whole(ctx, dims, values.clone(), masking, true, None)
                    .await
            }
            (Given::Qkv(_), Some(_)) => {
                let Some([q, k, v]) = &self.arrays else {
                    return Err(Error::invalid("split", "internal: Q, K, V not read"));
                };
                let plan = op.plan(ctx, dims)?;
                let op = op.whole_key_split(ctx, dims, k.shape()[2], &plan);
                let (q, k, v) = (four(q)?, four(k)?, four(v)?);
                op.sdpa_in_parts(ctx, q, k, v, masking, plan).await
            }
        }
    }
}

/// A 4-d (checked) array as the view the split takes.
fn four<'v>(a: &'v CowArray<'_, f32, IxDyn>) -> Result<ArrayView4<'v, f32>> {
    a.view()
        .into_dimensionality()
        .map_err(|e| Error::shape(e.to_string()))
}
