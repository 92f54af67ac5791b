//! `shaders/matmul_blocked.wgsl`: the register-blocked, double-buffered matmul for GPUs, the
//! [`Matmul`] problem of `matmul.rs` with `vec4` loads, `4·tb × 4·tb` outputs per thread, and
//! optionally its columns split over three outputs (Q, K and V from one `X·[W_Q W_K W_V]`).
//! It needs aligned operands ([`eligible`]); `matmul.wgsl` computes everything else.

use super::matmul::{Matmul, F16_A, F16_B};
use super::wgsl::{constants, uniform};
use super::{record, u32_of, Dim, Kernel, KernelId, Slot, Strides};
use crate::error::Result;
use crate::gpu::Gpu;

/// The kernel.
pub(crate) struct Shader;

/// The outputs per thread the tuner may pick: `4·tb × 4·tb` (4 × 4 and 8 × 8).
pub(crate) const BLOCKS: [u32; 2] = [1, 2];

uniform! {
    /// The uniform block of `matmul_blocked.wgsl`.
    pub(crate) struct MatmulBlockedParams {
        m: u32,
        n: u32,
        k: u32,
        heads: u32,
        groups: u32,
        tiles_m: u32,
        tiles_n: u32,
        flags: u32,
        a_off: u32,
        a_batch: u32,
        a_head: u32,
        a_row: u32,
        a_col: u32,
        b_off: u32,
        b_batch: u32,
        b_head: u32,
        b_row: u32,
        b_col: u32,
        c_off: u32,
        c_batch: u32,
        c_head: u32,
        c_row: u32,
        b_ratio: u32,
        split_k: u32,
        split_v: u32,
        _pad0: u32,
        _pad: [u32; 2],
    }
}

constants! {
    /// Specialisation of `matmul_blocked.wgsl`.
    pub(crate) struct MatmulBlockedConsts {
        /// 4 × 4 blocks per thread along each side (1 or 2).
        tb => "TB",
        /// vec4s of the inner dimension per stage (`tb · kq = 4`).
        kq => "KQ",
        /// 1 when B is contiguous along the inner dimension (Kᵀ), 0 along its columns.
        b_kmajor => "B_KMAJOR",
    }
}

