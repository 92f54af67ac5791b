//! `shaders/flash_blocked.wgsl`: fused attention for GPUs, in FlashAttention-2's manner. A
//! workgroup owns `rows` query rows of one (batch, head) and walks the keys in tiles of
//! `keys`; each thread computes a 4 × 4 block of the scores and 4 rows × a slice of the head
//! dimension of the output in registers, Q, K and V streaming through workgroup memory in
//! chunks (so workgroup memory does not grow with the head size). Same [`Flash`] problem and
//! uniform as `flash_tiled.rs`.

use super::flash_tiled::{Flash, FlashOut};
use crate::error::{Error, Limit, Result};
use crate::gpu::Gpu;
use crate::kernels::loops::{self, run, Build};
use crate::kernels::wgsl::constants;
use crate::kernels::{record_with, Dim, Kernel, KernelId, MaskArg, Slot};

/// The kernel.
pub(crate) struct Shader;

constants! {
    /// Specialisation of `flash_blocked.wgsl`.
    pub(crate) struct FlashBlockedConsts {
        /// Query rows per workgroup.
        rows => "BR",
        /// Keys per tile.
        keys => "BC",
        /// Threads per workgroup: `(rows / 4) · (keys / 4)`.
        threads => "WG",
        /// Query/key width of one head in vec4s, rounded up.
        dk4 => "DK4",
        /// Value width of one head in vec4s, rounded up.
        dv4 => "DV4",
        /// Width of the Q and K chunks in vec4s (divides `dk4`).
        chunk4 => "DC4",
        /// Keys per V chunk (a multiple of 4 dividing `keys`).
        v_keys => "VC",
        /// Output vec4 columns per thread: `dv4 / (keys / 4)`, rounded up.
        out4 => "OC",
        /// 1 when a mask is bound.
        mask => "MASK",
        /// 1 to leave keys of weight exactly 0 out of the sum (NaN/Inf pass-through).
        skip_zero => "SKIP_ZERO",
        /// 1 to write each row's log-sum-exp (a forward saved for the backward pass).
        lse => "LSE",
        /// 1 to compute one key range and write partial results (`flash_combine.rs`).
        split => "SPLIT",
        /// 1 to double-buffer the chunks: the next one loads while this one is used.
        dbuf => "DBUF",
        /// 1 to reduce the row maxima and sums with subgroup shuffles instead of `red`.
        sgr => "SGR",
        /// 1 to keep the chunks and P in workgroup memory as f16 (`H_T = f16`), widened to
        /// f32 where they are multiplied; statistics and sums stay f32.
        hmul => "HMUL",
        /// 1 to read Q, K, V and write the output as vec4s ([`Flash::vector_layout`]).
        vec => "VEC",
        /// 1 to keep the block's Q rows in workgroup memory for the whole key loop.
        qres => "QRES",
    }
}

