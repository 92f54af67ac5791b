//! `shaders/add.wgsl`: `y += x` elementwise over f32 buffers.

use super::wgsl::{uniform, NoConstants};
use super::{record, u32_of, Dim, Kernel, KernelId, Slot};
use crate::error::Result;
use crate::gpu::Gpu;

/// The kernel.
pub(crate) struct Shader;

uniform! {
    /// The uniform block of `add.wgsl`.
    pub(crate) struct AddParams {
        count: u32,
        _pad0: u32,
        _pad: [u32; 2],
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::Add;
    const WORKGROUP: [Dim; 3] = [Dim::Fixed(256), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[Slot::Read("x"), Slot::ReadWrite("y")];
    type Consts = NoConstants;
    type Params = AddParams;
}

/// Records `y[i] ← y[i] + x[i]` for the first `count` elements.
pub(crate) fn dispatch(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    count: usize,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
) -> Result<()> {
    let params = AddParams {
        count: u32_of("elements", count)?,
        ..Default::default()
    };
    record::<Shader>(
        ctx,
        encoder,
        &NoConstants,
        0,
        &params,
        &[x.into(), y.into()],
        (count as u64).div_ceil(256),
    )
}
