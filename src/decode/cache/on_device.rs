//! Appending to the cache from device buffers: the tensor form ([`KvCache::append_record`])
//! and what [`crate::Layer::decode_record`] records (the projections' K and V moved into the
//! cache's row order by `swap_heads.wgsl`, then copied into place), and the bookkeeping of an
//! append recorded into a [`Recorder`] not yet submitted.

use std::sync::atomic::Ordering;

use super::{elem_bytes, padded, KvCache};
use crate::context::Context;
use crate::dtype::Dtype;
use crate::error::{Error, Limit, Result};
use crate::gpu::buffer;
use crate::kernels::swap_heads::SwapHeads;
use crate::tensor::{Recorder, Tensor};

/// Where the new tokens' K or V lie in a device buffer: element `(b, i, h, c)` (batch, token,
/// K/V head, column) at `off + b·strides[0] + i·strides[1] + h·strides[2] + c`, the rows
/// layout the projections write.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowsSource<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub strides: [usize; 3],
    pub off: usize,
    pub f16: bool,
}

impl<'a> RowsSource<'a> {
    /// A dense `(batch, m, heads, width)` buffer.
    pub fn dense(buffer: &'a wgpu::Buffer, [m, heads, width]: [usize; 3], f16: bool) -> Self {
        RowsSource {
            buffer,
            strides: [m * heads * width, heads * width, width],
            off: 0,
            f16,
        }
    }
}

impl KvCache {
    /// [`KvCache::append`] from tensors already on the device, in the rows layout the
    /// projections write: K `(batch, m, kv_heads, d_k)` and V `(batch, m, kv_heads, d_v)`, of
    /// the cache's dtype. Recorded into `rec` (a kernel moves the rows into the cache's order,
    /// then copies place them): nothing goes through the host. The tokens count from now on,
    /// and are written when `rec` is submitted; until then only operations recorded into the
    /// same `rec` may use the cache (anything else is an error, and a recorder dropped
    /// unsubmitted leaves the cache needing [`KvCache::clear`]).
    ///
    /// # Errors
    /// As [`KvCache::append`] (the cache unchanged), and tensors of another context or not
    /// yet written. Values are not checked for NaN/Inf: tensors are checked when made.
    pub fn append_record(&mut self, rec: &mut Recorder<'_>, k: &Tensor, v: &Tensor) -> Result<()> {
        let ctx = rec.ctx;
        self.check_context(ctx)?;
        self.check_written(Some(rec))?;
        let s = self.spec;
        let mut m = None;
        for (name, t, d) in [("K", k, s.d_k), ("V", v, s.d_v)] {
            let rows = match *t.shape() {
                [b, m, h, w] if [b, h, w] == [s.batch, s.kv_heads, d] => m,
                ref shape => {
                    return Err(Error::shape(format!(
                        "KV cache append: {name} is {shape:?}, the cache takes (batch, m, \
                         kv_heads, d) = [{}, m, {}, {d}] on the device",
                        s.batch, s.kv_heads
                    )))
                }
            };
            if t.dtype() != s.dtype {
                return Err(Error::invalid(
                    "KV cache append",
                    format!("the cache stores {} but {name} is {}", s.dtype, t.dtype()),
                ));
            }
            if m.is_some_and(|m| m != rows) {
                return Err(Error::shape(format!(
                    "KV cache append: K has {} tokens and V {rows}",
                    m.unwrap_or_default()
                )));
            }
            m = Some(rows);
        }
        let m = m.unwrap_or_default();
        self.check_room(m)?;
        let f16 = s.dtype == Dtype::F16;
        let what = "KV cache append";
        let ks = RowsSource::dense(k.input(rec, what)?, [m, s.kv_heads, s.d_k], f16);
        let vs = RowsSource::dense(v.input(rec, what)?, [m, s.kv_heads, s.d_v], f16);
        let held = self.len;
        let recorded = ctx.scoped(|| self.record_append(ctx, rec.encoder(), ks, vs, m));
        // Copies may sit in `rec` even on a failure (rows past the count, rewritten by the next
        // append): the cache waits for `rec` either way, and counts the tokens only on success.
        self.mark_pending(rec);
        recorded.inspect_err(|_| self.truncate(held))
    }

    /// Records the append of `m` tokens' K and V from device buffers (see [`RowsSource`]),
    /// checked to fit; counts them at once.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] past the capacity (nothing recorded); GPU errors.
    pub(crate) fn record_append(
        &mut self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        k: RowsSource<'_>,
        v: RowsSource<'_>,
        m: usize,
    ) -> Result<()> {
        self.check_room(m)?;
        let s = self.spec;
        let f16 = s.dtype == Dtype::F16;
        let texel = 4 * elem_bytes(s.dtype);
        for (plane, src, d) in [(&self.k, k, s.d_k), (&self.v, v, s.d_v)] {
            let swap = SwapHeads {
                n: [s.batch, m, s.kv_heads],
                w: d,
                dw: padded(d),
                strides: src.strides,
                off: src.off,
                src_f16: src.f16,
                dst_f16: f16,
            };
            let staging = match f16 {
                true => buffer::output_f16(ctx, "KV cache append", swap.dst_len())?,
                false => buffer::output(ctx, "KV cache append", swap.dst_len(), false)?,
            };
            swap.record(ctx, encoder, src.buffer, &staging)?;
            for (src_row, rows) in self.placements(m) {
                plane.copy_rows(encoder, &staging, src_row, rows, texel);
            }
        }
        self.len += m;
        Ok(())
    }

    /// Forgets the tokens past the first `len` (a recorded append whose operation failed).
    pub(crate) fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// The tokens counted so far are written when `rec` is submitted.
    pub(crate) fn mark_pending(&mut self, rec: &Recorder<'_>) {
        self.pending = Some(rec.flag());
    }

    /// `Err` when `m` more tokens do not fit.
    pub(crate) fn check_room(&self, m: usize) -> Result<()> {
        // A rolling cache takes any number of appends, each at most its capacity.
        let needed = if self.rolling { m } else { self.len + m };
        if needed > self.spec.capacity {
            return Err(Error::LimitExceeded {
                what: "KV cache append".into(),
                needed: match self.rolling {
                    true => format!("{m} tokens in one append (a rolling cache)"),
                    false => format!("{} tokens ({} held + {m})", self.len + m, self.len),
                },
                limit: format!("{} tokens", self.spec.capacity),
                limit_name: Limit::KvCacheCapacity,
            });
        }
        Ok(())
    }

    /// `Err` when the last append was recorded into a recorder not yet submitted, unless that
    /// is `rec`.
    pub(crate) fn check_written(&self, rec: Option<&Recorder<'_>>) -> Result<()> {
        let Some(flag) = &self.pending else {
            return Ok(());
        };
        if flag.load(Ordering::Acquire) || rec.is_some_and(|r| r.sees(flag)) {
            return Ok(());
        }
        Err(Error::invalid(
            "KV cache",
            "its last append was recorded into a Recorder that was not submitted: submit that \
             one first (if it was dropped, its tokens are missing: clear() the cache)",
        ))
    }
}
