//! `shaders/flash_tiled.wgsl`: fused attention from storage buffers, for any adapter. A
//! workgroup owns 64 query rows of one (batch, head), one row per thread; K and V stream
//! through workgroup memory in tiles of `BK` keys; online softmax, so memory stays O(n·d).
//!
//! The [`Flash`] problem and its uniform are shared with `flash_subgroup.rs`: both kernels
//! compute `softmax(scale·Q·Kᵀ + mask)·V` per (batch, head) in one pass.

use crate::error::{Error, Limit, Result};
use crate::gpu::Gpu;
use crate::kernels::block_map::{BlockMap, MapShape};
use crate::kernels::loops::{self, run, Build};
use crate::kernels::mods::{ModsBind, ModsUpload};
use crate::kernels::wgsl::{constants, uniform};
use crate::kernels::{record_with, u32_of, Dim, Kernel, KernelId, MaskArg, Slot, Strides};

/// The kernel.
pub(crate) struct Shader;

/// Query rows per workgroup (the shader's `WG`).
pub(crate) const ROWS: usize = 64;

uniform! {
    /// The uniform block of `flash_tiled.wgsl` and `flash_subgroup.wgsl`.
    pub(crate) struct FlashParams {
        n_q: u32,
        n_kv: u32,
        heads: u32,
        groups: u32,
        blocks: u32,
        causal: u32,
        dk_h: u32,
        dv_h: u32,
        q_off: u32,
        q_batch: u32,
        q_head: u32,
        q_row: u32,
        o_off: u32,
        o_batch: u32,
        o_head: u32,
        o_row: u32,
        k_off: u32,
        k_batch: u32,
        k_head: u32,
        k_row: u32,
        v_off: u32,
        v_batch: u32,
        v_head: u32,
        v_row: u32,
        /// Packed K and V textures' layouts (`flash_subgroup.wgsl` only).
        k_shift: u32,
        k_rows: u32,
        v_shift: u32,
        v_rows: u32,
        scale_log2: f32,
        kv_ratio: u32,
        /// Key ranges per query block and keys per range (`flash_blocked.wgsl` with `SPLIT`).
        splits: u32,
        split_keys: u32,
        /// The mask's element strides over (batch, head, query, key).
        mask: [u32; 4],
    }
}

