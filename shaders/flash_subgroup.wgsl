// Fused attention (flash attention, online softmax) for adapters where textures and
// subgroup operations are fast and storage/workgroup memory is slow (lavapipe):
//
//     o_i = Σ_j exp(s_ij − m_i) · v_j / Σ_j exp(s_ij − m_i),   s_ij = scale · q_i·k_j
//
// computed in one pass over the keys with a running max m_i and sum l_i; the n × n scores
// never exist in memory. Scores run in the log2 domain (q is pre-multiplied by
// scale·log2 e, so exp becomes exp2).
//
// One workgroup is one subgroup of SG lanes. Lane `l` owns the R query rows
// row0 + r·SG + l: their q and output accumulators live in its registers, so the softmax
// of a row is private to one lane. Keys are streamed in tiles of SG: lane `l` loads key
// j0 + l from the K and V textures (one textureLoad per 4 values), and subgroupShuffle hands
// it to every lane. With the loop bound SG constant, the shuffles have constant lanes once
// unrolled.
//
// K and V are packed by pack.wgsl into rgba32float textures (rgba16float from f16): key j of group g, values
// 4c..4c+3, sits at texel ((j & mask)·D4 + c, g·rows + (j >> shift)).
// Causal (top-left, PyTorch's is_causal): row i sees keys j ≤ i; tiles past the block's
// last row are skipped.
//
// Mask (when MASK ≠ 0): a bias added to the scaled scores, read through its strides (0 along
// broadcast axes); f32::MIN marks a key masked out. The running max starts at FLOOR, above
// the masked marker, so masked keys weigh exactly 0 and a row with nothing visible ends
// with l = 0 and is written as zeros.
//
// The host prepends: const SG (subgroup size), R (rows per lane), DK4 / DV4 (per-head
// widths of q·k and v in vec4s, rounded up), MASK (1 when there is a mask), SKIP_ZERO (1: keys
// of weight exactly 0 are left out of o, so a NaN/Inf value there cannot reach it), LSE (1: each
// row's log-sum-exp of its log2-domain scores, m + log2(l), goes to `lse[g·n_q + row]`, LSE_EMPTY
// for a row with nothing visible; `lse` is bound to `out` and untouched when 0), and the element
// type `alias Q_T` (f32 or f16; K and V come from textures, read as f32).
//
// The host prepends, from src/kernels/flash_subgroup.rs: the constants and element-type aliases
// named there, shaders/prelude.wgsl (NEG, FLOOR, LOG2E, mask_offset, add_bias), and
// `struct Params`, generated from the Rust uniform of the same fields.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q_buf: array<Q_T>;
@group(0) @binding(2) var k_tex: texture_2d<f32>;
@group(0) @binding(3) var v_tex: texture_2d<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read> mask: array<f32>;
@group(0) @binding(6) var<storage, read_write> lse: array<f32>;

