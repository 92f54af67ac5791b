// Weighted sum of the values by the attention weights, written into the heads-concatenated
// context:
//
//     context[b, i, h·dv_h + c] = Σ_j A[b, h, i, j] · V[b, j, h·dv_h + c]
//
// with j < n_kv, or j ≤ i under the causal mask (the weights there are 0, so the loop just
// stops early: causal attention does half the work).
//
// A workgroup of 8×8 threads computes a 32×32 block of one group's context, each thread a
// 4×4 block read straight from the operands (no workgroup memory: the inner loop is bounded
// per row block, which a shared tile would not save). Linear grid as in matmul.wgsl.
//
// The host prepends, from src/kernels/weighted_sum.rs: the constants and element-type aliases
// named there, shaders/prelude.wgsl (NEG, FLOOR, LOG2E, mask_offset, add_bias), and
// `struct Params`, generated from the Rust uniform of the same fields.

const TILE: u32 = 32u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<V_T>;
@group(0) @binding(3) var<storage, read_write> ctx: array<f32>;

@compute @workgroup_size(8, 8, 1)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
) {
    let wid = wg.x + wg.y * nwg.x;
    let per_group = p.tiles_m * p.tiles_n;
    if wid >= per_group * p.groups {
        return;
    }
    let g = wid / per_group;
    let t = wid % per_group;
    let m0 = (t / p.tiles_n) * TILE;
    let n0 = (t % p.tiles_n) * TILE;
    let bi = g / p.heads;
    let hi = g % p.heads;

    var k_end = p.n_kv;
    if p.causal != 0u {
        k_end = min(k_end, m0 + TILE);
    }

    // Rows and columns this thread owns; out-of-range ones are clamped for reading and
    // skipped for writing.
    var w_rows: array<u32, 4>;
    var v_cols: array<u32, 4>;
    for (var i = 0u; i < 4u; i++) { // unroll
        let row = min(m0 + lid.y + 8u * i, p.n_q - 1u);
        w_rows[i] = (g * p.n_q + row) * p.n_kv;
        let col = min(n0 + lid.x + 8u * i, p.dv_h - 1u);
        // Grouped-query attention: v_ratio query heads share one value head.
        v_cols[i] = bi * p.v_batch + (hi / p.v_ratio) * p.v_head + col;
    }

    var acc: array<array<f32, 4>, 4>;
    for (var i = 0u; i < 4u; i++) { // unroll
        for (var j = 0u; j < 4u; j++) { // unroll
            acc[i][j] = 0.0;
        }
    }
    for (var k = 0u; k < k_end; k++) {
        var wr: array<f32, 4>;
        var vr: array<f32, 4>;
        for (var i = 0u; i < 4u; i++) { // unroll
            wr[i] = w[w_rows[i] + k];
            vr[i] = f32(v[v_cols[i] + k * p.v_row]);
        }
        for (var i = 0u; i < 4u; i++) { // unroll
            // A key of weight 0 (masked, hidden, underflowed) adds nothing: skipping it keeps a
            // NaN/Inf value there out of the row when such inputs are passed through. Written
            // !(w == 0.0) because `!=` compiles to an ordered compare, false for a NaN weight.
            if !(wr[i] == 0.0) {
                for (var j = 0u; j < 4u; j++) { // unroll
                    acc[i][j] = fma(wr[i], vr[j], acc[i][j]);
                }
            }
        }
    }

    let c_base = bi * p.c_batch + hi * p.c_head;
    for (var i = 0u; i < 4u; i++) {
        let row = m0 + lid.y + 8u * i;
        if row >= p.n_q {
            continue;
        }
        for (var j = 0u; j < 4u; j++) {
            let col = n0 + lid.x + 8u * j;
            if col >= p.dv_h {
                continue;
            }
            ctx[c_base + row * p.c_row + col] = acc[i][j];
        }
    }
}
