//! Tensors that stay on the device, and a [`Recorder`] that chains operations on them into
//! one command encoder and one submit.
//!
//! A [`Tensor`] is a buffer on one [`Context`]'s device with a shape and a [`Dtype`]: made from
//! an `ndarray` once ([`Tensor::from_array`]), passed from operation to operation without
//! leaving the device ([`crate::Attention::run`] on tensors, `Inputs::x(&x)` or
//! `Inputs::qkv(&q, &k, &v)`, and [`crate::Layer::run`] on `Inputs::x(&x)` return an
//! `Output<Tensor>`; [`crate::Attention::record`] and [`crate::Layer::record`] record the
//! same into a [`Recorder`]), and read back only when asked ([`Tensor::to_array`]). Cloning
//! a tensor clones the handle, not the data.
//!
//! ```
//! use wgpu_attention::ndarray::{Array2, Array3};
//! use wgpu_attention::{Attention, Context, Dtype, Inputs, Layer, Projections};
//! use wgpu_attention::{Recorder, Tensor};
//! # fn main() -> wgpu_attention::Result<()> {
//! let ctx = Context::new()?;
//! let w = Array2::<f32>::eye(16);
//! let x = Array3::from_shape_fn((2, 5, 16), |(b, i, j)| ((b * 80 + i * 16 + j) as f32).cos());
//! let p = Projections::new(w.view(), w.view(), w.view());
//! let op = Attention::new().heads(4).causal(true).return_weights(false);
//! let (l1, l2) = (Layer::new(&ctx, op, &p)?, Layer::new(&ctx, op, &p)?);
//! let x = Tensor::from_array(&ctx, x.view().into_dyn(), Dtype::F32)?; // uploaded once
//! let mut rec = Recorder::new(&ctx);
//! let h = l1.record(&mut rec, Inputs::x(&x))?.context; // stays on the device
//! let y = l2.record(&mut rec, Inputs::x(&h))?.context;
//! rec.submit()?; // both layers, one encoder, one submit
//! let y = y.to_array(&ctx)?; // the only readback
//! assert_eq!(y.shape(), &[2, 5, 16]);
//! # Ok(()) }
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ndarray::{ArrayD, ArrayViewD, IxDyn};

use crate::context::Context;
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::gpu::buffer::Buf;
use crate::gpu::pool::OpenGuard;
use crate::gpu::readback;
use crate::gpu::timing;

/// An array on the device (see the [module](self)).
#[derive(Clone, Debug)]
pub struct Tensor {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    buffer: Buf,
    shape: Vec<usize>,
    dtype: Dtype,
    context: u64,
    /// Set once the commands that write the tensor were submitted.
    submitted: Arc<AtomicBool>,
}

impl Tensor {
    /// Uploads `a` as `dtype` (f16 rounds each value, and needs `Features::SHADER_F16`).
    ///
    /// # Errors
    /// An empty array, NaN/Inf, a value past f16's range under f16, an adapter without f16,
    /// a size over the device's limits, and GPU errors.
    pub fn from_array(ctx: &Context, a: ArrayViewD<'_, f32>, dtype: Dtype) -> Result<Tensor> {
        if a.is_empty() {
            return Err(Error::invalid(
                "tensor",
                format!("empty array of shape {:?}", a.shape()),
            ));
        }
        let f16 = dtype == Dtype::F16;
        if f16 {
            ctx.require_f16()?;
        }
        // One pass: copied from `a`'s layout into the device's memory, NaN/Inf and f16's
        // range checked on the way (the first bad value named at its index in `a`).
        let how = crate::gpu::upload::Stored {
            f16,
            finite: true,
            dry: false,
        };
        let buffer = ctx.scoped(|| crate::gpu::upload::array(ctx, "tensor", &a, how))?;
        // The caller's, not the pool's: held as long as the tensor is (not in the pool's
        // figures, which count what calls hand back).
        Ok(Tensor::new(
            ctx,
            Buf::unpooled(buffer.detach()),
            a.shape().to_vec(),
            dtype,
            Arc::new(AtomicBool::new(true)),
        ))
    }

    pub(crate) fn new(
        ctx: &Context,
        buffer: Buf,
        shape: Vec<usize>,
        dtype: Dtype,
        submitted: Arc<AtomicBool>,
    ) -> Tensor {
        Tensor {
            inner: Arc::new(Inner {
                buffer,
                shape,
                dtype,
                context: ctx.id(),
                submitted,
            }),
        }
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.inner.shape
    }

    /// The element type on the device.
    pub fn dtype(&self) -> Dtype {
        self.inner.dtype
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.inner.shape.iter().product()
    }

    /// Whether it has no elements (never, for a tensor this crate made).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The buffer, checked to belong to `ctx` and to have been written (its recorder
    /// submitted).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `what` otherwise.
    pub(crate) fn buffer(&self, ctx: &Context, what: &str) -> Result<&wgpu::Buffer> {
        self.buf(ctx, what).map(|b| &**b)
    }

