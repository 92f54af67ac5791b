// The first pass of the fused backward (FlashAttention-2): for every query row of every
// (batch, head),
//
//     D_i = Σ_c dO_ic · O_ic        (= Σ_j P_ij · dP_ij, since O = P·V and dP = dO·Vᵀ)
//
// written to the second half of `stats` (row (b·heads + h)·n_q + i, after the forward's
// log-sum-exp of every row), where both backward kernels read it. A workgroup takes 64 rows:
// each row is read by TR threads side by side (consecutive columns: whole sectors, where one
// thread per row read a column of 64 rows at a time, a sector each), RR rows per pass, and
// their partial sums are added up through workgroup memory (a row's TR partials padded to
// TR + 1 words, so neither the writes nor the reads of a subgroup share a bank).
//
// The host prepends, from src/kernels/flash_backward_dot.rs: shaders/prelude.wgsl and the
// `struct Params` shared with the fused forward (flash_tiled.rs's FlashParams: O's and dO's
// layout are `o_*`).

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> do_buf: array<f32>;
@group(0) @binding(2) var<storage, read> o_buf: array<f32>;
@group(0) @binding(3) var<storage, read_write> stats: array<f32>;

// Threads per row, and rows per pass of the workgroup's 64 threads.
const TR: u32 = 32u;
const RR: u32 = 64u / TR;

var<workgroup> part: array<f32, 64u * (TR + 1u)>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let rows = p.groups * p.n_q;
    let first = (wg.x + wg.y * nwg.x) * 64u;
    let k = li / TR;
    let q = li % TR;
    for (var r0 = 0u; r0 < 64u; r0 += RR) {
        let id = first + r0 + k;
        var acc = 0.0;
        if id < rows {
            let g = id / p.n_q;
            let i = id % p.n_q;
            let b = g / p.heads;
            let h = g % p.heads;
            let base = p.o_off + b * p.o_batch + h * p.o_head + i * p.o_row;
            for (var c = q; c < p.dv_h; c += TR) {
                acc = fma(do_buf[base + c], o_buf[base + c], acc);
            }
        }
        part[(r0 + k) * (TR + 1u) + q] = acc;
    }
    workgroupBarrier();
    let id = first + li;
    if id < rows {
        var acc = 0.0;
        for (var u = 0u; u < TR; u++) {
            acc += part[li * (TR + 1u) + u];
        }
        stats[rows + id] = acc;
    }
}
