//! Token-by-token decoding: a [`KvCache`] holds K and V of every token so far on the device,
//! and a [`Decoder`] attends the new tokens' queries to the whole cache.
//!
//! ```text
//! cache.append(ctx, k_new, v_new)            K, V: (batch, kv_heads, m, d)  → written on the device
//! Decoder::new().step(ctx, &cache, q_new)    Q:    (batch, heads, m, d_k)   → (batch, heads, m, d_v)
//! ```
//!
//! **Alignment.** The `m` query rows of a step are the *last* `m` tokens of the cache (append
//! their K and V first): with `len` tokens in the cache, new row `i` sits at position
//! `len − m + i` and attends to keys `j ≤ len − m + i`. This is causal attention aligned to
//! the bottom right (PyTorch's `causal_lower_right`), which for `m = len` (a prefill of the
//! whole prompt) is the usual top-left causal mask. So a prefill of `p` tokens followed by
//! one-token steps gives, row for row, the output of a causal forward over all the tokens.
//!
//! **Grouped-query attention**: `heads` may be any multiple of the cache's `kv_heads`; query
//! head `h` reads K/V head `h / (heads / kv_heads)`, as [`crate::Attention::run`] does on
//! `Inputs::qkv`.
//!
//! **How it runs** (flash-decoding): `decode_partial.wgsl` splits the keys into blocks; one
//! workgroup per (batch, K/V head, chunk of its query rows, key block) computes each row's
//! partial max, sum and weighted V over the block (each thread walks its own keys with an
//! online softmax in registers, and the threads' partials are merged at the end), reading each
//! K and V row once for all the query heads that share it; `decode_combine.wgsl` merges the
//! blocks. A single query row is thus spread over `batch · kv_heads · blocks` workgroups.
//!
//! **Block size** (keys per block, a multiple of 64): the fewest blocks that give about 1,024
//! workgroups on a GPU (at least 256 keys each, so every thread walks several keys before the
//! merge), or 4 per host core on a CPU adapter such as lavapipe, whose workgroups run one per
//! thread, so that more blocks only add merges and combine work; never more than the cache.
//! Measured on lavapipe (2 cores, batch 1, 8 heads, d = 64, S = 4096; `bench --decode
//! --decode-block B`, ms per step, median of 9 on a loaded machine): blocks of 256 keys 8.8,
//! 1,024 keys 7.1, 4,096 keys (the rule's choice there) 3.9. [`Decoder::block`] overrides the
//! rule.

mod cache;
// The CPU peer of `bench --decode`: not part of the API.
#[doc(hidden)]
pub mod cpu;

use ndarray::{Array4, ArrayView4};

pub(crate) use cache::RowsSource;
pub use cache::{CacheElement, KvCache, KvCacheSpec};

use crate::context::Context;
use crate::error::{Error, Result};
use crate::gpu::buffer::{self, Buf};
use crate::gpu::readback;
use crate::kernels::decode_partial::{Decode, DecodeBuffers};
use crate::kernels::mods::ModsUpload;
use crate::kernels::swap_heads::SwapHeads;
use crate::modifiers::{Modifiers, Preset};
use crate::tensor::{Recorder, Tensor};
use crate::values::check_finite;

/// A decode step's options: the scale and, for measurements, the key block.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decoder {
    scale: Option<f32>,
    /// The modifiers and their content key (a step looks their upload up by it: computed
    /// once here, not per token).
    mods: Option<std::sync::Arc<Modifiers>>,
    block: Option<usize>,
    nan_fill: bool,
    threads: Option<u32>,
    gpu_kernel: Option<bool>,
}

impl Decoder {
    /// Scale `1/sqrt(d_k)`, block size chosen per call.
    pub fn new() -> Self {
        Self::default()
    }

    /// The factor on `Q·Kᵀ` (default `1/sqrt(d_k)`).
    pub fn scale(mut self, scale: f32) -> Self {
        self.scale = Some(scale);
        self
    }

    /// Keys per block of the split, rounded up to a multiple of 64 (default: chosen from the
    /// cache length and the device, see the [module docs](self)).
    pub fn block(mut self, keys: usize) -> Self {
        self.block = Some(keys);
        self
    }

    /// Score and mask modifiers ([`Modifiers`]), applied as in the fused forward at each new
    /// row's position in the sequence (`len − m + i`) and each key's (`j`): a window preset
    /// also leaves the keys before the earliest row's reach out of the step's work, so a
    /// step costs O(window), not O(len). Buffers indexed by position (document ids) must
    /// cover every position the cache holds.
    pub fn modifiers(mut self, mods: &Modifiers) -> Self {
        self.mods = (!mods.is_empty()).then(|| std::sync::Arc::new(mods.clone()));
        self
    }

