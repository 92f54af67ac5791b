//! `shaders/matmul_subgroup.wgsl`: the texture/subgroup matmul, on operands packed by
//! `pack.wgsl` first, with three epilogues: plain (`C = A·B + bias`), the softmax statistics
//! of each row and column tile, and the softmax itself from each row's statistics. Takes the
//! same [`Matmul`] problem as `matmul.wgsl`.

use super::matmul::{Matmul, F16_A, F16_B, F16_C, HAS_BIAS, SKIP_UPPER};
use super::mods::ModsBind;
use super::pack::{Pack, Packed};
use super::wgsl::{constants, uniform};
use super::{record_with, u32_of, Binding, Dim, Kernel, KernelId, MaskArg, Slot};
use crate::error::Result;
use crate::gpu::Gpu;

/// The kernel.
pub(crate) struct Shader;

/// Epilogue flag: `C = exp2(scale_log2·(A·B) − M[row]) / L[row]`, zero above the diagonal with
/// [`SKIP_UPPER`].
const SOFTMAX: u32 = 4;
/// Epilogue flag: per row and column tile, the max and sum of exp2 of `scale_log2·(A·B)`.
const STATS: u32 = 8;

uniform! {
    /// The uniform block of `matmul_subgroup.wgsl`.
    pub(crate) struct MatmulSubgroupParams {
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
        /// Split output: the first column of `c1` (`n` without a split).
        split_k: u32,
        c_off: u32,
        c_batch: u32,
        c_head: u32,
        c_row: u32,
        scale_log2: f32,
        /// Split output: the first column of `c2` (`n` without a split).
        split_v: u32,
        _pad2: [u32; 2],
        /// The mask's element strides over (batch, head, row, column).
        mask: [u32; 4],
    }
}

constants! {
    /// Specialisation of `matmul_subgroup.wgsl`.
    pub(crate) struct MatmulSubgroupConsts {
        /// The subgroup size (one subgroup per workgroup).
        sg => "SG",
        /// Tile rows per lane.
        rows_per_lane => "T",
        /// 1 when a mask is bound.
        mask => "MASK",
        /// 1 when the columns are split over three outputs (else the epilogue writes `c`
        /// only, without the per-element branch).
        split => "SPLIT",
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::MatmulSubgroup;
    const WORKGROUP: [Dim; 3] = [Dim::Const("SG"), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[
        Slot::Texture("a_tex"),
        Slot::Texture("b_tex"),
        Slot::Read("bias"),
        Slot::Read("row_stats"),
        Slot::ReadWrite("c"),
        Slot::Read("mask"),
        Slot::ReadWrite("c1"),
        Slot::ReadWrite("c2"),
    ];
    /// Bit 0: B (and its bias) is f16; bit 1: C is written as f16.
    const DTYPES: &'static [&'static str] = &["B_T", "C_T"];
    const SUBGROUPS: bool = true;
    type Consts = MatmulSubgroupConsts;
    type Params = MatmulSubgroupParams;

    /// One iteration per 4 of K with its `// unroll` loops (counted where they stay loops),
    /// and the epilogues' `// unroll` loops.
    fn loops(c: &MatmulSubgroupConsts, p: &MatmulSubgroupParams, b: super::loops::Build) -> u64 {
        let (t, sg) = (u64::from(c.rows_per_lane), u64::from(c.sg));
        let m = |n| b.marked(n);
        let step = 1 + m(t) + m(4) + m(t) + t * m(sg);
        let epilogue = m(t) + t * (m(sg) + sg * 2 * m(4));
        super::loops::run(u64::from(p.k).div_ceil(4) * step) + 2 * epilogue
    }
}

/// What the kernel does after the products.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Epilogue<'a> {
    /// `C = A·B (+ bias)`.
    Plain,
    /// Partial softmax statistics of `scale·A·B` per row and column tile (with the mask and
    /// its modifiers).
    Stats { scale: f32 },
    /// `C = exp(scale·A·B − M) / L` with each row's (M, L) in `stats`: the attention weights
    /// (with the mask and its modifiers).
    Softmax { scale: f32, stats: &'a wgpu::Buffer },
}

/// A and B packed into textures, ready for one or more dispatches.
#[derive(Clone)]
pub(crate) struct Operands {
    sg: u32,
    a: Packed,
    b: Packed,
}

impl Operands {
    /// Records the packing of `mm`'s operands `a` and `b`.
    ///
    /// # Errors
    /// No fixed subgroup size; texture limits.
    pub fn pack(
        ctx: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        mm: &Matmul,
        a: &wgpu::Buffer,
        b: &wgpu::Buffer,
    ) -> Result<Self> {
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
            .dispatch(ctx, encoder, what, buf)
        };
        let b_heads = mm.heads / mm.b_ratio.max(1);
        let (a_f16, b_f16) = (mm.f16 & F16_A != 0, mm.f16 & F16_B != 0);
        Ok(Operands {
            sg,
            a: pack("matmul A", a, mm.a, mm.heads, mm.m, mm.k, a_f16)?,
            b: pack("matmul B", b, mm.b, b_heads, mm.k, mm.n, b_f16)?,
        })
    }

    /// Records the packing of `mm`'s operand `a` only, with B already packed (a layer's
    /// weights, packed once when it is built).
    ///
    /// # Errors
    /// No fixed subgroup size; texture limits.
    pub fn pack_a(
        ctx: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        mm: &Matmul,
        a: &wgpu::Buffer,
        b: &Packed,
    ) -> Result<Self> {
        let sg = ctx.require_subgroups()?;
        let a = Pack {
            batch: mm.batch,
            heads: mm.heads,
            rows: mm.m,
            width: mm.k,
            src: mm.a,
            f16: mm.f16 & F16_A != 0,
        }
        .dispatch(ctx, encoder, "matmul A", a)?;
        Ok(Operands {
            sg,
            a,
            b: b.clone(),
        })
    }

    /// Column tiles of `mm` (each `4 · subgroup size` wide).
    pub fn tiles_n(&self, mm: &Matmul) -> usize {
        mm.n.div_ceil(4 * self.sg as usize)
    }
}