/// How the GPU family's fused kernel ([`super::FlashVariant::Blocked`]) runs its inner loop.
/// Each choice is a specialisation constant, so every combination is a variant of its own;
/// `None` leaves the choice to the adapter ([`crate::Context::with_blocked_options`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct BlockedOptions {
    /// Double-buffer the Q/K and V chunks in workgroup memory (the next chunk loads while the
    /// current one is used, one barrier per chunk instead of two). `None`: on GPUs, wherever
    /// the two buffers fit the workgroup memory limit; off on CPU adapters (lavapipe), where
    /// it measured slower.
    pub double_buffer: Option<bool>,
    /// Reduce the running row max and sum with subgroup shuffles instead of a round trip
    /// through workgroup memory. `None`: where the adapter has `Features::SUBGROUP` and every
    /// subgroup size it may use holds a row group; `Some(true)` elsewhere is an error.
    pub subgroups: Option<bool>,
    /// With f16 operands (`Dtype::F16`), keep Q, K, V and P in workgroup memory as f16
    /// (`vec4<f16>`: half the bytes; P rounded to f16), each widened to f32 where `Q·Kᵀ` and
    /// `P·V` multiply it (exact products; the softmax statistics and the output accumulators
    /// stay f32). `None`: on GPUs, off on CPU adapters (lavapipe), where f16 brings no speed.
    /// Ignored with f32 operands.
    pub f16_arithmetic: Option<bool>,
    /// Read Q, K and V (and write the output) with one vector load (store) per 4 values of a
    /// row, where the layout allows it (head widths and every offset and stride of Q, K, V
    /// and the output multiples of 4; elsewhere 4 scalar loads, whatever this says). `None`:
    /// on, on every adapter.
    pub vector_loads: Option<bool>,
    /// Stage the block's query rows into workgroup memory once, before the first key tile,
    /// instead of again with every tile (each tile then loads its keys alone). `None`: on
    /// every adapter wherever the block's workgroup memory stays within 32 KiB with it (on
    /// lavapipe, 64 × 32 blocks at d = 64, 15 % faster; past 32 KiB GPUs lose occupancy);
    /// `Some(true)`: wherever it fits the device's limit, a limit error elsewhere.
    pub resident_queries: Option<bool>,
}

crate::setters::setters!(BlockedOptions {
    double_buffer: Option<bool>,
    subgroups: Option<bool>,
    f16_arithmetic: Option<bool>,
    vector_loads: Option<bool>,
    resident_queries: Option<bool>,
});

impl BlockedOptions {
    /// Every inner-loop option off: the plain loop, scalar loads, Q staged with every key
    /// tile, no double buffer, no subgroup reductions, f32 arithmetic (what each option is
    /// measured and checked against).
    pub const fn plain() -> Self {
        BlockedOptions {
            double_buffer: Some(false),
            subgroups: Some(false),
            f16_arithmetic: Some(false),
            vector_loads: Some(false),
            resident_queries: Some(false),
        }
    }

    /// Whether f16 operands are multiplied in f16 on `ctx` (`f16_arithmetic`, by default on
    /// GPUs only).
    pub(crate) fn f16_products(&self, ctx: &Gpu) -> bool {
        self.f16_arithmetic
            .unwrap_or(ctx.hardware().decide.f16_products)
    }
}

/// The inner-loop constants [`BlockedOptions`] resolve to on one adapter: `(dbuf, sgr, hmul,
/// vec, qres)` (`vec`: wherever the layout allows; `dbuf` and `qres`: where they fit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Inner {
    pub dbuf: u32,
    pub sgr: u32,
    pub hmul: u32,
    pub vec: u32,
    pub qres: u32,
}

impl Inner {
    /// What `opts` mean for blocks of `keys` keys on `ctx` (the double buffer is decided by
    /// [`Flash::blocked_consts_with`], by what fits), with f16 operands when `f16`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when `opts` ask for subgroups the adapter cannot give.
    pub fn resolve(
        ctx: &Gpu,
        opts: BlockedOptions,
        (rows, keys): (u32, u32),
        f16: bool,
    ) -> Result<Self> {
        let (min, max) = ctx.hardware().subgroup_range;
        let tx = keys / 4;
        // Row groups of TX aligned lanes, and only full subgroups (sizes are powers of 2).
        let has = ctx.device().features().contains(wgpu::Features::SUBGROUP)
            && tx.is_power_of_two()
            && min >= tx
            && max.is_power_of_two()
            && ((rows / 4) * tx) % max.max(1) == 0;
        let sgr = match opts.subgroups {
            Some(true) if !has => {
                return Err(Error::Unsupported {
                    feature: format!(
                        "subgroup reductions in flash_blocked with {keys} keys per tile \
                         (wgpu::Features::SUBGROUP, subgroups of at least {tx} lanes)"
                    ),
                    adapter: ctx.adapter_name(),
                    hint: "leave BlockedOptions::subgroups unset, or use 32 keys per tile".into(),
                });
            }
            Some(on) => on,
            None => has,
        };
        let hmul = f16 && opts.f16_products(ctx);
        Ok(Inner {
            dbuf: u32::from(
                opts.double_buffer
                    .unwrap_or(ctx.hardware().decide.double_buffer),
            ),
            sgr: u32::from(sgr),
            hmul: u32::from(hmul),
            vec: u32::from(opts.vector_loads.unwrap_or(true)),
            qres: u32::from(opts.resident_queries.unwrap_or(true)),
        })
    }
}

