//! One launcher per WGSL kernel: its typed uniform (mirroring the WGSL `Params` struct) and
//! the arithmetic of its grid. Recording a dispatch is the same for all of them:
//! [`record`] builds the uniform, the bind group and the pass.

pub mod flash;
pub mod matmul;
pub mod matmul_subgroup;
pub mod pack;
pub mod softmax;
pub mod weighted_sum;

use crate::context::{Context, Profiling};
use crate::error::{Error, Result};
use crate::gpu::pipeline::PipelineKey;
use crate::gpu::timing::KernelTime;
use crate::gpu::{buffer, readback};

/// Splits `count` workgroups into an `(x, y)` grid under the per-dimension limit; kernels
/// recover the linear id as `x + y · num_workgroups.x` and drop ids past `count`.
///
/// # Errors
/// [`Error::LimitExceeded`] when even a square grid cannot hold `count`.
pub fn grid(count: u64, max_per_dim: u32) -> Result<(u32, u32)> {
    let max = u64::from(max_per_dim.max(1));
    if count == 0 {
        return Ok((0, 0));
    }
    let x = count.min(max);
    let y = count.div_ceil(x);
    if y > max {
        return Err(Error::LimitExceeded {
            what: "dispatch".into(),
            needed: format!("{count} workgroups"),
            limit: format!("{} workgroups", max * max),
            limit_name: "max_compute_workgroups_per_dimension",
        });
    }
    Ok((x as u32, y as u32))
}

/// A resource bound to a kernel after its uniform block.
#[derive(Debug, Clone, Copy)]
pub enum Binding<'a> {
    /// A storage buffer.
    Buffer(&'a wgpu::Buffer),
    /// A sampled or storage texture.
    Texture(&'a wgpu::TextureView),
}

impl<'a> From<&'a wgpu::Buffer> for Binding<'a> {
    fn from(b: &'a wgpu::Buffer) -> Self {
        Binding::Buffer(b)
    }
}

impl<'a> From<&'a wgpu::TextureView> for Binding<'a> {
    fn from(t: &'a wgpu::TextureView) -> Self {
        Binding::Texture(t)
    }
}

/// A mask as the kernels read it: the bias buffer (see [`crate::mask::gpu_layout`]) and its
/// element strides over `(batch, head, query, key)`, 0 along broadcast axes.
#[derive(Debug, Clone, Copy)]
pub struct MaskArg<'a> {
    /// The bias, `f32::MIN` where masked out.
    pub buffer: &'a wgpu::Buffer,
    /// Element strides over `(batch, head, query, key)`.
    pub strides: [u32; 4],
}

impl<'a> MaskArg<'a> {
    /// What a kernel binds and is built with for `mask`: the buffer (the context's stand-in
    /// when there is none), the strides, and the `MASK` constant.
    pub fn parts(ctx: &'a Context, mask: Option<MaskArg<'a>>) -> (&'a wgpu::Buffer, [u32; 4], u32) {
        match mask {
            Some(m) => (m.buffer, m.strides, 1),
            None => (ctx.stand_in(), [0; 4], 0),
        }
    }
}

/// Records one dispatch of `kernel` into `encoder`: `params` at binding 0, then `resources`
/// at bindings 1, 2, …, over `workgroups` workgroups.
pub fn record<P: bytemuck::Pod>(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    kernel: impl Into<PipelineKey>,
    params: &P,
    resources: &[Binding<'_>],
    workgroups: u64,
) -> Result<()> {
    let key = kernel.into();
    let label = key.kernel.file_name();
    let (x, y) = grid(
        workgroups,
        ctx.limits().max_compute_workgroups_per_dimension,
    )?;
    if x == 0 {
        return Ok(());
    }
    log::debug!(
        "{label} {:?}: {workgroups} workgroups as {x}x{y}",
        &key.consts[..key.kernel.constants().len()]
    );
    let pipeline = ctx.pipelines.get(ctx, key)?;
    let uniform = buffer::uniform(ctx, label, params)?;
    let mut entries = vec![wgpu::BindGroupEntry {
        binding: 0,
        resource: uniform.as_entire_binding(),
    }];
    entries.extend(
        resources
            .iter()
            .enumerate()
            .map(|(i, r)| wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: match *r {
                    Binding::Buffer(b) => b.as_entire_binding(),
                    Binding::Texture(t) => wgpu::BindingResource::TextureView(t),
                },
            }),
    );
    let bind_group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(label),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &entries,
    });
    let wall_clock = ctx.profiling() == Profiling::WallClock;
    let started = if wall_clock {
        // Finish what came before, so the clock sees this kernel alone.
        submit_and_wait(ctx, encoder)?;
        Some(std::time::Instant::now())
    } else {
        None
    };
    {
        let mut profiler = ctx
            .profiler
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(label),
            timestamp_writes: profiler.as_mut().and_then(|p| p.next(label)),
        });
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(x, y, 1);
    }
    if let Some(t) = started {
        submit_and_wait(ctx, encoder)?;
        ctx.push_time(KernelTime {
            kernel: label,
            ms: t.elapsed().as_secs_f64() * 1e3,
        });
    }
    Ok(())
}

/// Submits what `encoder` holds so far, waits for it, and leaves a fresh encoder in its place
/// (wall-clock profiling).
fn submit_and_wait(ctx: &Context, encoder: &mut wgpu::CommandEncoder) -> Result<()> {
    let fresh = ctx
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("profiled"),
        });
    let done = std::mem::replace(encoder, fresh);
    let submission = ctx.queue.submit([done.finish()]);
    readback::wait(ctx, submission)
}

/// Converts a size to the u32 the kernels index with.
pub(crate) fn u32_of(what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::LimitExceeded {
        what: what.to_string(),
        needed: v.to_string(),
        limit: u32::MAX.to_string(),
        limit_name: "u32 indexing",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_covers_count_exactly_or_more() {
        for &(count, max) in &[
            (1u64, 65535u32),
            (65535, 65535),
            (65536, 65535),
            (10_000_000, 65535),
            (3, 2),
        ] {
            let (x, y) = grid(count, max).unwrap();
            assert!(x <= max && y <= max);
            assert!(u64::from(x) * u64::from(y) >= count);
            assert!(u64::from(x) * u64::from(y - 1) < count, "one row too many");
        }
    }

    #[test]
    fn grid_rejects_what_cannot_fit() {
        assert!(matches!(grid(5, 2), Err(Error::LimitExceeded { .. })));
        assert_eq!(grid(0, 65535).unwrap(), (0, 0));
    }
}
