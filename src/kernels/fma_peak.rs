//! `shaders/fma_peak.wgsl`: independent chains of multiply-adds, the adapter's f32 arithmetic
//! ceiling for `bench`.

use super::loops::{run, Build};
use super::wgsl::{uniform, NoConstants};
use super::{record, Dim, Kernel, KernelId, Slot};
use crate::error::Result;
use crate::gpu::Gpu;

/// The kernel.
pub(crate) struct Shader;

/// FLOP per invocation and iteration: eight vec4 multiply-adds.
pub(crate) const FLOPS_PER_ITER: f64 = 64.0;

uniform! {
    /// The uniform block of `fma_peak.wgsl`.
    pub(crate) struct FmaPeakParams {
        iters: u32,
        invocations: u32,
        _pad: [u32; 2],
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::FmaPeak;
    const WORKGROUP: [Dim; 3] = [Dim::Fixed(64), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[Slot::ReadWrite("out")];
    type Consts = NoConstants;
    type Params = FmaPeakParams;

    /// The one loop, `iters` trips.
    fn loops(_: &NoConstants, p: &FmaPeakParams, _: Build) -> u64 {
        run(u64::from(p.iters))
    }
}

/// Records `invocations` invocations of `iters` iterations each, writing one value each to
/// `out`.
pub(crate) fn dispatch(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    invocations: u32,
    iters: u32,
    out: &wgpu::Buffer,
) -> Result<()> {
    let params = FmaPeakParams {
        iters,
        invocations,
        ..Default::default()
    };
    record::<Shader>(
        ctx,
        encoder,
        &NoConstants,
        0,
        &params,
        &[out.into()],
        u64::from(invocations.div_ceil(64)),
    )
}
