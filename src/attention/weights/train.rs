//! Training a [`Layer`] on the device: [`Adam`] keeps its moments beside the layer's weights
//! and updates them in place (`shaders/adam.wgsl`) from a backward's [`Gradients`];
//! [`MseLoss`] computes a mean squared error's gradient (and the loss, read only when asked)
//! on the device (`shaders/mse.wgsl`). With [`Layer::record`] (its op saving for the
//! backward, [`crate::Attention::save_for_backward`]) and [`crate::Saved::record_backward`],
//! a whole training step is one [`Recorder`] and one submit, and nothing comes back to the
//! host.
//!
//! Each update also writes the layer's packed copies of its weights (`W_Q | W_K | W_V` in
//! one, the subgroup matmul's textures; `qkv.rs`) on the device, in the same encoder, so
//! forwards after a step run as fast as before it.
//!
//! The layer's host copy of its weights (kept for calls past the device's limits, which are
//! projected on the CPU, and for [`Layer::projections`]) is not updated by a step:
//! [`Layer::sync_host`] reads the device's weights back into it.

use std::sync::atomic::Ordering;

use ndarray::{Array1, Array2};

use super::{Layer, Linear};
use crate::attention::Gradients;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::gpu::buffer::{self, Buf};
use crate::gpu::readback;
use crate::kernels::{adam, mse};
use crate::tensor::{Recorder, Tensor};

/// The Adam optimiser (Kingma & Ba; with [`Adam::weight_decay`], AdamW's decoupled decay),
/// its first and second moments held on the device beside the weights of the one [`Layer`]
/// it updates ([`Layer::update`]). The moments are made (zero) by the first update, so an
/// `Adam` serves one layer: another layer's parameters are an error. On an f16 layer it also
/// keeps f32 master weights (from the layer's host copy) and writes each step's result
/// rounded to f16 into the layer, so steps smaller than f16's spacing are not lost.
///
/// ```
/// use wgpu_attention::ndarray::{Array2, Array3};
/// use wgpu_attention::{Adam, Attention, Context, Dtype, Inputs, Layer, MseLoss, Projections};
/// use wgpu_attention::{Recorder, Tensor};
/// # fn main() -> wgpu_attention::Result<()> {
/// let ctx = Context::new()?;
/// let w = Array2::<f32>::eye(8);
/// let x = Array3::from_shape_fn((2, 5, 8), |(b, i, j)| ((b * 40 + i * 8 + j) as f32).sin());
/// let target = Array3::<f32>::zeros((2, 5, 8));
/// let p = Projections::new(w.view(), w.view(), w.view());
/// let op = Attention::new().heads(2).causal(true).save_for_backward(true);
/// let mut layer = Layer::new(&ctx, op, &p)?;
/// let mut adam = Adam::new(1e-2);
/// let x = Tensor::from_array(&ctx, x.view().into_dyn(), Dtype::F32)?; // uploaded once
/// let target = Tensor::from_array(&ctx, target.view().into_dyn(), Dtype::F32)?;
/// let mut losses = Vec::new();
/// for step in 1..=20 {
///     let mut rec = Recorder::new(&ctx);
///     let y = layer.record(&mut rec, Inputs::x(&x))?;
///     let loss = MseLoss::record(&mut rec, &y.context, &target)?;
///     let saved = y.saved.expect("the layer's op saves for the backward");
///     let grads = saved.record_backward(&mut rec, &loss.grad)?;
///     layer.record_update(&mut rec, &mut adam, &grads)?;
///     rec.submit()?; // one submit per step, nothing read back
///     if step % 10 == 0 {
///         losses.push(loss.value(&ctx)?); // reads a few floats
///     }
/// }
/// assert!(losses[1] < losses[0], "{losses:?}");
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Adam {
    lr: f32,
    betas: (f32, f32),
    eps: f32,
    weight_decay: f32,
    /// Steps taken.
    t: u32,
    /// The context and, per parameter, its length and moments `[m, v]`, once made.
    state: Option<(u64, Vec<Moments>)>,
}