impl MatmulBlockedConsts {
    /// The constants for `tb` blocks per thread and B's layout.
    pub(crate) fn new(tb: u32, b_kmajor: bool) -> Self {
        MatmulBlockedConsts {
            tb,
            kq: 4 / tb.clamp(1, 4),
            b_kmajor: u32::from(b_kmajor),
        }
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::MatmulBlocked;
    const WORKGROUP: [Dim; 3] = [Dim::Fixed(16), Dim::Fixed(16), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[
        Slot::Read("a"),
        Slot::Read("b"),
        Slot::Read("bias"),
        Slot::ReadWrite("c"),
        Slot::ReadWrite("c1"),
        Slot::ReadWrite("c2"),
    ];
    /// Bits as [`F16_A`], [`F16_B`], [`super::matmul::F16_C`].
    const DTYPES: &'static [&'static str] = &["A_T", "B_T", "C_T"];
    type Consts = MatmulBlockedConsts;
    type Params = MatmulBlockedParams;

    /// Per stage of `TK = 4·KQ` (one more stage than K has): its loads and stores (`LOADS`
    /// each, with their 4-wide loops) and the products over the stage; every loop counted.
    fn loops(c: &MatmulBlockedConsts, p: &MatmulBlockedParams, _b: super::loops::Build) -> u64 {
        let run = super::loops::run;
        let (tb, tk) = (u64::from(c.tb), 4 * u64::from(c.kq).max(1));
        let loads = (tk * 16 * tb).div_ceil(256);
        let copy = run(loads) + 2 * loads * run(4);
        let products = run(tk) + tk * (2 * run(tb) + tb * (run(4) + 4 * run(tb)));
        let stages = u64::from(p.k).div_ceil(tk) + 1;
        let epilogue = run(tb) + tb * (run(4) + 4 * (run(tb) + tb * run(4)));
        run(stages * (1 + 2 * copy + products)) + run(4 * tb * tb) + epilogue
    }
}

/// Whether the strided operand `s` reaches only whole aligned vec4s inside `buf`: contiguous
/// along `inner` (its `col` stride 1 when `!transposed`, `row` when `transposed`), every other
/// stride and the offset a multiple of 4, and the last vec4 it touches inside the buffer.
fn vec4_ok(
    s: Strides,
    (batch, heads): (usize, usize),
    (outer, inner): (usize, usize),
    transposed: bool,
    bytes: u64,
    buf: &wgpu::Buffer,
) -> bool {
    let (step, unit) = if transposed {
        (s.col, s.row)
    } else {
        (s.row, s.col)
    };
    if unit != 1 || outer == 0 || inner == 0 || batch == 0 || heads == 0 {
        return false;
    }
    if ![s.off, s.batch, s.head, step]
        .iter()
        .all(|v| v.is_multiple_of(4))
    {
        return false;
    }
    let last = s.off as u64
        + (batch as u64 - 1) * s.batch as u64
        + (heads as u64 - 1) * s.head as u64
        + (outer as u64 - 1) * step as u64
        + inner.next_multiple_of(4) as u64;
    last * bytes <= buf.size()
}

/// The constants for `mm` with `tb` blocks per thread, when its operands suit the kernel:
/// A contiguous along the inner dimension, B along its columns or its inner dimension, all
/// other strides multiples of 4, every vec4 inside its buffer; `None` otherwise.
pub(crate) fn eligible(
    mm: &Matmul,
    tb: u32,
    a: &wgpu::Buffer,
    b: &wgpu::Buffer,
) -> Option<MatmulBlockedConsts> {
    let bytes = |f16: bool| if f16 { 2 } else { 4 };
    let a_ok = vec4_ok(
        mm.a,
        (mm.batch, mm.heads),
        (mm.m, mm.k),
        false,
        bytes(mm.f16 & F16_A != 0),
        a,
    );
    let b_heads = mm.heads / mm.b_ratio.max(1);
    let b_bytes = bytes(mm.f16 & F16_B != 0);
    let kmajor = mm.b.row == 1 && mm.b.col != 1;
    let b_ok = if kmajor {
        vec4_ok(mm.b, (mm.batch, b_heads), (mm.n, mm.k), true, b_bytes, b)
    } else {
        vec4_ok(mm.b, (mm.batch, b_heads), (mm.k, mm.n), false, b_bytes, b)
    };
    (a_ok && b_ok && BLOCKS.contains(&tb)).then(|| MatmulBlockedConsts::new(tb, kmajor))
}

/// Records `mm` with constants `consts` (from [`eligible`]). With `split = Some((k, v))`
/// columns `[0, k)` go to `c`, `[k, v)` to `c1` and `[v, n)` to `c2`, each row-major at its
/// own width (one group); without, everything goes to `c` and `c1`,
/// `c2` are unused (pass `c`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn dispatch(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    mm: &Matmul,
    consts: MatmulBlockedConsts,
    (a, b, bias): (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
    (c, c1, c2): (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
    split: Option<(usize, usize)>,
) -> Result<()> {
    let tile = 64 * consts.tb as usize;
    let tiles_m = mm.m.div_ceil(tile);
    let tiles_n = mm.n.div_ceil(tile);
    let groups = mm.batch * mm.heads;
    let (split_k, split_v) = split.unwrap_or((mm.n, mm.n));
    // Unsplit: all to `c`; the other two outputs get the context's unused stand-ins.
    let (c1, c2) = match split {
        None => ctx.unused_outs(),
        Some(_) => (c1, c2),
    };
    // A split's first output is row-major at its own width, like the other two.
    let sc = match split {
        Some((k, _)) => Strides::row_major(u32_of("split", k)?, 0, 0),
        None => mm.c,
    };
    let (sa, sb) = (mm.a, mm.b);
    let params = MatmulBlockedParams {
        m: u32_of("matmul rows", mm.m)?,
        n: u32_of("matmul columns", mm.n)?,
        k: u32_of("matmul inner dimension", mm.k)?,
        heads: u32_of("heads", mm.heads)?,
        groups: u32_of("matmul groups", groups)?,
        tiles_m: u32_of("matmul row tiles", tiles_m)?,
        tiles_n: u32_of("matmul column tiles", tiles_n)?,
        flags: mm.flags,
        a_off: sa.off,
        a_batch: sa.batch,
        a_head: sa.head,
        a_row: sa.row,
        a_col: sa.col,
        b_off: sb.off,
        b_batch: sb.batch,
        b_head: sb.head,
        b_row: sb.row,
        b_col: sb.col,
        c_off: sc.off,
        c_batch: sc.batch,
        c_head: sc.head,
        c_row: sc.row,
        b_ratio: u32_of("heads per B head", mm.b_ratio.max(1))?,
        split_k: u32_of("split", split_k)?,
        split_v: u32_of("split", split_v)?,
        ..Default::default()
    };
    record::<Shader>(
        ctx,
        encoder,
        &consts,
        mm.f16,
        &params,
        &[
            a.into(),
            b.into(),
            bias.into(),
            c.into(),
            c1.into(),
            c2.into(),
        ],
        (tiles_m * tiles_n * groups) as u64,
    )
}

#[cfg(test)]
#[path = "matmul_blocked_tests.rs"]
mod tests;
