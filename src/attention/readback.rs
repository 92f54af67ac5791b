//! Readback: the context and, when asked for, the weights copied out in the same encoder,
//! one submit, one wait; the results copied out once, checked for overflow on the way.

use super::Attention;
use crate::context::Context;
use crate::error::Result;
use crate::gpu::readback;
use crate::gpu::timing;
use crate::values::overflow_at as check_overflow_at;

impl Attention {
    /// Finishes `encoder` with the copies out of `context` (its first `context_len` values)
    /// and, when asked for, of `weights` (buffer and length); submits, waits, and returns
    /// them.
    pub(super) async fn read_back(
        &self,
        ctx: &Context,
        mut encoder: wgpu::CommandEncoder,
        context: &crate::gpu::pool::Buf,
        context_len: usize,
        weights: Option<(&crate::gpu::pool::Buf, usize)>,
    ) -> Result<(Vec<f32>, Option<Vec<f32>>)> {
        let mut pending = vec![readback::copy_out(ctx, &mut encoder, context, context_len)];
        if let (true, Some((w, len))) = (self.return_weights, weights) {
            pending.push(readback::copy_out(ctx, &mut encoder, w, len));
        }
        let results = timing::submit_and_read_scanned_async(ctx, encoder, pending).await?;
        let mut results = results.into_iter();
        let (context, bad_context) = results.next().unwrap_or_default();
        let weights = results.next();
        // Finite inputs give finite results unless the arithmetic overflowed (products past
        // f32's range, or f16 operands past f16's): say so rather than return inf or NaN. The
        // copies out found the first such value on their way.
        if !self.propagate {
            check_overflow_at("context", self.dtype, bad_context)?;
            if let Some((_, bad)) = &weights {
                check_overflow_at("weights", self.dtype, *bad)?;
            }
        }
        let weights = weights.map(|(w, _)| w);
        Ok((context, weights))
    }
}
