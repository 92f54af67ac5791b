//! Projection weights on the device: uploaded for one call, or once for a [`Layer`] that
//! keeps them (then every call uploads only X).

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use ndarray::{Array1, Array2};

use super::plan::Plan;
use super::projections::Projections;
use super::upload::upload_as;
use super::Attention;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::matmul::Matmul;
use crate::variant;

pub(super) mod train;

/// One projection on the device: its weight `(in, out)` in the `X·W` orientation and its
/// optional bias. Cloning shares the buffers.
#[derive(Clone)]
pub(super) struct Linear {
    w: wgpu::Buffer,
    pub b: Option<wgpu::Buffer>,
    /// Input width: the weight's rows.
    pub rows: usize,
    /// Output width: the weight's columns.
    pub cols: usize,
    /// The weight in the subgroup matmul's texture layout, packed when a layer is built and
    /// again on the device after each of its updates (see `qkv.rs`), else packed by each call.
    pub packed: Option<crate::kernels::pack::Packed>,
}

impl Linear {
    /// The weight `(rows, cols)` on the device.
    pub(super) fn weight(&self) -> &wgpu::Buffer {
        &self.w
    }

    pub(super) fn upload(
        ctx: &Context,
        name: &str,
        w: &ndarray::ArrayView2<'_, f32>,
        b: Option<&ndarray::ArrayView1<'_, f32>>,
        f16: bool,
    ) -> Result<Self> {
        Ok(Linear {
            w: upload_as(ctx, name, w.view(), f16)?,
            b: b.map(|b| upload_as(ctx, name, b.view(), f16)).transpose()?,
            rows: w.nrows(),
            cols: w.ncols(),
            packed: None,
        })
    }

    /// Records `out ← a·W (+ b)` for the problem `mm`.
    pub(super) fn record(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        plan: &Plan,
        mm: &Matmul,
        a: &wgpu::Buffer,
        out: &wgpu::Buffer,
    ) -> Result<()> {
        if self.packed.is_some() && matches!(plan.matmul, variant::MatmulVariant::Subgroup { .. }) {
            // Only X to pack (the subgroup family), else as below.
            if self.record_split(ctx, encoder, plan, mm, a, (out, out, out), None)? {
                return Ok(());
            }
        }
        // The context's stand-in serves every matmul without a bias.
        let bias = self.b.as_ref().unwrap_or(ctx.stand_in());
        variant::record_matmul(ctx, encoder, mm, plan.matmul, a, &self.w, bias, out)?;
        Ok(())
    }
}

/// `W_Q`, `W_K`, `W_V` with their biases, and `W_O` with `b_O`, on the device, stored as the
/// op's dtype (f32, or f16 under [`crate::Dtype::F16`]).
#[derive(Clone)]
pub(super) struct DeviceWeights {
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Option<Linear>,
    /// `W_Q | W_K | W_V` as one weight (a layer's: Q, K and V from one matmul, `qkv.rs`).
    pub qkv: Option<Linear>,
}

impl DeviceWeights {
    /// Forgets the packed copies of the weights (`W_Q | W_K | W_V` in one, the subgroup
    /// matmul's textures): after an update that failed part-way they may be stale, and calls
    /// go back to the separate weights. (A whole update writes them again: `qkv.rs`.)
    pub(super) fn drop_packed(&mut self) {
        self.qkv = None;
        for l in [&mut self.q, &mut self.k, &mut self.v]
            .into_iter()
            .chain(self.o.as_mut())
        {
            l.packed = None;
        }
    }

    /// Uploads `p` (already checked against X by [`Attention::dims`]).
    pub(super) fn upload(ctx: &Context, p: &Projections<'_>, f16: bool) -> Result<Self> {
        let _upload = ctx.phases.enter(crate::phases::Phase::Upload);
        Ok(DeviceWeights {
            q: Linear::upload(ctx, "W_Q", &p.w_q, p.b_q.as_ref(), f16)?,
            k: Linear::upload(ctx, "W_K", &p.w_k, p.b_k.as_ref(), f16)?,
            v: Linear::upload(ctx, "W_V", &p.w_v, p.b_v.as_ref(), f16)?,
            o: p.w_o
                .as_ref()
                .map(|w| Linear::upload(ctx, "W_O", w, p.b_o.as_ref(), f16))
                .transpose()?,
            qkv: None,
        })
    }
}

