//! Launcher of `shaders/matmul.wgsl`: `C[g] = A[g]·B[g] (+ bias)` for groups
//! `g = batch_index·heads + head`, every operand addressed through element strides.

use bytemuck::{Pod, Zeroable};

use crate::context::Context;
use crate::error::Result;
use crate::gpu::pipeline::{KernelId, PipelineKey};
use crate::kernels::{matmul_subgroup, record, u32_of};

/// Side of the square output tile one workgroup computes.
pub const TILE: u32 = 64;

/// Flag: add `bias[col]` to every row.
pub const HAS_BIAS: u32 = 1;
/// Flag: skip tiles wholly above the diagonal (causal scores; the softmax never reads them).
pub const SKIP_UPPER: u32 = 2;

/// [`Matmul::f16`] bit: A is f16.
pub const F16_A: u8 = 1;
/// [`Matmul::f16`] bit: B and the bias are f16.
pub const F16_B: u8 = 2;
/// [`Matmul::f16`] bit: C is written as f16.
pub const F16_C: u8 = 4;

/// Where an operand's element `(g, row, col)` lives:
/// `off + batch·(g / heads) + head·(g % heads) + row·row_stride + col·col_stride`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Strides {
    /// First element.
    pub off: u32,
    /// Per batch index.
    pub batch: u32,
    /// Per head.
    pub head: u32,
    /// Per row.
    pub row: u32,
    /// Per column.
    pub col: u32,
}

impl Strides {
    /// A row-major `rows × cols` matrix inside rows of `width` elements, starting at column
    /// `head·cols` for head `head` and at `batch` elements per batch index.
    pub fn row_major(width: u32, head_cols: u32, batch: u32) -> Self {
        Strides {
            off: 0,
            batch,
            head: head_cols,
            row: width,
            col: 1,
        }
    }

    /// The same matrix read transposed.
    pub fn transposed(self) -> Self {
        Strides {
            row: self.col,
            col: self.row,
            ..self
        }
    }
}

/// Mirrors `Params` in `shaders/matmul.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct MatmulParams {
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

/// One matmul problem.
#[derive(Debug, Clone, Copy)]
pub struct Matmul {
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
    /// [`HAS_BIAS`] | [`SKIP_UPPER`].
    pub flags: u32,
    /// Heads of A that share one head of B (grouped-query attention; 1 otherwise): head
    /// `h` of A pairs with head `h / b_ratio` of B.
    pub b_ratio: usize,
    /// Which operands are f16 ([`F16_A`], [`F16_B`], [`F16_C`]); the rest are f32. Products
    /// accumulate in f32 either way.
    pub f16: u8,
}

impl Matmul {
    /// The uniform block and the number of workgroups to dispatch.
    pub fn params(&self) -> Result<(MatmulParams, u64)> {
        let tiles_m = self.m.div_ceil(TILE as usize);
        let tiles_n = self.n.div_ceil(TILE as usize);
        let groups = self.batch * self.heads;
        let p = MatmulParams {
            m: u32_of("matmul rows", self.m)?,
            n: u32_of("matmul columns", self.n)?,
            k: u32_of("matmul inner dimension", self.k)?,
            heads: u32_of("heads", self.heads)?,
            groups: u32_of("matmul groups", groups)?,
            tiles_m: u32_of("matmul row tiles", tiles_m)?,
            tiles_n: u32_of("matmul column tiles", tiles_n)?,
            flags: self.flags,
            a_off: self.a.off,
            a_batch: self.a.batch,
            a_head: self.a.head,
            a_row: self.a.row,
            a_col: self.a.col,
            b_off: self.b.off,
            b_batch: self.b.batch,
            b_head: self.b.head,
            b_row: self.b.row,
            b_col: self.b.col,
            c_off: self.c.off,
            c_batch: self.c.batch,
            c_head: self.c.head,
            c_row: self.c.row,
            b_ratio: u32_of("heads per B head", self.b_ratio.max(1))?,
            _pad: 0,
        };
        Ok((p, (tiles_m * tiles_n * groups) as u64))
    }
}

/// Which kernel computes a [`Matmul`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum MatmulVariant {
    /// `matmul.wgsl`: storage buffers, 64 × 64 workgroup tiles in workgroup memory.
    Tiled,
    /// `matmul_subgroup.wgsl`: textures and subgroup shuffles, `(subgroup size ·
    /// rows_per_lane) × (4 · subgroup size)` tiles.
    Subgroup {
        /// Tile rows per lane.
        rows_per_lane: u32,
    },
}

impl std::fmt::Display for MatmulVariant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MatmulVariant::Tiled => write!(f, "matmul-tiled(64x64)"),
            MatmulVariant::Subgroup { rows_per_lane } => {
                write!(f, "matmul-subgroup(t={rows_per_lane})")
            }
        }
    }
}

impl Matmul {
    /// Records `c ← a·b (+ bias)` with `variant`; `bias` is read only with [`HAS_BIAS`]
    /// (any buffer may stand in otherwise).
    ///
    /// # Errors
    /// Size limits, and the subgroup variant on an adapter without a fixed subgroup size.
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        variant: MatmulVariant,
        a: &wgpu::Buffer,
        b: &wgpu::Buffer,
        bias: &wgpu::Buffer,
        c: &wgpu::Buffer,
    ) -> Result<()> {
        match variant {
            MatmulVariant::Tiled => {
                let (params, wgs) = self.params()?;
                let key = PipelineKey {
                    f16: self.f16,
                    ..KernelId::Matmul.into()
                };
                record(
                    ctx,
                    encoder,
                    key,
                    &params,
                    &[a.into(), b.into(), bias.into(), c.into()],
                    wgs,
                )
            }
            MatmulVariant::Subgroup { rows_per_lane } => {
                matmul_subgroup::record_matmul(ctx, encoder, self, rows_per_lane, a, b, bias, c)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_size_matches_wgsl_struct() {
        // 24 u32 fields in shaders/matmul.wgsl.
        assert_eq!(std::mem::size_of::<MatmulParams>(), 24 * 4);
    }

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
