//! Launchers of the fused attention kernels: `shaders/flash_tiled.wgsl` (storage buffers,
//! workgroup tiles; runs anywhere) and `shaders/flash_subgroup.wgsl` (K and V packed into
//! textures by `shaders/pack.wgsl`, shared through subgroup shuffles; fast on lavapipe).
//! Both compute `softmax(scale·Q·Kᵀ)·V` per (batch, head) group in one pass with an online
//! softmax, so memory stays O(n·d): no n × n matrix is ever allocated.

use bytemuck::{Pod, Zeroable};

use crate::context::Context;
use crate::error::{Error, Result};
use crate::gpu::pipeline::{KernelId, PipelineKey};
use crate::kernels::matmul::Strides;
use crate::kernels::pack::Pack;
use crate::kernels::{record, u32_of, Binding, MaskArg};

/// Query rows per workgroup in `flash_tiled.wgsl` (its `WG`).
pub const TILED_ROWS: usize = 64;

/// How the fused pass is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum FlashVariant {
    /// `flash_tiled.wgsl`: one query row per thread, K/V tiles of `keys` rows in workgroup
    /// memory.
    Tiled {
        /// Keys per tile.
        keys: u32,
    },
    /// `flash_subgroup.wgsl`: one subgroup per workgroup, `rows_per_lane` query rows per
    /// lane, K/V from textures.
    Subgroup {
        /// Query rows each lane owns.
        rows_per_lane: u32,
    },
}

impl std::fmt::Display for FlashVariant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FlashVariant::Tiled { keys } => write!(f, "flash-tiled(bk={keys})"),
            FlashVariant::Subgroup { rows_per_lane } => {
                write!(f, "flash-subgroup(r={rows_per_lane})")
            }
        }
    }
}

/// Mirrors `Params` in `shaders/flash_tiled.wgsl` and `shaders/flash_subgroup.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, Default)]
pub struct FlashParams {
    n_q: u32,
    n_kv: u32,
    heads: u32,
    groups: u32,
    blocks: u32,
    causal: u32,
    dk_h: u32,
    dv_h: u32,
    q: [u32; 4],
    o: [u32; 4],
    k: [u32; 4],
    v: [u32; 4],
    k_shift: u32,
    k_rows: u32,
    v_shift: u32,
    v_rows: u32,
    scale_log2: f32,
    kv_ratio: u32,
    mask: [u32; 4],
    _pad: [u32; 2],
}

/// One fused attention problem: `groups = batch · heads` independent heads.
#[derive(Debug, Clone, Copy)]
pub struct Flash {
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
}

fn strides4(s: Strides) -> [u32; 4] {
    [s.off, s.batch, s.head, s.row]
}

impl Flash {
    fn params(&self, rows_per_block: usize) -> Result<(FlashParams, u64)> {
        let groups = self.batch * self.heads;
        let blocks = self.n_q.div_ceil(rows_per_block);
        let p = FlashParams {
            n_q: u32_of("queries", self.n_q)?,
            n_kv: u32_of("keys", self.n_kv)?,
            heads: u32_of("heads", self.heads)?,
            groups: u32_of("batch·heads", groups)?,
            blocks: u32_of("query blocks", blocks)?,
            causal: u32::from(self.causal),
            dk_h: u32_of("d_k per head", self.dk_h)?,
            dv_h: u32_of("d_v per head", self.dv_h)?,
            q: strides4(self.q),
            o: strides4(self.o),
            k: strides4(self.k),
            v: strides4(self.v),
            scale_log2: self.scale * std::f32::consts::LOG2_E,
            kv_ratio: u32_of("heads per K/V head", self.kv_ratio.max(1))?,
            ..Default::default()
        };
        Ok((p, (groups * blocks) as u64))
    }

