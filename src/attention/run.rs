//! The verbs: [`Attention::run`], [`Attention::run_async`] and [`Attention::record`] (and a
//! [`Layer`]'s `run` and `record`). Each takes [`Inputs`] of one [`Kind`] and hands the call
//! to the path of that kind: arrays are uploaded, computed and read back in one call (split
//! when past the device's limits); tensors are recorded into a [`Recorder`] and stay on the
//! device.

use ndarray::{ArrayViewD, Ix4};

use super::call::{Call, Given};
use super::inputs::{Files, Host, Inputs, Kind, OnDevice, Operands};
use super::outputs::Output;
use super::weights::Layer;
use super::Attention;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::gpu::oneshot::block_on;
use crate::gpu::upload::Values;
use crate::mask::Mask;
use crate::tensor::{Recorder, Tensor};

/// How a call runs for each [`Kind`] of operand.
#[doc(hidden)]
pub trait Run: Kind {
    /// Runs `op` on `inputs` now.
    fn run(op: &Attention, ctx: &Context, inputs: &Inputs<'_, Self>)
        -> Result<Output<Self::Value>>;
    /// Runs `layer` on `inputs` now.
    fn run_layer(
        layer: &Layer,
        ctx: &Context,
        inputs: &Inputs<'_, Self>,
    ) -> Result<Output<Self::Value>>;
}

/// Q, K and V arrays as the 4-d views the sdpa path takes.
fn four<'a>(a: &ArrayViewD<'a, f32>, name: &str) -> Result<ndarray::ArrayView4<'a, f32>> {
    a.clone().into_dimensionality::<Ix4>().map_err(|_| {
        Error::shape(format!(
            "{name} must be 4-d (batch, heads, rows, width), got shape {:?}",
            a.shape()
        ))
    })
}

fn no_projections<K: Kind>(inputs: &Inputs<'_, K>, why: &str) -> Result<()> {
    match inputs.projections {
        Some(_) => Err(Error::invalid("inputs", why.to_string())),
        None => Ok(()),
    }
}

const QKV_PROJECTED: &str = "projections apply to X, not to Q, K and V: give Inputs::x(x)";
const LAYER_PROJECTED: &str =
    "a Layer projects with its own weights: give Inputs::x(x) without projections";
const LAYER_TAKES_X: &str = "a Layer takes X: give Inputs::x(x)";

/// What arrays `inputs` give a call: X and its projections, or Q, K and V (4-d).
fn given_arrays<'a, 'p>(inputs: &'a Inputs<'p, Host>) -> Result<Given<'a, 'p>> {
    match &inputs.operands {
        Operands::X(x) => Ok(Given::X {
            x: x.view(),
            proj: inputs.projections.as_ref(),
            layer: None,
        }),
        Operands::Qkv([q, k, v]) => {
            no_projections(inputs, QKV_PROJECTED)?;
            let qkv = [four(q, "Q")?, four(k, "K")?, four(v, "V")?];
            Ok(Given::Qkv(qkv.map(|a| Values::Array(a.into_dyn()))))
        }
    }
}

/// What tensors `inputs` give a call: X, projected by `layer` when given, or Q, K and V.
fn given_tensors<'a>(
    inputs: &'a Inputs<'_, OnDevice>,
    layer: Option<&'a Layer>,
) -> Result<Given<'a, 'a>> {
    match (&inputs.operands, layer) {
        (Operands::X(x), None) => {
            no_projections(
                inputs,
                "projections on tensors stay on the device in a Layer: build one with Layer::new",
            )?;
            Ok(Given::TensorX { x, layer: None })
        }
        (Operands::X(x), Some(layer)) => {
            no_projections(inputs, LAYER_PROJECTED)?;
            Ok(Given::TensorX {
                x,
                layer: Some(layer),
            })
        }
        (Operands::Qkv([q, k, v]), None) => {
            no_projections(inputs, QKV_PROJECTED)?;
            Ok(Given::TensorQkv([q, k, v]))
        }
        (Operands::Qkv(_), Some(_)) => {
            no_projections(inputs, LAYER_PROJECTED)?;
            Err(Error::invalid("inputs", LAYER_TAKES_X))
        }
    }
}

