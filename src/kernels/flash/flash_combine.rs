//! Prefill's key split (flash-decoding's, for the real-GPU fused kernel): when a call has too
//! few `batch · heads · query blocks` to fill a GPU, `flash_blocked.wgsl` (with `SPLIT`)
//! computes each query block over several key ranges at once, one workgroup per range, each
//! writing its rows' partial max, sum and unnormalised output; `shaders/flash_combine.wgsl`
//! merges them into the output (and the log-sum-exp, for a forward saved for the backward).
//!
//! **The rule** ([`KeySplit::Auto`]): on an adapter that is not a CPU, a call of fewer than
//! `2 · ASSUMED_UNITS` workgroups (wgpu reports no compute-unit count; 64 stands in for a large
//! GPU's) is split into enough ranges to reach `4 · ASSUMED_UNITS` workgroups, each range at
//! least `MIN_TILES` key tiles (fewer keys per range would spend more on the partials and
//! the combine than they save). CPU adapters (lavapipe) run a workgroup per host thread and
//! are filled by far fewer, so they never split unless [`KeySplit::Ranges`] forces it.

use super::flash_tiled::{Flash, FlashOut};
use crate::error::Result;
use crate::gpu::Gpu;
use crate::kernels::wgsl::{constants, uniform};
use crate::kernels::{record, record_with, u32_of, Dim, Kernel, KernelId, MaskArg, Slot};

/// The kernel.
pub(crate) struct Shader;

/// Threads per workgroup (the shader's literal).
const THREADS: usize = 64;

/// Compute units a GPU is assumed to have (wgpu does not report them): 64 is a large one's
/// (an RX 7900 XTX has 96, an H100 132 SMs, an M2 Max 38 cores).
pub(crate) const ASSUMED_UNITS: usize = 64;

/// The fewest key tiles one range holds.
const MIN_TILES: usize = 4;