impl Adam {
    /// Adam with learning rate `lr`, β = (0.9, 0.999), ε = 1e-8 and no weight decay.
    pub fn new(lr: f32) -> Self {
        Adam {
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            t: 0,
            state: None,
        }
    }

    /// The moments' decay rates β1, β2 (each in `[0, 1)`).
    pub fn betas(mut self, beta1: f32, beta2: f32) -> Self {
        self.betas = (beta1, beta2);
        self
    }

    /// ε, added to `sqrt(v̂)` (positive).
    pub fn eps(mut self, eps: f32) -> Self {
        self.eps = eps;
        self
    }

    /// AdamW's decoupled weight decay λ: each step also takes `lr·λ·w` off every weight and
    /// bias (0, the default, is plain Adam).
    pub fn weight_decay(mut self, weight_decay: f32) -> Self {
        self.weight_decay = weight_decay;
        self
    }

    /// Changes the learning rate (for a schedule); the moments are kept.
    pub fn set_lr(&mut self, lr: f32) {
        self.lr = lr;
    }

    /// The steps taken so far.
    pub fn steps(&self) -> u32 {
        self.t
    }

    fn check(&self) -> Result<()> {
        let (b1, b2) = self.betas;
        let bad = |what: &str, v: f32, want: &str| {
            Err(Error::invalid(
                "Adam",
                format!("{what} = {v} must be {want}"),
            ))
        };
        if !(self.lr.is_finite() && self.lr >= 0.0) {
            return bad("the learning rate", self.lr, "finite and ≥ 0");
        }
        for (what, b) in [("β1", b1), ("β2", b2)] {
            if !(0.0..1.0).contains(&b) {
                return bad(what, b, "in [0, 1)");
            }
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return bad("ε", self.eps, "finite and > 0");
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return bad("the weight decay", self.weight_decay, "finite and ≥ 0");
        }
        Ok(())
    }

    /// The moments for parameters of `lens`, made zero on the first call, with f32 master
    /// copies from `master(i)` for parameter `i` when given.
    fn moments(
        &mut self,
        ctx: &Context,
        lens: &[usize],
        master: Option<&dyn Fn(usize) -> Vec<f32>>,
    ) -> Result<&[Moments]> {
        if self.state.is_none() {
            let mut made = Vec::with_capacity(lens.len());
            for (i, &len) in lens.iter().enumerate() {
                let zeros = vec![0.0f32; len];
                let m = buffer::upload(ctx, "Adam m", &zeros)?;
                let v = buffer::upload(ctx, "Adam v", &zeros)?;
                let w = master
                    .map(|f| buffer::upload(ctx, "Adam master", &f(i)))
                    .transpose()?;
                made.push((len, [m, v], w));
            }
            self.state = Some((ctx.id(), made));
        }
        let Some((id, state)) = &self.state else {
            return Err(Error::invalid("Adam", "internal: no moments"));
        };
        if *id != ctx.id() {
            return Err(Error::invalid(
                "Adam",
                "its moments live on another Context's device: use one Adam per layer",
            ));
        }
        let ours: Vec<usize> = state.iter().map(|(len, ..)| *len).collect();
        if ours != lens {
            return Err(Error::shape(format!(
                "this Adam holds moments for parameters of {ours:?} elements, the layer has \
                 {lens:?}: use one Adam per layer"
            )));
        }
        Ok(state)
    }
}

/// A parameter's length, its moments `[m, v]`, and its f32 master copy when it is f16.
type Moments = (usize, [wgpu::Buffer; 2], Option<wgpu::Buffer>);

/// One trainable parameter: its name, buffer, shape and gradient.
type Param<'a> = (&'static str, &'a wgpu::Buffer, Vec<usize>, &'a Tensor);