impl Kernel for Shader {
    /// Every index proven in bounds: see the "Bounds" paragraph of its WGSL header.
    const TRUSTED: bool = true;
    const ID: KernelId = KernelId::FlashBlocked;
    const WORKGROUP: [Dim; 3] = [Dim::Const("WG"), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[
        Slot::Read("q_buf"),
        Slot::Read("k_buf"),
        Slot::Read("v_buf"),
        Slot::ReadWrite("out"),
        Slot::Read("mask"),
        Slot::ReadWrite("lse"),
    ];
    /// Bit 0: Q is f16; bit 1: K and V are f16; bit 2: products in f16 (`HMUL`).
    const DTYPES: &'static [&'static str] = &["Q_T", "KV_T", "H_T"];
    const SUBGROUPS_IF: Option<&'static str> = Some("SGR");
    type Consts = FlashBlockedConsts;
    type Params = super::flash_tiled::FlashParams;

    /// Per key tile (of a key range, with `SPLIT`): the head-dimension chunks of Q·Kᵀ with
    /// their staging, the row reductions, and the V chunks of P·V with theirs; every staging
    /// counted on both `DBUF` branches, both reductions, and `// unroll` loops where they
    /// stay loops.
    fn loops(c: &FlashBlockedConsts, p: &super::flash_tiled::FlashParams, b: Build) -> u64 {
        let u = |x: u32| u64::from(x);
        let (br, bc, wg) = (u(c.rows), u(c.keys).max(4), u(c.threads).max(1));
        let (dk4, dv4, oc) = (u(c.dk4), u(c.dv4), u(c.out4));
        let (dc4, vc) = (u(c.chunk4).max(1), u(c.v_keys).max(4));
        let m = |n| b.marked(n);
        let m4 = m(4);
        let staged = |elems| {
            let trips = loops::strided(elems, wg);
            run(trips) + trips * m4
        };
        let qr = if c.qres != 0 { 0 } else { br };
        let (stage_qk, stage_v) = (staged((qr + bc) * dc4), staged(vc * dv4));
        let chunk = 1 + stage_qk + stage_v + m(dc4) + dc4 * 7 * m4;
        let steps = u64::from(u64::BITS - (bc / 4).leading_zeros());
        let reduce = run(steps) + run(bc / 4);
        let probs = m4 + 4 * (m4 + m(oc)) + 16 * m(oc);
        let v_step = m4 + m(oc) + oc * (m4 + 4 * m4);
        let v_chunk = 1 + stage_v + stage_qk + run(vc / 4) + (vc / 4) * v_step;
        let chunks = run(dk4.div_ceil(dc4)) + dk4.div_ceil(dc4) * chunk;
        let tile = 1 + chunks + reduce + probs + run(bc.div_ceil(vc)) + bc.div_ceil(vc) * v_chunk;
        let keys = match c.split {
            0 => u(p.n_kv),
            _ => u(p.split_keys).min(u(p.n_kv)),
        };
        let tiles = keys.div_ceil(bc) + 1;
        let edges =
            staged(br * dk4) + stage_qk + reduce + m4 + m(oc) + 3 * (m4 + 4 * m(oc)) + 16 * oc * m4;
        run(tiles * tile) + edges
    }
}