constants! {
    /// Specialisation of `flash_tiled.wgsl`.
    pub(crate) struct FlashTiledConsts {
        /// Keys per tile.
        keys => "BK",
        /// Query/key width of one head in vec4s, rounded up.
        dk4 => "DK4",
        /// Value width of one head in vec4s, rounded up.
        dv4 => "DV4",
        /// 1 when a mask is bound.
        mask => "MASK",
        /// 1 to write each row's log-sum-exp (a forward saved for the backward pass).
        lse => "LSE",
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::FlashTiled;
    const WORKGROUP: [Dim; 3] = [Dim::Fixed(ROWS as u32), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[
        Slot::Read("q_buf"),
        Slot::Read("k_buf"),
        Slot::Read("v_buf"),
        Slot::ReadWrite("out"),
        Slot::Read("mask"),
        Slot::ReadWrite("lse"),
    ];
    /// Bit 0: Q is f16; bit 1: K and V are f16.
    const DTYPES: &'static [&'static str] = &["Q_T", "KV_T"];
    type Consts = FlashTiledConsts;
    type Params = FlashParams;

    /// Per key tile: the tile's loop, its K and V staging, the scores and the P·V loops
    /// over its keys; around it Q's load and the output's store (`// unroll` loops, counted
    /// only where they stay loops).
    fn loops(c: &FlashTiledConsts, p: &FlashParams, b: Build) -> u64 {
        let (bk, dk4, dv4) = (u64::from(c.keys), u64::from(c.dk4), u64::from(c.dv4));
        let wg = ROWS as u64;
        let m4 = b.marked(4);
        let stage = |width4| {
            let trips = loops::strided(bk * width4, wg);
            run(trips) + trips * m4
        };
        let scores = run(bk) + bk * b.marked(dk4);
        let values = b.marked(dv4) + run(bk) + bk * b.marked(dv4);
        let tile = 1 + stage(dk4) + stage(dv4) + scores + values;
        let tiles = u64::from(p.n_kv).div_ceil(bk.max(1)) + 1;
        let edges = b.marked(dk4) + dk4 * m4 + 2 * b.marked(dv4) + dv4 * m4;
        run(tiles * tile) + edges
    }
}

/// The workgroup memory of K/V tiles of `keys` rows at per-head widths `(dk4, dv4)` in vec4s.
fn tile_bytes(keys: u32, (dk4, dv4): (u32, u32)) -> u64 {
    u64::from(keys) * u64::from(dk4 + dv4) * 16
}

/// Whether K/V tiles of `keys` rows fit `limits` at per-head widths `widths4` (in vec4s).
pub(crate) fn tiles_fit(limits: &wgpu::Limits, keys: u32, widths4: (u32, u32)) -> bool {
    tile_bytes(keys, widths4) <= u64::from(limits.max_compute_workgroup_storage_size)
}

/// Where a fused kernel writes: the context and, for a forward saved for the backward pass,
/// each row's log-sum-exp of its log2-domain scores (`batch·heads·n_q` f32s, row
/// `(b·heads + h)·n_q + i`; `LSE_EMPTY` = 3e38 for a row with nothing to attend to).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FlashOut<'a> {
    /// The context.
    pub context: &'a wgpu::Buffer,
    /// The row statistics, when saved.
    pub lse: Option<&'a wgpu::Buffer>,
}

impl<'a> From<&'a wgpu::Buffer> for FlashOut<'a> {
    fn from(context: &'a wgpu::Buffer) -> Self {
        FlashOut { context, lse: None }
    }
}

impl<'a> From<&'a crate::gpu::pool::Buf> for FlashOut<'a> {
    fn from(context: &'a crate::gpu::pool::Buf) -> Self {
        FlashOut { context, lse: None }
    }
}

impl<'a> FlashOut<'a> {
    /// The context buffer, the buffer bound as `lse` (when unsaved, the context's stand-in
    /// for an untouched output: not the context itself, since WebGPU rejects a writable
    /// binding aliasing another) and the `LSE` constant.
    pub fn parts(self, ctx: &'a Gpu) -> (&'a wgpu::Buffer, &'a wgpu::Buffer, u32) {
        match self.lse {
            Some(lse) => (self.context, lse, 1),
            None => (self.context, ctx.unused_out(), 0),
        }
    }
}

/// One fused attention problem: `groups = batch · heads` independent heads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Flash {
    /// Batch indices.
    pub batch: usize,
    /// Heads per batch index.
    pub heads: usize,
    /// Query rows.
    pub n_q: usize,
    /// Key/value rows.
    pub n_kv: usize,
    /// Query/key width of one head.
    pub dk_h: usize,
    /// Value width of one head.
    pub dv_h: usize,
    /// Q's layout (column stride 1).
    pub q: Strides,
    /// K's layout (column stride 1).
    pub k: Strides,
    /// V's layout (column stride 1).
    pub v: Strides,
    /// The output's layout (column stride 1).
    pub o: Strides,
    /// Causal mask (top-left aligned).
    pub causal: bool,
    /// Factor on `Q·Kᵀ`.
    pub scale: f32,
    /// Query heads that share one K/V head (grouped-query attention; 1 otherwise).
    pub kv_ratio: usize,
    /// Q, K and V are f16 (scores, sums and the output are f32 either way).
    pub f16: bool,
    /// Keys whose weight is exactly 0 (masked, hidden by causal, underflowed) are left out
    /// of the sum, so a non-finite value there cannot reach the row (for inputs passed through
    /// with NaN/Inf; finite inputs give the same either way). `flash_tiled` always does this.
    pub skip_zero: bool,
    /// Whether `flash_blocked` splits the keys (see `flash_combine.rs`).
    pub key_split: super::flash_combine::KeySplit,
}

