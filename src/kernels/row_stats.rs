//! `shaders/row_stats.wgsl`: per-tile softmax statistics (max and sum of `exp2`) reduced into
//! each row's max and sum, between the two passes of the subgroup weights.

use super::wgsl::{uniform, NoConstants};
use super::{record, u32_of, Dim, Kernel, KernelId, Slot};
use crate::error::Result;
use crate::gpu::Gpu;

/// The kernel.
pub(crate) struct Shader;

uniform! {
    /// The uniform block of `row_stats.wgsl`.
    pub(crate) struct RowStatsParams {
        rows: u32,
        tiles: u32,
        _pad: [u32; 2],
    }
}

impl Kernel for Shader {
    const ID: KernelId = KernelId::RowStats;
    const WORKGROUP: [Dim; 3] = [Dim::Fixed(64), Dim::Fixed(1), Dim::Fixed(1)];
    const BINDINGS: &'static [Slot] = &[Slot::Read("partial"), Slot::ReadWrite("stats")];
    type Consts = NoConstants;
    type Params = RowStatsParams;

    /// Two passes over the tiles.
    fn loops(_c: &NoConstants, p: &RowStatsParams, _b: super::loops::Build) -> u64 {
        2 * super::loops::run(u64::from(p.tiles))
    }
}

/// Records `stats[row] ← (max, sum)` over the `tiles` partial `(max, sum)` pairs of each of
/// `rows` rows.
pub(crate) fn dispatch(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    rows: usize,
    tiles: usize,
    partial: &wgpu::Buffer,
    stats: &wgpu::Buffer,
) -> Result<()> {
    let params = RowStatsParams {
        rows: u32_of("rows", rows)?,
        tiles: u32_of("column tiles", tiles)?,
        ..Default::default()
    };
    record::<Shader>(
        ctx,
        encoder,
        &NoConstants,
        0,
        &params,
        &[partial.into(), stats.into()],
        (rows as u64).div_ceil(64),
    )
}
