//! `shaders/weighted_sum.wgsl`: `context[b, i, h·dv_h + c] = Σ_j A[b,h,i,j]·V[b,j,h·dv_h + c]`,
//! stopping at `j = i` under the causal mask; V heads shared by groups of query heads.

use super::wgsl::{uniform, NoConstants};
use super::{record, u32_of, Dim, Kernel, KernelId, Slot, Strides};
use crate::error::Result;
use crate::gpu::Gpu;

/// The kernel.
pub(crate) struct Shader;

/// Side of the output block one workgroup computes.
pub(crate) const TILE: usize = 32;

uniform! {
    /// The uniform block of `weighted_sum.wgsl`.
    pub(crate) struct WeightedSumParams {
        n_q: u32,
        n_kv: u32,
        dv_h: u32,
        heads: u32,
        groups: u32,
        tiles_m: u32,
        tiles_n: u32,
        causal: u32,
        v_batch: u32,
        v_head: u32,
        v_row: u32,
        c_batch: u32,
        c_head: u32,
        c_row: u32,
        v_ratio: u32,
        _pad: u32,
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::WeightedSum;
    const WORKGROUP: [Dim; 3] = [Dim::Fixed(8), Dim::Fixed(8), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[Slot::Read("w"), Slot::Read("v"), Slot::ReadWrite("ctx")];
    const DTYPES: &'static [&'static str] = &["V_T"];
    type Consts = NoConstants;
    type Params = WeightedSumParams;

    /// One iteration per key (and its `// unroll` loops), the set-up and the 4 × 4 epilogue.
    fn loops(_c: &NoConstants, p: &WeightedSumParams, b: super::loops::Build) -> u64 {
        let (m4, run) = (b.marked(4), super::loops::run);
        run(u64::from(p.n_kv) * (1 + m4 + m4 + 4 * m4)) + m4 + m4 + 4 * m4 + run(4) + 4 * run(4)
    }
}

/// The sizes of one weighted sum: `batch · heads` weight matrices `n_q × n_kv`; V and the
/// context through their strides (`(batch, n, heads·dv_h)` with the heads side by side, or
/// heads-first), V with `kv_heads` heads each shared by `heads / kv_heads` query heads
/// (grouped-query attention).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WeightedSum {
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub n_q: usize,
    pub n_kv: usize,
    /// Value width over all heads.
    pub d_v: usize,
    /// V's layout (column stride 1, head stride per K/V head).
    pub v: Strides,
    /// The context's layout (column stride 1).
    pub context: Strides,
    pub causal: bool,
    /// V is f16.
    pub f16: bool,
}

impl WeightedSum {
    /// The uniform block and workgroup count.
    fn params(&self) -> Result<(WeightedSumParams, u64)> {
        let (heads, kv_heads) = (self.heads, self.kv_heads.max(1));
        let dv_h = self.d_v / heads;
        let tiles_m = self.n_q.div_ceil(TILE);
        let tiles_n = dv_h.div_ceil(TILE);
        let groups = self.batch * heads;
        let p = WeightedSumParams {
            n_q: u32_of("queries", self.n_q)?,
            n_kv: u32_of("keys", self.n_kv)?,
            dv_h: u32_of("value width per head", dv_h)?,
            heads: u32_of("heads", heads)?,
            groups: u32_of("groups", groups)?,
            tiles_m: u32_of("row tiles", tiles_m)?,
            tiles_n: u32_of("column tiles", tiles_n)?,
            causal: u32::from(self.causal),
            v_batch: self.v.batch,
            v_head: self.v.head,
            v_row: self.v.row,
            c_batch: self.context.batch,
            c_head: self.context.head,
            c_row: self.context.row,
            v_ratio: u32_of("heads per value head", heads / kv_heads)?,
            _pad: 0,
        };
        Ok((p, (tiles_m * tiles_n * groups) as u64))
    }

    /// Records `context ← weights · V` per (batch, head).
    pub fn dispatch(
        &self,
        ctx: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        weights: &wgpu::Buffer,
        v: &wgpu::Buffer,
        context: &wgpu::Buffer,
    ) -> Result<()> {
        let (params, workgroups) = self.params()?;
        record::<Shader>(
            ctx,
            encoder,
            &NoConstants,
            u8::from(self.f16),
            &params,
            &[weights.into(), v.into(), context.into()],
            workgroups,
        )
    }
}
