//! The KV cache: K and V of every token so far, on the device, appended to in place.

use ndarray::ArrayView4;

use crate::attention::Dtype;
use crate::context::Context;
use crate::error::{Error, Result};

/// The sizes of a [`KvCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheSpec {
    /// The most tokens it holds.
    pub capacity: usize,
    /// Sequences decoded side by side.
    pub batch: usize,
    /// K/V heads (fewer than the query heads for grouped-query attention).
    pub kv_heads: usize,
    /// Width of one K head (and of one query head).
    pub d_k: usize,
    /// Width of one V head (and of one output head).
    pub d_v: usize,
    /// How K and V are stored: f32, or f16 (half the memory; arithmetic stays f32).
    pub dtype: Dtype,
}

/// An element type K and V can be appended in: `f32` into an f32 cache, [`half::f16`] into an
/// f16 cache. A cache never converts silently: appending the other type is an error.
pub trait CacheElement: bytemuck::Pod + sealed::Sealed {
    /// The cache dtype it belongs to.
    const DTYPE: Dtype;
    /// Zero, the padding of a row to whole vec4s.
    const ZERO: Self;
    /// Whether it is finite.
    fn finite(self) -> bool;
    /// Its value as f32.
    fn to_f32(self) -> f32;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
}

impl CacheElement for f32 {
    const DTYPE: Dtype = Dtype::F32;
    const ZERO: Self = 0.0;
    fn finite(self) -> bool {
        self.is_finite()
    }
    fn to_f32(self) -> f32 {
        self
    }
}

impl CacheElement for half::f16 {
    const DTYPE: Dtype = Dtype::F16;
    const ZERO: Self = half::f16::ZERO;
    fn finite(self) -> bool {
        self.is_finite()
    }
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
}

/// K and V of every token so far for one attention layer, held on the device for
/// [`crate::decode::Decoder`].
///
/// Layout (device memory, head-major): K is `(batch, kv_heads, capacity, d_k')` and V
/// `(batch, kv_heads, capacity, d_v')`, each row padded with zeros to `d'`, a multiple of 4
/// (one vec4), so the keys a decode workgroup reads are one contiguous range. An append
/// uploads the new tokens once (one `write_buffer` per array) and copies each head's rows into
/// place on the device (one submit, no wait).
///
/// Every error leaves the cache exactly as it was: all checks run before anything is written.
#[derive(Debug)]
pub struct KvCache {
    spec: KvCacheSpec,
    len: usize,
    k: wgpu::Buffer,
    v: wgpu::Buffer,
    ctx_id: u64,
}

/// `d` rounded up to whole vec4s.
fn padded(d: usize) -> usize {
    d.next_multiple_of(4)
}

