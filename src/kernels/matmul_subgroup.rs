//! Launcher of `shaders/matmul_subgroup.wgsl`: the texture/subgroup matmul, with its operands
//! packed by `shaders/pack.wgsl` first. Takes the same [`Matmul`] problem as
//! `shaders/matmul.wgsl`, so either kernel family computes the same thing.

use bytemuck::{Pod, Zeroable};

use crate::context::Context;
use crate::error::{Error, Result};
use crate::gpu::pipeline::{KernelId, PipelineKey};
use crate::kernels::matmul::{Matmul, HAS_BIAS, SKIP_UPPER};
use crate::kernels::pack::Pack;
use crate::kernels::{record, u32_of, Binding};

/// Epilogue flag: `C = exp2(scale_log2·(A·B) − lse[row])`, zero above the diagonal with
/// [`SKIP_UPPER`] (the attention weights from the flash pass's row statistics).
pub const SOFTMAX: u32 = 4;

/// Mirrors `Params` in `shaders/matmul_subgroup.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, Default)]
struct Params {
    m: u32,
    n: u32,
    k: u32,
    heads: u32,
    groups: u32,
    tiles_m: u32,
    tiles_n: u32,
    flags: u32,
    a_shift: u32,
    a_rows: u32,
    a_d4: u32,
    b_shift: u32,
    b_rows: u32,
    b_d4: u32,
    _pad0: [u32; 2],
    c_off: u32,
    c_batch: u32,
    c_head: u32,
    c_row: u32,
    scale_log2: f32,
    _pad1: [u32; 3],
}

/// The softmax epilogue's inputs: the row statistics and the scale.
#[derive(Debug, Clone, Copy)]
pub struct SoftmaxEpilogue<'a> {
    /// Per-row log2-sum-exp, `groups × m` values, from the flash pass.
    pub lse: &'a wgpu::Buffer,
    /// Factor on `A·B` before the softmax.
    pub scale: f32,
}

/// Records `mm` with the subgroup kernel, `rows_per_lane` tile rows per lane: packs A and B,
/// then one dispatch. `bias` is read when `mm.flags` has [`HAS_BIAS`]; with `softmax`, the
/// product becomes attention weights.
///
/// # Errors
/// [`Error::InvalidArgument`] without a fixed subgroup size; texture limits as
/// [`Error::LimitExceeded`].
#[allow(clippy::too_many_arguments)]
pub fn record_matmul(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    mm: &Matmul,
    rows_per_lane: u32,
    a: &wgpu::Buffer,
    b: &wgpu::Buffer,
    bias: &wgpu::Buffer,
    softmax: Option<SoftmaxEpilogue<'_>>,
    c: &wgpu::Buffer,
) -> Result<()> {
    let sg = ctx.subgroup_size().ok_or_else(|| {
        Error::invalid(
            "kernel",
            "matmul_subgroup needs Features::SUBGROUP and a fixed subgroup size",
        )
    })?;
    let mut pack = |what: &str, buf: &wgpu::Buffer, src, rows, width| {
        Pack {
            batch: mm.batch,
            heads: mm.heads,
            rows,
            width,
            src,
        }
        .record(ctx, encoder, what, buf)
    };
    let a_tex = pack("matmul A", a, mm.a, mm.m, mm.k)?;
    let b_tex = pack("matmul B", b, mm.b, mm.k, mm.n)?;
    let tile_rows = (sg * rows_per_lane) as usize;
    let tiles_m = mm.m.div_ceil(tile_rows);
    let tiles_n = mm.n.div_ceil(4 * sg as usize);
    let groups = mm.batch * mm.heads;
    let mut flags = mm.flags & (HAS_BIAS | SKIP_UPPER);
    if softmax.is_some() {
        flags |= SOFTMAX;
    }
    let params = Params {
        m: u32_of("matmul rows", mm.m)?,
        n: u32_of("matmul columns", mm.n)?,
        k: u32_of("matmul inner dimension", mm.k)?,
        heads: u32_of("heads", mm.heads)?,
        groups: u32_of("matmul groups", groups)?,
        tiles_m: u32_of("matmul row tiles", tiles_m)?,
        tiles_n: u32_of("matmul column tiles", tiles_n)?,
        flags,
        a_shift: a_tex.layout.shift,
        a_rows: a_tex.layout.rows,
        a_d4: a_tex.layout.d4,
        b_shift: b_tex.layout.shift,
        b_rows: b_tex.layout.rows,
        b_d4: b_tex.layout.d4,
        c_off: mm.c.off,
        c_batch: mm.c.batch,
        c_head: mm.c.head,
        c_row: mm.c.row,
        scale_log2: softmax.map_or(0.0, |s| s.scale * std::f32::consts::LOG2_E),
        ..Default::default()
    };
    let key = PipelineKey {
        kernel: KernelId::MatmulSubgroup,
        consts: [sg, rows_per_lane, 0, 0],
    };
    record(
        ctx,
        encoder,
        key,
        &params,
        &[
            Binding::Texture(&a_tex.view),
            Binding::Texture(&b_tex.view),
            bias.into(),
            softmax.map_or(bias, |s| s.lse).into(),
            c.into(),
        ],
        (tiles_m * tiles_n * groups) as u64,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_size_matches_wgsl_struct() {
        assert_eq!(std::mem::size_of::<Params>(), 24 * 4);
    }
}
