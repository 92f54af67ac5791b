//! Launchers of the fused attention kernels: `shaders/flash_tiled.wgsl` (storage buffers,
//! workgroup tiles; runs anywhere) and `shaders/flash_subgroup.wgsl` (K and V packed into
//! textures by `shaders/pack.wgsl`, shared through subgroup shuffles; fast on lavapipe).
//! Both compute `softmax(scale·Q·Kᵀ)·V` per (batch, head) group in one pass with an online
//! softmax, so memory stays O(n·d): no n × n matrix is ever allocated.

use bytemuck::{Pod, Zeroable};

use crate::context::Context;
use crate::error::{Error, Result};
use crate::gpu::pipeline::{KernelId, PipelineKey};
use crate::gpu::texture;
use crate::kernels::matmul::Strides;
use crate::kernels::{record, u32_of, Binding};

/// Query rows per workgroup in `flash_tiled.wgsl` (its `WG`).
pub const TILED_ROWS: usize = 64;

/// How the fused pass is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    _pad: [u32; 3],
}

/// Mirrors `Params` in `shaders/pack.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
struct PackParams {
    n: u32,
    heads: u32,
    groups: u32,
    width: u32,
    d4: u32,
    shift: u32,
    rows: u32,
    src: [u32; 4],
    _pad: u32,
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
}

fn strides4(s: Strides) -> [u32; 4] {
    [s.off, s.batch, s.head, s.row]
}

/// Where `n` rows of `d4` texels per group go in a packed texture: `2^shift` rows side by side
/// per texture row, `rows` texture rows per group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackLayout {
    /// log2 of the rows per texture row.
    pub shift: u32,
    /// Texture rows per group.
    pub rows: u32,
    /// Texture width in texels.
    pub width: u32,
    /// Texture height in texels.
    pub height: u32,
}

impl PackLayout {
    /// The layout for `groups` groups of `n` rows of `d4` texels under a side limit of
    /// `max_dim` texels.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] when even one row per texture row is too tall.
    pub fn new(what: &str, groups: usize, n: usize, d4: usize, max_dim: u32) -> Result<Self> {
        let max_dim = max_dim as usize;
        if d4 > max_dim {
            return Err(Error::LimitExceeded {
                what: format!("{what} texture width (one head)"),
                needed: format!("{d4} texels"),
                limit: format!("{max_dim} texels"),
                limit_name: "max_texture_dimension_2d",
            });
        }
        let mut shift = 0u32;
        while (d4 << (shift + 1)) <= max_dim && (1usize << shift) < n {
            shift += 1;
        }
        let rows = n.div_ceil(1 << shift);
        let height = groups * rows;
        if height > max_dim {
            return Err(Error::LimitExceeded {
                what: format!("{what} texture height (batch·heads·rows)"),
                needed: format!("{height} texels"),
                limit: format!("{max_dim} texels"),
                limit_name: "max_texture_dimension_2d",
            });
        }
        Ok(PackLayout {
            shift,
            rows: rows as u32,
            width: (d4 << shift) as u32,
            height: height as u32,
        })
    }
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
            ..Default::default()
        };
        Ok((p, (groups * blocks) as u64))
    }

    /// Records the fused pass: `out ← softmax(scale·Q·Kᵀ)·V`, with `variant`.
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
    ) -> Result<()> {
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
                let (params, wgs) = self.params(TILED_ROWS)?;
                let key = PipelineKey {
                    kernel: KernelId::FlashTiled,
                    consts: [keys, dk4, dv4, 0],
                };
                record(
                    ctx,
                    encoder,
                    key,
                    &params,
                    &[q.into(), k.into(), v.into(), out.into()],
                    wgs,
                )
            }
            FlashVariant::Subgroup { rows_per_lane } => {
                let sg = ctx.subgroup_size().ok_or_else(|| {
                    Error::invalid(
                        "kernel",
                        "the subgroup kernels need Features::SUBGROUP and a fixed subgroup \
                         size, which this adapter does not report; use the tiled kernels",
                    )
                })?;
                let groups = self.batch * self.heads;
                let max_dim = ctx.limits().max_texture_dimension_2d;
                let k_layout = PackLayout::new("K", groups, self.n_kv, dk4 as usize, max_dim)?;
                let v_layout = PackLayout::new("V", groups, self.n_kv, dv4 as usize, max_dim)?;
                let k_tex = self.pack(ctx, encoder, "K", k, self.k, self.dk_h, dk4, k_layout)?;
                let v_tex = self.pack(ctx, encoder, "V", v, self.v, self.dv_h, dv4, v_layout)?;
                let (mut params, wgs) = self.params((sg * rows_per_lane) as usize)?;
                params.k_shift = k_layout.shift;
                params.k_rows = k_layout.rows;
                params.v_shift = v_layout.shift;
                params.v_rows = v_layout.rows;
                let key = PipelineKey {
                    kernel: KernelId::FlashSubgroup,
                    consts: [sg, rows_per_lane, dk4, dv4],
                };
                record(
                    ctx,
                    encoder,
                    key,
                    &params,
                    &[
                        q.into(),
                        Binding::Texture(&k_tex),
                        Binding::Texture(&v_tex),
                        out.into(),
                    ],
                    wgs,
                )
            }
        }
    }

    /// Packs one of K or V into a texture with `layout`; returns its view.
    #[allow(clippy::too_many_arguments)]
    fn pack(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        what: &str,
        src: &wgpu::Buffer,
        strides: Strides,
        width: usize,
        d4: u32,
        layout: PackLayout,
    ) -> Result<wgpu::TextureView> {
        let (_texture, view) = texture::rgba32f(ctx, what, layout.width, layout.height)?;
        let groups = self.batch * self.heads;
        let params = PackParams {
            n: u32_of("keys", self.n_kv)?,
            heads: u32_of("heads", self.heads)?,
            groups: u32_of("batch·heads", groups)?,
            width: u32_of("head width", width)?,
            d4,
            shift: layout.shift,
            rows: layout.rows,
            src: strides4(strides),
            _pad: 0,
        };
        let texels = (groups * self.n_kv) as u64 * u64::from(d4);
        record(
            ctx,
            encoder,
            KernelId::Pack,
            &params,
            &[src.into(), Binding::Texture(&view)],
            texels.div_ceil(64),
        )?;
        Ok(view)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_sizes_match_wgsl_structs() {
        assert_eq!(std::mem::size_of::<FlashParams>(), 32 * 4);
        assert_eq!(std::mem::size_of::<PackParams>(), 12 * 4);
    }

    #[test]
    fn pack_layout_folds_long_sequences_under_the_limit() {
        let l = PackLayout::new("K", 2, 32768, 16, 16384).unwrap();
        assert_eq!((l.shift, l.rows, l.width, l.height), (10, 32, 16384, 64));
        let l = PackLayout::new("K", 3, 7, 2, 16384).unwrap();
        assert!(l.width <= 16384 && (l.rows << l.shift) >= 7);
        assert_eq!(l.rows, 1);
        assert!(PackLayout::new("K", 100_000, 32768, 16, 16384).is_err());
        assert!(PackLayout::new("K", 1, 1, 20_000, 16384).is_err());
    }
}