impl KvCache {
    /// An empty cache of `spec` on `ctx`'s device (K and V allocated for the full capacity).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a size is 0; [`Error::Unsupported`] for f16 on a device
    /// without `SHADER_F16`; [`Error::LimitExceeded`] when K or V would exceed the device's
    /// buffer limits.
    pub fn new(ctx: &Context, spec: KvCacheSpec) -> Result<Self> {
        for (name, n) in [
            ("capacity", spec.capacity),
            ("batch", spec.batch),
            ("kv_heads", spec.kv_heads),
            ("d_k", spec.d_k),
            ("d_v", spec.d_v),
        ] {
            if n == 0 {
                return Err(Error::invalid("KV cache", format!("{name} is 0")));
            }
        }
        if spec.dtype == Dtype::F16 {
            ctx.require_f16()?;
        }
        ctx.check_alive()?;
        let rows = spec.capacity * spec.batch * spec.kv_heads;
        let alloc = |what: &str, d: usize| -> Result<wgpu::Buffer> {
            let len = rows
                .checked_mul(padded(d))
                .ok_or_else(|| Error::invalid("KV cache", "capacity overflows"))?;
            crate::gpu::buffer::check_len(ctx, what, len)?;
            let bytes = (len * elem_bytes(spec.dtype)) as u64;
            ctx.scoped(|| {
                Ok(ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(what),
                    size: bytes,
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_DST
                        | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                }))
            })
        };
        Ok(KvCache {
            k: alloc("KV cache K", spec.d_k)?,
            v: alloc("KV cache V", spec.d_v)?,
            spec,
            len: 0,
            ctx_id: ctx.id(),
        })
    }

    /// Its sizes.
    pub fn spec(&self) -> &KvCacheSpec {
        &self.spec
    }

    /// Tokens held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no token.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most tokens it can hold.
    pub fn capacity(&self) -> usize {
        self.spec.capacity
    }

    /// Device memory held by K and V, in bytes (the full capacity, allocated up front).
    pub fn memory_bytes(&self) -> u64 {
        self.k.size() + self.v.size()
    }

    /// Forgets every token (the memory stays allocated for the next sequence).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Appends `m` tokens' K `(batch, kv_heads, m, d_k)` and V `(batch, kv_heads, m, d_v)`
    /// (PyTorch's layout, as [`crate::Attention::sdpa`] takes them), written into the device
    /// buffers with one `write_buffer` each; nothing is read back. `T` is `f32` for an f32
    /// cache and [`half::f16`] for an f16 one. An empty append (`m = 0`) does nothing.
    ///
    /// # Errors
    /// One-line errors, the cache left unchanged: a cache made on another [`Context`]
    /// ([`Error::InvalidArgument`]); `T` not the cache's dtype ([`Error::InvalidArgument`]);
    /// a batch, head count or width that is not the cache's, or K and V of different lengths
    /// ([`Error::ShapeMismatch`]); more tokens than the capacity left
    /// ([`Error::LimitExceeded`]); NaN or infinity ([`Error::NonFinite`]); GPU errors.
    pub fn append<T: CacheElement>(
        &mut self,
        ctx: &Context,
        k: ArrayView4<'_, T>,
        v: ArrayView4<'_, T>,
    ) -> Result<()> {
        self.check_context(ctx)?;
        let s = self.spec;
        if T::DTYPE != s.dtype {
            return Err(Error::invalid(
                "KV cache append",
                format!(
                    "the cache stores {} but K and V are {}: append {} arrays (an f16 cache \
                     takes half::f16, an f32 cache f32)",
                    s.dtype,
                    T::DTYPE,
                    s.dtype
                ),
            ));
        }
        let m = k.dim().2;
        for (name, a, d) in [("K", &k, s.d_k), ("V", &v, s.d_v)] {
            let want = [s.batch, s.kv_heads, m, d];
            if a.shape() != want {
                return Err(Error::shape(format!(
                    "KV cache append: {name} is {:?}, the cache takes (batch, kv_heads, m, d) = \
                     {want:?}",
                    a.shape()
                )));
            }
        }
        if m == 0 {
            return Ok(());
        }
        if self.len + m > s.capacity {
            return Err(Error::LimitExceeded {
                what: "KV cache append".into(),
                needed: format!("{} tokens ({} held + {m})", self.len + m, self.len),
                limit: format!("{} tokens", s.capacity),
                limit_name: "KV cache capacity",
            });
        }
        for (name, a) in [("K", &k), ("V", &v)] {
            if let Some((idx, x)) = a.indexed_iter().find(|(_, x)| !x.finite()) {
                return Err(Error::NonFinite {
                    array: format!("appended {name}"),
                    value: x.to_f32(),
                    index: vec![idx.0, idx.1, idx.2, idx.3],
                });
            }
        }
        let k_rows = padded_rows(&k, padded(s.d_k));
        let v_rows = padded_rows(&v, padded(s.d_v));
        let bytes = elem_bytes(s.dtype);
        ctx.scoped(|| {
            let mut encoder = ctx
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("KV cache append"),
                });
            for (cache, rows, d) in [(&self.k, &k_rows, s.d_k), (&self.v, &v_rows, s.d_v)] {
                let incoming = ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("KV cache append"),
                    size: (rows.len() * bytes) as u64,
                    usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                ctx.queue
                    .write_buffer(&incoming, 0, bytemuck::cast_slice(rows));
                // Head `bh`'s m new rows go after its `len` rows.
                let head = (m * padded(d) * bytes) as u64;
                for bh in 0..s.batch * s.kv_heads {
                    let at = ((bh * s.capacity + self.len) * padded(d) * bytes) as u64;
                    encoder.copy_buffer_to_buffer(&incoming, bh as u64 * head, cache, at, head);
                }
            }
            ctx.queue.submit([encoder.finish()]);
            Ok(())
        })?;
        self.len += m;
        Ok(())
    }

    /// `Err` unless the cache was made on `ctx`.
    pub(crate) fn check_context(&self, ctx: &Context) -> Result<()> {
        if self.ctx_id != ctx.id() {
            return Err(Error::invalid(
                "KV cache",
                "it was made on another Context: use the context it was created with",
            ));
        }
        Ok(())
    }

    /// The device buffers K and V.
    pub(crate) fn buffers(&self) -> (&wgpu::Buffer, &wgpu::Buffer) {
        (&self.k, &self.v)
    }
}

/// Bytes per stored element.
fn elem_bytes(dtype: Dtype) -> usize {
    match dtype {
        Dtype::F32 => 4,
        Dtype::F16 => 2,
    }
}

/// `a` `(batch, heads, m, d)` row-major, each row zero-padded to `width`.
fn padded_rows<T: CacheElement>(a: &ArrayView4<'_, T>, width: usize) -> Vec<T> {
    let d = a.dim().3;
    let mut out = Vec::with_capacity(a.len() / d.max(1) * width);
    for row in a.rows() {
        out.extend(row.iter().copied());
        out.resize(out.len() + width - d, T::ZERO);
    }
    out
}
