//! Launcher of `shaders/matmul_subgroup.wgsl`: the texture/subgroup matmul, with its operands
//! packed by `shaders/pack.wgsl` first. Takes the same [`Matmul`] problem as
//! `shaders/matmul.wgsl`, so either kernel family computes the same thing.

use bytemuck::{Pod, Zeroable};

use crate::context::Context;
use crate::error::Result;
use crate::gpu::buffer;
use crate::gpu::pipeline::{KernelId, PipelineKey};
use crate::kernels::matmul::{Matmul, F16_A, F16_B, F16_C, HAS_BIAS, SKIP_UPPER};
use crate::kernels::pack::{Pack, Packed};
use crate::kernels::{record, u32_of, Binding, MaskArg};

/// Epilogue flag: `C = exp2(scale_log2·(A·B) − M[row]) / L[row]`, zero above the diagonal with
/// [`SKIP_UPPER`].
const SOFTMAX: u32 = 4;
/// Epilogue flag: per row and column tile, the max and sum of exp2 of `scale_log2·(A·B)`.
const STATS: u32 = 8;

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
    b_ratio: u32,
    _pad0: u32,
    c_off: u32,
    c_batch: u32,
    c_head: u32,
    c_row: u32,
    scale_log2: f32,
    mask: [u32; 4],
    _pad1: [u32; 3],
}

/// Mirrors `Params` in `shaders/row_stats.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
struct ReduceParams {
    rows: u32,
    tiles: u32,
    _pad: [u32; 2],
}

/// What the kernel does after the products.
#[derive(Debug, Clone, Copy)]
enum Epilogue<'a> {
    /// `C = A·B (+ bias)`.
    Plain,
    /// Partial softmax statistics of `scale·A·B` per row and column tile.
    Stats { scale: f32 },
    /// `C = exp(scale·A·B − M) / L` with each row's (M, L) in `stats`: the attention weights.
    Softmax { scale: f32, stats: &'a wgpu::Buffer },
}

/// A and B packed into textures, ready for one or more dispatches.
struct Operands {
    sg: u32,
    a: Packed,
    b: Packed,
}

fn pack(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    mm: &Matmul,
    a: &wgpu::Buffer,
    b: &wgpu::Buffer,
) -> Result<Operands> {
    let sg = ctx.require_subgroups()?;
    let mut pack = |what: &str, buf: &wgpu::Buffer, src, heads, rows, width, f16| {
        Pack {
            batch: mm.batch,
            heads,
            rows,
            width,
            src,
            f16,
        }
        .record(ctx, encoder, what, buf)
    };
    let b_heads = mm.heads / mm.b_ratio.max(1);
    let (a_f16, b_f16) = (mm.f16 & F16_A != 0, mm.f16 & F16_B != 0);
    Ok(Operands {
        sg,
        a: pack("matmul A", a, mm.a, mm.heads, mm.m, mm.k, a_f16)?,
        b: pack("matmul B", b, mm.b, b_heads, mm.k, mm.n, b_f16)?,
    })
}

/// Column tiles of `mm` (each `4 · subgroup size` wide).
fn tiles_n(mm: &Matmul, sg: u32) -> usize {
    mm.n.div_ceil(4 * sg as usize)
}

#[allow(clippy::too_many_arguments)]
fn dispatch(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    mm: &Matmul,
    rows_per_lane: u32,
    ops: &Operands,
    bias: &wgpu::Buffer,
    epilogue: Epilogue<'_>,
    mask: Option<MaskArg<'_>>,
    c: &wgpu::Buffer,
) -> Result<()> {
    let (mask, mask_strides, has_mask) = MaskArg::parts(ctx, mask);
    let sg = ops.sg;
    let tiles_m = mm.m.div_ceil((sg * rows_per_lane) as usize);
    let tiles_n = tiles_n(mm, sg);
    let groups = mm.batch * mm.heads;
    let (flags, scale, lse) = match epilogue {
        Epilogue::Plain => (mm.flags & (HAS_BIAS | SKIP_UPPER), 0.0, bias),
        Epilogue::Stats { scale } => ((mm.flags & SKIP_UPPER) | STATS, scale, bias),
        Epilogue::Softmax { scale, stats } => ((mm.flags & SKIP_UPPER) | SOFTMAX, scale, stats),
    };
    let params = Params {
        m: u32_of("matmul rows", mm.m)?,
        n: u32_of("matmul columns", mm.n)?,
        k: u32_of("matmul inner dimension", mm.k)?,
        heads: u32_of("heads", mm.heads)?,
        groups: u32_of("matmul groups", groups)?,
        tiles_m: u32_of("matmul row tiles", tiles_m)?,
        tiles_n: u32_of("matmul column tiles", tiles_n)?,
        flags,
        a_shift: ops.a.layout.shift,
        a_rows: ops.a.layout.rows,
        a_d4: ops.a.layout.d4,
        b_shift: ops.b.layout.shift,
        b_rows: ops.b.layout.rows,
        b_d4: ops.b.layout.d4,
        b_ratio: u32_of("heads per B head", mm.b_ratio.max(1))?,
        c_off: mm.c.off,
        c_batch: mm.c.batch,
        c_head: mm.c.head,
        c_row: mm.c.row,
        scale_log2: scale * std::f32::consts::LOG2_E,
        mask: mask_strides,
        ..Default::default()
    };
    // The kernel's element types: B_T (the bias, with B) and C_T; statistics stay f32.
    let c_f16 = mm.f16 & F16_C != 0 && matches!(epilogue, Epilogue::Plain);
    let key = PipelineKey {
        kernel: KernelId::MatmulSubgroup,
        consts: [sg, rows_per_lane, has_mask, 0, 0, 0],
        f16: u8::from(mm.f16 & F16_B != 0) | (u8::from(c_f16) << 1),
    };
    record(
        ctx,
        encoder,
        key,
        &params,
        &[
            Binding::Texture(&ops.a.view),
            Binding::Texture(&ops.b.view),
            bias.into(),
            lse.into(),
            c.into(),
            mask.into(),
        ],
        (tiles_m * tiles_n * groups) as u64,
    )
}