impl Layer {
    /// One [`Adam`] step on the layer's weights and biases, in place on the device, from the
    /// gradients of a saved forward of this layer ([`crate::Saved::backward`] on a tensor
    /// `dO`, or [`crate::Saved::record_backward`]). Recorded and submitted at once; see
    /// [`Layer::record_update`]. Later forwards use the new weights, still with Q, K and V
    /// from one matmul: the layer's packed copies of its weights are written again on the
    /// device in the same submit. The [`crate::Saved`] of an earlier forward can no longer
    /// run its backward.
    ///
    /// # Errors
    /// As [`Layer::record_update`].
    pub fn update(
        &mut self,
        ctx: &Context,
        adam: &mut Adam,
        grads: &Gradients<Tensor>,
    ) -> Result<()> {
        let mut rec = Recorder::new(ctx);
        self.record_update(&mut rec, adam, grads)?;
        rec.submit()
    }

    /// [`Layer::update`] recorded into `rec` (after the backward that made `grads`).
    ///
    /// # Errors
    /// Another context; a new `Adam` on an f16 layer whose host copy is behind (see
    /// [`Layer::sync_host`]: its master weights start from it); gradients that do not match
    /// the layer's parameters (missing or extra, shapes, f16, another recorder not yet
    /// submitted); an `Adam` with bad hyper-parameters or made for another layer; GPU
    /// errors. Nothing is recorded on an error.
    pub fn record_update(
        &mut self,
        rec: &mut Recorder<'_>,
        adam: &mut Adam,
        grads: &Gradients<Tensor>,
    ) -> Result<()> {
        let ctx = rec.ctx;
        self.check_context(ctx)?;
        adam.check()?;
        let f16 = self.op().f16();
        if f16 && adam.state.is_none() && self.version.load(Ordering::Acquire) != self.host_version
        {
            return Err(Error::invalid(
                "update",
                "a new Adam on an f16 layer starts its f32 master weights from the layer's host \
                 copy, which earlier updates left behind: call Layer::sync_host first",
            ));
        }
        let params = self.params(grads)?;
        let mut bound = Vec::with_capacity(params.len());
        for (name, param, shape, grad) in &params {
            bound.push((
                *param,
                grad.input(rec, name)?,
                shape.iter().product::<usize>(),
            ));
        }
        let lens: Vec<usize> = bound.iter().map(|(_, _, len)| *len).collect();
        let t = adam.t + 1;
        let hyper = (
            adam.lr,
            adam.betas.0,
            adam.betas.1,
            adam.eps,
            adam.weight_decay,
        );
        let uniforms = lens
            .iter()
            .map(|&len| adam::params(len, hyper, t))
            .collect::<Result<Vec<_>>>()?;
        let names: Vec<&str> = params.iter().map(|(name, ..)| *name).collect();
        let host = |i: usize| self.host_values(names[i]);
        let moments = adam.moments(ctx, &lens, f16.then_some(&host as &dyn Fn(usize) -> _))?;
        let device = &self.device;
        let recorded = ctx.scoped(|| {
            let steps = bound.iter().zip(moments).zip(&uniforms).zip(&names);
            for ((((param, grad, _), (_, [m, v], w)), u), name) in steps {
                let mirror = device.mirror(name);
                adam::dispatch(
                    ctx,
                    rec.encoder(),
                    u,
                    grad,
                    [param, m, v],
                    w.as_ref(),
                    mirror,
                )?;
            }
            // The packed W_Q | W_K | W_V took the new values with the separate weights (each
            // step's mirror); the textures are packed again from the updated buffers.
            device.record_repack(ctx, rec.encoder(), f16)
        });
        drop(params);
        // Even on a failure earlier dispatches may be in `rec`: the packed copies (Q|K|V in one
        // weight, the subgroup matmul's textures) may hold a mix of old and new weights, so
        // they are dropped and later calls use the updated separate ones. The version moves
        // on either way.
        if recorded.is_err() {
            self.device.drop_packed();
        }
        self.version.fetch_add(1, Ordering::AcqRel);
        recorded?;
        adam.t = t;
        Ok(())
    }

