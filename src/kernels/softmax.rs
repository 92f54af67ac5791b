//! Launcher of `shaders/softmax.wgsl`: in-place row-wise softmax of `scale · scores`, one
//! workgroup per row, with the causal mask and an optional additive mask.

use bytemuck::{Pod, Zeroable};

use crate::error::Result;
use crate::kernels::u32_of;

/// Mirrors `Params` in `shaders/softmax.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct SoftmaxParams {
    rows: u32,
    cols: u32,
    n_q: u32,
    causal: u32,
    scale: f32,
    heads: u32,
    mask: [u32; 4],
    _pad: [u32; 2],
}

/// The uniform block and workgroup count for `batch · heads` score matrices of `n_q × n_kv`,
/// with the mask's element strides over `(batch, head, query, key)` (zeros without one).
pub fn params(
    (batch, heads): (usize, usize),
    n_q: usize,
    n_kv: usize,
    scale: f32,
    causal: bool,
    mask: [u32; 4],
) -> Result<(SoftmaxParams, u64)> {
    let rows = batch * heads * n_q;
    let p = SoftmaxParams {
        rows: u32_of("softmax rows", rows)?,
        cols: u32_of("softmax columns", n_kv)?,
        n_q: u32_of("queries", n_q)?,
        causal: u32::from(causal),
        scale,
        heads: u32_of("heads", heads)?,
        mask,
        _pad: [0; 2],
    };
    Ok((p, rows as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_size_matches_wgsl_struct() {
        assert_eq!(std::mem::size_of::<SoftmaxParams>(), 48);
    }
}
