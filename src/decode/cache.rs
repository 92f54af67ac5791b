//! The KV cache: K and V of every token so far, on the device, appended to in place.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use ndarray::ArrayView4;

use crate::context::Context;
use crate::dtype::Dtype;
use crate::error::{Error, Limit, Result};

/// The sizes of a [`KvCache`]: [`KvCacheSpec::new`], then [`KvCacheSpec::dtype`] for f16.
///
/// ```
/// use wgpu_attention::{Dtype, KvCacheSpec};
/// let spec = KvCacheSpec::new(256, 1, 8, 64, 64).dtype(Dtype::F16);
/// assert_eq!((spec.capacity, spec.d_v, spec.dtype), (256, 64, Dtype::F16));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
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

impl KvCacheSpec {
    /// `capacity` tokens of `batch` sequences, `kv_heads` K/V heads of widths `d_k` (K) and
    /// `d_v` (V), stored as f32.
    pub fn new(capacity: usize, batch: usize, kv_heads: usize, d_k: usize, d_v: usize) -> Self {
        KvCacheSpec {
            capacity,
            batch,
            kv_heads,
            d_k,
            d_v,
            dtype: Dtype::F32,
        }
    }
}

crate::setters::setters!(KvCacheSpec {
    capacity: usize,
    dtype: Dtype
});

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
/// Layout (device memory): K and V are each a 2-D texture (`rgba32float`, or `rgba16float`
/// for f16: four values per texel), rows head-major — row `(b·kv_heads + h)·capacity + t`
/// holds token `t` of K/V head `h` of sequence `b`, padded with zeros to whole texels —
/// and as many whole rows per texture line as the device's `max_texture_dimension_2d`
/// allows, so the keys a decode workgroup reads are one contiguous range. (Textures rather
/// than storage buffers: texel fetches are several times cheaper on lavapipe.) An append
/// uploads the new tokens once (one `write_buffer` per array) and copies each head's rows into
/// place on the device (one submit, no wait).
///
/// Every error leaves the cache exactly as it was: all checks run before anything is written.
#[derive(Debug)]
pub struct KvCache {
    spec: KvCacheSpec,
    len: usize,
    /// Keeps only the last `capacity` tokens, overwriting the oldest ([`KvCache::rolling`]).
    rolling: bool,
    k: Plane,
    v: Plane,
    ctx_id: u64,
    /// The submitted-flag of the [`crate::Recorder`] the last append was recorded into, until
    /// it is known to be submitted: the tokens counted in `len` are written only then.
    pending: Option<Arc<AtomicBool>>,
}

/// One of K and V: its texture, view and line layout.
#[derive(Debug)]
struct Plane {
    texture: wgpu::Texture,
    view: wgpu::TextureView,
    lines: Lines,
}

/// How cache rows lie in a texture: `per_line` rows of `d4` texels per line, `lines` lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lines {
    pub d4: usize,
    pub per_line: usize,
    pub lines: usize,
}

impl Lines {
    /// The layout of `rows` rows of `d4` texels of `texel_bytes` each under a side limit of
    /// `max` texels: rows per line a multiple of 256 bytes' worth of texels (what a copy of
    /// several lines needs), and no more than `rows` need.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] when one aligned group of rows is wider than `max`, or the
    /// lines are more than `max`.
    pub fn new(what: &str, rows: usize, d4: usize, texel_bytes: usize, max: u32) -> Result<Self> {
        let max = max as usize;
        let align = 256 / texel_bytes;
        let per_line = (max / d4.max(1) / align * align).min(rows.next_multiple_of(align));
        let too_big = |needed: String, limit: String| Error::LimitExceeded {
            what: what.to_string(),
            needed,
            limit,
            limit_name: Limit::MaxTextureDimension2d,
        };
        if per_line == 0 {
            return Err(too_big(
                format!("{} texels per line", d4 * align),
                format!("{max} texels"),
            ));
        }
        let lines = rows.div_ceil(per_line);
        if lines > max {
            return Err(too_big(
                format!("{lines} texture lines"),
                format!("{max} lines"),
            ));
        }
        Ok(Lines {
            d4,
            per_line,
            lines,
        })
    }
}

/// `d` rounded up to whole vec4s.
fn padded(d: usize) -> usize {
    d.next_multiple_of(4)
}