    /// [`Tensor::buffer`] as the pool's handle: what a readback that maps it where it lies
    /// holds on to.
    ///
    /// # Errors
    /// As [`Tensor::buffer`].
    pub(crate) fn buf(&self, ctx: &Context, what: &str) -> Result<&Buf> {
        if self.inner.context != ctx.id() {
            return Err(Error::invalid(
                what,
                "the tensor lives on another Context's device: make it on the context you call with",
            ));
        }
        Ok(&self.inner.buffer)
    }

    /// The buffer as an input of an operation recorded into `rec`: of `rec`'s context, and
    /// written by a submitted recorder or by `rec` itself (earlier in its order).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `what` otherwise.
    pub(crate) fn input(&self, rec: &Recorder<'_>, what: &str) -> Result<&wgpu::Buffer> {
        let buffer = self.buffer(rec.ctx, what)?;
        if !rec.sees(&self.inner.submitted) {
            return Err(Error::invalid(
                what,
                "it comes from another Recorder that was not submitted yet: submit that one first",
            ));
        }
        Ok(buffer)
    }

    /// Reads the tensor back (f16 widened to f32).
    ///
    /// # Errors
    /// A tensor of another context, one whose [`Recorder`] was never submitted, and GPU
    /// errors.
    pub fn to_array(&self, ctx: &Context) -> Result<ArrayD<f32>> {
        let buffer = self.buffer(ctx, "tensor")?;
        if !self.inner.submitted.load(Ordering::Acquire) {
            return Err(Error::invalid(
                "tensor",
                "it was recorded but its Recorder was never submitted: call Recorder::submit first",
            ));
        }
        let f16 = self.dtype() == Dtype::F16;
        let values = ctx.scoped(|| {
            let _open = ctx.pool.open();
            readback::read_as(ctx, buffer, self.len(), f16)
        })?;
        ArrayD::from_shape_vec(IxDyn(self.shape()), values).map_err(|e| Error::shape(e.to_string()))
    }
}

/// Records operations on tensors into one command encoder, submitted together by
/// [`Recorder::submit`] (see the [module](self)). The tensors an operation returns hold its
/// results once the recorder is submitted; reading one before is an error, and dropping the
/// recorder unsubmitted discards its work.
pub struct Recorder<'c> {
    pub(crate) ctx: &'c Context,
    encoder: wgpu::CommandEncoder,
    submitted: Arc<AtomicBool>,
    _open: OpenGuard,
}

impl std::fmt::Debug for Recorder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").finish_non_exhaustive()
    }
}

impl<'c> Recorder<'c> {
    /// A new, empty recorder on `ctx`. With profiling on ([`Context::set_profiling`]), its
    /// kernels are timed and [`Context::kernel_times`] has them after [`Recorder::submit`].
    pub fn new(ctx: &'c Context) -> Self {
        let open = ctx.pool.open();
        timing::begin(ctx);
        Recorder {
            ctx,
            encoder: ctx
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("recorder"),
                }),
            submitted: Arc::new(AtomicBool::new(false)),
            _open: open,
        }
    }

    /// Submits everything recorded, in order, as one command buffer. It does not wait (reads
    /// of the results, or [`Context::synchronize`], wait for it), except with timestamp
    /// profiling on, when it reads the kernels' times back.
    ///
    /// # Errors
    /// GPU validation, out-of-memory and device-lost errors.
    pub fn submit(self) -> Result<()> {
        let Recorder {
            ctx,
            mut encoder,
            submitted,
            _open,
        } = self;
        ctx.scoped(|| {
            let profile = timing::end(ctx, &mut encoder);
            let submission = ctx.queue.submit([encoder.finish()]);
            if let Some((pending, labels)) = profile {
                let words = readback::finish(ctx, submission, vec![pending])?;
                timing::store(ctx, words.first().map_or(&[][..], |w| w), &labels);
            }
            Ok(())
        })?;
        submitted.store(true, Ordering::Release);
        Ok(())
    }

    /// The flag set when this recorder is submitted.
    pub(crate) fn flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.submitted)
    }

    /// Whether work flagged by `flag` (a recorder's [`Recorder::flag`]) is visible to what
    /// this recorder records: submitted already, or recorded earlier into this one.
    pub(crate) fn sees(&self, flag: &Arc<AtomicBool>) -> bool {
        Arc::ptr_eq(flag, &self.submitted) || flag.load(Ordering::Acquire)
    }

    /// The encoder, for the operations that record into it.
    pub(crate) fn encoder(&mut self) -> &mut wgpu::CommandEncoder {
        &mut self.encoder
    }

    /// What [`Recorder::tensor`] does, as a function that holds no borrow of the recorder
    /// (for code that records into its encoder meanwhile).
    pub(crate) fn wrapper(&self) -> impl Fn(Buf, Vec<usize>) -> Tensor + 'c {
        let (ctx, submitted) = (self.ctx, Arc::clone(&self.submitted));
        move |buffer, shape| Tensor::new(ctx, buffer, shape, Dtype::F32, Arc::clone(&submitted))
    }

    /// Wraps a result buffer of this recorder as a tensor.
    pub(crate) fn tensor(&self, buffer: Buf, shape: Vec<usize>) -> Tensor {
        Tensor::new(
            self.ctx,
            buffer,
            shape,
            Dtype::F32,
            Arc::clone(&self.submitted),
        )
    }
}