impl Flash {
    /// The block map that a kernel of blocks of `rows` query rows with tiles of `keys` keys
    /// (one that calls `wa_block`) binds with the modifiers `mods`: with a mask modifier,
    /// theirs for this problem (computed the first time).
    ///
    /// # Errors
    /// As [`crate::kernels::block_map::BlockMap::compute`].
    pub fn block_map(
        &self,
        ctx: &Gpu,
        mods: Option<&ModsUpload>,
        rows: usize,
        keys: u32,
    ) -> Result<Option<std::sync::Arc<BlockMap>>> {
        let Some(m) = mods else {
            return Ok(None);
        };
        let shape = MapShape {
            rows: u32_of("query rows per block", rows)?,
            keys: MapShape::keys_for(keys),
            batch: u32_of("batch", self.batch)?,
            heads: u32_of("heads", self.heads)?,
            n_q: u32_of("queries", self.n_q)?,
            n_kv: u32_of("keys", self.n_kv)?,
            causal: self.causal,
        };
        m.bind(ctx, shape)
    }

    /// The uniform block (texture layouts zero) and the workgroup count for blocks of
    /// `rows_per_block` query rows.
    pub fn params(&self, rows_per_block: usize, mask: [u32; 4]) -> Result<(FlashParams, u64)> {
        let groups = self.batch * self.heads;
        let blocks = self.n_q.div_ceil(rows_per_block);
        let (q, k, v, o) = (self.q, self.k, self.v, self.o);
        let p = FlashParams {
            n_q: u32_of("queries", self.n_q)?,
            n_kv: u32_of("keys", self.n_kv)?,
            heads: u32_of("heads", self.heads)?,
            groups: u32_of("batch·heads", groups)?,
            blocks: u32_of("query blocks", blocks)?,
            causal: u32::from(self.causal),
            dk_h: u32_of("d_k per head", self.dk_h)?,
            dv_h: u32_of("d_v per head", self.dv_h)?,
            q_off: q.off,
            q_batch: q.batch,
            q_head: q.head,
            q_row: q.row,
            o_off: o.off,
            o_batch: o.batch,
            o_head: o.head,
            o_row: o.row,
            k_off: k.off,
            k_batch: k.batch,
            k_head: k.head,
            k_row: k.row,
            v_off: v.off,
            v_batch: v.batch,
            v_head: v.head,
            v_row: v.row,
            scale_log2: self.scale * std::f32::consts::LOG2_E,
            kv_ratio: u32_of("heads per K/V head", self.kv_ratio.max(1))?,
            mask,
            ..Default::default()
        };
        Ok((p, (groups * blocks) as u64))
    }

    /// Which of the storage kernels' element types (`Q_T`, `KV_T`) are f16.
    pub fn f16_bits(&self) -> u8 {
        if self.f16 {
            0b11
        } else {
            0
        }
    }

    /// Whether each 4 values of a row of Q, K, V and the output (dO and the gradients in
    /// the backward, laid out as O, Q, K and V) are one aligned vec4: head widths and every
    /// offset and stride multiples of 4 (the kernels' `VEC`).
    pub fn vector_layout(&self) -> bool {
        let aligned = |s: crate::kernels::Strides| {
            [s.off, s.batch, s.head, s.row]
                .iter()
                .all(|x| x.is_multiple_of(4))
        };
        self.dk_h.is_multiple_of(4)
            && self.dv_h.is_multiple_of(4)
            && [self.q, self.k, self.v, self.o].into_iter().all(aligned)
    }

