//! `shaders/decode_partial_gpu.wgsl`: step 1 of a decode step on GPUs. The same problem,
//! uniform ([`PartialParams`]), bindings and partial results as `decode_partial.rs`, but the
//! head dimension is split over threads, so no thread keeps a whole Q or output row (the CPU
//! kernel's rows spill on a GPU). Picked on adapters that are not CPUs; lavapipe keeps
//! `decode_partial.wgsl`, whose per-thread key runs suit a CPU.

use super::decode_partial::{PartialParams, THREADS};
use super::loops::{run, strided, Build};
use super::wgsl::constants;
use super::{Dim, Kernel, KernelId, Slot};
use crate::error::{Error, Limit, Result};

/// The kernel.
pub(crate) struct Shader;

/// The most query rows one workgroup keeps.
const MAX_ROWS: u32 = 8;

/// The texel loads a thread issues before it uses the first (K's per step of the scores,
/// V's per step of the output): a decode step reads the whole cache once, and a GPU hides
/// a memory latency only with enough loads in flight.
const LOADS_IN_FLIGHT: u32 = 8;

constants! {
    /// Specialisation of `decode_partial_gpu.wgsl`.
    pub(crate) struct GpuPartialConsts {
        /// Threads per workgroup (and keys per tile).
        threads => "WG",
        /// Query rows per workgroup.
        rows => "GC",
        /// d_k in vec4s, rounded up.
        dk4 => "DK4",
        /// d_v in vec4s, rounded up.
        dv4 => "DV4",
        /// Threads across the output columns: `min(DV4, WG)`.
        col_threads => "CT",
        /// Key groups: `WG / CT`.
        key_groups => "KG",
        /// Output vec4 columns per thread: `DV4 / CT`, rounded up.
        out4 => "OC",
        /// K texels a thread loads per step of its scores (a divisor of DK4, at most
        /// [`LOADS_IN_FLIGHT`]).
        k_step => "KU",
        /// Vec4s per key in the scores' K staging: odd and at least KU + 1, so a thread's
        /// reads of its own key's texels fall on distinct banks.
        k_pitch => "KP",
        /// Vec4s of the workgroup array K's staging shares with the key groups' merge (one
        /// after the other): the larger of `WG · KP` and `GC · KG · DV4`.
        shared4 => "KS",
        /// Keys a thread takes per step of its output (their V texels loaded together).
        v_step => "VU",
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::DecodePartialGpu;
    const WORKGROUP: [Dim; 3] = [Dim::Const("WG"), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[
        Slot::Read("q_buf"),
        Slot::Texture("k_tex"),
        Slot::Texture("v_tex"),
        Slot::ReadWrite("o_part"),
        Slot::ReadWrite("ml_part"),
    ];
    type Consts = GpuPartialConsts;
    type Params = PartialParams;

    /// The block's key-tile loop (`⌈block / WG⌉` tiles of WG keys) around: the scores' loop
    /// over K's DK4 texels in steps of KU (each `// unroll`: KU loads, KU stores to the
    /// staging, KU × GC dots), the
    /// scores' store (GC), and the loop over the thread's key group's keys of the tile in
    /// steps of VU (`⌈WG / (KG·VU)⌉`: VU × OC loads; per row VU maxima, OC rescales, VU × OC
    /// sums); before it Q's staging (`⌈GC·DK4 / WG⌉`) and the maxima (GC); after it the key
    /// groups' partials (GC × OC) and their merge, a loop over the GC rows (two over the KG
    /// groups, and per output column OC one more). The `// unroll` loops count only where
    /// they stay loops (`Build::marked`).
    fn loops(c: &GpuPartialConsts, p: &PartialParams, b: Build) -> u64 {
        let m = |n| b.marked(n);
        let (wg, gc, kg, oc) = (
            u64::from(c.threads.max(1)),
            u64::from(c.rows),
            u64::from(c.key_groups),
            u64::from(c.out4),
        );
        let (ku, vu) = (u64::from(c.k_step.max(1)), u64::from(c.v_step.max(1)));
        let dk4 = u64::from(c.dk4);
        let k_steps = strided(dk4, ku);
        let scores = run(k_steps) + k_steps * (3 * m(ku) + ku * m(gc)) + m(gc);
        let steps = strided(wg, kg * vu);
        let per_row = 2 * m(vu) + m(oc) + vu * m(oc);
        let tile = scores + run(steps) + steps * (m(vu) + vu * m(oc) + m(gc) + gc * per_row);
        let tiles = strided(u64::from(p.block), wg);
        let start = run(strided(gc * dk4, wg)) + m(gc);
        let merge = m(gc) + gc * m(oc) + run(gc) + gc * (2 * run(kg) + m(oc) + oc * run(kg));
        start + run(tiles) + tiles * tile + merge
    }
}

impl GpuPartialConsts {
    /// The specialisation for `rows` query rows per K/V head and widths `dk4`, `dv4` (vec4s),
    /// [`THREADS`] threads: as many rows per workgroup as fit `limit` bytes of workgroup
    /// memory (a power of two, at most [`MAX_ROWS`]), with the largest K step that fits
    /// beside them (a divisor of DK4 up to [`LOADS_IN_FLIGHT`]; below 4 texels, a step's
    /// texels of a key fill less than a sector in f16, so rows give way first, down to one).
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] when even one row does not fit.
    pub fn new(rows: u32, (dk4, dv4): (u32, u32), limit: u32) -> Result<Self> {
        let threads = THREADS;
        let col_threads = dv4.clamp(1, threads);
        let mut c = GpuPartialConsts {
            threads,
            rows: rows.clamp(1, MAX_ROWS).next_power_of_two(),
            dk4,
            dv4,
            col_threads,
            key_groups: threads / col_threads,
            out4: dv4.div_ceil(col_threads),
            k_step: 1,
            k_pitch: 1,
            shared4: 0,
            // The key group's keys of a tile, up to the loads in flight over its V texels.
            v_step: (LOADS_IN_FLIGHT / dv4.div_ceil(col_threads).max(1))
                .clamp(1, threads.div_ceil(threads / col_threads)),
        };
        // K steps, largest first: divisors of DK4 up to the loads in flight (1 where DK4 is
        // a prime past them).
        let steps: Vec<u32> = (1..=LOADS_IN_FLIGHT.min(dk4.max(1)))
            .rev()
            .filter(|u| dk4.max(1).is_multiple_of(*u))
            .collect();
        let wide = steps[0].min(4);
        loop {
            for &ku in steps.iter().filter(|&&u| u >= wide || c.rows == 1) {
                c.k_step = ku;
                c.k_pitch = (ku + 1) | 1;
                c.shared4 = (threads * c.k_pitch).max(c.rows * c.key_groups * dv4);
                if c.workgroup_bytes() <= u64::from(limit) {
                    return Ok(c);
                }
            }
            if c.rows == 1 {
                return Err(Error::LimitExceeded {
                    what: "decode workgroup memory".into(),
                    needed: format!("{} bytes", c.workgroup_bytes()),
                    limit: format!("{limit} bytes"),
                    limit_name: Limit::MaxComputeWorkgroupStorageSize,
                });
            }
            c.rows /= 2;
        }
    }

    /// Workgroup memory used, as the shader declares it.
    pub fn workgroup_bytes(&self) -> u64 {
        let (g, kg) = (u64::from(self.rows), u64::from(self.key_groups));
        g * (16 * u64::from(self.dk4) + 4 * u64::from(self.threads) + 8 * kg)
            + 16 * u64::from(self.shared4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::Attention;
    use crate::decode::{Decoder, KvCache, KvCacheSpec};
    use crate::Dtype;
    use ndarray::Array4;

    #[test]
    fn rows_fit_workgroup_memory_and_columns_cover_the_head() {
        // K's staging shares its array with the key groups' merge: 16 KiB keep 8 rows and
        // 8 texels a step at d 128.
        let c = GpuPartialConsts::new(32, (32, 32), 16 << 10).unwrap();
        assert_eq!((c.rows, c.col_threads, c.key_groups, c.out4), (8, 32, 2, 1));
        assert_eq!((c.k_step, c.k_pitch, c.shared4), (8, 9, 576));
        assert_eq!(c.workgroup_bytes(), 15488);
        // Where neither fits, the K step shrinks to 4 before the rows halve.
        let c = GpuPartialConsts::new(32, (32, 32), 15 << 10).unwrap();
        assert_eq!((c.rows, c.k_step, c.k_pitch), (8, 4, 5));
        let c = GpuPartialConsts::new(8, (64, 64), 16 << 10).unwrap();
        assert_eq!((c.rows, c.key_groups, c.out4), (4, 1, 1));
        // d_v = 20 (5 vec4s): 12 key groups of 5 threads; 3 rows round up to 4.
        let c = GpuPartialConsts::new(3, (2, 5), 16 << 10).unwrap();
        assert_eq!((c.rows, c.col_threads, c.key_groups), (4, 5, 12));
        // d_v = 512: two columns per thread.
        assert_eq!(
            GpuPartialConsts::new(1, (8, 128), 32 << 10).unwrap().out4,
            2
        );
        assert!(GpuPartialConsts::new(1, (4096, 4096), 16 << 10).is_err());
        // Loads in flight: d 128, 8 K texels and 8 keys' V per step; d_k 20 (5 vec4s, a
        // prime) all 5; d_v 20: a key group's 6 keys; d 512: 4 keys of 2 columns.
        let c = GpuPartialConsts::new(1, (32, 32), 32 << 10).unwrap();
        assert_eq!((c.k_step, c.v_step), (8, 8));
        let c = GpuPartialConsts::new(3, (5, 5), 16 << 10).unwrap();
        assert_eq!((c.k_step, c.v_step), (5, 6));
        let c = GpuPartialConsts::new(1, (128, 128), 32 << 10).unwrap();
        assert_eq!((c.k_step, c.v_step), (8, 4));
        assert_eq!(
            GpuPartialConsts::new(1, (13, 8), 32 << 10).unwrap().k_step,
            1
        );
    }

    /// The GPU kernel, forced on the test adapter, against the f64 reference: odd lengths and
    /// widths, GQA, several rows per step, blocks that end inside a tile, an f16 cache.
    #[test]
    fn the_gpu_kernel_matches_the_reference() {
        let ctx = crate::context::test_context();
        let f = |salt: usize| {
            move |(a, b, c, d): (usize, usize, usize, usize)| {
                (((a * 31 + b * 17 + c * 7 + d) * (salt + 2)) as f32 * 0.013).sin() * 2.0
            }
        };
        for (len, heads, kv_heads, (dk, dv), dtype) in [
            (300, 6, 2, (6, 9), Dtype::F32),
            (37, 4, 4, (64, 64), Dtype::F32),
            (130, 8, 2, (128, 80), Dtype::F16),
            (7, 2, 1, (20, 256), Dtype::F32),
        ] {
            let q = Array4::from_shape_fn((2, heads, len, dk), f(1));
            let k = Array4::from_shape_fn((2, kv_heads, len, dk), f(2));
            let v = Array4::from_shape_fn((2, kv_heads, len, dv), f(3));
            let spec = KvCacheSpec {
                capacity: len + 3,
                batch: 2,
                kv_heads,
                d_k: dk,
                d_v: dv,
                dtype,
            };
            let mut cache = KvCache::new(ctx, spec).unwrap();
            let (k, v) = match dtype {
                Dtype::F16 => {
                    let h = |a: &Array4<f32>| a.mapv(half::f16::from_f32);
                    let (kh, vh) = (h(&k), h(&v));
                    cache.append(ctx, kh.view(), vh.view()).unwrap();
                    let f = |a: Array4<half::f16>| a.mapv(half::f16::to_f32);
                    (f(kh), f(vh))
                }
                Dtype::F32 => {
                    cache.append(ctx, k.view(), v.view()).unwrap();
                    (k, v)
                }
            };
            let op = Attention::new().causal(true);
            let want = crate::reference::run(&op, &crate::Inputs::qkv(&q, &k, &v))
                .unwrap()
                .context;
            for block in [64, 1024] {
                let dec = Decoder::new().nan_fill(true).gpu_kernel(true).block(block);
                let got = dec.step(ctx, &cache, q.view()).unwrap();
                let (rel, _) = crate::reference::compare(&got.into_dyn(), &want);
                assert!(rel < 1e-5, "len {len} d {dk}/{dv} block {block}: {rel:e}");
                // One new row against the whole cache.
                let last = q.slice(ndarray::s![.., .., len - 1.., ..]);
                let got = dec.step(ctx, &cache, last).unwrap();
                let want_last = want.slice(ndarray::s![.., .., len - 1.., ..]).to_owned();
                let (rel, _) = crate::reference::compare(&got.into_dyn(), &want_last.into_dyn());
                assert!(rel < 1e-5, "len {len} one row, block {block}: {rel:e}");
            }
        }
    }

    /// The GPU kernel with modifiers (a window, which also moves the first block, a soft-cap
    /// and ALiBi) against the reference with the same presets: the last 20 rows, from the
    /// whole cache and from a rolling cache that holds only the last 128 tokens.
    #[test]
    fn the_gpu_kernel_applies_modifiers() {
        use crate::modifiers::{Modifiers, Preset};
        let ctx = crate::context::test_context();
        let f = |salt: usize| {
            move |(a, b, c, d): (usize, usize, usize, usize)| {
                (((a * 31 + b * 17 + c * 7 + d) * (salt + 2)) as f32 * 0.013).sin() * 2.0
            }
        };
        let (len, heads, kv_heads, d) = (300, 4, 2, 12);
        let q = Array4::from_shape_fn((2, heads, len, d), f(1));
        let k = Array4::from_shape_fn((2, kv_heads, len, d), f(2));
        let v = Array4::from_shape_fn((2, kv_heads, len, d), f(3));
        let spec = KvCacheSpec {
            capacity: len,
            batch: 2,
            kv_heads,
            d_k: d,
            d_v: d,
            dtype: Dtype::F32,
        };
        let mut cache = KvCache::new(ctx, spec).unwrap();
        cache.append(ctx, k.view(), v.view()).unwrap();
        // And a rolling cache of 128 tokens that got them in three appends (wrapped twice).
        let mut rolling = KvCache::new(
            ctx,
            KvCacheSpec {
                capacity: 128,
                ..spec
            },
        )
        .unwrap()
        .rolling();
        for at in [0, 100, 200] {
            let r = ndarray::s![.., .., at..at + 100, ..];
            rolling.append(ctx, k.slice(r), v.slice(r)).unwrap();
        }
        let mods = Modifiers::new()
            .preset(Preset::Window { left: 50, right: 0 })
            .preset(Preset::Softcap(1.5))
            .preset(Preset::Alibi(Preset::alibi_slopes(heads)));
        let mask = crate::Mask::none().with_modifiers(&mods);
        let op = Attention::new().causal(true);
        let want = crate::reference::run(&op, &crate::Inputs::qkv(&q, &k, &v).mask(&mask))
            .unwrap()
            .context;
        let last = ndarray::s![.., .., len - 20.., ..];
        let want = want.slice(last).to_owned().into_dyn();
        for block in [64, 1024] {
            let dec = Decoder::new()
                .nan_fill(true)
                .gpu_kernel(true)
                .block(block)
                .modifiers(&mods);
            for (what, cache) in [("whole", &cache), ("rolling", &rolling)] {
                let got = dec.step(ctx, cache, q.slice(last)).unwrap();
                let (rel, _) = crate::reference::compare(&got.into_dyn(), &want);
                assert!(rel < 1e-5, "{what}, block {block}: {rel:e}");
            }
        }
    }
}