uniform! {
    /// The uniform block of `flash_combine.wgsl`.
    pub(crate) struct SplitCombineParams {
        /// Output rows: `batch · heads · n_q`.
        rows: u32,
        /// Key ranges per row.
        splits: u32,
        /// Output width per head (unpadded).
        dv: u32,
        n_q: u32,
        heads: u32,
        /// The output's layout.
        o_off: u32,
        o_batch: u32,
        o_head: u32,
        o_row: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

constants! {
    /// Specialisation of `flash_combine.wgsl`.
    pub(crate) struct SplitCombineConsts {
        /// d_v per head in vec4s, rounded up.
        dv4 => "DV4",
        /// 1 to write each row's log-sum-exp.
        lse => "LSE",
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::FlashCombine;
    const WORKGROUP: [Dim; 3] = [Dim::Fixed(THREADS as u32), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[
        Slot::Read("o_part"),
        Slot::Read("ml_part"),
        Slot::ReadWrite("out"),
        Slot::ReadWrite("lse"),
    ];
    type Consts = SplitCombineConsts;
    type Params = SplitCombineParams;

    /// Two passes over the key ranges, then the `// unroll` store.
    fn loops(
        _c: &SplitCombineConsts,
        p: &SplitCombineParams,
        b: crate::kernels::loops::Build,
    ) -> u64 {
        2 * crate::kernels::loops::run(u64::from(p.splits)) + b.marked(4)
    }
}

/// How a split call's keys are cut: `splits` ranges of `keys` keys (a multiple of the tile).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyRanges {
    pub splits: usize,
    pub keys: usize,
}

/// The ranges for `n_kv` keys in tiles of `tile` when `split` asks for `want` ranges: whole
/// tiles each, at most one range per tile; `None` when that leaves one range.
fn ranges(n_kv: usize, tile: usize, want: usize) -> Option<KeyRanges> {
    let want = want.min(n_kv.div_ceil(tile)).max(1);
    let keys = n_kv.div_ceil(want).next_multiple_of(tile);
    let splits = n_kv.div_ceil(keys);
    (splits > 1).then_some(KeyRanges { splits, keys })
}

/// Whether the real-GPU fused kernel ([`super::FlashVariant::Blocked`]) splits the keys of each
/// query block over several workgroups (flash-decoding's split: each writes a partial max,
/// sum and output over its key range, and one combine merges them), so that a call with few
/// `batch · heads · query blocks` still fills a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeySplit {
    /// Split on adapters that are not CPUs when the call has fewer than
    /// 2 · 64 workgroups (wgpu reports no compute-unit count: 64 stands in for a large GPU),
    /// into ranges of at least 4 key tiles (see the README's kernel families).
    #[default]
    Auto,
    /// Never split.
    Off,
    /// Split into this many key ranges (fewer when the keys are fewer tiles), on any adapter
    /// (tests and measurements).
    Ranges(u32),
}

/// The split of a call of `workgroups` workgroups over `n_kv` keys in tiles of `tile`, by
/// `split` on an adapter that is a CPU or not (see the [module docs](self)).
pub(crate) fn key_ranges(
    split: KeySplit,
    cpu: bool,
    workgroups: usize,
    n_kv: usize,
    tile: usize,
) -> Option<KeyRanges> {
    match split {
        KeySplit::Off => None,
        KeySplit::Ranges(n) => ranges(n_kv, tile, n as usize),
        KeySplit::Auto if cpu || workgroups >= 2 * ASSUMED_UNITS => None,
        KeySplit::Auto => {
            let want = (4 * ASSUMED_UNITS).div_ceil(workgroups.max(1));
            ranges(n_kv, tile, want.min(n_kv / (MIN_TILES * tile)))
        }
    }
}

/// `split`, or where it has more than `most` ranges, the ranges of [`ranges`] for `most`
/// (`None` when that is one range).
fn within(split: Option<KeyRanges>, n_kv: usize, tile: usize, most: u64) -> Option<KeyRanges> {
    match split {
        Some(r) if r.splits as u64 > most => {
            ranges(n_kv, tile, usize::try_from(most).unwrap_or(usize::MAX))
        }
        other => other,
    }
}

impl Flash {
    /// The key split `flash_blocked` runs this call with in blocks of `rows` × `keys`.
    ///
    /// An automatic split ([`KeySplit::Auto`]) has no more ranges than the partial outputs'
    /// buffer holds within the device's binding limit (none when that is one).
    ///
    /// On a device that caps an invocation's loop iterations (llvmpipe: see
    /// [`crate::kernels::loops`]) the ranges are also short enough for one range's loops to
    /// fit, whatever `key_split` says: the split is invisible in the result, and a long call
    /// is then right where it would otherwise be refused.
    pub(crate) fn key_ranges(&self, ctx: &Gpu, (rows, keys): (u32, u32)) -> Option<KeyRanges> {
        let cpu = !ctx.hardware().decide.split_keys_to_fill;
        let workgroups = self.batch * self.heads * self.n_q.div_ceil(rows.max(1) as usize);
        let tile = keys.max(1) as usize;
        let mut base = key_ranges(self.key_split, cpu, workgroups, self.n_kv, tile);
        if self.key_split == KeySplit::Auto {
            // One vec4 per row, range and d_v / 4 (the max/sum pair is smaller): a split that
            // an automatic choice makes must not turn a call that fits into one refused.
            let limits = ctx.limits();
            let most = limits
                .max_storage_buffer_binding_size
                .min(limits.max_buffer_size);
            let slot = self.batch * self.heads * self.n_q * self.dv_h.div_ceil(4) * 16;
            base = within(base, self.n_kv, tile, most / slot.max(1) as u64);
        }
        let Some(cap) = ctx.hardware().loop_cap else {
            return base;
        };
        let fits = |range: usize| {
            self.range_loops(ctx, (rows, keys), range)
                .is_some_and(|n| n <= cap)
        };
        let longest = base.map_or(self.n_kv, |r| r.keys);
        if fits(longest) || !fits(tile) {
            // Fits as it is; or not even one tile per range does, and the dispatch says so.
            return base;
        }
        // The most whole tiles a range may hold (the count grows with the range).
        let (mut lo, mut hi) = (1, longest.div_ceil(tile));
        while lo + 1 < hi {
            let mid = (lo + hi) / 2;
            if fits(mid * tile) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let keys = lo * tile;
        Some(KeyRanges {
            splits: self.n_kv.div_ceil(keys),
            keys,
        })
    }

    /// The loop iterations of one invocation of `flash_blocked` split into ranges of
    /// `range` keys (`None` when the block does not fit the device at all).
    fn range_loops(&self, ctx: &Gpu, (rows, keys): (u32, u32), range: usize) -> Option<u64> {
        use crate::kernels::Kernel;
        let consts = super::flash_blocked::FlashBlockedConsts {
            split: 1,
            ..self
                .blocked_consts_with(ctx.limits(), (rows, keys), 0, Default::default())
                .ok()?
        };
        let (mut params, _) = self.params(rows as usize, [0; 4]).ok()?;
        params.split_keys = u32::try_from(range).ok()?;
        params.splits = u32::try_from(self.n_kv.div_ceil(range.max(1))).ok()?;
        let build = crate::kernels::loops::Build::of(ctx.hardware().emulate);
        Some(<super::flash_blocked::Shader as Kernel>::loops(
            &consts, &params, build,
        ))
    }

    /// Records `flash_blocked` split into `split`'s key ranges (its inner loop `inner`), then
    /// the combine into `out`.
    ///
    /// # Errors
    /// As [`Flash::dispatch_blocked`]; partial buffers or a grid past the device's limits.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn dispatch_blocked_split(
        &self,
        ctx: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        (rows, keys, inner): (u32, u32, super::flash_blocked::Inner),
        split: KeyRanges,
        (q, k, v): (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
        out: FlashOut<'_>,
        mask: Option<MaskArg<'_>>,
    ) -> Result<()> {
        let mods = MaskArg::mods(mask);
        let (mask, mask_strides, has_mask) = MaskArg::bias_parts(ctx, mask);
        let consts = super::flash_blocked::FlashBlockedConsts {
            split: 1,
            ..self.blocked_consts_with(ctx.limits(), (rows, keys), has_mask, inner)?
        };
        let (mut params, workgroups) = self.params(rows as usize, mask_strides)?;
        let map = self.block_map(ctx, mods, rows as usize, keys)?;
        params.splits = u32_of("key ranges", split.splits)?;
        params.split_keys = u32_of("keys per range", split.keys)?;
        let out_rows = self.batch * self.heads * self.n_q;
        let slots = out_rows * split.splits;
        let dv4 = consts.dv4 as usize;
        u32_of("split partial outputs", slots * dv4 * 4)?;
        let o_part =
            crate::gpu::buffer::output(ctx, "split partial outputs", slots * dv4 * 4, false)?;
        let ml_part = crate::gpu::buffer::output(ctx, "split partial max/sum", slots * 2, false)?;
        log::debug!(
            "flash-blocked({rows}x{keys}): keys split into {} ranges of {}",
            split.splits,
            split.keys
        );
        record_with::<super::flash_blocked::Shader>(
            ctx,
            encoder,
            (&consts, self.f16_bits()),
            &params,
            &[
                q.into(),
                k.into(),
                v.into(),
                (&o_part).into(),
                mask.into(),
                (&ml_part).into(),
            ],
            mods.map(|upload| crate::kernels::mods::ModsBind {
                upload,
                map: map.as_deref(),
            }),
            workgroups * split.splits as u64,
        )?;
        let (out, lse_buf, lse) = out.parts(ctx);
        let o = self.o;
        let params = SplitCombineParams {
            rows: u32_of("rows", out_rows)?,
            splits: params.splits,
            dv: u32_of("d_v per head", self.dv_h)?,
            n_q: u32_of("queries", self.n_q)?,
            heads: u32_of("heads", self.heads)?,
            o_off: o.off,
            o_batch: o.batch,
            o_head: o.head,
            o_row: o.row,
            ..Default::default()
        };
        u32_of("combine threads", out_rows * dv4)?;
        record::<Shader>(
            ctx,
            encoder,
            &SplitCombineConsts {
                dv4: consts.dv4,
                lse,
            },
            0,
            &params,
            &[
                (&o_part).into(),
                (&ml_part).into(),
                out.into(),
                lse_buf.into(),
            ],
            (out_rows * dv4).div_ceil(THREADS) as u64,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_splits_only_small_calls_on_gpus_into_whole_tiles() {
        // One head, 64 rows per block, 4096 keys: 1 workgroup; 256 wanted, 16 ranges of 4 tiles.
        let r = key_ranges(KeySplit::Auto, false, 1, 4096, 64).unwrap();
        assert_eq!(
            r,
            KeyRanges {
                splits: 16,
                keys: 256
            }
        );
        // 32 workgroups: 8 ranges wanted.
        let r = key_ranges(KeySplit::Auto, false, 32, 4096, 64).unwrap();
        assert_eq!(
            r,
            KeyRanges {
                splits: 8,
                keys: 512
            }
        );
        // Enough workgroups, a CPU adapter, too few keys, or Off: none.
        assert_eq!(key_ranges(KeySplit::Auto, false, 128, 4096, 64), None);
        assert_eq!(key_ranges(KeySplit::Auto, true, 1, 4096, 64), None);
        assert_eq!(key_ranges(KeySplit::Auto, false, 1, 300, 64), None);
        assert_eq!(key_ranges(KeySplit::Off, false, 1, 4096, 64), None);
        // Forced: on a CPU too, at most one range per tile, never one range.
        let r = key_ranges(KeySplit::Ranges(3), true, 1000, 300, 64).unwrap();
        assert_eq!(
            r,
            KeyRanges {
                splits: 3,
                keys: 128
            }
        );
        let r = key_ranges(KeySplit::Ranges(100), true, 1, 300, 64).unwrap();
        assert_eq!(
            r,
            KeyRanges {
                splits: 5,
                keys: 64
            }
        );
        assert_eq!(key_ranges(KeySplit::Ranges(4), true, 1, 37, 64), None);
        // Within a binding limit: fewer ranges, or none where only one fits.
        let r = key_ranges(KeySplit::Auto, false, 1, 4096, 64);
        assert_eq!(within(r, 4096, 64, 16), r);
        assert_eq!(
            within(r, 4096, 64, 5),
            Some(KeyRanges {
                splits: 5,
                keys: 832
            })
        );
        assert_eq!(within(r, 4096, 64, 1), None);
        assert_eq!(within(r, 4096, 64, 0), None);
        for n in [1, 7, 37, 300, 4097] {
            for want in 1..20 {
                if let Some(r) = key_ranges(KeySplit::Ranges(want), false, 1, n, 32) {
                    assert!(r.keys % 32 == 0 && r.splits > 1 && r.splits * r.keys >= n);
                    assert!((r.splits - 1) * r.keys < n, "{r:?} {n}");
                }
            }
        }
    }
}