impl KvCache {
    /// An empty cache of `spec` on `ctx`'s device (K and V allocated for the full capacity).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a size is 0; [`Error::LimitExceeded`] when K or V would
    /// exceed the device's texture limits.
    pub fn new(ctx: &Context, spec: KvCacheSpec) -> Result<Self> {
        Self::with_side_limit(ctx, spec, ctx.limits().max_texture_dimension_2d)
    }

    /// [`KvCache::new`] with textures no wider or taller than `max` texels (tests: rows over
    /// several lines without a huge cache).
    pub(crate) fn with_side_limit(ctx: &Context, spec: KvCacheSpec, max: u32) -> Result<Self> {
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
        ctx.check_alive()?;
        let rows = spec
            .capacity
            .checked_mul(spec.batch * spec.kv_heads)
            .ok_or_else(|| Error::invalid("KV cache", "capacity overflows"))?;
        u32::try_from(rows * padded(spec.d_k.max(spec.d_v)) / 4).map_err(|_| {
            Error::LimitExceeded {
                what: "KV cache".into(),
                needed: format!("{rows} rows"),
                limit: format!("{} texels", u32::MAX),
                limit_name: Limit::U32Indexing,
            }
        })?;
        let texel = 4 * elem_bytes(spec.dtype);
        let plane = |what: &str, d: usize| -> Result<Plane> {
            let lines = Lines::new(what, rows, padded(d) / 4, texel, max)?;
            let texture = ctx.scoped(|| {
                Ok(ctx.device.create_texture(&wgpu::TextureDescriptor {
                    label: Some(what),
                    size: wgpu::Extent3d {
                        width: (lines.per_line * lines.d4) as u32,
                        height: lines.lines as u32,
                        depth_or_array_layers: 1,
                    },
                    mip_level_count: 1,
                    sample_count: 1,
                    dimension: wgpu::TextureDimension::D2,
                    format: match spec.dtype {
                        Dtype::F32 => wgpu::TextureFormat::Rgba32Float,
                        Dtype::F16 => wgpu::TextureFormat::Rgba16Float,
                    },
                    // COPY_SRC: the WGSL sanitizer reads every bound texture back.
                    usage: wgpu::TextureUsages::TEXTURE_BINDING
                        | wgpu::TextureUsages::COPY_DST
                        | wgpu::TextureUsages::COPY_SRC,
                    view_formats: &[],
                }))
            })?;
            let view = texture.create_view(&Default::default());
            Ok(Plane {
                texture,
                view,
                lines,
            })
        };
        Ok(KvCache {
            k: plane("KV cache K", spec.d_k)?,
            v: plane("KV cache V", spec.d_v)?,
            spec,
            len: 0,
            rolling: false,
            ctx_id: ctx.id(),
            pending: None,
        })
    }

    /// This cache as a rolling one: it keeps the last `capacity` tokens, each append past
    /// the capacity overwriting the oldest, for a [`crate::decode::Decoder`] whose window
    /// preset never reaches further back (`m + left ≤ capacity`: memory O(window), not
    /// O(sequence)). [`KvCache::len`] still counts every token appended (the positions).
    pub fn rolling(mut self) -> Self {
        self.rolling = true;
        self
    }

    /// Whether it is a rolling cache ([`KvCache::rolling`]).
    pub fn is_rolling(&self) -> bool {
        self.rolling
    }

    /// Its sizes.
    pub fn spec(&self) -> &KvCacheSpec {
        &self.spec
    }

    /// Tokens appended since the last [`KvCache::clear`]: those held (a rolling cache holds
    /// the last `capacity` of them), and the position of the next.
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

    /// Device memory held by K and V, in bytes (the full capacity, allocated up front; the
    /// last texture line may be partly unused).
    pub fn memory_bytes(&self) -> u64 {
        let texel = (4 * elem_bytes(self.spec.dtype)) as u64;
        [&self.k.lines, &self.v.lines]
            .iter()
            .map(|l| (l.per_line * l.d4 * l.lines) as u64 * texel)
            .sum()
    }

    /// Forgets every token (the memory stays allocated for the next sequence).
    pub fn clear(&mut self) {
        self.len = 0;
        self.pending = None;
    }

