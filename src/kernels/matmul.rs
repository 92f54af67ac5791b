//! `shaders/matmul.wgsl`: `C[g] = A[g]·B[g] (+ bias)` for groups
//! `g = batch_index·heads + head`, every operand addressed through element strides; 64 × 64
//! output tiles in workgroup memory. The [`Matmul`] problem is shared with
//! `matmul_subgroup.rs`, so either kernel computes the same thing.

use super::loops::{run, Build};
use super::wgsl::{uniform, NoConstants};
use super::{record, u32_of, Dim, Kernel, KernelId, Slot, Strides};
use crate::error::Result;
use crate::gpu::Gpu;

/// The kernel.
pub(crate) struct Shader;

/// Side of the square output tile one workgroup computes.
pub(crate) const TILE: u32 = 64;

/// Flag: add `bias[col]` to every row.
pub(crate) const HAS_BIAS: u32 = 1;
/// Flag: skip tiles wholly above the diagonal (causal scores; the softmax never reads them).
pub(crate) const SKIP_UPPER: u32 = 2;
/// Flag: add the product to what C holds (`C += A·B`; this kernel only, not the subgroup one).
pub(crate) const ACCUMULATE: u32 = 4;

/// [`Matmul::f16`] bit: A is f16.
pub(crate) const F16_A: u8 = 1;
/// [`Matmul::f16`] bit: B and the bias are f16.
pub(crate) const F16_B: u8 = 2;
/// [`Matmul::f16`] bit: C is written as f16.
pub(crate) const F16_C: u8 = 4;

uniform! {
    /// The uniform block of `matmul.wgsl`.
    pub(crate) struct MatmulParams {
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
        _pad: u32,
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::Matmul;
    const WORKGROUP: [Dim; 3] = [Dim::Fixed(16), Dim::Fixed(16), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[
        Slot::Read("a"),
        Slot::Read("b"),
        Slot::Read("bias"),
        Slot::ReadWrite("c"),
    ];
    /// Bits as [`F16_A`], [`F16_B`], [`F16_C`].
    const DTYPES: &'static [&'static str] = &["A_T", "B_T", "C_T"];
    type Consts = NoConstants;
    type Params = MatmulParams;

    /// Per K tile of `TK`: its loop, the staging's and the products' `// unroll` loops and
    /// the `TK` loop; the set-up's and the epilogue's 4 × 4.
    fn loops(_c: &NoConstants, p: &MatmulParams, b: Build) -> u64 {
        let (m4, tk) = (b.marked(4), 16);
        let tile = 1 + m4 + run(tk) + tk * (m4 + m4 + 4 * m4);
        run(u64::from(p.k).div_ceil(tk) * tile) + m4 + 4 * m4 + run(4) + 4 * run(4)
    }
}

/// One matmul problem.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Matmul {
    /// Rows of A and C.
    pub m: usize,
    /// Columns of B and C.
    pub n: usize,
    /// Inner dimension.
    pub k: usize,
    /// Batch indices (groups = batch · heads).
    pub batch: usize,
    /// Heads per batch index.
    pub heads: usize,
    /// A's layout.
    pub a: Strides,
    /// B's layout.
    pub b: Strides,
    /// C's layout (column stride must be 1).
    pub c: Strides,
    /// [`HAS_BIAS`] | [`SKIP_UPPER`] | [`ACCUMULATE`].
    pub flags: u32,
    /// Heads of A that share one head of B (grouped-query attention; 1 otherwise): head
    /// `h` of A pairs with head `h / b_ratio` of B.
    pub b_ratio: usize,
    /// Which operands are f16 ([`F16_A`], [`F16_B`], [`F16_C`]); the rest are f32. Products
    /// accumulate in f32 either way.
    pub f16: u8,
}

impl Matmul {
    /// A plain row-major `(m, k)·(k, n) (+ bias)`, one group.
    pub fn plain(m: usize, n: usize, k: usize, bias: bool, f16: u8) -> Result<Self> {
        Ok(Matmul {
            m,
            n,
            k,
            batch: 1,
            heads: 1,
            a: Strides::row_major(u32_of("k", k)?, 0, 0),
            b: Strides::row_major(u32_of("n", n)?, 0, 0),
            c: Strides::row_major(u32_of("n", n)?, 0, 0),
            flags: if bias { HAS_BIAS } else { 0 },
            b_ratio: 1,
            f16,
        })
    }

    /// The uniform block and the number of workgroups to dispatch.
    pub(crate) fn params(&self) -> Result<(MatmulParams, u64)> {
        let tiles_m = self.m.div_ceil(TILE as usize);
        let tiles_n = self.n.div_ceil(TILE as usize);
        let groups = self.batch * self.heads;
        let (a, b, c) = (self.a, self.b, self.c);
        let p = MatmulParams {
            m: u32_of("matmul rows", self.m)?,
            n: u32_of("matmul columns", self.n)?,
            k: u32_of("matmul inner dimension", self.k)?,
            heads: u32_of("heads", self.heads)?,
            groups: u32_of("matmul groups", groups)?,
            tiles_m: u32_of("matmul row tiles", tiles_m)?,
            tiles_n: u32_of("matmul column tiles", tiles_n)?,
            flags: self.flags,
            a_off: a.off,
            a_batch: a.batch,
            a_head: a.head,
            a_row: a.row,
            a_col: a.col,
            b_off: b.off,
            b_batch: b.batch,
            b_head: b.head,
            b_row: b.row,
            b_col: b.col,
            c_off: c.off,
            c_batch: c.batch,
            c_head: c.head,
            c_row: c.row,
            b_ratio: u32_of("heads per B head", self.b_ratio.max(1))?,
            _pad: 0,
        };
        Ok((p, (tiles_m * tiles_n * groups) as u64))
    }

    /// Records `c ← a·b (+ bias)`; `bias` is read only with [`HAS_BIAS`] (any buffer may
    /// stand in otherwise).
    pub fn dispatch(
        &self,
        ctx: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        a: &wgpu::Buffer,
        b: &wgpu::Buffer,
        bias: &wgpu::Buffer,
        c: &wgpu::Buffer,
    ) -> Result<()> {
        let (params, workgroups) = self.params()?;
        record::<Shader>(
            ctx,
            encoder,
            &NoConstants,
            self.f16,
            &params,
            &[a.into(), b.into(), bias.into(), c.into()],
            workgroups,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workgroups_cover_uneven_sizes() {
        let mm = Matmul {
            m: 65,
            n: 1,
            k: 3,
            batch: 2,
            heads: 3,
            a: Strides::default(),
            b: Strides::default(),
            c: Strides::default(),
            flags: 0,
            b_ratio: 1,
            f16: 0,
        };
        let (p, wg) = mm.params().unwrap();
        assert_eq!((p.tiles_m, p.tiles_n, wg), (2, 1, 12));
    }
}
