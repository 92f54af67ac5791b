//! `shaders/decode_partial.wgsl`: step 1 of a decode step (flash-decoding). Per (batch, K/V
//! head, chunk of query rows, key block), the partial max, sum and weighted V of the block's
//! keys. [`Decode`] describes the problem, chooses the key block and records both steps (the
//! combine is `decode_combine.rs`).

use super::loops::{run, strided, Build};
use super::mods::{ModsBind, ModsUpload};
use super::wgsl::{constants, uniform};
use super::{record_with, u32_of, Dim, Kernel, KernelId, Slot};
use crate::error::{Error, Limit, Result};
use crate::gpu::Gpu;

/// The kernel.
pub(crate) struct Shader;

/// The most threads per workgroup (each walks its own keys of the block), and the unit of
/// block sizes.
pub(crate) const THREADS: u32 = 64;

/// Threads per workgroup on an adapter: [`THREADS`] on a GPU; on a CPU adapter one subgroup
/// (lavapipe runs a workgroup's subgroups one after the other on one core, so more threads
/// only add rounds to the merge through workgroup memory, which is slow there).
pub(crate) fn threads_for(ctx: &Gpu) -> u32 {
    if !ctx.hardware().decide.decode_gpu_kernel {
        ctx.subgroup_size().unwrap_or(8).clamp(1, THREADS)
    } else {
        THREADS
    }
}

/// Registers a thread may spend on its rows' Q and output, in vec4s: the chunk's rows are
/// as many as fit (at least one).
const ROW_REGISTERS: u32 = 64;

/// The most query rows one workgroup keeps.
const MAX_ROWS: u32 = 8;

uniform! {
    /// The uniform block of `decode_partial.wgsl`.
    pub(crate) struct PartialParams {
        /// Workgroups in use: `batch · kv_heads · chunks · blocks`.
        workgroups: u32,
        /// Key blocks.
        blocks: u32,
        /// Chunks of `GC` query rows per K/V head.
        chunks: u32,
        /// Keys per block (a multiple of `WG`).
        block: u32,
        heads: u32,
        kv_heads: u32,
        /// Query heads per K/V head.
        ratio: u32,
        /// New query rows per head.
        m: u32,
        /// Keys in the cache.
        len: u32,
        /// Tokens the cache has room for (its rows per head).
        capacity: u32,
        /// Cache rows per texture line of K and of V.
        k_line: u32,
        v_line: u32,
        kv0: u32,
        _pad1: u32,
        _pad2: u32,
        /// `scale · log2(e)`.
        scale_log2: f32,
    }
}

