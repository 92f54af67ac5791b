//! A layer generating token by token: [`Layer::decode_step`] projects the new tokens with the
//! layer's weights (on the device), appends their K and V to the layer's [`KvCache`], attends
//! their queries to the whole cache ([`Decoder::step`]: flash-decoding), and applies `W_O`.

use ndarray::{Array3, ArrayView3, Axis};

use super::plan::Plan;
use super::upload::upload_as;
use super::weights::Layer;
use super::Dtype;
use crate::context::Context;
use crate::decode::{Decoder, KvCache};
use crate::error::{Error, Result};
use crate::gpu::readback;

impl Layer {
    /// The layer's output for `x_new`, `(batch, m, d)`: the next `m` tokens of each sequence,
    /// attending causally to every token already in `cache` and to each other (new token `i`
    /// sees the cache and new tokens `≤ i`), as a causal [`Layer::forward`] over the whole
    /// sequence gives for its last `m` rows. Their K and V are appended to `cache`, so the
    /// next call continues the sequence. A prompt is a first call with many tokens (prefill).
    ///
    /// The layer must be causal, without a mask; the cache's batch, K/V heads and head widths
    /// must be the layer's, and its dtype the layer's (an f16 layer takes an f16 cache).
    ///
    /// # Errors
    /// A layer that is not causal, a cache that does not match it, more tokens than the
    /// cache has room for (the cache is then unchanged), NaN/Inf, and GPU errors.
    pub fn decode_step(
        &self,
        ctx: &Context,
        cache: &mut KvCache,
        x_new: ArrayView3<'_, f32>,
    ) -> Result<Array3<f32>> {
        self.check_context(ctx)?;
        let op = *self.op();
        let p = self.projections();
        let dims = op.dims(x_new.shape(), Some(&p))?;
        if !dims.causal {
            return Err(Error::invalid(
                "decode_step",
                "the layer is not causal: decoding attends each new token to the tokens \
                 before it; build the Layer with Attention::causal(true)",
            ));
        }
        let spec = *cache.spec();
        let (dk_h, dv_h) = (dims.d_k / dims.heads, dims.d_v / dims.heads);
        if (spec.batch, spec.kv_heads, spec.d_k, spec.d_v, spec.dtype)
            != (dims.batch, dims.kv_heads, dk_h, dv_h, op.dtype)
        {
            return Err(Error::shape(format!(
                "decode_step: the cache holds batch {}, {} K/V heads of widths {}/{} in {}; the \
                 layer and X need batch {}, {} K/V heads of widths {}/{} in {}",
                spec.batch,
                spec.kv_heads,
                spec.d_k,
                spec.d_v,
                spec.dtype,
                dims.batch,
                dims.kv_heads,
                dk_h,
                dv_h,
                op.dtype
            )));
        }
        super::check_finite("X", &x_new)?;
        let (batch, m) = (dims.batch, dims.n);
        let plan = op.plan(ctx, &dims)?;
        let [q, k, v] = self.project(ctx, &plan, x_new, dims.d)?;
        // (batch, m, heads·width) → (batch, heads, m, width), as the cache and decoder take.
        let heads_first = |a: Vec<f32>, heads: usize, w: usize| -> Result<ndarray::Array4<f32>> {
            let a = ndarray::Array4::from_shape_vec((batch, m, heads, w), a)
                .map_err(|e| Error::shape(e.to_string()))?;
            Ok(a.permuted_axes([0, 2, 1, 3])
                .as_standard_layout()
                .into_owned())
        };
        let q = heads_first(q, dims.heads, dk_h)?;
        let k = heads_first(k, dims.kv_heads, dk_h)?;
        let v = heads_first(v, dims.kv_heads, dv_h)?;
        match spec.dtype {
            Dtype::F32 => cache.append(ctx, k.view(), v.view())?,
            Dtype::F16 => {
                let half = |a: &ndarray::Array4<f32>| a.mapv(half::f16::from_f32);
                cache.append(ctx, half(&k).view(), half(&v).view())?
            }
        }
        let context = Decoder::new()
            .scale(dims.scale)
            .step(ctx, cache, q.view())?;
        // (batch, heads, m, d_v/H) → (batch, m, d_v), then W_O.
        let context = context
            .permuted_axes([0, 2, 1, 3])
            .as_standard_layout()
            .into_owned()
            .into_shape_with_order((batch, m, dims.d_v))
            .map_err(|e| Error::shape(e.to_string()))?;
        self.output_projection(ctx, &plan, context)
    }

    /// Q, K, V of `x` `(batch, m, d)` by the layer's projections on the device, read back.
    fn project(
        &self,
        ctx: &Context,
        plan: &Plan,
        x: ArrayView3<'_, f32>,
        d: usize,
    ) -> Result<[Vec<f32>; 3]> {
        let op = self.op();
        let rows = x.len_of(Axis(0)) * x.len_of(Axis(1));
        let f16 = op.dtype == Dtype::F16;
        ctx.scoped(|| {
            let _open = ctx.pool.open();
            let x_buf = upload_as(ctx, "X", x.view(), f16)?;
            let mut encoder = ctx.device.create_command_encoder(&Default::default());
            let (q, k, v) = op.record_projections(
                ctx,
                &mut encoder,
                plan,
                (rows, d),
                (&x_buf, f16),
                self.device(),
            )?;
            let w = self.device();
            let pending = [(&q, w.q.cols), (&k, w.k.cols), (&v, w.v.cols)]
                .map(|(b, cols)| readback::copy_out_as(ctx, &mut encoder, b, rows * cols, f16));
            let submission = ctx.queue.submit([encoder.finish()]);
            let mut out = readback::finish(ctx, submission, pending.into())?.into_iter();
            let mut next = || out.next().unwrap_or_default();
            Ok([next(), next(), next()])
        })
    }

    /// `context·W_O + b_O` on the device, or the context as it is without `W_O`.
    fn output_projection(
        &self,
        ctx: &Context,
        plan: &Plan,
        context: Array3<f32>,
    ) -> Result<Array3<f32>> {
        let Some(o) = &self.device().o else {
            return Ok(context);
        };
        let op = self.op();
        let (batch, m, d_v) = context.dim();
        let rows = batch * m;
        let flat = ctx.scoped(|| {
            let _open = ctx.pool.open();
            let c = upload_as(ctx, "context", context.view(), false)?;
            let mut encoder = ctx.device.create_command_encoder(&Default::default());
            let out = op.record_output_projection(
                ctx,
                &mut encoder,
                plan,
                (rows, d_v),
                &c,
                Some(self.device()),
            )?;
            let Some((y, width)) = out else {
                return Ok(Vec::new());
            };
            let pending = readback::copy_out(ctx, &mut encoder, &y, rows * width);
            let submission = ctx.queue.submit([encoder.finish()]);
            Ok(readback::finish(ctx, submission, vec![pending])?.remove(0))
        })?;
        Array3::from_shape_vec((batch, m, o.cols), flat).map_err(|e| Error::shape(e.to_string()))
    }
}