    /// Records the fused pass: `out ← softmax(scale·Q·Kᵀ + mask)·V`, with `variant`. When K and V
    /// are the same rows of the same buffer (no projections) and `host` holds that buffer's
    /// contents, the subgroup variant packs them on the CPU and uploads the texture, instead
    /// of a pack pass on the GPU.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the subgroup variant is asked for on a device without
    /// a fixed subgroup size; size limits as [`Error::LimitExceeded`].
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        variant: FlashVariant,
        q: &wgpu::Buffer,
        k: &wgpu::Buffer,
        v: &wgpu::Buffer,
        out: &wgpu::Buffer,
        mask: Option<MaskArg<'_>>,
        host: Option<&[f32]>,
    ) -> Result<()> {
        let (mask, mask_strides, has_mask) = MaskArg::parts(ctx, mask);
        let dk4 = u32_of("d_k per head", self.dk_h.div_ceil(4))?;
        let dv4 = u32_of("d_v per head", self.dv_h.div_ceil(4))?;
        match variant {
            FlashVariant::Tiled { keys } => {
                let needed = u64::from(keys) * u64::from(dk4 + dv4) * 16;
                let limit = u64::from(ctx.limits().max_compute_workgroup_storage_size);
                if needed > limit {
                    return Err(Error::LimitExceeded {
                        what: format!("{variant} K/V tiles"),
                        needed: format!("{needed} bytes"),
                        limit: format!("{limit} bytes"),
                        limit_name: "max_compute_workgroup_storage_size",
                    });
                }
                let (mut params, wgs) = self.params(TILED_ROWS)?;
                params.mask = mask_strides;
                let key = PipelineKey {
                    kernel: KernelId::FlashTiled,
                    consts: [keys, dk4, dv4, has_mask, 0, 0],
                    f16: if self.f16 { 0b11 } else { 0 },
                };
                record(
                    ctx,
                    encoder,
                    key,
                    &params,
                    &[q.into(), k.into(), v.into(), out.into(), mask.into()],
                    wgs,
                )
            }
            FlashVariant::Subgroup { rows_per_lane } => {
                let sg = ctx.require_subgroups()?;
                let pack = |src: Strides, width: usize| Pack {
                    batch: self.batch,
                    heads: self.heads / self.kv_ratio.max(1),
                    rows: self.n_kv,
                    width,
                    src,
                    f16: self.f16,
                };
                // Q = K = V = X (no projections): one texture serves both.
                let same = k == v && self.k == self.v && self.dk_h == self.dv_h;
                let k_tex = match host {
                    Some(data) if same => pack(self.k, self.dk_h).upload(ctx, "K", data)?,
                    _ => pack(self.k, self.dk_h).record(ctx, encoder, "K", k)?,
                };
                let v_packed;
                let v_tex = if same {
                    &k_tex
                } else {
                    v_packed = pack(self.v, self.dv_h).record(ctx, encoder, "V", v)?;
                    &v_packed
                };
                let (mut params, wgs) = self.params((sg * rows_per_lane) as usize)?;
                params.k_shift = k_tex.layout.shift;
                params.k_rows = k_tex.layout.rows;
                params.v_shift = v_tex.layout.shift;
                params.v_rows = v_tex.layout.rows;
                params.mask = mask_strides;
                let key = PipelineKey {
                    kernel: KernelId::FlashSubgroup,
                    consts: [
                        sg,
                        rows_per_lane,
                        dk4,
                        dv4,
                        has_mask,
                        u32::from(self.skip_zero),
                    ],
                    f16: u8::from(self.f16),
                };
                record(
                    ctx,
                    encoder,
                    key,
                    &params,
                    &[
                        q.into(),
                        Binding::Texture(&k_tex.view),
                        Binding::Texture(&v_tex.view),
                        out.into(),
                        mask.into(),
                    ],
                    wgs,
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_size_matches_wgsl_structs() {
        assert_eq!(std::mem::size_of::<FlashParams>(), 36 * 4);
    }
}