constants! {
    /// Specialisation of `decode_partial.wgsl`.
    pub(crate) struct PartialConsts {
        /// Threads per workgroup.
        threads => "WG",
        /// Query rows per workgroup.
        rows => "GC",
        /// d_k in vec4s, rounded up.
        dk4 => "DK4",
        /// d_v in vec4s, rounded up.
        dv4 => "DV4",
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::DecodePartial;
    const WORKGROUP: [Dim; 3] = [Dim::Const("WG"), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[
        Slot::Read("q_buf"),
        Slot::Texture("k_tex"),
        Slot::Texture("v_tex"),
        Slot::ReadWrite("o_part"),
        Slot::ReadWrite("ml_part"),
    ];
    type Consts = PartialConsts;
    type Params = PartialParams;

    /// The thread's run of `⌈block / WG⌉` keys (the block's keys split over its WG threads)
    /// around `// unroll` loops only (K's DK4 texels × GC rows, V's DV4, and per row the
    /// rescale's and the sum's DV4); before it the rows' Q (GC × DK4) and the maxima (GC);
    /// after it, per row (GC), the merge: its partial (DV4), the ⌈log2 WG⌉ rounds (DV4
    /// each) and the output's store (`⌈DV4 / WG⌉`). The `// unroll` loops count only where
    /// they stay loops (`Build::marked`): natively the key run and the merge's loops alone.
    fn loops(c: &PartialConsts, p: &PartialParams, b: Build) -> u64 {
        let m = |n| b.marked(n);
        let (wg, gc) = (u64::from(c.threads.max(1)), u64::from(c.rows));
        let (dk4, dv4) = (u64::from(c.dk4), u64::from(c.dv4));
        let per_key = m(dk4) + dk4 * m(gc) + m(dv4) + m(gc) + gc * 2 * m(dv4);
        let keys = strided(u64::from(p.block), wg);
        let rounds = u64::from(wg.next_power_of_two().trailing_zeros());
        let merge = m(dv4) + run(rounds) + rounds * m(dv4) + run(strided(dv4, wg));
        let start = m(gc) + gc * m(dk4) + m(gc);
        start + run(keys) + keys * per_key + m(gc) + gc * merge
    }
}

impl PartialConsts {
    /// The specialisation for `rows` query rows per K/V head and widths `dk4`, `dv4` (vec4s):
    /// as many rows per workgroup as [`ROW_REGISTERS`] allow (a power of two, at most
    /// [`MAX_ROWS`] and at least 1), and `threads` threads, halved while the merge's
    /// workgroup memory does not fit `limit` bytes.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] when even one thread's row does not fit.
    pub fn new(rows: u32, (dk4, dv4): (u32, u32), threads: u32, limit: u32) -> Result<Self> {
        let fit = (ROW_REGISTERS / (dk4 + dv4).max(1)).clamp(1, MAX_ROWS);
        let mut c = PartialConsts {
            threads: threads.clamp(1, THREADS),
            rows: rows.clamp(1, MAX_ROWS).min(fit).next_power_of_two(),
            dk4,
            dv4,
        };
        if c.rows > fit {
            c.rows /= 2;
        }
        while c.workgroup_bytes() > u64::from(limit) && c.threads > 1 {
            c.threads /= 2;
        }
        if c.workgroup_bytes() > u64::from(limit) {
            return Err(Error::LimitExceeded {
                what: "decode workgroup memory".into(),
                needed: format!("{} bytes", c.workgroup_bytes()),
                limit: format!("{limit} bytes"),
                limit_name: Limit::MaxComputeWorkgroupStorageSize,
            });
        }
        Ok(c)
    }

    /// Workgroup memory used, as the shader declares it.
    pub fn workgroup_bytes(&self) -> u64 {
        u64::from(self.threads) * (8 + 16 * u64::from(self.dv4))
    }
}

/// The partial kernel a step runs, specialised.
enum Partial {
    /// `decode_partial.wgsl` (CPU adapters).
    Cpu(PartialConsts),
    /// `decode_partial_gpu.wgsl`.
    Gpu(super::decode_partial_gpu::GpuPartialConsts),
}

impl Partial {
    /// Its loop iterations per invocation ([`Kernel::loops`]) for blocks of `block` keys.
    fn loops(&self, block: usize, build: Build) -> u64 {
        let p = PartialParams {
            block: u32::try_from(block).unwrap_or(u32::MAX),
            ..Default::default()
        };
        match self {
            Partial::Cpu(c) => <Shader as Kernel>::loops(c, &p, build),
            Partial::Gpu(c) => <super::decode_partial_gpu::Shader as Kernel>::loops(c, &p, build),
        }
    }

    /// `block` (a multiple of [`THREADS`]), or where its loops would pass `cap` the largest
    /// multiple of [`THREADS`] below it whose loops do not (at least [`THREADS`]: a block
    /// that still passes is refused when it is recorded). A thread's loops grow with the
    /// block's keys, and more blocks only lengthen the combine's two loops by one each.
    fn within_loop_cap(&self, block: usize, cap: Option<u64>, build: Build) -> usize {
        let wg = THREADS as usize;
        let Some(cap) = cap.filter(|&cap| self.loops(block, build) > cap) else {
            return block;
        };
        // The most tiles of `wg` keys that fit, by bisection (the count grows with them).
        let (mut lo, mut hi) = (1, block / wg);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if self.loops(mid * wg, build) <= cap {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        log::debug!(
            "decode: blocks of {block} keys pass the loop cap {cap}: {}",
            lo * wg
        );
        lo * wg
    }
}

/// One decode step: `heads · m` new query rows per batch index against `len` cached keys.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Decode {
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    /// New query rows per head.
    pub m: usize,
    /// Keys in the cache (the last `m` are the new rows' own).
    pub len: usize,
    /// The first key any new row may see: 0, or where a window preset's reach begins.
    pub first: usize,
    /// Rows per (batch, K/V head) in the cache's textures.
    pub capacity: usize,
    /// Cache rows per texture line of K and of V.
    pub k_line: usize,
    pub v_line: usize,
    pub dk: usize,
    pub dv: usize,
    pub scale: f32,
    /// The partial results start as NaN (tests: a slot no kernel wrote shows up).
    pub nan_fill: bool,
    /// Threads per workgroup, when forced (tests: the GPU's 64 on lavapipe).
    pub threads: Option<u32>,
    /// `decode_partial_gpu.wgsl` (true) or this kernel (false), when forced; by default the
    /// GPU kernel on adapters that are not CPUs.
    pub gpu_kernel: Option<bool>,
}

/// The buffers of one decode step.
pub(crate) struct DecodeBuffers<'a> {
    /// The queries, `(batch, heads, m, DK4)` vec4s, f32.
    pub q: &'a wgpu::Buffer,
    /// The cache's K and V textures.
    pub k: &'a wgpu::TextureView,
    pub v: &'a wgpu::TextureView,
    /// The output, `(batch, heads, m, d_v)` f32.
    pub out: &'a wgpu::Buffer,
}

impl Decode {
    /// Widths in vec4s, rounded up: `(DK4, DV4)`.
    pub fn widths4(&self) -> (u32, u32) {
        (self.dk.div_ceil(4) as u32, self.dv.div_ceil(4) as u32)
    }

    /// The keys per block when none is forced: see [`block_for`].
    pub fn block(&self, ctx: &Gpu, rows_per_workgroup: u32) -> usize {
        let chunks =
            (self.heads / self.kv_heads.max(1) * self.m).div_ceil(rows_per_workgroup as usize);
        let groups = self.batch * self.kv_heads * chunks;
        let cpu = !ctx.hardware().decide.decode_gpu_kernel;
        block_for(self.len, groups, cpu)
    }

    /// Records both steps: the partials over blocks of `block` keys (`None`: chosen by
    /// [`Decode::block`]), then the combine into `bufs.out`.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] when a buffer, the workgroup memory or the grid does not fit.
    pub fn record(
        &self,
        ctx: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        bufs: &DecodeBuffers<'_>,
        block: Option<usize>,
        mods: Option<&ModsUpload>,
    ) -> Result<()> {
        let (dk4, dv4) = self.widths4();
        let ratio = self.heads / self.kv_heads;
        let rows = ratio * self.m;
        let limit = ctx.limits().max_compute_workgroup_storage_size;
        let rows32 = u32_of("query rows per K/V head", rows)?;
        let kernel = if self
            .gpu_kernel
            .unwrap_or(ctx.hardware().decide.decode_gpu_kernel)
        {
            Partial::Gpu(super::decode_partial_gpu::GpuPartialConsts::new(
                rows32,
                (dk4, dv4),
                limit,
            )?)
        } else {
            let threads = self.threads.unwrap_or_else(|| threads_for(ctx));
            Partial::Cpu(PartialConsts::new(rows32, (dk4, dv4), threads, limit)?)
        };
        let gc = match &kernel {
            Partial::Cpu(c) => c.rows,
            Partial::Gpu(c) => c.rows,
        };
        let wg = THREADS as usize;
        // Blocks are whole multiples of 64 keys (of every thread count the constants choose).
        let block = block
            .unwrap_or_else(|| self.block(ctx, gc))
            .next_multiple_of(wg)
            .max(wg);
        // On a loop-capped adapter (lavapipe), blocks no longer than a thread's key run fits.
        let hw = ctx.hardware();
        let block = kernel.within_loop_cap(block, hw.loop_cap, Build::of(hw.emulate));
        // Keys before `first` are outside every row's window: no block holds them.
        let kv0 = self.first.min(self.len.saturating_sub(1)) / wg * wg;
        let blocks = (self.len - kv0).div_ceil(block);
        let chunks = rows.div_ceil(gc as usize);
        let workgroups = self.batch * self.kv_heads * chunks * blocks;
        let out_rows = self.batch * self.heads * self.m;
        let o_part = crate::gpu::buffer::output(
            ctx,
            "decode partial outputs",
            out_rows * blocks * dv4 as usize * 4,
            self.nan_fill,
        )?;
        let ml_part = crate::gpu::buffer::output(
            ctx,
            "decode partial max/sum",
            out_rows * blocks * 2,
            self.nan_fill,
        )?;
        let params = PartialParams {
            workgroups: u32_of("decode workgroups", workgroups)?,
            blocks: u32_of("key blocks", blocks)?,
            chunks: u32_of("row chunks", chunks)?,
            block: u32_of("keys per block", block)?,
            heads: u32_of("heads", self.heads)?,
            kv_heads: u32_of("kv heads", self.kv_heads)?,
            ratio: u32_of("heads per K/V head", ratio)?,
            m: u32_of("new rows", self.m)?,
            len: u32_of("cache length", self.len)?,
            kv0: u32_of("first key", kv0)?,
            capacity: u32_of("cache capacity", self.capacity)?,
            k_line: u32_of("K rows per line", self.k_line)?,
            v_line: u32_of("V rows per line", self.v_line)?,
            scale_log2: self.scale * std::f32::consts::LOG2_E,
            ..Default::default()
        };
        log::debug!(
            "decode: {} rows x {} keys in {blocks} blocks of {block}, {chunks} chunks of {gc} rows",
            out_rows,
            self.len,
        );
        let resources = [
            bufs.q.into(),
            bufs.k.into(),
            bufs.v.into(),
            (&o_part).into(),
            (&ml_part).into(),
        ];
        let mods = mods.map(|upload| ModsBind { upload, map: None });
        match kernel {
            Partial::Cpu(c) => record_with::<Shader>(
                ctx,
                encoder,
                (&c, 0),
                &params,
                &resources,
                mods,
                workgroups as u64,
            )?,
            Partial::Gpu(c) => record_with::<super::decode_partial_gpu::Shader>(
                ctx,
                encoder,
                (&c, 0),
                &params,
                &resources,
                mods,
                workgroups as u64,
            )?,
        }
        super::decode_combine::dispatch(
            ctx,
            encoder,
            (out_rows, blocks, self.dv),
            (&o_part, &ml_part),
            bufs.out,
        )
    }
}

/// Workgroups a decode step aims for: enough to fill a GPU several times over; on a CPU
/// adapter (lavapipe runs a workgroup per host thread) a few per core, since each extra block
/// costs a merge, a partial result and its share of the combine.
fn target_workgroups(cpu: bool) -> usize {
    if cpu {
        4 * std::thread::available_parallelism().map_or(2, |n| n.get())
    } else {
        1024
    }
}

/// Keys per block for a cache of `len` keys and `groups` workgroups per block (batch ·
/// kv_heads · row chunks): the fewest blocks that reach [`target_workgroups`], each a whole
/// multiple of 64 keys, at most the whole cache and at least 64 keys — 256 on a GPU, so each
/// of a workgroup's threads walks at least 4 keys before the merge.
pub(crate) fn block_for(len: usize, groups: usize, cpu: bool) -> usize {
    let wg = THREADS as usize;
    let least = if cpu { wg } else { 4 * wg };
    let want_blocks = target_workgroups(cpu).div_ceil(groups.max(1)).max(1);
    let block = len.div_ceil(want_blocks).next_multiple_of(wg);
    block
        .min(len.next_multiple_of(wg))
        .max(least.min(len.next_multiple_of(wg)))
}

#[cfg(test)]
mod tests {
    use super::super::decode_partial_gpu::GpuPartialConsts;
    use super::*;

    #[test]
    fn rows_and_threads_fit_registers_and_workgroup_memory() {
        // d = 64: two rows per workgroup (2 · 32 vec4 registers); 64 threads need 16.9 KiB.
        let c = PartialConsts::new(1, (16, 16), 64, 32 << 10).unwrap();
        assert_eq!((c.rows, c.threads), (1, 64));
        let c = PartialConsts::new(32, (16, 16), 64, 32 << 10).unwrap();
        assert_eq!((c.rows, c.threads), (2, 64));
        let c = PartialConsts::new(32, (16, 16), 64, 16 << 10).unwrap();
        assert_eq!((c.rows, c.threads), (2, 32));
        // d = 8: up to 8 rows; 3 rows round up to 4.
        assert_eq!(PartialConsts::new(3, (2, 2), 64, 16 << 10).unwrap().rows, 4);
        assert_eq!(
            PartialConsts::new(100, (2, 2), 64, 16 << 10).unwrap().rows,
            8
        );
        // d = 256: one row, still fits.
        let c = PartialConsts::new(8, (64, 64), 64, 16 << 10).unwrap();
        assert_eq!(c.rows, 1);
        assert!(c.workgroup_bytes() <= 16 << 10);
        assert!(PartialConsts::new(1, (4096, 4096), 64, 16 << 10).is_err());
        // A CPU adapter's one subgroup of 8.
        let c = PartialConsts::new(1, (16, 16), 8, 32 << 10).unwrap();
        assert_eq!((c.rows, c.threads), (1, 8));
    }

    #[test]
    fn blocks_shrink_to_the_loop_cap() {
        let native = Build::of(crate::gpu::hardware::Emulation::default());
        let cpu = Partial::Cpu(PartialConsts::new(1, (4, 4), 8, 32 << 10).unwrap());
        // One thread's run of keys is the block's eighth: 1 << 20 keys pass the cap.
        assert!(cpu.loops(1 << 20, native) > 65_535);
        let block = cpu.within_loop_cap(1 << 20, Some(65_535), native);
        assert!(block.is_multiple_of(64) && block < 1 << 20);
        assert!(cpu.loops(block, native) <= 65_535 && cpu.loops(block + 64, native) > 65_535);
        // No cap, or a block that fits: unchanged.
        assert_eq!(cpu.within_loop_cap(1 << 20, None, native), 1 << 20);
        assert_eq!(cpu.within_loop_cap(4096, Some(65_535), native), 4096);
        let gpu = Partial::Gpu(GpuPartialConsts::new(1, (4, 4), 32 << 10).unwrap());
        let block = gpu.within_loop_cap(1 << 24, Some(65_535), native);
        assert!(gpu.loops(block, native) <= 65_535 && block > 64);
    }

    #[test]
    fn blocks_fill_the_device_and_are_whole_tiles() {
        // A GPU: batch 1, 8 heads, 4096 keys: 1024 / 8 = 128 blocks of 32 keys, but at least
        // 256; a CPU with 8 groups already: one block.
        assert_eq!(block_for(4096, 8, false), 256);
        assert_eq!(block_for(65536, 8, false), 512);
        // Many groups already: one block of the whole (rounded) cache.
        assert_eq!(block_for(1000, 4096, false), 1024);
        assert_eq!(block_for(1, 1, false), 64);
        assert_eq!(block_for(1, 1, true), 64);
        assert_eq!(block_for(100, 1, false), 128);
        for len in [1, 7, 37, 1000, 4096] {
            for groups in [1, 8, 64] {
                let b = block_for(len, groups, true);
                assert!(b.is_multiple_of(64) && b >= 64 && b <= len.next_multiple_of(64));
            }
        }
    }
}
