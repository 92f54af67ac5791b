// Fused attention (flash attention, online softmax) for any adapter, from storage buffers:
//
//     o_i = Σ_j exp(s_ij − m_i) · v_j / Σ_j exp(s_ij − m_i),   s_ij = scale · q_i·k_j
//
// one pass over the keys with a running max m_i and sum l_i; the n × n scores never exist in
// memory. Scores run in the log2 domain (q pre-multiplied by scale·log2 e).
//
// A workgroup of WG threads owns WG consecutive query rows of one (batch, head) group, one
// row per thread, its q and output accumulator in registers. Keys are streamed in tiles of
// BK: the workgroup loads the tile's K and V rows into workgroup memory together, then every
// thread reads them from there (the classic GPU layout: one global read per key per
// workgroup, not per row). Causal (top-left, PyTorch's is_causal): row i sees keys j ≤ i;
// tiles past the workgroup's last row are skipped.
//
// Mask (when MASK ≠ 0): a bias added to the scaled scores, read through its strides (0 along
// broadcast axes); f32::MIN marks a key masked out. The running max starts at FLOOR, above
// the masked marker, so masked keys weigh exactly 0 and a row with nothing visible ends
// with l = 0 and is written as zeros.
//
// The host prepends: const BK (keys per tile), DK4 / DV4 (per-head widths of q·k and v in
// vec4s, rounded up), MASK (1 when there is a mask), LSE (1: save the row statistics), and the element types `alias Q_T` and
// `KV_T` (f32 or f16; scores and sums are f32 either way). The Params block is shared with
// flash_subgroup.wgsl (its texture fields unused here); K and V are read through their strides.
//
// The host prepends, from src/kernels/flash_tiled.rs: the constants and element-type aliases
// named there, shaders/prelude.wgsl (NEG, FLOOR, LOG2E, mask_offset, add_bias), and
// `struct Params`, generated from the Rust uniform of the same fields.

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q_buf: array<Q_T>;
@group(0) @binding(2) var<storage, read> k_buf: array<KV_T>;
@group(0) @binding(3) var<storage, read> v_buf: array<KV_T>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read> mask: array<f32>;
// LSE ≠ 0: each row's log-sum-exp of its log2-domain scores (LSE_EMPTY when nothing is
// visible), for the backward pass; bound to `out` and untouched when LSE = 0.
@group(0) @binding(6) var<storage, read_write> lse: array<f32>;

var<workgroup> k_tile: array<vec4<f32>, BK * DK4>;
var<workgroup> v_tile: array<vec4<f32>, BK * DV4>;

