//! Storage buffers: uploads of host arrays and allocations for results, each checked against
//! the device's limits first so an oversize problem is an `Err`, not a wgpu panic.

use super::Gpu;
use crate::error::{Error, Limit, Result};
pub(crate) use crate::gpu::pool::Buf;

const F32: u64 = std::mem::size_of::<f32>() as u64;

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// Checks that a storage buffer of `len` f32s fits the device's limits.
///
/// # Errors
/// [`Error::LimitExceeded`] naming the buffer, its size and the limit.
pub(crate) fn check_len(ctx: &Gpu, what: &str, len: usize) -> Result<u64> {
    let bytes = (len as u64).max(1) * F32;
    let limits = ctx.limits();
    if bytes > limits.max_storage_buffer_binding_size {
        return Err(Error::LimitExceeded {
            what: what.to_string(),
            needed: mib(bytes),
            limit: mib(limits.max_storage_buffer_binding_size),
            limit_name: Limit::MaxStorageBufferBindingSize,
        });
    }
    if bytes > limits.max_buffer_size {
        return Err(Error::LimitExceeded {
            what: what.to_string(),
            needed: mib(bytes),
            limit: mib(limits.max_buffer_size),
            limit_name: Limit::MaxBufferSize,
        });
    }
    // Kernels index with u32.
    if len as u64 > u32::MAX as u64 {
        return Err(Error::LimitExceeded {
            what: what.to_string(),
            needed: format!("{len} elements"),
            limit: format!("{} elements", u32::MAX),
            limit_name: Limit::U32Indexing,
        });
    }
    Ok(bytes)
}

/// Uploads `data` into a new read-only storage buffer.
///
/// # Errors
/// [`Error::LimitExceeded`] when it is larger than the device allows.
pub(crate) fn upload(ctx: &Gpu, label: &str, data: &[f32]) -> Result<wgpu::Buffer> {
    check_len(ctx, label, data.len())?;
    // wgpu rejects zero-sized bindings; a one-element dummy stands in for "no data".
    let contents: &[f32] = if data.is_empty() { &[0.0] } else { data };
    init(
        ctx,
        label,
        bytemuck::cast_slice(contents),
        // COPY_DST: kernels write some (Adam's state), and the WGSL sanitizer writes what
        // they wrote back.
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
    )
}

/// Uploads `data` as the element type the kernels read it in: f32, or with `f16` each value
/// rounded to f16 (half the bytes), padded to a multiple of four values (one `vec4<f16>`).
///
/// # Errors
/// [`Error::LimitExceeded`] when it is larger than the device allows.
pub(crate) fn upload_as(ctx: &Gpu, label: &str, data: &[f32], f16: bool) -> Result<wgpu::Buffer> {
    if !f16 {
        return upload(ctx, label, data);
    }
    check_len(ctx, label, data.len())?;
    let mut halves: Vec<half::f16> = data.iter().map(|&v| half::f16::from_f32(v)).collect();
    halves.resize(data.len().max(1).next_multiple_of(4), half::f16::ZERO);
    init(
        ctx,
        label,
        bytemuck::cast_slice(&halves),
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
    )
}

/// A storage buffer of `len` f16 values (padded to a multiple of four) that a kernel writes
/// and another reads: the projected Q, K, V under `--dtype f16`. From the context's pool.
///
/// # Errors
/// [`Error::LimitExceeded`] when it is larger than the device allows.
pub(crate) fn output_f16(ctx: &Gpu, label: &str, len: usize) -> Result<Buf> {
    check_len(ctx, label, len)?;
    Ok(pooled(
        ctx,
        label,
        (len.max(1).next_multiple_of(4) * 2) as u64,
    ))
}

/// A storage buffer of at least `bytes` from the context's pool, which kernels write and
/// copies read: a size class up, so nothing may read its length from the buffer.
pub(crate) fn pooled(ctx: &Gpu, label: &str, bytes: u64) -> Buf {
    pooled_as(ctx, label, bytes, storage_usage(ctx))
}

/// [`pooled`] with `usage`.
pub(crate) fn pooled_as(ctx: &Gpu, label: &str, bytes: u64, usage: wgpu::BufferUsages) -> Buf {
    let limits = ctx.limits();
    let max = limits
        .max_storage_buffer_binding_size
        .min(limits.max_buffer_size);
    ctx.pool.take(&ctx.device, label, bytes, usage, max)
}

/// The usage of the storage buffers kernels write: on unified memory also `MAP_READ`, so a
/// readback maps the buffer itself instead of copying it into a staging buffer.
fn storage_usage(ctx: &Gpu) -> wgpu::BufferUsages {
    let usage =
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
    match ctx.hardware().unified_memory {
        true => usage | wgpu::BufferUsages::MAP_READ,
        false => usage,
    }
}

/// A buffer holding `bytes` (a multiple of 4 long), written while mapped at creation. Unlike
/// wgpu's `create_buffer_init`, a device that is gone is an `Err` here, not a panic.
fn init(ctx: &Gpu, label: &str, bytes: &[u8], usage: wgpu::BufferUsages) -> Result<wgpu::Buffer> {
    let buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: bytes.len() as u64,
        usage,
        mapped_at_creation: true,
    });
    {
        let mut view = buffer.slice(..).get_mapped_range_mut().map_err(|e| {
            ctx.check_alive()
                .err()
                .unwrap_or_else(|| Error::Validation(format!("{label}: {e}")))
        })?;
        view.copy_from_slice(bytes);
    }
    buffer.unmap();
    Ok(buffer)
}

/// Allocates a storage buffer of `len` f32s that kernels write and readback copies from,
/// from the context's pool. With `nan_fill` every element starts as NaN, so an element no
/// kernel wrote shows up (such a buffer is new, not pooled).
///
/// # Errors
/// [`Error::LimitExceeded`] when it is larger than the device allows.
pub(crate) fn output(ctx: &Gpu, label: &str, len: usize, nan_fill: bool) -> Result<Buf> {
    let bytes = check_len(ctx, label, len)?;
    if !nan_fill {
        return Ok(pooled(ctx, label, bytes));
    }
    let buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: bytes,
        usage: storage_usage(ctx),
        mapped_at_creation: nan_fill,
    });
    if nan_fill {
        {
            let mut view = buffer.slice(..).get_mapped_range_mut().map_err(|e| {
                ctx.check_alive()
                    .err()
                    .unwrap_or_else(|| Error::Validation(format!("{label}: {e}")))
            })?;
            // Mapped memory is write-only: write whole bytes, never read.
            let nans = vec![f32::NAN; len.max(1)];
            view.copy_from_slice(bytemuck::cast_slice(&nans));
        }
        buffer.unmap();
    }
    Ok(Buf::unpooled(buffer))
}

/// A uniform buffer holding one typed parameter block.
///
/// # Errors
/// As [`upload`].
pub(crate) fn uniform<P: bytemuck::Pod>(
    ctx: &Gpu,
    label: &str,
    params: &P,
) -> Result<wgpu::Buffer> {
    init(
        ctx,
        label,
        bytemuck::bytes_of(params),
        // COPY_SRC: the WGSL sanitizer reads a modifier's uniforms back.
        wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_SRC,
    )
}
