//! `shaders/softmax.wgsl`: in-place row-wise softmax of `scale · scores`, one workgroup per
//! row, with the causal mask, an optional additive mask and the mask's score and mask
//! modifiers.

use super::mods::ModsBind;
use super::wgsl::{constants, uniform};
use super::{record_with, u32_of, Dim, Kernel, KernelId, MaskArg, Slot};
use crate::error::Result;
use crate::gpu::Gpu;

/// The kernel.
pub(crate) struct Shader;

uniform! {
    /// The uniform block of `softmax.wgsl`.
    pub(crate) struct SoftmaxParams {
        rows: u32,
        cols: u32,
        n_q: u32,
        causal: u32,
        scale: f32,
        heads: u32,
        _pad: [u32; 2],
        /// The mask's element strides over (batch, head, query, key).
        mask: [u32; 4],
    }
}

constants! {
    /// Specialisation of `softmax.wgsl`.
    pub(crate) struct SoftmaxConsts {
        /// 1 when a mask is bound.
        mask => "MASK",
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::Softmax;
    const WORKGROUP: [Dim; 3] = [Dim::Fixed(64), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[Slot::ReadWrite("s"), Slot::Read("mask")];
    type Consts = SoftmaxConsts;
    type Params = SoftmaxParams;

    /// Three strided passes over a row's columns and two tree reductions.
    fn loops(_c: &SoftmaxConsts, p: &SoftmaxParams, _b: super::loops::Build) -> u64 {
        let run = super::loops::run;
        3 * run(super::loops::strided(u64::from(p.cols), 64)) + 2 * run(6)
    }
}

/// Records `scores ← softmax(scale · scores + mask)` row by row, in place, for
/// `batch · heads` score matrices of `n_q × n_kv`; causal hides keys past each query, and the
/// mask's modifiers apply as in the fused kernels (the score modifier before the bias, the
/// mask modifier after).
#[allow(clippy::too_many_arguments)]
pub(crate) fn dispatch(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    (batch, heads): (usize, usize),
    (n_q, n_kv): (usize, usize),
    scale: f32,
    causal: bool,
    scores: &wgpu::Buffer,
    mask: Option<MaskArg<'_>>,
) -> Result<()> {
    let mods = MaskArg::mods(mask);
    let (mask, strides, has_mask) = MaskArg::bias_parts(ctx, mask);
    let rows = batch * heads * n_q;
    let params = SoftmaxParams {
        rows: u32_of("softmax rows", rows)?,
        cols: u32_of("softmax columns", n_kv)?,
        n_q: u32_of("queries", n_q)?,
        causal: u32::from(causal),
        scale,
        heads: u32_of("heads", heads)?,
        mask: strides,
        ..Default::default()
    };
    let consts = SoftmaxConsts { mask: has_mask };
    // No block map: this kernel visits every key of a row (it calls no `wa_block`).
    record_with::<Shader>(
        ctx,
        encoder,
        (&consts, 0),
        &params,
        &[scores.into(), mask.into()],
        mods.map(|upload| ModsBind { upload, map: None }),
        rows as u64,
    )
}
