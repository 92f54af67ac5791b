//! `rgba32float` (or `rgba16float`) textures that kernels fill with `textureStore` and read
//! with `textureLoad` (four values per texel, read as f32), checked against the device's
//! texture limits first.

use super::Gpu;
use crate::error::{Error, Limit, Result};

/// A 2-D `rgba32float` texture (`rgba16float` when `half`) of `width × height` texels,
/// writable as a storage texture or by a copy, and readable with `textureLoad`; returns it
/// with its default view.
///
/// # Errors
/// [`Error::LimitExceeded`] when a side exceeds `max_texture_dimension_2d`.
pub fn rgba(
    ctx: &Gpu,
    label: &str,
    (width, height): (u32, u32),
    half: bool,
) -> Result<(wgpu::Texture, wgpu::TextureView)> {
    let max = ctx.limits().max_texture_dimension_2d;
    for (side, len) in [("width", width), ("height", height)] {
        if len > max {
            return Err(Error::LimitExceeded {
                what: format!("{label} texture {side}"),
                needed: format!("{len} texels"),
                limit: format!("{max} texels"),
                limit_name: Limit::MaxTextureDimension2d,
            });
        }
    }
    let texture = ctx.device.create_texture(&wgpu::TextureDescriptor {
        label: Some(label),
        size: wgpu::Extent3d {
            width: width.max(1),
            height: height.max(1),
            depth_or_array_layers: 1,
        },
        mip_level_count: 1,
        sample_count: 1,
        dimension: wgpu::TextureDimension::D2,
        format: match half {
            true => wgpu::TextureFormat::Rgba16Float,
            false => wgpu::TextureFormat::Rgba32Float,
        },
        // COPY_SRC: the WGSL sanitizer reads every bound texture back.
        usage: wgpu::TextureUsages::STORAGE_BINDING
            | wgpu::TextureUsages::TEXTURE_BINDING
            | wgpu::TextureUsages::COPY_DST
            | wgpu::TextureUsages::COPY_SRC,
        view_formats: &[],
    });
    let view = texture.create_view(&Default::default());
    Ok((texture, view))
}