/// A call on arrays, start to end ([`Call::new`], [`Call::run`]), timed as one call.
async fn run_arrays(
    op: &Attention,
    ctx: &Context,
    given: Given<'_, '_>,
    mask: &Mask<'_>,
) -> Result<Output> {
    let _call = ctx.phases.call();
    Call::new(op, ctx, given, mask)?.run(ctx).await
}

/// A call on tensors ([`Call::new`], [`Call::record`]), recorded into `rec`.
fn record_tensors(
    op: &Attention,
    rec: &mut Recorder<'_>,
    given: Given<'_, '_>,
    mask: &Mask<'_>,
) -> Result<Output<Tensor>> {
    Call::new(op, rec.ctx, given, mask)?.record(rec)
}

impl Run for Host {
    fn run(op: &Attention, ctx: &Context, inputs: &Inputs<'_, Host>) -> Result<Output> {
        let given = given_arrays(inputs)?;
        block_on(run_arrays(op, ctx, given, &inputs.mask_or_none()))
    }

    fn run_layer(layer: &Layer, ctx: &Context, inputs: &Inputs<'_, Host>) -> Result<Output> {
        no_projections(inputs, LAYER_PROJECTED)?;
        let Operands::X(x) = &inputs.operands else {
            return Err(Error::invalid("inputs", LAYER_TAKES_X));
        };
        let p = layer.projections();
        let given = Given::X {
            x: x.view(),
            proj: Some(&p),
            layer: Some(layer),
        };
        block_on(run_arrays(layer.op(), ctx, given, &inputs.mask_or_none()))
    }
}

impl Run for Files {
    fn run(op: &Attention, ctx: &Context, inputs: &Inputs<'_, Files>) -> Result<Output> {
        match &inputs.operands {
            Operands::Qkv([q, k, v]) if !op.save && inputs.projections.is_none() => {
                let files = Given::Qkv([*q, *k, *v].map(Values::File));
                block_on(run_arrays(op, ctx, files, &inputs.mask_or_none()))
            }
            _ => read_files(inputs, |host| Host::run(op, ctx, host)),
        }
    }

    fn run_layer(layer: &Layer, ctx: &Context, inputs: &Inputs<'_, Files>) -> Result<Output> {
        read_files(inputs, |host| Host::run_layer(layer, ctx, host))
    }
}