/// Records `mm` on packed operands with `epilogue`, `rows_per_lane` tile rows per lane, into
/// `c`; `bias` is read with [`HAS_BIAS`] in the plain epilogue (any buffer may stand in
/// otherwise).
#[allow(clippy::too_many_arguments)]
pub(crate) fn dispatch(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    mm: &Matmul,
    rows_per_lane: u32,
    ops: &Operands,
    bias: &wgpu::Buffer,
    epilogue: Epilogue<'_>,
    mask: Option<MaskArg<'_>>,
    c: &wgpu::Buffer,
) -> Result<()> {
    let outs = (c, c, c);
    dispatch_split(
        ctx,
        encoder,
        mm,
        rows_per_lane,
        ops,
        bias,
        epilogue,
        mask,
        outs,
        None,
    )
}

/// [`dispatch`] with the plain epilogue's columns split over three outputs: with
/// `split = Some((k, v))`, columns `[0, k)` go to `c`, `[k, v)` to `c1` and `[v, n)` to `c2`,
/// each row-major at its own width (Q, K, V from one `X·[W_Q W_K W_V]`); without, all to `c`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dispatch_split(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    mm: &Matmul,
    rows_per_lane: u32,
    ops: &Operands,
    bias: &wgpu::Buffer,
    epilogue: Epilogue<'_>,
    mask: Option<MaskArg<'_>>,
    (c, c1, c2): (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
    split: Option<(usize, usize)>,
) -> Result<()> {
    let (split_k, split_v) = split.unwrap_or((mm.n, mm.n));
    // Unsplit: all to `c`; the other two outputs get the context's unused stand-ins.
    let (c1, c2) = match split {
        None => ctx.unused_outs(),
        Some(_) => (c1, c2),
    };
    // A split's first output is row-major at its own width, like the other two.
    let c_strides = match split {
        Some((k, _)) => super::Strides::row_major(u32_of("split", k)?, 0, 0),
        None => mm.c,
    };
    // The weights' epilogues apply the mask's modifiers (no block map: they call no
    // `wa_block`); the plain one reads no mask, and refuses one with modifiers.
    let (mods, (mask, mask_strides, has_mask)) = match epilogue {
        Epilogue::Plain => (None, MaskArg::parts(ctx, mask)?),
        _ => (MaskArg::mods(mask), MaskArg::bias_parts(ctx, mask)),
    };
    let sg = ops.sg;
    let tiles_m = mm.m.div_ceil((sg * rows_per_lane) as usize);
    let tiles_n = ops.tiles_n(mm);
    let groups = mm.batch * mm.heads;
    // The row statistics are read by the softmax epilogue only; the others bind the
    // stand-in (not the bias: `array<vec2<f32>>` needs 8 bytes, a bias of one column has 4).
    let (flags, scale, lse) = match epilogue {
        Epilogue::Plain => (mm.flags & (HAS_BIAS | SKIP_UPPER), 0.0, ctx.stand_in()),
        Epilogue::Stats { scale } => ((mm.flags & SKIP_UPPER) | STATS, scale, ctx.stand_in()),
        Epilogue::Softmax { scale, stats } => ((mm.flags & SKIP_UPPER) | SOFTMAX, scale, stats),
    };
    let params = MatmulSubgroupParams {
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
        c_off: c_strides.off,
        c_batch: c_strides.batch,
        c_head: c_strides.head,
        c_row: c_strides.row,
        scale_log2: scale * std::f32::consts::LOG2_E,
        mask: mask_strides,
        split_k: u32_of("split", split_k)?,
        split_v: u32_of("split", split_v)?,
        ..Default::default()
    };
    // B_T (the bias, with B) and C_T; statistics stay f32.
    let c_f16 = mm.f16 & F16_C != 0 && matches!(epilogue, Epilogue::Plain);
    let f16 = u8::from(mm.f16 & F16_B != 0) | (u8::from(c_f16) << 1);
    let consts = MatmulSubgroupConsts {
        sg,
        rows_per_lane,
        mask: has_mask,
        split: u32::from(split.is_some()),
    };
    record_with::<Shader>(
        ctx,
        encoder,
        (&consts, f16),
        &params,
        &[
            Binding::Texture(&ops.a.view),
            Binding::Texture(&ops.b.view),
            bias.into(),
            lse.into(),
            c.into(),
            mask.into(),
            c1.into(),
            c2.into(),
        ],
        mods.map(|upload| ModsBind { upload, map: None }),
        (tiles_m * tiles_n * groups) as u64,
    )
}