    /// Appends `m` tokens' K `(batch, kv_heads, m, d_k)` and V `(batch, kv_heads, m, d_v)`
    /// (PyTorch's layout, as [`crate::Inputs::qkv`] takes them), written into the device
    /// buffers with one `write_buffer` each; nothing is read back. `T` is `f32` for an f32
    /// cache and [`half::f16`] for an f16 one. An empty append (`m = 0`) does nothing.
    ///
    /// # Errors
    /// One-line errors, the cache left unchanged: a cache made on another [`Context`]
    /// ([`Error::InvalidArgument`]); `T` not the cache's dtype ([`Error::InvalidArgument`]);
    /// a batch, head count or width that is not the cache's, or K and V of different lengths
    /// ([`Error::ShapeMismatch`]); more tokens than the capacity left
    /// ([`Error::LimitExceeded`]), or a row wider than the device's `max_buffer_size` (more
    /// rows than one buffer holds are uploaded in pieces); NaN or infinity
    /// ([`Error::NonFinite`]); GPU errors.
    pub fn append<T: CacheElement>(
        &mut self,
        ctx: &Context,
        k: ArrayView4<'_, T>,
        v: ArrayView4<'_, T>,
    ) -> Result<()> {
        self.check_context(ctx)?;
        self.check_written(None)?;
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
        self.check_room(m)?;
        for (name, a) in [("K", &k), ("V", &v)] {
            if let Some((idx, x)) = a.indexed_iter().find(|(_, x)| !x.finite()) {
                return Err(Error::NonFinite {
                    array: format!("appended {name}"),
                    value: x.to_f32(),
                    index: vec![idx.0, idx.1, idx.2, idx.3],
                });
            }
        }
        let texel = 4 * elem_bytes(s.dtype);
        // The staging holds at most `max_buffer_size` bytes: more rows go in several pieces.
        let max_bytes = ctx.limits().max_buffer_size;
        let mut pieces = Vec::new();
        for d in [s.d_k, s.d_v] {
            let row_bytes = (padded(d) * elem_bytes(s.dtype)) as u64;
            if row_bytes > max_bytes {
                return Err(Error::LimitExceeded {
                    what: "KV cache append".into(),
                    needed: format!("{row_bytes} bytes per row"),
                    limit: format!("{max_bytes} bytes"),
                    limit_name: Limit::MaxBufferSize,
                });
            }
            pieces.push(staging_pieces(
                &self.placements(m),
                s.batch * s.kv_heads * m,
                (max_bytes / row_bytes) as usize,
            ));
        }
        let k_rows = padded_rows(&k, padded(s.d_k));
        let v_rows = padded_rows(&v, padded(s.d_v));
        ctx.scoped(|| {
            // The staging comes from the pool (a decode loop appends every step); it is free,
            // so nothing submitted earlier still reads it when the write lands.
            let _open = ctx.pool.open();
            let mut encoder = ctx
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("KV cache append"),
                });
            let mut held = Vec::new();
            for ((plane, rows), pieces) in [(&self.k, &k_rows), (&self.v, &v_rows)]
                .into_iter()
                .zip(&pieces)
            {
                let width = plane.lines.d4 * 4;
                for (src, copies) in pieces {
                    let part = &rows[src.start * width..src.end * width];
                    let incoming = ctx.pool.take(
                        &ctx.device,
                        "KV cache append",
                        std::mem::size_of_val(part) as u64,
                        wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                        max_bytes,
                    );
                    ctx.queue
                        .write_buffer(&incoming, 0, bytemuck::cast_slice(part));
                    for (src_row, rows) in copies {
                        plane.copy_rows(&mut encoder, &incoming, *src_row, rows.clone(), texel);
                    }
                    held.push(incoming);
                }
            }
            ctx.queue.submit([encoder.finish()]);
            drop(held);
            Ok(())
        })?;
        self.len += m;
        Ok(())
    }

    /// Where the next `m` tokens go: per (batch, K/V head) their rows in the textures, as
    /// `(first source row, cache rows)`; a rolling cache wraps them past its capacity.
    pub(crate) fn placements(&self, m: usize) -> Vec<(usize, std::ops::Range<usize>)> {
        let cap = self.spec.capacity;
        let start = if self.rolling {
            self.len % cap
        } else {
            self.len
        };
        let first = m.min(cap - start);
        let mut out = Vec::new();
        for bh in 0..self.spec.batch * self.spec.kv_heads {
            let base = bh * cap;
            out.push((bh * m, base + start..base + start + first));
            if first < m {
                out.push((bh * m + first, base..base + m - first));
            }
        }
        out
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

    /// The textures of K and V.
    pub(crate) fn views(&self) -> (&wgpu::TextureView, &wgpu::TextureView) {
        (&self.k.view, &self.v.view)
    }

    /// The line layouts of K and V.
    pub(crate) fn lines(&self) -> (Lines, Lines) {
        (self.k.lines, self.v.lines)
    }
}