/// The largest V chunk, in vec4s (8 KiB).
const V_CHUNK4: u32 = 512;
/// The widest Q/K chunk, in vec4s.
const MAX_CHUNK4: u32 = 8;
/// The most output vec4 columns a thread keeps (its 4 rows × 4 vec4s = 64 f32 registers):
/// more spills on real GPUs (8 at 64 × 32 blocks, d = 256, spilled 326 registers on RDNA3).
const MAX_OUT4: u32 = 4;

/// The most workgroup memory resident queries take by default (`BlockedOptions::
/// resident_queries` left `None`): past it RDNA3 runs fewer than 4 subgroups per SIMD
/// (64 × 32 blocks at d = 128 in f32, 47–52 KB, `.ci/gpu-shader-stats`), so the block
/// stages Q with each tile instead.
const RESIDENT_BYTES: u32 = 32 << 10;

/// The most output vec4 columns per thread with f16 arithmetic (wider falls back to f32
/// arithmetic: 64 × 32 blocks at d = 128, 4 columns, spilled 18 registers on RDNA3).
const MAX_HMUL_OUT4: u32 = 2;

impl FlashBlockedConsts {
    /// The specialisation for blocks of `rows` × `keys` and per-head widths `dk4`, `dv4` (in
    /// vec4s) whose workgroup memory fits `limits` (the chunks shrink until it does), or why
    /// there is none.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `rows` or `keys` is not a positive multiple of 4;
    /// [`Error::LimitExceeded`] when the workgroup has too many threads or its memory does not
    /// fit even with the smallest chunks.
    pub fn new(limits: &wgpu::Limits, shape: (u32, u32), widths4: (u32, u32)) -> Result<Self> {
        Self::fit(limits, shape, widths4, Inner::default())
    }

    /// As [`FlashBlockedConsts::new`], with the inner loop `inner` (with a double buffer,
    /// the V chunks shrink too until both buffers fit).
    ///
    /// # Errors
    /// As [`FlashBlockedConsts::new`].
    pub fn fit(
        limits: &wgpu::Limits,
        (rows, keys): (u32, u32),
        (dk4, dv4): (u32, u32),
        inner: Inner,
    ) -> Result<Self> {
        let what = format!("flash-blocked({rows}x{keys})");
        if rows == 0 || keys == 0 || rows % 4 != 0 || keys % 4 != 0 || dk4 == 0 || dv4 == 0 {
            return Err(Error::invalid(
                what,
                "rows and keys per block must be positive multiples of 4",
            ));
        }
        let threads = (rows / 4) * (keys / 4);
        let max_threads = limits
            .max_compute_invocations_per_workgroup
            .min(limits.max_compute_workgroup_size_x);
        if threads > max_threads {
            return Err(Error::LimitExceeded {
                what,
                needed: format!("{threads} threads"),
                limit: format!("{max_threads} threads"),
                limit_name: Limit::MaxComputeInvocationsPerWorkgroup,
            });
        }
        let out4 = dv4.div_ceil(keys / 4);
        if out4 > MAX_OUT4 {
            return Err(Error::LimitExceeded {
                what: format!("{what} output registers"),
                needed: format!("{out4} vec4 columns per thread"),
                limit: format!("{MAX_OUT4} (keys per tile ≥ d_v / 4)"),
                limit_name: Limit::Registers,
            });
        }
        // f16 products beside 4 × out4 f32 accumulators: past MAX_HMUL_OUT4 RDNA3 spills.
        let inner = Inner {
            hmul: inner.hmul * u32::from(out4 <= MAX_HMUL_OUT4),
            ..inner
        };
        let limit = u64::from(limits.max_compute_workgroup_storage_size);
        let mut best = None;
        // Widest chunks first: fewer barriers.
        let widest_v = (4..=keys)
            .rev()
            .step_by(4)
            .find(|&c| keys % c == 0 && (c * dv4 <= V_CHUNK4 || c == 4))
            .unwrap_or(4);
        for chunk4 in (1..=MAX_CHUNK4.min(dk4)).rev().filter(|c| dk4 % c == 0) {
            // Single-buffered with Q in the chunks, the widest V chunk only (its buffer is
            // shared with Q/K's, which are larger); with resident queries, the K chunk alone
            // is small, so the V chunk shrinks too.
            let narrowest_v = if inner.dbuf != 0 || inner.qres != 0 {
                4
            } else {
                widest_v
            };
            for v_keys in (narrowest_v..=widest_v).rev().step_by(4) {
                if keys % v_keys != 0 {
                    continue;
                }
                let c = FlashBlockedConsts {
                    rows,
                    keys,
                    threads,
                    dk4,
                    dv4,
                    chunk4,
                    v_keys,
                    out4,
                    mask: 0,
                    skip_zero: 0,
                    lse: 0,
                    split: 0,
                    dbuf: inner.dbuf,
                    sgr: inner.sgr,
                    hmul: inner.hmul,
                    vec: inner.vec,
                    qres: inner.qres,
                };
                if c.workgroup_bytes() <= limit {
                    return Ok(c);
                }
                best = Some(c);
            }
        }
        let needed = best.map_or(0, |c| c.workgroup_bytes());
        Err(Error::LimitExceeded {
            what: format!("{what} workgroup memory"),
            needed: format!("{needed} bytes"),
            limit: format!("{limit} bytes"),
            limit_name: Limit::MaxComputeWorkgroupStorageSize,
        })
    }

