// Decode, step 2 of 2: the key blocks of decode_partial.wgsl merged into each row's output.
//
// Per query row and output column, over the blocks k with partial (o_k, m_k, l_k):
//
//     M = max_k m_k,   L = Σ_k l_k · exp2(m_k − M),   out = Σ_k o_k · exp2(m_k − M) / L
//
// One thread per (row, vec4 column); rows are (batch, head, new row) in that order, and the
// output is written unpadded, (batch, heads, m, d_v) row-major (PyTorch's layout). A block
// with nothing visible has (m, l, o) = (FLOOR, 0, 0) and adds nothing; a row with nothing
// visible at all is written as zeros.
//
// The host prepends, from src/kernels/decode_combine.rs: the constant DV4 (d_v in vec4s,
// rounded up), shaders/prelude.wgsl and `struct Params`.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> o_part: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> ml_part: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

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
    let base = row * p.blocks;
    var mx = FLOOR;
    for (var k = 0u; k < p.blocks; k++) {
        mx = max(mx, ml_part[base + k].x);
    }
    var l = 0.0;
    var o = vec4<f32>(0.0);
    for (var k = 0u; k < p.blocks; k++) {
        let ml = ml_part[base + k];
        let w = exp2(ml.x - mx);
        l += ml.y * w;
        o += o_part[(base + k) * DV4 + c] * w;
    }
    let inv = select(1.0 / l, 0.0, l == 0.0);
    for (var e = 0u; e < 4u; e++) { // unroll
        if c * 4u + e < p.dv {
            out[row * p.dv + c * 4u + e] = o[e] * inv;
        }
    }
}
