//! Launcher of `shaders/softmax.wgsl`: in-place row-wise softmax of `scale · scores`, one
//! workgroup per row, with the causal mask.

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
    _pad: [u32; 3],
}

/// The uniform block and workgroup count for `groups` score matrices of `n_q × n_kv`.
pub fn params(
    groups: usize,
    n_q: usize,
    n_kv: usize,
    scale: f32,
    causal: bool,
) -> Result<(SoftmaxParams, u64)> {
    let rows = groups * n_q;
    let p = SoftmaxParams {
        rows: u32_of("softmax rows", rows)?,
        cols: u32_of("softmax columns", n_kv)?,
        n_q: u32_of("queries", n_q)?,
        causal: u32::from(causal),
        scale,
        _pad: [0; 3],
    };
    Ok((p, rows as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_size_matches_wgsl_struct() {
        assert_eq!(std::mem::size_of::<SoftmaxParams>(), 32);
    }
}