    /// The layer's parameters beside their gradients, checked.
    fn params<'a>(&'a self, g: &'a Gradients<Tensor>) -> Result<Vec<Param<'a>>> {
        let w = &self.device;
        let mut out = Vec::new();
        let linears = [
            ("W_Q", "b_Q", Some(&w.q), &g.w_q, &g.b_q),
            ("W_K", "b_K", Some(&w.k), &g.w_k, &g.b_k),
            ("W_V", "b_V", Some(&w.v), &g.w_v, &g.b_v),
            ("W_O", "b_O", w.o.as_ref(), &g.w_o, &g.b_o),
        ];
        for (wn, bn, lin, gw, gb) in linears {
            let (weight, bias) = match lin {
                Some(Linear { b, rows, cols, .. }) => (
                    Some((lin.map(Linear::weight), vec![*rows, *cols])),
                    b.as_ref().map(|b| (Some(b), vec![*cols])),
                ),
                None => (None, None),
            };
            for (name, have, grad) in [(wn, weight, gw), (bn, bias, gb)] {
                match (have, grad) {
                    (Some((Some(buf), shape)), Some(grad)) => {
                        check_grad(name, &shape, grad)?;
                        out.push((name, buf, shape, grad));
                    }
                    (None, None) => {}
                    (Some(_), None) | (None, Some(_)) => {
                        return Err(Error::invalid(
                            "update",
                            format!(
                                "the gradients {} d{name} and the layer {} {name}: they come \
                                 from another layer's backward",
                                if grad.is_some() { "have" } else { "lack" },
                                if grad.is_some() { "has no" } else { "has" },
                            ),
                        ));
                    }
                    (Some((None, _)), Some(_)) => {}
                }
            }
        }
        Ok(out)
    }

    /// The host copy of parameter `name` (as [`Layer::params`] names them), flat.
    fn host_values(&self, name: &str) -> Vec<f32> {
        let two = |a: &Array2<f32>| a.iter().copied().collect();
        let one = |a: &Option<Array1<f32>>| a.iter().flatten().copied().collect();
        match name {
            "W_Q" => two(&self.host.0),
            "W_K" => two(&self.host.1),
            "W_V" => two(&self.host.2),
            "b_Q" => one(&self.biases[0]),
            "b_K" => one(&self.biases[1]),
            "b_V" => one(&self.biases[2]),
            "W_O" => self.output.as_ref().map(|o| two(&o.0)).unwrap_or_default(),
            _ => self.output.as_ref().map(|o| one(&o.1)).unwrap_or_default(),
        }
    }

    /// Reads the device's weights back into the layer's host copy ([`Layer::projections`],
    /// and what calls past the device's limits project with), after [`Layer::update`]s.
    ///
    /// # Errors
    /// Another context; GPU errors.
    pub fn sync_host(&mut self, ctx: &Context) -> Result<()> {
        self.check_context(ctx)?;
        let version = self.version.load(Ordering::Acquire);
        if version == self.host_version {
            return Ok(());
        }
        let f16 = self.op().f16();
        let read = |b: &wgpu::Buffer, len: usize| {
            ctx.scoped(|| {
                let _open = ctx.pool.open();
                readback::read_as(ctx, b, len, f16)
            })
        };
        let read2 = |l: &Linear| -> Result<(Array2<f32>, Option<Array1<f32>>)> {
            let w = Array2::from_shape_vec((l.rows, l.cols), read(l.weight(), l.rows * l.cols)?)
                .map_err(|e| Error::shape(e.to_string()))?;
            let b =
                l.b.as_ref()
                    .map(|b| read(b, l.cols).map(Array1::from_vec))
                    .transpose()?;
            Ok((w, b))
        };
        let (q, bq) = read2(&self.device.q)?;
        let (k, bk) = read2(&self.device.k)?;
        let (v, bv) = read2(&self.device.v)?;
        let o = self.device.o.as_ref().map(read2).transpose()?;
        self.host = (q, k, v);
        self.biases = [bq, bk, bv];
        self.output = o;
        self.host_version = version;
        Ok(())
    }