/// `f` on the same inputs with each file read into an array: the calls on files that do not
/// go from the files to the device directly.
fn read_files(
    inputs: &Inputs<'_, Files>,
    f: impl FnOnce(&Inputs<'_, Host>) -> Result<Output>,
) -> Result<Output> {
    let read = |files: &[&crate::npy::Opened]| -> Result<Vec<ndarray::ArrayD<f32>>> {
        files.iter().map(|o| o.read()).collect()
    };
    let (arrays, qkv) = match &inputs.operands {
        Operands::X(x) => (read(&[x])?, false),
        Operands::Qkv([q, k, v]) => (read(&[q, k, v])?, true),
    };
    let operands = match qkv {
        true => Operands::Qkv([0, 1, 2].map(|i| arrays[i].view())),
        false => Operands::X(arrays[0].view()),
    };
    let host = Inputs {
        operands,
        projections: inputs.projections.as_ref().map(|p| p.reborrow()),
        mask: inputs.mask.as_ref().map(|m| m.reborrow()),
    };
    f(&host)
}

impl Run for OnDevice {
    fn run(op: &Attention, ctx: &Context, inputs: &Inputs<'_, OnDevice>) -> Result<Output<Tensor>> {
        let mut rec = Recorder::new(ctx);
        let out = op.record(&mut rec, inputs.clone())?;
        rec.submit()?;
        Ok(out)
    }

    fn run_layer(
        layer: &Layer,
        ctx: &Context,
        inputs: &Inputs<'_, OnDevice>,
    ) -> Result<Output<Tensor>> {
        let mut rec = Recorder::new(ctx);
        let out = layer.record(&mut rec, inputs.clone())?;
        rec.submit()?;
        Ok(out)
    }
}

impl Attention {
    /// Computes attention now, blocking until the results are ready.
    ///
    /// With arrays (`Inputs::x(&x)`, `Inputs::qkv(&q, &k, &v)`), the operands are uploaded,
    /// computed and read back as `ArrayD<f32>`; a call past the device's limits is split by
    /// batch and heads. With tensors, the call is recorded and submitted at once and its
    /// results stay on the device; a call past the limits is an error.
    ///
    /// ```
    /// use wgpu_attention::{Attention, Context, Inputs, ndarray::Array2};
    /// # fn main() -> wgpu_attention::Result<()> {
    /// let ctx = Context::new()?;
    /// let x = Array2::from_shape_fn((5, 8), |(i, j)| ((i * 8 + j) as f32 * 0.1).sin());
    /// let out = Attention::new().causal(true).run(&ctx, Inputs::x(&x))?;
    /// assert_eq!(out.context.shape(), &[5, 8]);
    /// assert_eq!(out.weights.unwrap().shape(), &[5, 5]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Bad shapes or options, non-finite inputs, masks that do not broadcast, sizes over the
    /// device's limits, tensors of another context or dtype, and any wgpu validation,
    /// out-of-memory or device-lost error, as [`Error`] variants.
    pub fn run<K: Run>(&self, ctx: &Context, inputs: Inputs<'_, K>) -> Result<Output<K::Value>> {
        K::run(self, ctx, &inputs)
    }

    /// [`Attention::run`] on arrays without blocking: what the browser (wasm32, WebGPU)
    /// calls. For arrays without saving, `run` is this, waited for.
    ///
    /// # Errors
    /// As [`Attention::run`]; saving for the backward is not offered here (use `run`).
    pub async fn run_async(&self, ctx: &Context, inputs: Inputs<'_, Host>) -> Result<Output> {
        if self.save {
            return Err(Error::invalid(
                "save_for_backward",
                "a saved forward runs with Attention::run, not run_async",
            ));
        }
        let given = given_arrays(&inputs)?;
        run_arrays(self, ctx, given, &inputs.mask_or_none()).await
    }

    /// Records attention on tensors into `rec`: nothing runs until [`Recorder::submit`], so
    /// several calls (layers, a loss, a backward) share one encoder and one submit. The
    /// results are tensors, written when `rec` is submitted.
    ///
    /// # Errors
    /// As [`Attention::run`] on tensors; projections (use a [`Layer`]).
    pub fn record(
        &self,
        rec: &mut Recorder<'_>,
        inputs: Inputs<'_, OnDevice>,
    ) -> Result<Output<Tensor>> {
        let given = given_tensors(&inputs, None)?;
        record_tensors(self, rec, given, &inputs.mask_or_none())
    }
}

impl Layer {
    /// Runs the layer now on X (`Inputs::x`, with a mask if any): arrays come back as
    /// arrays, tensors stay on the device. With [`Attention::save_for_backward`] on the
    /// layer's op, the output carries the [`crate::Saved`] state for [`crate::Saved::backward`].
    ///
    /// # Errors
    /// As [`Attention::run`]; Q, K, V or projections in `inputs` (the layer has its own).
    pub fn run<K: Run>(&self, ctx: &Context, inputs: Inputs<'_, K>) -> Result<Output<K::Value>> {
        K::run_layer(self, ctx, &inputs)
    }

    /// Records the layer on a tensor X into `rec` (see [`Attention::record`]).
    ///
    /// # Errors
    /// As [`Layer::run`].
    pub fn record(
        &self,
        rec: &mut Recorder<'_>,
        inputs: Inputs<'_, OnDevice>,
    ) -> Result<Output<Tensor>> {
        let given = given_tensors(&inputs, Some(self))?;
        record_tensors(self.op(), rec, given, &inputs.mask_or_none())
    }
}