impl Plane {
    /// Records the copy of cache rows `rows` from `src`, where they start at row `src_row`
    /// (rows of `d4` texels, back to back): the part of a first line, whole lines, the part of
    /// a last line.
    fn copy_rows(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        src: &wgpu::Buffer,
        src_row: usize,
        rows: std::ops::Range<usize>,
        texel: usize,
    ) {
        let Lines { d4, per_line, .. } = self.lines;
        let mut r = rows.start;
        while r < rows.end {
            let (line, col) = (r / per_line, r % per_line);
            let left = rows.end - r;
            // Part of one line, or as many whole lines as there are.
            let (count, height) = if col != 0 || left < per_line {
                ((per_line - col).min(left), 1)
            } else {
                (per_line, left / per_line)
            };
            let offset = ((src_row + r - rows.start) * d4 * texel) as u64;
            encoder.copy_buffer_to_texture(
                wgpu::TexelCopyBufferInfo {
                    buffer: src,
                    layout: wgpu::TexelCopyBufferLayout {
                        offset,
                        bytes_per_row: (height > 1).then_some((per_line * d4 * texel) as u32),
                        rows_per_image: None,
                    },
                },
                wgpu::TexelCopyTextureInfo {
                    texture: &self.texture,
                    mip_level: 0,
                    origin: wgpu::Origin3d {
                        x: (col * d4) as u32,
                        y: line as u32,
                        z: 0,
                    },
                    aspect: wgpu::TextureAspect::All,
                },
                wgpu::Extent3d {
                    width: (count * d4) as u32,
                    height: height as u32,
                    depth_or_array_layers: 1,
                },
            );
            r += count * height;
        }
    }
}

/// Copies of source rows into cache rows: `(first source row, cache rows)`.
pub(crate) type Copies = Vec<(usize, std::ops::Range<usize>)>;

/// The appended rows in staging pieces of at most `max_rows` rows: per piece, its source
/// rows (of `total`, the rows `placements` takes from, back to back in their order) and its
/// copies (the first source row counted within the piece).
pub(crate) fn staging_pieces(
    placements: &[(usize, std::ops::Range<usize>)],
    total: usize,
    max_rows: usize,
) -> Vec<(std::ops::Range<usize>, Copies)> {
    let max_rows = max_rows.max(1);
    let mut out = Vec::new();
    let mut start = 0;
    while start < total {
        let end = (start + max_rows).min(total);
        let mut copies = Vec::new();
        for (src_row, rows) in placements {
            // The part of this placement whose source rows lie in start..end.
            let lo = (*src_row).max(start);
            let hi = (src_row + rows.len()).min(end);
            if lo < hi {
                let at = rows.start + (lo - src_row);
                copies.push((lo - start, at..at + (hi - lo)));
            }
        }
        out.push((start..end, copies));
        start = end;
    }
    out
}

/// Bytes per stored element.
fn elem_bytes(dtype: Dtype) -> usize {
    match dtype {
        Dtype::F32 => 4,
        Dtype::F16 => 2,
    }
}

/// `a` `(batch, heads, m, d)` row-major, each row zero-padded to `width`.
pub(super) fn padded_rows<T: CacheElement>(a: &ArrayView4<'_, T>, width: usize) -> Vec<T> {
    let d = a.dim().3;
    let mut out = Vec::with_capacity(a.len() / d.max(1) * width);
    for row in a.rows() {
        out.extend(row.iter().copied());
        out.resize(out.len() + width - d, T::ZERO);
    }
    out
}

mod on_device;
#[cfg(test)]
mod tests;

pub(crate) use on_device::RowsSource;
