//! `shaders/pack.wgsl`: per-group matrices from a storage buffer into an `rgba32float`
//! texture (`rgba16float` for an f16 source: the values as they are, in half the memory), the
//! operand format of the subgroup kernels (also packed on the CPU when the source is a host
//! array: [`Pack::upload`]).

use super::wgsl::{uniform, NoConstants};
use super::{record, u32_of, Binding, Dim, Kernel, KernelId, Slot, Strides};
use crate::error::{Error, Limit, Result};
use crate::gpu::texture;
use crate::gpu::Gpu;

/// The kernel.
pub(crate) struct Shader;

uniform! {
    /// The uniform block of `pack.wgsl`.
    pub(crate) struct PackParams {
        n: u32,
        heads: u32,
        groups: u32,
        width: u32,
        d4: u32,
        shift: u32,
        rows: u32,
        off: u32,
        batch: u32,
        head: u32,
        row: u32,
        col: u32,
        aligned: u32,
        _pad0: u32,
        _pad: [u32; 2],
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::Pack;
    const WORKGROUP: [Dim; 3] = [Dim::Fixed(64), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[
        Slot::Read("src"),
        Slot::StorageTexture("dst"),
        Slot::Read("src4"),
    ];
    /// The source is f16; the texels are f16 (`rgba16float`, else `rgba32float`).
    const DTYPES: &'static [&'static str] = &["SRC_T", "TEX_T"];
    const TEXEL_DTYPE: Option<usize> = Some(1);
    type Consts = NoConstants;
    type Params = PackParams;

    /// The unaligned path's loop over a texel's 4 values (the WGSL sanitizer measured 5
    /// where the trait's default said 0).
    fn loops(_: &NoConstants, _: &PackParams, _: super::loops::Build) -> u64 {
        super::loops::run(4)
    }
}

/// Where `n` rows of `d4` texels per group go in a packed texture: `2^shift` rows side by side
/// per texture row, `rows` texture rows per group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PackLayout {
    /// log2 of the rows per texture row.
    pub shift: u32,
    /// Texture rows per group.
    pub rows: u32,
    /// Texels per matrix row (values / 4, rounded up).
    pub d4: u32,
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
    /// [`Error::LimitExceeded`] when one row is wider than the limit or the groups' rows do
    /// not fit its height.
    pub fn new(what: &str, groups: usize, n: usize, d4: usize, max_dim: u32) -> Result<Self> {
        let max_dim = max_dim as usize;
        if d4 > max_dim {
            return Err(Error::LimitExceeded {
                what: format!("{what} texture width (one row)"),
                needed: format!("{d4} texels"),
                limit: format!("{max_dim} texels"),
                limit_name: Limit::MaxTextureDimension2d,
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
                limit_name: Limit::MaxTextureDimension2d,
            });
        }
        Ok(PackLayout {
            shift,
            rows: rows as u32,
            d4: d4 as u32,
            width: (d4 << shift) as u32,
            height: height as u32,
        })
    }
}

/// A packed operand: the texture's view and where its rows are. Cloning shares the texture.
#[derive(Clone)]
pub(crate) struct Packed {
    /// For `textureLoad`.
    pub view: wgpu::TextureView,
    /// Its layout.
    pub layout: PackLayout,
    /// Its texels are `rgba16float` (an f16 source's), else `rgba32float`.
    pub half: bool,
}

/// One matrix per group to pack: `rows × width` values, element `(g, r, c)` at
/// `off + batch·(g / heads) + head·(g % heads) + row·r + col·c` of the source.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pack {
    /// Batch indices.
    pub batch: usize,
    /// Heads per batch index.
    pub heads: usize,
    /// Rows per group.
    pub rows: usize,
    /// Values per row.
    pub width: usize,
    /// Where the source elements are.
    pub src: Strides,
    /// The source is f16 (widened to f32 as it is packed).
    pub f16: bool,
}

impl Pack {
    /// Whether every texel is one aligned vec4 of the source.
    fn aligned(&self) -> bool {
        let s = self.src;
        s.col == 1
            && self.width.is_multiple_of(4)
            && [s.off, s.batch, s.head, s.row]
                .iter()
                .all(|v| v.is_multiple_of(4))
    }