    /// `Err` when the host copy is older than the device's weights: what a call on X that
    /// splits (and is projected with the host copy) checks.
    pub(in crate::attention) fn check_host_current(&self) -> Result<()> {
        if self.version.load(Ordering::Acquire) == self.host_version {
            return Ok(());
        }
        Err(Error::invalid(
            "layer",
            "this call is past the device's limits, so it would be projected on the CPU \
             with the host copy of the weights, which Layer::update left behind: call \
             Layer::sync_host first",
        ))
    }
}

fn check_grad(name: &str, shape: &[usize], g: &Tensor) -> Result<()> {
    if g.shape() != shape {
        return Err(Error::shape(format!(
            "d{name} has shape {:?}, {name} has {shape:?}: the gradients come from another \
             layer's backward",
            g.shape()
        )));
    }
    if g.dtype() != crate::attention::Dtype::F32 {
        return Err(Error::invalid(name, "the gradient must be an f32 tensor"));
    }
    Ok(())
}

/// The mean squared error `ℓ = mean((O − T)²)` of an output against a target, on the device:
/// [`MseLoss::grad`] is `∂ℓ/∂O = 2(O − T)/N`, ready for a backward, and the loss itself is
/// summed from per-workgroup partial sums only when [`MseLoss::value`] reads it.
#[derive(Debug, Clone)]
pub struct MseLoss {
    /// `∂ℓ/∂O`, O's shape (f32).
    pub grad: Tensor,
    /// The partial sums of squares, one per 256 elements.
    sums: Tensor,
    count: usize,
}

impl MseLoss {
    /// Records the loss of `output` against `target` (f32 tensors of one shape) into `rec`.
    ///
    /// # Errors
    /// Shapes that differ, f16 tensors, tensors of another context or not yet written, and
    /// GPU errors.
    pub fn record(rec: &mut Recorder<'_>, output: &Tensor, target: &Tensor) -> Result<MseLoss> {
        let ctx = rec.ctx;
        if output.shape() != target.shape() {
            return Err(Error::shape(format!(
                "the loss's output has shape {:?}, its target {:?}",
                output.shape(),
                target.shape()
            )));
        }
        for (t, what) in [(output, "output"), (target, "target")] {
            if t.dtype() != crate::attention::Dtype::F32 {
                return Err(Error::invalid(what, "the loss takes f32 tensors"));
            }
        }
        let (o, t) = (output.input(rec, "output")?, target.input(rec, "target")?);
        let count = output.len();
        let groups = count.div_ceil(mse::PER_GROUP);
        let wrap = rec.wrapper();
        let (grad, sums): (Buf, Buf) = ctx.scoped(|| {
            let grad = buffer::output(ctx, "dO", count, false)?;
            let sums = buffer::output(ctx, "loss partial sums", groups, false)?;
            let scale = 2.0 / count as f32;
            mse::dispatch(ctx, rec.encoder(), count, scale, o, t, &grad, &sums)?;
            Ok((grad, sums))
        })?;
        Ok(MseLoss {
            grad: wrap(grad, output.shape().to_vec()),
            sums: wrap(sums, vec![groups]),
            count,
        })
    }

    /// The loss, read back (a few floats, summed in f64).
    ///
    /// # Errors
    /// A recorder not yet submitted, another context, GPU errors.
    pub fn value(&self, ctx: &Context) -> Result<f32> {
        let sums = self.sums.to_array(ctx)?;
        let total: f64 = sums.iter().map(|&v| f64::from(v)).sum();
        Ok((total / self.count as f64) as f32)
    }
}
