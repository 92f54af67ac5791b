// Prefill's key split, step 2 of 2: the key ranges of flash_blocked.wgsl (SPLIT ≠ 0) merged
// into each query row's output (and its log-sum-exp, LSE ≠ 0).
//
// Per row (g = b·heads + h, i) and output column, over the ranges k with partial (o_k, m_k,
// l_k) (scores in the log2 domain):
//
//     M = max_k m_k,   L = Σ_k l_k · exp2(m_k − M),   out = Σ_k o_k · exp2(m_k − M) / L
//
// One thread per (row, vec4 column); rows are g·n_q + i. A range with nothing visible has
// (m, l, o) = (FLOOR, 0, 0) and adds nothing; a row with nothing visible at all is written as
// zeros, its log-sum-exp as LSE_EMPTY (as flash_blocked.wgsl does unsplit). The output goes
// through the fused kernels' strides (o_off, o_batch, o_head, o_row; columns contiguous).
//
// The host prepends, from src/kernels/flash_combine.rs: the constants DV4 (d_v per head in
// vec4s, rounded up) and LSE, shaders/prelude.wgsl and `struct Params`.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> o_part: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> ml_part: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read_write> lse: array<f32>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let idx = (wg.x + wg.y * nwg.x) * 64u + t;
    if idx >= p.rows * DV4 {
        return;
    }
    let row = idx / DV4;
    let c = idx % DV4;
    let base = row * p.splits;
    var mx = FLOOR;
    for (var k = 0u; k < p.splits; k++) {
        mx = max(mx, ml_part[base + k].x);
    }
    var l = 0.0;
    var o = vec4<f32>(0.0);
    for (var k = 0u; k < p.splits; k++) {
        let ml = ml_part[base + k];
        let w = exp2(ml.x - mx);
        l += ml.y * w;
        o += o_part[(base + k) * DV4 + c] * w;
    }
    let inv = select(1.0 / l, 0.0, l == 0.0);
    let g = row / p.n_q;
    let i = row % p.n_q;
    let o_base = p.o_off + (g / p.heads) * p.o_batch + (g % p.heads) * p.o_head + i * p.o_row;
    for (var e = 0u; e < 4u; e++) { // unroll
        if c * 4u + e < p.dv {
            out[o_base + c * 4u + e] = o[e] * inv;
        }
    }
    if LSE != 0u && c == 0u {
        lse[row] = select(mx + log2(l), LSE_EMPTY, l == 0.0);
    }
}
