// Combines the per-tile partial softmax statistics that matmul_subgroup.wgsl (STATS) writes
// into each row's max and sum (log2 domain):
//
//     M = max_t m_t,   L = Σ_t l_t · exp2(m_t − M)
//
// (m_t, l_t) for row r and tile t at partial[r·tiles + t]; (M, L) to stats[r]. The SOFTMAX
// epilogue then writes exp2(s − M) / L. Keeping M and L apart (not M + log2 L) matters: for a
// row of huge scores (a float mask of -1e9), M + log2 L rounds back to M in f32 and the
// weights would come out unnormalized. A tile with nothing visible has (−3e38, 0) and adds
// nothing; a row with nothing visible gets L = 0. One invocation per row, linear 2-D grid of
// 64-wide workgroups.
//
// The host prepends, from src/kernels/row_stats.rs: the constants and element-type aliases
// named there, shaders/prelude.wgsl (NEG, FLOOR, LOG2E, mask_offset, add_bias), and
// `struct Params`, generated from the Rust uniform of the same fields.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> partial: array<vec2<f32>>;
@group(0) @binding(2) var<storage, read_write> stats: array<vec2<f32>>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let row = (wg.x + wg.y * nwg.x) * 64u + li;
    if row >= p.rows {
        return;
    }
    let base = row * p.tiles;
    var m = -3.0e38;
    for (var t = 0u; t < p.tiles; t++) {
        m = max(m, partial[base + t].x);
    }
    var l = 0.0;
    for (var t = 0u; t < p.tiles; t++) {
        let s = partial[base + t];
        l += s.y * exp2(s.x - m);
    }
    stats[row] = vec2<f32>(m, l);
}