    /// One (batch, head) of `n_q` queries against `n_kv` keys at head width `d`, rows
    /// packed, not causal, f32, scale 1 (tests start from it).
    #[cfg(test)]
    pub(crate) fn one_head(n_q: usize, n_kv: usize, d: usize) -> Self {
        let st = Strides::row_major(d as u32, 0, 0);
        Flash {
            batch: 1,
            heads: 1,
            n_q,
            n_kv,
            dk_h: d,
            dv_h: d,
            q: st,
            k: st,
            v: st,
            o: st,
            causal: false,
            scale: 1.0,
            kv_ratio: 1,
            f16: false,
            skip_zero: false,
            key_split: Default::default(),
        }
    }

    /// Per-head widths in vec4s, rounded up: `(DK4, DV4)`.
    pub fn widths4(&self) -> Result<(u32, u32)> {
        Ok((
            u32_of("d_k per head", self.dk_h.div_ceil(4))?,
            u32_of("d_v per head", self.dv_h.div_ceil(4))?,
        ))
    }

    /// The constants of `flash_tiled.wgsl` with tiles of `keys` keys, `(mask, lse)` its
    /// flags.
    fn tiled_consts(&self, keys: u32, (mask, lse): (u32, u32)) -> Result<FlashTiledConsts> {
        let (dk4, dv4) = self.widths4()?;
        Ok(FlashTiledConsts {
            keys,
            dk4,
            dv4,
            mask,
            lse,
        })
    }

    /// The loop iterations of `flash_tiled`'s busiest invocation on `dev` with tiles of
    /// `keys` keys: what recording it checks against the adapter's loop cap (the count does
    /// not depend on the mask or the saved log-sum-exp).
    pub(crate) fn tiled_loops(&self, dev: &Gpu, keys: u32) -> Result<u64> {
        let consts = self.tiled_consts(keys, (0, 0))?;
        let (params, _) = self.params(ROWS, [0; 4])?;
        Ok(Shader::loops(
            &consts,
            &params,
            Build::of(dev.hardware().emulate),
        ))
    }

    /// Records `out ← softmax(scale·Q·Kᵀ + mask)·V` with `flash_tiled.wgsl`, K/V tiles of
    /// `keys` rows.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] when the tiles do not fit in workgroup memory, or a size does
    /// not fit the grid.
    #[allow(clippy::too_many_arguments)]
    pub fn dispatch_tiled(
        &self,
        ctx: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        keys: u32,
        q: &wgpu::Buffer,
        k: &wgpu::Buffer,
        v: &wgpu::Buffer,
        out: FlashOut<'_>,
        mask: Option<MaskArg<'_>>,
    ) -> Result<()> {
        let mods = MaskArg::mods(mask);
        let (mask, mask_strides, has_mask) = MaskArg::bias_parts(ctx, mask);
        let (out, lse_buf, lse) = out.parts(ctx);
        let consts = self.tiled_consts(keys, (has_mask, lse))?;
        let needed = tile_bytes(keys, (consts.dk4, consts.dv4));
        let limit = u64::from(ctx.limits().max_compute_workgroup_storage_size);
        if needed > limit {
            return Err(Error::LimitExceeded {
                what: format!("flash-tiled(bk={keys}) K/V tiles"),
                needed: format!("{needed} bytes"),
                limit: format!("{limit} bytes"),
                limit_name: Limit::MaxComputeWorkgroupStorageSize,
            });
        }
        let (params, workgroups) = self.params(ROWS, mask_strides)?;
        let map = self.block_map(ctx, mods, ROWS, keys)?;
        record_with::<Shader>(
            ctx,
            encoder,
            (&consts, self.f16_bits()),
            &params,
            &[
                q.into(),
                k.into(),
                v.into(),
                out.into(),
                mask.into(),
                lse_buf.into(),
            ],
            mods.map(|upload| ModsBind {
                upload,
                map: map.as_deref(),
            }),
            workgroups,
        )
    }
}