    /// Fills the output and the partial results with NaN before the kernels run, so an
    /// element no kernel wrote shows up (for tests).
    pub fn nan_fill(mut self, yes: bool) -> Self {
        self.nan_fill = yes;
        self
    }

    /// Forces the threads per workgroup (tests: what a GPU runs, on a CPU adapter).
    #[cfg(test)]
    pub(crate) fn threads(mut self, n: u32) -> Self {
        self.threads = Some(n);
        self
    }

    /// Forces the GPU kernel (`decode_partial_gpu.wgsl`, true) or the CPU one (false)
    /// (tests: the GPU's kernel on a CPU adapter).
    #[cfg(test)]
    pub(crate) fn gpu_kernel(mut self, yes: bool) -> Self {
        self.gpu_kernel = Some(yes);
        self
    }

    /// Attends `q`, `(batch, heads, m, d_k)`, the queries of the cache's last `m` tokens, to
    /// every token in `cache`, causally aligned to the end (see the [module docs](self)).
    /// Returns the output `(batch, heads, m, d_v)` (f32, PyTorch's layout).
    ///
    /// # Errors
    /// A cache from another context or a scale that is not finite ([`Error::InvalidArgument`]);
    /// a batch or width that is not the cache's, heads not a multiple of its K/V heads, `m = 0`
    /// or more rows than cached tokens ([`Error::ShapeMismatch`]); NaN/Inf in `q`
    /// ([`Error::NonFinite`]); a result that overflowed ([`Error::Overflow`]); GPU errors.
    pub fn step(
        &self,
        ctx: &Context,
        cache: &KvCache,
        q: ArrayView4<'_, f32>,
    ) -> Result<Array4<f32>> {
        cache.check_context(ctx)?;
        cache.check_written(None)?;
        let (batch, heads, m, d_k) = q.dim();
        let problem = self.problem(cache, [batch, heads, m, d_k], "Q is")?;
        check_finite("Q", &q)?;
        let d_v = cache.spec().d_v;
        let out_len = batch * heads * m * d_v;
        let flat = ctx.scoped(|| {
            // The step's scratch buffers come from the pool, reused only after this submit.
            let _open = ctx.pool.open();
            let q_buf = buffer::upload(
                ctx,
                "decode Q",
                &cache::padded_rows(&q, d_k.next_multiple_of(4)),
            )?;
            let mut encoder = ctx
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("decode"),
                });
            crate::gpu::timing::begin(ctx);
            let out = self.record(ctx, &mut encoder, cache, &problem, &q_buf)?;
            let pending = readback::copy_out(ctx, &mut encoder, &out, out_len);
            crate::gpu::timing::submit_and_read(ctx, encoder, vec![pending])
        })?;
        let flat = flat.into_iter().next().unwrap_or_default();
        crate::values::check_overflow("decode output", cache.spec().dtype, &flat)?;
        Array4::from_shape_vec((batch, heads, m, d_v), flat)
            .map_err(|e| Error::shape(e.to_string()))
    }

    /// [`Decoder::step`] on a tensor already on the device, in the rows layout the projections
    /// write: `q` is `(batch, m, heads, d_k)` (f32 or f16) and the output comes back as
    /// `(batch, m, heads, d_v)` (f32), so it reshapes to `(batch, m, heads·d_v)` for free.
    /// Recorded into `rec`: it may follow an append recorded into the same `rec`.
    ///
    /// # Errors
    /// As [`Decoder::step`], and a tensor of another context or not yet written, and a cache
    /// whose last append sits in another recorder not yet submitted.
    pub fn step_record(
        &self,
        rec: &mut Recorder<'_>,
        cache: &KvCache,
        q: &Tensor,
    ) -> Result<Tensor> {
        let ctx = rec.ctx;
        cache.check_context(ctx)?;
        cache.check_written(Some(rec))?;
        let [batch, m, heads, d_k] = match *q.shape() {
            [b, m, h, d] => [b, m, h, d],
            ref s => {
                return Err(Error::shape(format!(
                    "decode: Q must be (batch, m, heads, d_k) on the device, got {s:?}"
                )))
            }
        };
        let problem = self.problem(cache, [batch, heads, m, d_k], "Q (batch, heads, m, d_k) is")?;
        let source = q.input(rec, "decode Q")?;
        let out = ctx.scoped(|| {
            let f16 = q.dtype() == crate::dtype::Dtype::F16;
            self.record_rows(ctx, rec.encoder(), cache, &problem, source, f16)
        })?;
        Ok(rec.tensor(out, vec![batch, m, heads, cache.spec().d_v]))
    }

    /// Records the step for Q in the rows layout `(batch, m, heads, d_k)` (f16 when `f16`),
    /// into a new buffer in the same layout, `(batch, m, heads, d_v)` f32.
    ///
    /// # Errors
    /// GPU errors and limits.
    pub(crate) fn record_rows(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        cache: &KvCache,
        problem: &Decode,
        q: &wgpu::Buffer,
        f16: bool,
    ) -> Result<Buf> {
        let (batch, heads, m) = (problem.batch, problem.heads, problem.m);
        let (d_k, d_v) = (problem.dk, problem.dv);
        // Q into the kernel's padded heads-first rows, the output back into rows.
        let to_heads =
            SwapHeads::dense([batch, m, heads], d_k, d_k.next_multiple_of(4)).types(f16, false);
        let q_heads = buffer::output(ctx, "decode Q", to_heads.dst_len(), false)?;
        to_heads.record(ctx, encoder, q, &q_heads)?;
        let out = self.record(ctx, encoder, cache, problem, &q_heads)?;
        let to_rows = SwapHeads::dense([batch, heads, m], d_v, d_v);
        let rows = buffer::output(ctx, "decode output", to_rows.dst_len(), self.nan_fill)?;
        to_rows.record(ctx, encoder, &out, &rows)?;
        Ok(rows)
    }

    /// The checked problem of a step of Q `[batch, heads, m, d_k]` on `cache`.
    ///
    /// # Errors
    /// As [`Decoder::step`]'s shape and scale errors.
    pub(crate) fn problem(&self, cache: &KvCache, dims: [usize; 4], q_is: &str) -> Result<Decode> {
        let spec = *cache.spec();
        let [batch, heads, m, d_k] = dims;
        if batch != spec.batch || d_k != spec.d_k {
            return Err(Error::shape(format!(
                "decode: {q_is} {dims:?}, the cache holds batch {} and d_k {}",
                spec.batch, spec.d_k
            )));
        }
        if heads == 0 || heads % spec.kv_heads != 0 {
            return Err(Error::shape(format!(
                "decode: Q has {heads} heads and the cache {} K/V heads: the query heads must \
                 be a multiple of them",
                spec.kv_heads
            )));
        }
        if m == 0 || m > cache.len() {
            return Err(Error::shape(format!(
                "decode: Q has {m} rows and the cache {} tokens: the rows are the last tokens \
                 appended, at least 1 and at most the cache's length",
                cache.len()
            )));
        }
        let scale = self.scale.unwrap_or(1.0 / (d_k as f32).sqrt());
        if !scale.is_finite() {
            return Err(Error::invalid(
                "scale",
                format!("must be finite, got {scale}"),
            ));
        }
        if let Some(mods) = self.mods.as_deref() {
            mods.check_problem([batch, heads, cache.len(), cache.len()])?;
        }
        // A window preset's reach: the earliest new row, at len − m, sees no key before
        // len − m − left.
        let first = self.mods.as_deref().map_or(0, |mods| {
            mods.presets()
                .iter()
                .filter_map(|p| match p {
                    Preset::Window { left, .. } => {
                        Some((cache.len() - m).saturating_sub(*left as usize))
                    }
                    _ => None,
                })
                .max()
                .unwrap_or(0)
        });
        // A rolling cache holds the last `capacity` tokens: a step may not reach past them.
        let oldest = cache.len().saturating_sub(spec.capacity);
        if first < oldest {
            return Err(Error::invalid(
                "decode",
                format!(
                    "the rolling cache holds the last {} of {} tokens, and this step's rows \
                     reach key {first}: give the Decoder a window preset with m + left ≤ \
                     capacity ({m} rows here)",
                    spec.capacity,
                    cache.len()
                ),
            ));
        }
        Ok(Decode {
            batch,
            heads,
            kv_heads: spec.kv_heads,
            m,
            len: cache.len(),
            first,
            capacity: spec.capacity,
            k_line: cache.lines().0.per_line,
            v_line: cache.lines().1.per_line,
            dk: d_k,
            dv: spec.d_v,
            scale,
            nan_fill: self.nan_fill,
            threads: self.threads,
            gpu_kernel: self.gpu_kernel,
        })
    }

    /// Records the kernels for Q in padded heads-first rows (`q_heads`, f32), into a new
    /// output buffer `(batch, heads, m, d_v)`.
    fn record(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        cache: &KvCache,
        problem: &Decode,
        q_heads: &wgpu::Buffer,
    ) -> Result<Buf> {
        let out_len = problem.batch * problem.heads * problem.m * problem.dv;
        let out = buffer::output(ctx, "decode output", out_len, self.nan_fill)?;
        let (k, v) = cache.views();
        let bufs = DecodeBuffers {
            q: q_heads,
            k,
            v,
            out: &out,
        };
        let mods = self
            .mods
            .as_deref()
            .map(|m| ModsUpload::shared(ctx, m))
            .transpose()?;
        problem.record(ctx, encoder, &bufs, self.block, mods.as_deref())?;
        Ok(out)
    }
}