// Values 4c..4c+3 of a row that starts at `base` and has `width` values (zero past it).
fn load4(buf_is_k: bool, base: u32, c: u32, width: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var e = 0u; e < 4u; e++) { // unroll
        let col = c * 4u + e;
        if col < width {
            if buf_is_k {
                v[e] = f32(k_buf[base + col]);
            } else {
                v[e] = f32(v_buf[base + col]);
            }
        }
    }
    return v;
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let id = wg.x + wg.y * nwg.x;
    if id >= p.groups * p.blocks {
        return;
    }
    let g = id / p.blocks;
    let row0 = (id % p.blocks) * WG;
    let row = row0 + li;
    let b = g / p.heads;
    let h = g % p.heads;

    var q: array<vec4<f32>, DK4>;
    var o: array<vec4<f32>, DV4>;
    var m = FLOOR;
    var l = 0.0;
    let q_base = p.q_off + b * p.q_batch + h * p.q_head + row * p.q_row;
    for (var c = 0u; c < DK4; c++) { // unroll
        var v = vec4<f32>(0.0);
        if row < p.n_q {
            for (var e = 0u; e < 4u; e++) { // unroll
                let col = c * 4u + e;
                if col < p.dk_h {
                    v[e] = f32(q_buf[q_base + col]);
                }
            }
        }
        q[c] = v * p.scale_log2;
    }
    for (var c = 0u; c < DV4; c++) { // unroll
        o[c] = vec4<f32>(0.0);
    }

    var kv_end = p.n_kv;
    if p.causal != 0u {
        kv_end = min(kv_end, min(row0 + WG, p.n_q));
    }
    // Grouped-query attention: kv_ratio query heads share one K/V head.
    let hk = h / p.kv_ratio;
    let k_base = p.k_off + b * p.k_batch + hk * p.k_head;
    let v_base = p.v_off + b * p.v_batch + hk * p.v_head;

    // The mask modifiers' block map (src/kernels/mods.rs): the keys that hold any visible
    // pair for this block's rows, and per tile 0 = none visible (skipped), 1 = all (no mask
    // modifier to evaluate), 2 = some.
    let span = wa_span(b, h, row0);
    kv_end = min(kv_end, span.y);
    for (var j0 = span.x; j0 < kv_end; j0 += BK) {
        let tile = wa_block(b, h, row0, j0);
        if tile == 0u {
            continue;
        }
        for (var t = li; t < BK * DK4; t += WG) {
            let j = j0 + t / DK4;
            var v = vec4<f32>(0.0);
            if j < p.n_kv {
                v = load4(true, k_base + j * p.k_row, t % DK4, p.dk_h);
            }
            k_tile[t] = v;
        }
        for (var t = li; t < BK * DV4; t += WG) {
            let j = j0 + t / DV4;
            var v = vec4<f32>(0.0);
            if j < p.n_kv {
                v = load4(false, v_base + j * p.v_row, t % DV4, p.dv_h);
            }
            v_tile[t] = v;
        }
        workgroupBarrier();

        let count = min(BK, kv_end - j0);
        var s: array<f32, BK>;
        var tile_max = NEG;
        for (var jj = 0u; jj < BK; jj++) {
            var acc = 0.0;
            for (var c = 0u; c < DK4; c++) { // unroll
                acc += dot(q[c], k_tile[jj * DK4 + c]);
            }
            if jj >= count || (p.causal != 0u && j0 + jj > row) {
                acc = NEG;
            } else if row < p.n_q {
                // The modifiers (identity stubs without any; see src/kernels/mods.rs): the
                // score modifier on the scaled score, the bias, then the mask modifier.
                acc = wa_score_log2(acc, b, h, row, j0 + jj);
                if MASK != 0u {
                    acc = add_bias(acc, mask[mask_offset(p.mask, b, h, row, j0 + jj)], LOG2E);
                }
                if tile == 2u {
                    acc = select(NEG, acc, wa_keep(b, h, row, j0 + jj));
                }
            }
            s[jj] = acc;
            tile_max = max(tile_max, acc);
        }
        let m_new = max(m, tile_max);
        let corr = exp2(m - m_new);
        m = m_new;
        l *= corr;
        for (var c = 0u; c < DV4; c++) { // unroll
            o[c] *= corr;
        }
        for (var jj = 0u; jj < count; jj++) {
            let pr = exp2(s[jj] - m);
            // A key of weight 0 (masked, hidden, underflowed) adds nothing: skipping it keeps a
            // NaN/Inf value there out of the row when such inputs are passed through. Written
            // !(w == 0.0) because `!=` compiles to an ordered compare, false for a NaN weight.
            if !(pr == 0.0) {
                l += pr;
                for (var c = 0u; c < DV4; c++) { // unroll
                    o[c] += pr * v_tile[jj * DV4 + c];
                }
            }
        }
        workgroupBarrier();
    }

    if row < p.n_q {
        let o_base = p.o_off + b * p.o_batch + h * p.o_head + row * p.o_row;
        // Nothing visible (every key masked out): zeros, not 0/0.
        let inv = select(1.0 / l, 0.0, l == 0.0);
        if LSE != 0u {
            lse[g * p.n_q + row] = select(m + log2(l), LSE_EMPTY, l == 0.0);
        }
        for (var c = 0u; c < DV4; c++) { // unroll
            for (var e = 0u; e < 4u; e++) { // unroll
                let col = c * 4u + e;
                if col < p.dv_h {
                    out[o_base + col] = o[c][e] * inv;
                }
            }
        }
    }
}
