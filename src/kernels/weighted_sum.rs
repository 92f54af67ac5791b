//! Launcher of `shaders/weighted_sum.wgsl`: `context[b, i, h·dv_h + c] = Σ_j A[b,h,i,j]·V[b,j,h·dv_h + c]`,
//! stopping at `j = i` under the causal mask.

use bytemuck::{Pod, Zeroable};

use crate::error::Result;
use crate::kernels::u32_of;

/// Side of the output block one workgroup computes.
pub const TILE: usize = 32;

/// Mirrors `Params` in `shaders/weighted_sum.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct WeightedSumParams {
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

/// The uniform block and workgroup count. `V` and the context are row-major
/// `(batch, n, heads·dv_h)` with the heads side by side along the last axis; `V` has
/// `kv_heads` heads, each shared by `heads / kv_heads` query heads (grouped-query attention).
#[allow(clippy::too_many_arguments)]
pub fn params(
    batch: usize,
    heads: usize,
    kv_heads: usize,
    n_q: usize,
    n_kv: usize,
    d_v: usize,
    causal: bool,
) -> Result<(WeightedSumParams, u64)> {
    let dv_h = d_v / heads;
    let tiles_m = n_q.div_ceil(TILE);
    let tiles_n = dv_h.div_ceil(TILE);
    let groups = batch * heads;
    let p = WeightedSumParams {
        n_q: u32_of("queries", n_q)?,
        n_kv: u32_of("keys", n_kv)?,
        dv_h: u32_of("value width per head", dv_h)?,
        heads: u32_of("heads", heads)?,
        groups: u32_of("groups", groups)?,
        tiles_m: u32_of("row tiles", tiles_m)?,
        tiles_n: u32_of("column tiles", tiles_n)?,
        causal: u32::from(causal),
        v_batch: u32_of("value batch stride", n_kv * kv_heads * dv_h)?,
        v_head: u32_of("value head stride", dv_h)?,
        v_row: u32_of("value row stride", kv_heads * dv_h)?,
        c_batch: u32_of("context batch stride", n_q * d_v)?,
        c_head: u32_of("context head stride", dv_h)?,
        c_row: u32_of("context row stride", d_v)?,
        v_ratio: u32_of("heads per value head", heads / kv_heads.max(1))?,
        _pad: 0,
    };
    Ok((p, (tiles_m * tiles_n * groups) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_size_matches_wgsl_struct() {
        assert_eq!(std::mem::size_of::<WeightedSumParams>(), 64);
    }
}