    /// Workgroup memory used, as the shader declares it.
    pub fn workgroup_bytes(&self) -> u64 {
        let resident = self.qres != 0;
        let q_rows = if resident { 0 } else { self.rows };
        let half = ((q_rows + self.keys) * (self.chunk4 + 1)).max(self.v_keys * self.dv4);
        let pool = u64::from(half) * (1 + u64::from(self.dbuf.min(1)));
        let q_sh = if resident {
            u64::from(self.rows * (self.dk4 + 1))
        } else {
            0
        };
        // P's rows are padded by a vec4 (other banks for neighbouring rows).
        let p = u64::from(self.rows * (self.keys.div_ceil(4) + 1)) + q_sh;
        // vec4<f16> is 8 bytes; `red` shrinks to one vec4 and an atomic counter with subgroups.
        let h_t = if self.hmul != 0 { 8 } else { 16 };
        let red = if self.sgr != 0 {
            16 + 4
        } else {
            16 * u64::from(self.threads)
        };
        h_t * (pool + p) + red
    }

    /// Which element types are f16 (`f16_bits` of the operands, and `H_T` with `hmul`).
    pub fn f16_bits(&self, operands: u8) -> u8 {
        operands | if self.hmul != 0 { 0b100 } else { 0 }
    }
}

impl Flash {
    /// The constants [`Flash::dispatch_blocked`] builds the kernel with on a device with
    /// `limits`, `has_mask` (0 or 1) saying whether a mask is bound, its inner loop `inner`
    /// (`hmul` only with f16 operands, `vec` only where [`Flash::vector_layout`] holds).
    ///
    /// # Errors
    /// As [`FlashBlockedConsts::new`].
    pub fn blocked_consts_with(
        &self,
        limits: &wgpu::Limits,
        shape: (u32, u32),
        has_mask: u32,
        inner: Inner,
    ) -> Result<FlashBlockedConsts> {
        let inner = Inner {
            hmul: inner.hmul * u32::from(self.f16),
            vec: inner.vec * u32::from(self.vector_layout()),
            ..inner
        };
        Ok(FlashBlockedConsts {
            mask: has_mask,
            skip_zero: u32::from(self.skip_zero),
            ..FlashBlockedConsts::fit(limits, shape, self.widths4()?, inner)?
        })
    }

