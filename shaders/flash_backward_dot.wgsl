// The first pass of the fused backward (FlashAttention-2): for every query row of every
// (batch, head),
//
//     D_i = Σ_c dO_ic · O_ic        (= Σ_j P_ij · dP_ij, since O = P·V and dP = dO·Vᵀ)
//
// written to the second half of `stats` (row (b·heads + h)·n_q + i, after the forward's
// log-sum-exp of every row), where both backward kernels read it. One thread per row.
//
// The host prepends, from src/kernels/flash_backward_dot.rs: shaders/prelude.wgsl and the
// `struct Params` shared with the fused forward (flash_tiled.rs's FlashParams: O's and dO's
// layout are `o_*`).

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> do_buf: array<f32>;
@group(0) @binding(2) var<storage, read> o_buf: array<f32>;
@group(0) @binding(3) var<storage, read_write> stats: array<f32>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let rows = p.groups * p.n_q;
    let id = (wg.x + wg.y * nwg.x) * 64u + li;
    if id >= rows {
        return;
    }
    let g = id / p.n_q;
    let i = id % p.n_q;
    let b = g / p.heads;
    let h = g % p.heads;
    let base = p.o_off + b * p.o_batch + h * p.o_head + i * p.o_row;
    var acc = 0.0;
    for (var c = 0u; c < p.dv_h; c++) {
        acc = fma(do_buf[base + c], o_buf[base + c], acc);
    }
    stats[rows + id] = acc;
}