/// Records `mm` with the subgroup kernel, `rows_per_lane` tile rows per lane: packs A and B,
/// then one dispatch. `bias` is read when `mm.flags` has [`HAS_BIAS`] (any buffer may stand
/// in otherwise).
///
/// # Errors
/// [`crate::Error::InvalidArgument`] without a fixed subgroup size; texture limits as
/// [`crate::Error::LimitExceeded`].
#[allow(clippy::too_many_arguments)]
pub fn record_matmul(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    mm: &Matmul,
    rows_per_lane: u32,
    a: &wgpu::Buffer,
    b: &wgpu::Buffer,
    bias: &wgpu::Buffer,
    c: &wgpu::Buffer,
) -> Result<()> {
    let ops = pack(ctx, encoder, mm, a, b)?;
    dispatch(
        ctx,
        encoder,
        mm,
        rows_per_lane,
        &ops,
        bias,
        Epilogue::Plain,
        None,
        c,
    )
}

/// Records the attention weights `softmax(scale · Q·Kᵀ + mask)` of the score problem `mm`
/// (A = Q, B = Kᵀ, with [`SKIP_UPPER`] for causal) into `weights`, in three passes that never hold
/// unnormalized scores: the products' per-tile softmax statistics, their reduction to each
/// row's max and sum (`shaders/row_stats.wgsl`), then the products again with
/// `exp(s − M) / L` as the epilogue.
///
/// # Errors
/// As [`record_matmul`], and the statistics buffer's size limit.
#[allow(clippy::too_many_arguments)]
pub fn record_weights(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    mm: &Matmul,
    rows_per_lane: u32,
    q: &wgpu::Buffer,
    k: &wgpu::Buffer,
    scale: f32,
    mask: Option<MaskArg<'_>>,
    weights: &wgpu::Buffer,
) -> Result<()> {
    let ops = pack(ctx, encoder, mm, q, k)?;
    let rows = mm.batch * mm.heads * mm.m;
    let tiles = tiles_n(mm, ops.sg);
    let partial = buffer::output(ctx, "softmax statistics", rows * tiles * 2, false)?;
    let row_stats = buffer::output(ctx, "row max and sum", rows * 2, false)?;
    let stats = Epilogue::Stats { scale };
    dispatch(
        ctx,
        encoder,
        mm,
        rows_per_lane,
        &ops,
        &row_stats,
        stats,
        mask,
        &partial,
    )?;
    let params = ReduceParams {
        rows: u32_of("rows", rows)?,
        tiles: u32_of("column tiles", tiles)?,
        _pad: [0; 2],
    };
    record(
        ctx,
        encoder,
        KernelId::RowStats,
        &params,
        &[(&partial).into(), (&row_stats).into()],
        (rows as u64).div_ceil(64),
    )?;
    let softmax = Epilogue::Softmax {
        scale,
        stats: &row_stats,
    };
    dispatch(
        ctx,
        encoder,
        mm,
        rows_per_lane,
        &ops,
        &partial,
        softmax,
        mask,
        weights,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_sizes_match_wgsl_structs() {
        assert_eq!(std::mem::size_of::<Params>(), 28 * 4);
        assert_eq!(std::mem::size_of::<ReduceParams>(), 4 * 4);
    }
}