    /// Packs `src` (the host copy of the buffer the strides index) on the CPU and uploads it
    /// into a new texture named `what`: the same texels [`Pack::dispatch`] writes, without a
    /// pass over slow storage loads.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] when the texture cannot hold it; [`Error::ShapeMismatch`]
    /// when the strides reach past `src`.
    pub fn upload(&self, ctx: &Gpu, what: &str, src: &[f32]) -> Result<Packed> {
        let groups = self.batch * self.heads;
        let layout = PackLayout::new(
            what,
            groups,
            self.rows,
            self.width.div_ceil(4),
            ctx.limits().max_texture_dimension_2d,
        )?;
        let (texture, view) = texture::rgba(ctx, what, (layout.width, layout.height), false)?;
        let (w, d4, shift) = (layout.width as usize, layout.d4 as usize, layout.shift);
        let mut texels = vec![0f32; w * layout.height as usize * 4];
        let s = self.src;
        let [off, batch, head, row, col] =
            [s.off, s.batch, s.head, s.row, s.col].map(|v| v as usize);
        for g in 0..groups {
            let base = off + (g / self.heads) * batch + (g % self.heads) * head;
            for j in 0..self.rows {
                let x = (j & ((1 << shift) - 1)) * d4;
                let y = g * layout.rows as usize + (j >> shift);
                let dst = &mut texels[(y * w + x) * 4..][..self.width];
                for (c, v) in dst.iter_mut().enumerate() {
                    *v = *src.get(base + j * row + c * col).ok_or_else(|| {
                        Error::shape(format!(
                            "{what}: strides reach past its {} values",
                            src.len()
                        ))
                    })?;
                }
            }
        }
        ctx.queue.write_texture(
            wgpu::TexelCopyTextureInfo {
                texture: &texture,
                mip_level: 0,
                origin: wgpu::Origin3d::ZERO,
                aspect: wgpu::TextureAspect::All,
            },
            bytemuck::cast_slice(&texels),
            wgpu::TexelCopyBufferLayout {
                offset: 0,
                bytes_per_row: Some(layout.width * 16),
                rows_per_image: Some(layout.height),
            },
            wgpu::Extent3d {
                width: layout.width,
                height: layout.height,
                depth_or_array_layers: 1,
            },
        );
        Ok(Packed {
            view,
            layout,
            half: false,
        })
    }

    /// Records the pack of `src` into a new texture named `what`.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] when the texture cannot hold it.
    pub fn dispatch(
        &self,
        ctx: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        what: &str,
        src: &wgpu::Buffer,
    ) -> Result<Packed> {
        let layout = self.layout(ctx, what)?;
        let (_texture, view) = texture::rgba(ctx, what, (layout.width, layout.height), self.f16)?;
        let packed = Packed {
            view,
            layout,
            half: self.f16,
        };
        self.dispatch_into(ctx, encoder, src, &packed)?;
        Ok(packed)
    }

    /// The layout of this pack's texture.
    fn layout(&self, ctx: &Gpu, what: &str) -> Result<PackLayout> {
        PackLayout::new(
            what,
            self.batch * self.heads,
            self.rows,
            self.width.div_ceil(4),
            ctx.limits().max_texture_dimension_2d,
        )
    }

    /// Records the pack of `src` into `dst`, a texture this pack made before (a packed copy
    /// of a weight, rewritten after the weight changed on the device). Texels past the
    /// matrices are left as they are.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `dst` has another layout; limits as
    /// [`Pack::dispatch`].
    pub fn dispatch_into(
        &self,
        ctx: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        src: &wgpu::Buffer,
        dst: &Packed,
    ) -> Result<()> {
        let groups = self.batch * self.heads;
        let layout = self.layout(ctx, "packed operand")?;
        if layout != dst.layout {
            return Err(Error::invalid(
                "pack",
                format!(
                    "internal: a texture of layout {:?} repacked as {layout:?}",
                    dst.layout
                ),
            ));
        }
        let params = PackParams {
            n: u32_of("rows", self.rows)?,
            heads: u32_of("heads", self.heads)?,
            groups: u32_of("batch·heads", groups)?,
            width: u32_of("row width", self.width)?,
            d4: layout.d4,
            shift: layout.shift,
            rows: layout.rows,
            off: self.src.off,
            batch: self.src.batch,
            head: self.src.head,
            row: self.src.row,
            col: self.src.col,
            aligned: u32::from(self.aligned()),
            _pad0: 0,
            _pad: [0; 2],
        };
        // The vec4 view needs at least one vec4; the stand-in serves tiny unaligned sources.
        let src4 = if src.size() >= 16 {
            src
        } else {
            ctx.stand_in()
        };
        let texels = (groups * self.rows) as u64 * u64::from(layout.d4);
        record::<Shader>(
            ctx,
            encoder,
            &NoConstants,
            // The source's type, and the texels' (an f16 weight is repacked into the
            // rgba32float texture its layer was built with).
            u8::from(self.f16) | (u8::from(dst.half) << 1),
            &params,
            &[src.into(), Binding::Texture(&dst.view), src4.into()],
            texels.div_ceil(64),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_folds_long_sequences_under_the_limit() {
        let l = PackLayout::new("K", 2, 32768, 16, 16384).unwrap();
        assert_eq!((l.shift, l.rows, l.width, l.height), (10, 32, 16384, 64));
        let l = PackLayout::new("K", 3, 7, 2, 16384).unwrap();
        assert!(l.width <= 16384 && (l.rows << l.shift) >= 7);
        assert_eq!(l.rows, 1);
        assert!(PackLayout::new("K", 100_000, 32768, 16, 16384).is_err());
        assert!(PackLayout::new("K", 1, 1, 20_000, 16384).is_err());
    }
}