    /// Records `out ← softmax(scale·Q·Kᵀ + mask)·V` with `flash_blocked.wgsl`, blocks of
    /// `rows` query rows × `keys` keys, its inner loop as `opts` say (the context's
    /// [`crate::Context::blocked_options`]).
    ///
    /// # Errors
    /// As [`FlashBlockedConsts::new`]; a size that does not fit the grid.
    #[allow(clippy::too_many_arguments)]
    pub fn dispatch_blocked(
        &self,
        ctx: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        (rows, keys): (u32, u32),
        opts: BlockedOptions,
        (q, k, v): (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
        out: FlashOut<'_>,
        mask: Option<MaskArg<'_>>,
    ) -> Result<()> {
        let inner = Inner::resolve(ctx, opts, (rows, keys), self.f16)?;
        if let Some(split) = self.key_ranges(ctx, (rows, keys)) {
            // The split's partials with the plain inner loop, read as vec4s where they can be.
            let plain = Inner {
                vec: inner.vec,
                ..Inner::default()
            };
            return self.dispatch_blocked_split(
                ctx,
                encoder,
                (rows, keys, plain),
                split,
                (q, k, v),
                out,
                mask,
            );
        }
        let mods = MaskArg::mods(mask);
        let (mask, mask_strides, has_mask) = MaskArg::bias_parts(ctx, mask);
        let (out, lse_buf, lse) = out.parts(ctx);
        let limits = ctx.limits();
        // What does not fit the workgroup memory goes, unless it was asked for: the resident
        // queries first, then the double buffer, then both. Resident queries left to the
        // adapter stay within RESIDENT_BYTES.
        let drop_q = inner.qres != 0 && opts.resident_queries.is_none();
        let drop_d = inner.dbuf != 0 && opts.double_buffer.is_none();
        let budget = wgpu::Limits {
            max_compute_workgroup_storage_size: limits
                .max_compute_workgroup_storage_size
                .min(RESIDENT_BYTES),
            ..limits.clone()
        };
        let fit = |inner: Inner| {
            let limits = if drop_q && inner.qres != 0 {
                &budget
            } else {
                limits
            };
            self.blocked_consts_with(limits, (rows, keys), has_mask, inner)
        };
        let fallbacks = [
            drop_q.then_some(Inner { qres: 0, ..inner }),
            drop_d.then_some(Inner { dbuf: 0, ..inner }),
            (drop_q && drop_d).then_some(Inner {
                qres: 0,
                dbuf: 0,
                ..inner
            }),
        ];
        let mut fitted = fit(inner);
        for inner in fallbacks.into_iter().flatten() {
            if !matches!(fitted, Err(Error::LimitExceeded { .. })) {
                break;
            }
            fitted = fit(inner);
        }
        let consts = fitted?;
        let consts = FlashBlockedConsts { lse, ..consts };
        let (params, workgroups) = self.params(rows as usize, mask_strides)?;
        let map = self.block_map(ctx, mods, rows as usize, keys)?;
        record_with::<Shader>(
            ctx,
            encoder,
            (&consts, consts.f16_bits(self.f16_bits())),
            &params,
            &[
                q.into(),
                k.into(),
                v.into(),
                out.into(),
                mask.into(),
                lse_buf.into(),
            ],
            mods.map(|upload| crate::kernels::mods::ModsBind {
                upload,
                map: map.as_deref(),
            }),
            workgroups,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(bytes: u32) -> wgpu::Limits {
        wgpu::Limits {
            max_compute_workgroup_storage_size: bytes,
            ..wgpu::Limits::default()
        }
    }

    #[test]
    fn chunks_fit_the_head_size_and_workgroup_memory() {
        let l = limits(48 << 10);
        let c = FlashBlockedConsts::new(&l, (64, 64), (16, 16)).unwrap();
        assert_eq!((c.threads, c.chunk4, c.v_keys, c.out4), (256, 8, 32, 1));
        // d = 80: a chunk that divides 20 vec4s; d = 256: V in chunks of 8 keys, 4 columns.
        let c = FlashBlockedConsts::new(&l, (64, 64), (20, 64)).unwrap();
        assert_eq!((c.chunk4, c.v_keys, c.out4), (5, 8, 4));
        assert_eq!(c.workgroup_bytes(), 33 << 10);
        // Less memory: narrower chunks.
        let small = FlashBlockedConsts::new(&limits(32 << 10), (64, 64), (16, 16)).unwrap();
        assert!(
            small.chunk4 < 8 && small.workgroup_bytes() <= 32 << 10,
            "{small:?}"
        );
    }

    #[test]
    fn bad_blocks_and_limits_are_errors() {
        let l = limits(32 << 10);
        for shape in [(0, 64), (64, 6), (30, 32)] {
            assert!(matches!(
                FlashBlockedConsts::new(&l, shape, (16, 16)),
                Err(Error::InvalidArgument { .. })
            ));
        }
        // 1,024 threads, over the default 256.
        assert!(matches!(
            FlashBlockedConsts::new(&l, (128, 128), (16, 16)),
            Err(Error::LimitExceeded { .. })
        ));
        assert!(matches!(
            FlashBlockedConsts::new(&limits(4 << 10), (64, 64), (16, 16)),
            Err(Error::LimitExceeded { .. })
        ));
        // d = 256 over 32 keys: 8 output vec4s per thread would spill.
        assert!(matches!(
            FlashBlockedConsts::new(&l, (64, 32), (64, 64)),
            Err(Error::LimitExceeded { .. })
        ));
    }

    #[test]
    fn double_buffers_fit_the_limit_and_f16_arithmetic_skips_wide_outputs() {
        let l = limits(32 << 10);
        let all = Inner {
            dbuf: 1,
            sgr: 1,
            hmul: 1,
            vec: 1,
            qres: 0,
        };
        let c = FlashBlockedConsts::fit(&l, (64, 64), (16, 16), all).unwrap();
        assert_eq!((c.dbuf, c.hmul, c.chunk4, c.v_keys), (1, 1, 8, 32));
        assert_eq!(c.workgroup_bytes(), 27156);
        // d = 128 over 32 keys: 4 output vec4s per thread, f32 arithmetic.
        let c = FlashBlockedConsts::fit(&l, (64, 32), (32, 32), all).unwrap();
        assert_eq!(c.hmul, 0);
        // f32 at 32 KiB (and `red` beside them, without subgroups): two buffers take
        // narrower chunks than one.
        let one = FlashBlockedConsts::fit(&l, (64, 64), (16, 16), Inner::default()).unwrap();
        let dbuf = Inner {
            dbuf: 1,
            ..Inner::default()
        };
        let two = FlashBlockedConsts::fit(&l, (64, 64), (16, 16), dbuf).unwrap();
        assert_eq!(
            (one.chunk4, one.v_keys, two.chunk4, two.v_keys),
            (4, 32, 1, 16)
        );
        assert_eq!(two.workgroup_bytes(), 29 << 10);
    }

    #[test]
    fn resident_queries_take_their_rows_out_of_the_chunks() {
        let qres = Inner {
            qres: 1,
            ..Inner::default()
        };
        // 64 × 32 at d = 64: Q (64 rows of 17 vec4s) + P (64 rows of 9) + a chunk of 32 K
        // rows of 5 vec4s or 16 V rows of 16 + `red` (128 vec4s): the chunks shrink to fit
        // 32 KiB.
        let c = FlashBlockedConsts::fit(&limits(32 << 10), (64, 32), (16, 16), qres).unwrap();
        assert_eq!((c.chunk4, c.v_keys, c.qres), (4, 16, 1));
        assert_eq!(c.workgroup_bytes(), (64 * 17 + 64 * 9 + 16 * 16 + 128) * 16);
        // 64 × 64: P doubles, past 32 KiB; 48 KiB holds it.
        let c = FlashBlockedConsts::fit(&limits(32 << 10), (64, 64), (16, 16), qres);
        assert!(matches!(c, Err(Error::LimitExceeded { .. })));
        assert!(FlashBlockedConsts::fit(&limits(48 << 10), (64, 64), (16, 16), qres).is_ok());
    }
}