@compute @workgroup_size(SG)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let id = wg.x + wg.y * nwg.x;
    if id >= p.groups * p.blocks {
        return;
    }
    let g = id / p.blocks;
    let row0 = (id % p.blocks) * SG * R;
    let b = g / p.heads;
    let h = g % p.heads;
    // Grouped-query attention: kv_ratio query heads share one K/V head (its texture rows).
    let g_kv = b * (p.heads / p.kv_ratio) + h / p.kv_ratio;

    var q: array<array<vec4<f32>, DK4>, R>;
    var o: array<array<vec4<f32>, DV4>, R>;
    var m: array<f32, R>;
    var l: array<f32, R>;
    var rows: array<u32, R>;
    let q_base = p.q_off + b * p.q_batch + h * p.q_head;
    for (var r = 0u; r < R; r++) { // unroll
        let row = row0 + r * SG + lane;
        rows[r] = row;
        m[r] = FLOOR;
        l[r] = 0.0;
        for (var c = 0u; c < DK4; c++) { // unroll
            var v = vec4<f32>(0.0);
            if row < p.n_q {
                for (var e = 0u; e < 4u; e++) { // unroll
                    let col = c * 4u + e;
                    if col < p.dk_h {
                        v[e] = f32(q_buf[q_base + row * p.q_row + col]);
                    }
                }
            }
            q[r][c] = v * p.scale_log2;
        }
        for (var c = 0u; c < DV4; c++) { // unroll
            o[r][c] = vec4<f32>(0.0);
        }
    }

    // Keys this block needs (the same for every lane, so the loop stays uniform).
    var kv_end = p.n_kv;
    if p.causal != 0u {
        kv_end = min(kv_end, min(row0 + SG * R, p.n_q));
    }
    let k_mask = (1u << p.k_shift) - 1u;
    let v_mask = (1u << p.v_shift) - 1u;

    // The mask modifiers' block map (src/kernels/mods.rs): the keys that hold any visible
    // pair for this block's rows, and per tile 0 = none visible (skipped), 1 = all (no mask
    // modifier to evaluate), 2 = some.
    let span = wa_span(b, h, row0);
    kv_end = min(kv_end, span.y);
    for (var j0 = span.x; j0 < kv_end; j0 += SG) {
        let tile = wa_block(b, h, row0, j0);
        if tile == 0u {
            continue;
        }
        // Lane `lane` fetches key j0 + lane.
        let j = j0 + lane;
        var kr: array<vec4<f32>, DK4>;
        var vr: array<vec4<f32>, DV4>;
        if j < p.n_kv {
            let kx = (j & k_mask) * DK4;
            let ky = g_kv * p.k_rows + (j >> p.k_shift);
            for (var c = 0u; c < DK4; c++) { // unroll
                kr[c] = textureLoad(k_tex, vec2<u32>(kx + c, ky), 0);
            }
            let vx = (j & v_mask) * DV4;
            let vy = g_kv * p.v_rows + (j >> p.v_shift);
            for (var c = 0u; c < DV4; c++) { // unroll
                vr[c] = textureLoad(v_tex, vec2<u32>(vx + c, vy), 0);
            }
        }
        let count = min(SG, kv_end - j0);

        // Scores of this tile, and each row's tile max.
        var s: array<array<f32, SG>, R>;
        var tile_max: array<f32, R>;
        for (var r = 0u; r < R; r++) { // unroll
            tile_max[r] = NEG;
        }
        for (var jj = 0u; jj < SG; jj++) { // unroll
            var acc: array<f32, R>;
            for (var c = 0u; c < DK4; c++) { // unroll
                let kc = sg_shuffle4(kr[c], jj);
                for (var r = 0u; r < R; r++) { // unroll
                    acc[r] += dot(q[r][c], kc);
                }
            }
            for (var r = 0u; r < R; r++) { // unroll
                var x = acc[r];
                if jj >= count || (p.causal != 0u && j0 + jj > rows[r]) {
                    x = NEG;
                } else if rows[r] < p.n_q {
                    // The modifiers (identity stubs without any; see src/kernels/mods.rs).
                    x = wa_score_log2(x, b, h, rows[r], j0 + jj);
                    if MASK != 0u {
                        x = add_bias(x, mask[mask_offset(p.mask, b, h, rows[r], j0 + jj)], LOG2E);
                    }
                    if tile == 2u {
                        x = select(NEG, x, wa_keep(b, h, rows[r], j0 + jj));
                    }
                }
                s[r][jj] = x;
                tile_max[r] = max(tile_max[r], x);
            }
        }

        // The new running max; exp(s − m) of the tile, and the factor for what came before.
        var corr: array<f32, R>;
        for (var r = 0u; r < R; r++) { // unroll
            let m_new = max(m[r], tile_max[r]);
            corr[r] = exp2(m[r] - m_new);
            m[r] = m_new;
            var sum = 0.0;
            for (var jj = 0u; jj < SG; jj++) { // unroll
                s[r][jj] = exp2(s[r][jj] - m_new);
                sum += s[r][jj];
            }
            l[r] = l[r] * corr[r] + sum;
        }

        // o ← corr·o + Σ_j p_j·v_j, one vec4 column at a time so its accumulators stay in
        // registers across the tile's keys.
        for (var c = 0u; c < DV4; c++) { // unroll
            var oc: array<vec4<f32>, R>;
            for (var r = 0u; r < R; r++) { // unroll
                oc[r] = o[r][c] * corr[r];
            }
            for (var jj = 0u; jj < SG; jj++) { // unroll
                let vc = sg_shuffle4(vr[c], jj);
                for (var r = 0u; r < R; r++) { // unroll
                    let pr = s[r][jj];
                    if SKIP_ZERO == 0u || !(pr == 0.0) {
                        oc[r] = fma(vec4<f32>(pr), vc, oc[r]);
                    }
                }
            }
            for (var r = 0u; r < R; r++) { // unroll
                o[r][c] = oc[r];
            }
        }
    }

    let o_base = p.o_off + b * p.o_batch + h * p.o_head;
    for (var r = 0u; r < R; r++) { // unroll
        let row = rows[r];
        if row < p.n_q {
            // Nothing visible (every key masked out): zeros, not 0/0.
            let inv = select(1.0 / l[r], 0.0, l[r] == 0.0);
            if LSE != 0u {
                lse[g * p.n_q + row] = select(m[r] + log2(l[r]), LSE_EMPTY, l[r] == 0.0);
            }
            for (var c = 0u; c < DV4; c++) { // unroll
                for (var e = 0u; e < 4u; e++) { // unroll
                    let col = c * 4u + e;
                    if col < p.dv_h {
                        out[o_base + row * p.o_row + col] = o[r][c][e] * inv;
                    }
                }
            }
        }
    }
}