/// An attention layer whose projection weights live on the device: uploaded once, when the
/// layer is built, so each [`Layer::run`] uploads only X ([`Attention::run`] with
/// `Inputs::x(&x).projections(&p)` uploads every weight on every call). The op's options
/// (heads, causal, scale, dtype, saving for the backward, [`crate::Options`]) are fixed
/// with it. Results are those of [`Attention::run`] with the same op and projections, bit
/// for bit. On tensors, [`Layer::record`] keeps the whole forward on the device, and with
/// [`Attention::save_for_backward`] on, the output's [`crate::Saved`] gives the gradients
/// that [`Layer::update`] applies.
///
/// ```
/// use wgpu_attention::{Attention, Context, Inputs, Layer, Projections, ndarray::Array2};
/// # fn main() -> wgpu_attention::Result<()> {
/// let ctx = Context::new()?;
/// let (w_q, w_k, w_v) = (Array2::eye(8), Array2::eye(8) * 0.5, Array2::eye(8) * 2.0);
/// let p = Projections::new(w_q.view(), w_k.view(), w_v.view());
/// let op = Attention::new().heads(2).causal(true);
/// let layer = Layer::new(&ctx, op, &p)?; // the weights are uploaded here
/// let xs: Vec<Array2<f32>> = (0..3)
///     .map(|t| Array2::from_shape_fn((5, 8), |(i, j)| ((t * 40 + i * 8 + j) as f32).sin()))
///     .collect();
/// for x in &xs {
///     let out = layer.run(&ctx, Inputs::x(x))?; // uploads X only
///     assert_eq!(out.context.shape(), &[5, 8]);
///     let each_call = op.run(&ctx, Inputs::x(x).projections(&p))?; // uploads the weights too
///     assert_eq!(out.context, each_call.context);
/// }
/// # Ok(()) }
/// ```
pub struct Layer {
    op: Attention,
    host: (Array2<f32>, Array2<f32>, Array2<f32>),
    biases: [Option<Array1<f32>>; 3],
    output: Option<(Array2<f32>, Option<Array1<f32>>)>,
    device: DeviceWeights,
    context: u64,
    /// Bumped by every update of the device weights ([`Layer::update`]).
    version: Arc<AtomicU64>,
    /// The version the host copy holds.
    host_version: u64,
}

impl std::fmt::Debug for Layer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Layer")
            .field("op", &self.op)
            .field("w_q", &self.host.0.dim())
            .field("w_k", &self.host.1.dim())
            .field("w_v", &self.host.2.dim())
            .field("w_o", &self.output.as_ref().map(|o| o.0.dim()))
            .finish_non_exhaustive()
    }
}

impl Layer {
    /// Builds the layer on `ctx`: checks the projections (as [`crate::Dims::new`] does for
    /// an X of their input width), keeps a host copy ([`Layer::projections`]' and the
    /// training's) and uploads them.
    ///
    /// # Errors
    /// Mismatched shapes, NaN/Inf in the weights (unless the op passes them through), values
    /// past f16's range under f16, and GPU errors.
    pub fn new(ctx: &Context, op: Attention, p: &Projections<'_>) -> Result<Self> {
        let d = p.w_q.nrows();
        op.dims(&[1, d], Some(p))?;
        let x = ndarray::ArrayD::<f32>::zeros(ndarray::IxDyn(&[1, d]));
        if !op.propagates_non_finite() {
            super::check_inputs_finite(&x.view(), Some(p))?;
        }
        op.check_dtype(ctx, &super::shape::named_inputs(&x.view(), Some(p)))?;
        let device = ctx.scoped(|| DeviceWeights::upload_resident(ctx, p, op.f16()))?;
        Ok(Layer {
            op,
            host: (p.w_q.to_owned(), p.w_k.to_owned(), p.w_v.to_owned()),
            biases: [p.b_q, p.b_k, p.b_v].map(|b| b.map(|b| b.to_owned())),
            output: p.w_o.map(|w| (w.to_owned(), p.b_o.map(|b| b.to_owned()))),
            device,
            context: ctx.id(),
            version: Arc::new(AtomicU64::new(0)),
            host_version: 0,
        })
    }

    /// The op this layer runs.
    pub fn op(&self) -> &Attention {
        &self.op
    }

    /// The weights on the device.
    pub(super) fn device(&self) -> &DeviceWeights {
        &self.device
    }

    /// The device weights' version counter.
    pub(super) fn version(&self) -> &Arc<AtomicU64> {
        &self.version
    }

    /// `Err` unless `ctx` is the context the layer was built on.
    pub(super) fn check_context(&self, ctx: &Context) -> Result<()> {
        if ctx.id() != self.context {
            return Err(Error::invalid(
                "layer",
                "its weights live on another Context's device: build the Layer on the \
                 context you call it with",
            ));
        }
        Ok(())
    }

    /// The projections, as views of the layer's host copy.
    pub fn projections(&self) -> Projections<'_> {
        let (q, k, v) = &self.host;
        let mut p = Projections::new(q.view(), k.view(), v.view());
        [p.b_q, p.b_k, p.b_v] = [0, 1, 2].map(|i| self.biases[i].as_ref().map(|b| b.view()));
        match &self.output {
            Some((w, b)) => p.with_output(w.view(), b.as_ref().map(|b| b.view())),
            None => p,
        }
    }
}
