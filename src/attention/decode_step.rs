//! A layer generating token by token: [`Layer::decode`] projects the new tokens with the
//! layer's weights, appends their K and V to the layer's [`KvCache`], attends their queries to
//! the whole cache ([`Decoder::step`]: flash-decoding), and applies `W_O`: all on the device,
//! recorded into one encoder ([`Layer::decode_record`]), with one readback at the end (none
//! when the output is a tensor feeding the next layer).

use ndarray::{Array3, ArrayView3};

use super::weights::Layer;
use super::Dtype;
use crate::context::Context;
use crate::decode::{Decoder, KvCache, RowsSource};
use crate::error::{Error, Result};
use crate::tensor::{Recorder, Tensor};

impl Layer {
    /// The layer's output for `x_new`, `(batch, m, d)`: the next `m` tokens of each sequence,
    /// attending causally to every token already in `cache` and to each other (new token `i`
    /// sees the cache and new tokens `≤ i`), as a causal [`Layer::run`] over the whole
    /// sequence gives for its last `m` rows. Their K and V are appended to `cache`, so the
    /// next call continues the sequence. A prompt is a first call with many tokens (prefill).
    ///
    /// The layer must be causal, without a mask; the cache's batch, K/V heads and head widths
    /// must be the layer's, and its dtype the layer's (an f16 layer takes an f16 cache).
    ///
    /// # Errors
    /// A layer that is not causal, a cache that does not match it, more tokens than the
    /// cache has room for (the cache is then unchanged), NaN/Inf, and GPU errors.
    pub fn decode(
        &self,
        ctx: &Context,
        cache: &mut KvCache,
        x_new: ArrayView3<'_, f32>,
    ) -> Result<Array3<f32>> {
        self.check_context(ctx)?;
        // Checked here (finite, and in f16's range for an f16 layer) before anything moves.
        let x = Tensor::from_array(ctx, x_new.into_dyn(), self.op().dtype)?;
        let mut rec = Recorder::new(ctx);
        let y = self.decode_record(&mut rec, cache, &x)?;
        rec.submit()?;
        let y = y.to_array(ctx)?;
        let flat = y.as_slice().unwrap_or_default();
        crate::values::check_overflow("decode output", self.op().dtype, flat)?;
        y.into_dimensionality()
            .map_err(|e| Error::shape(e.to_string()))
    }

    /// [`Layer::decode`] on a tensor `x_new` `(batch, m, d)` already on the device,
    /// recorded into `rec`: the projections, the append of K and V to `cache`, the step and
    /// `W_O` run in one encoder, and the output `(batch, m, d_out)` (f32) stays on the device,
    /// so the next layer can be recorded after it and a whole model's step is one submit. The
    /// cache counts the new tokens at once (see [`KvCache::append_record`]).
    ///
    /// # Errors
    /// As [`Layer::decode`] (the cache unchanged), and a tensor of another context or
    /// not yet written.
    pub fn decode_record(
        &self,
        rec: &mut Recorder<'_>,
        cache: &mut KvCache,
        x_new: &Tensor,
    ) -> Result<Tensor> {
        let ctx = rec.ctx;
        self.check_context(ctx)?;
        cache.check_context(ctx)?;
        cache.check_written(Some(rec))?;
        let op = *self.op();
        let dims = op.dims(x_new.shape(), Some(&self.projections()))?;
        if x_new.shape().len() != 3 {
            return Err(Error::shape(format!(
                "Layer::decode: X must be (batch, m, d), got {:?}",
                x_new.shape()
            )));
        }
        if !dims.causal {
            return Err(Error::invalid(
                "Layer::decode",
                "the layer is not causal: decoding attends each new token to the tokens before \
                 it; build the Layer with Attention::causal(true)",
            ));
        }
        let spec = *cache.spec();
        let (dk_h, dv_h) = (dims.d_k / dims.heads, dims.d_v / dims.heads);
        if (spec.batch, spec.kv_heads, spec.d_k, spec.d_v, spec.dtype)
            != (dims.batch, dims.kv_heads, dk_h, dv_h, op.dtype)
        {
            return Err(Error::shape(format!(
                "Layer::decode: the cache holds batch {}, {} K/V heads of widths {}/{} in {}; the \
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
        let (batch, m) = (dims.batch, dims.n);
        // The append's own error, before anything is recorded.
        cache.check_room(m)?;
        let plan = op.plan(ctx, &dims)?;
        let decoder = Decoder::new().scale(dims.scale);
        let problem_dims = [batch, dims.heads, m, dk_h];
        let x = x_new.input(rec, "X")?;
        let x_f16 = x_new.dtype() == Dtype::F16;
        let f16 = op.dtype == Dtype::F16;
        let held = cache.len();
        let recorded = ctx.scoped(|| {
            let encoder = rec.encoder();
            let w = self.device();
            let (q, k, v) =
                op.record_projections(ctx, encoder, &plan, (batch * m, dims.d), (x, x_f16), w)?;
            let dense = |b, heads, width| RowsSource::dense(b, [m, heads, width], f16);
            let (ks, vs) = (
                dense(&k, dims.kv_heads, dk_h),
                dense(&v, dims.kv_heads, dv_h),
            );
            cache.record_append(ctx, encoder, ks, vs, m)?;
            let problem = decoder.problem(cache, problem_dims, "Q is")?;
            let context = decoder.record_rows(ctx, encoder, cache, &problem, &q, f16)?;
            let rows = (batch * m, dims.d_v);
            let out = op.record_output_projection(ctx, encoder, &plan, rows, &context, Some(w))?;
            Ok(out.unwrap_or((context, dims.d_v)))
        });
        // A failure after the append was recorded takes its tokens back out of the count.
        // Copies into the cache may sit in `rec` even on a failure: it waits for `rec` either way.
        cache.mark_pending(rec);
        let (y, width) = recorded.inspect_err(|_| cache.truncate(held))?;
        Ok(rec.tensor(y, vec![batch, m, width]))
    }
}
