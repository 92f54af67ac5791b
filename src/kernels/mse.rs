//! `shaders/mse.wgsl`: the mean squared error's gradient and per-workgroup sums of squares.

use super::loops::{run, Build};
use super::wgsl::{uniform, NoConstants};
use super::{record, u32_of, Dim, Kernel, KernelId, Slot};
use crate::error::Result;
use crate::gpu::Gpu;

/// The kernel.
pub(crate) struct Shader;

/// Elements per workgroup: each writes one partial sum.
pub(crate) const PER_GROUP: usize = 256;

uniform! {
    /// The uniform block of `mse.wgsl`.
    pub(crate) struct MseParams {
        count: u32,
        groups: u32,
        scale: f32,
        _pad: u32,
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::Mse;
    const WORKGROUP: [Dim; 3] = [Dim::Fixed(256), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[
        Slot::Read("o"),
        Slot::Read("t"),
        Slot::ReadWrite("d_o"),
        Slot::ReadWrite("partial"),
    ];
    type Consts = NoConstants;
    type Params = MseParams;

    /// The workgroup's reduction: strides 128, 64, …, 1 (small and constant; stated anyway).
    fn loops(_: &NoConstants, _: &MseParams, _: Build) -> u64 {
        run((PER_GROUP as u64).trailing_zeros().into())
    }
}

/// Records `d_o ← scale·(o − t)` and `partial[w] ← Σ (o − t)²` over each workgroup `w` of
/// [`PER_GROUP`] elements, for `count` elements (`partial` holds `count / PER_GROUP`
/// rounded up).
#[allow(clippy::too_many_arguments)]
pub(crate) fn dispatch(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    count: usize,
    scale: f32,
    o: &wgpu::Buffer,
    t: &wgpu::Buffer,
    d_o: &wgpu::Buffer,
    partial: &wgpu::Buffer,
) -> Result<()> {
    let groups = count.div_ceil(PER_GROUP);
    let params = MseParams {
        count: u32_of("elements", count)?,
        groups: u32_of("workgroups", groups)?,
        scale,
        ..Default::default()
    };
    record::<Shader>(
        ctx,
        encoder,
        &NoConstants,
        0,
        &params,
        &[o.into(), t.into(), d_o.into(), partial.into()],
        groups as u64,
    )
}
