// The fused backward's dQ for adapters where textures and subgroup operations are fast
// (lavapipe): the same arithmetic as flash_backward_q.wgsl,
//
//     P_ij = exp2(s_ij − lse_i),   dS_ij = P_ij · (dO_i·v_j − D_i),   dQ_i = scale · Σ_j dS_ij · k_j
//
// in the loop order of flash_subgroup.wgsl: one subgroup per workgroup, lane `l` owns the R
// query rows row0 + r·SG + l (q pre-scaled by scale·log2 e, dO, lse, D and the dQ
// accumulator in registers); keys stream in tiles of SG, lane `l` loading key j0 + l from
// the K and V textures (packed by pack.wgsl) and subgroupShuffle handing it to every lane.
// A pass of its own: accumulating dQ inside the dK/dV kernel would need atomic float adds,
// which WGSL does not have. Causal tiles past the block's last row are skipped; masks and
// the score/mask modifiers (wa_score_log2, wa_keep, and wa_score_grad for dS; see
// src/kernels/mods.rs) as the forward applies them, with the block map of this kernel's
// blocks of SG·R rows and tiles of SG keys (wa_span, wa_block: empty tiles skipped); a row with nothing visible (lse = LSE_EMPTY) gets dQ = 0.
//
// The host prepends, from src/kernels/flash_backward_q_subgroup.rs: the constants SG, R
// (rows per lane), DK4, DV4, MASK, the element type Q_T (f32 or f16; K and V come from
// textures as f32), shaders/prelude.wgsl, and the `struct Params` of the fused forward.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q_buf: array<Q_T>;
@group(0) @binding(2) var k_tex: texture_2d<f32>;
@group(0) @binding(3) var v_tex: texture_2d<f32>;
@group(0) @binding(4) var<storage, read> do_buf: array<f32>;
@group(0) @binding(5) var<storage, read> stats: array<f32>;
@group(0) @binding(6) var<storage, read_write> dq_buf: array<f32>;
@group(0) @binding(7) var<storage, read> mask: array<f32>;

// Values 4c..4c+3 of the row at `base` of Q (`is_k`, its first operand) or dO, zero past `width` or when
// `inside` is false.
fn load4(is_k: bool, inside: bool, base: u32, c: u32, width: u32) -> vec4<f32> {
    var x = vec4<f32>(0.0);
    for (var e = 0u; e < 4u; e++) { // unroll
        let col = c * 4u + e;
        if inside && col < width {
            if is_k {
                x[e] = f32(q_buf[base + col]);
            } else {
                x[e] = do_buf[base + col];
            }
        }
    }
    return x;
}

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
    let g_kv = b * (p.heads / p.kv_ratio) + h / p.kv_ratio;
    let n_rows = p.groups * p.n_q;

    var q: array<array<vec4<f32>, DK4>, R>;
    var d_o: array<array<vec4<f32>, DV4>, R>;
    var dq: array<array<vec4<f32>, DK4>, R>;
    var lse: array<f32, R>;
    var dd: array<f32, R>;
    var rows: array<u32, R>;
    for (var r = 0u; r < R; r++) { // unroll
        let i = row0 + r * SG + lane;
        rows[r] = i;
        let q_base = p.q_off + b * p.q_batch + h * p.q_head + i * p.q_row;
        let o_base = p.o_off + b * p.o_batch + h * p.o_head + i * p.o_row;
        for (var c = 0u; c < DK4; c++) { // unroll
            q[r][c] = load4(true, i < p.n_q, q_base, c, p.dk_h) * p.scale_log2;
            dq[r][c] = vec4<f32>(0.0);
        }
        for (var c = 0u; c < DV4; c++) { // unroll
            d_o[r][c] = load4(false, i < p.n_q, o_base, c, p.dv_h);
        }
        lse[r] = LSE_EMPTY;
        dd[r] = 0.0;
        if i < p.n_q {
            lse[r] = stats[g * p.n_q + i];
            dd[r] = stats[n_rows + g * p.n_q + i];
        }
    }

    var kv_end = p.n_kv;
    if p.causal != 0u {
        kv_end = min(kv_end, min(row0 + SG * R, p.n_q));
    }
    let k_mask = (1u << p.k_shift) - 1u;
    let v_mask = (1u << p.v_shift) - 1u;
    // The mask modifiers' block map, as the forward reads it (src/kernels/mods.rs): only
    // the keys that hold a visible pair for this block's rows, tiles 0 = none visible
    // (skipped), 1 = all (no mask modifier to evaluate), 2 = some.
    let span = wa_span(b, h, row0);
    kv_end = min(kv_end, span.y);
    for (var j0 = span.x; j0 < kv_end; j0 += SG) {
        let tile = wa_block(b, h, row0, j0);
        if tile == 0u {
            continue;
        }
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

        for (var jj = 0u; jj < SG; jj++) { // unroll
            var ks: array<vec4<f32>, DK4>;
            var s: array<f32, R>;
            for (var c = 0u; c < DK4; c++) { // unroll
                ks[c] = sg_shuffle4(kr[c], jj);
                for (var r = 0u; r < R; r++) { // unroll
                    s[r] += dot(q[r][c], ks[c]);
                }
            }
            var dp: array<f32, R>;
            for (var c = 0u; c < DV4; c++) { // unroll
                let vc = sg_shuffle4(vr[c], jj);
                for (var r = 0u; r < R; r++) { // unroll
                    dp[r] += dot(d_o[r][c], vc);
                }
            }
            for (var r = 0u; r < R; r++) { // unroll
                // As the forward: the score modifiers on the scaled score, the bias, then the
                // mask modifiers; dS through the score modifiers' derivative `gs`.
                let key = j0 + jj;
                var x = NEG;
                var gs = 0.0;
                if jj < count && rows[r] < p.n_q && (p.causal == 0u || key <= rows[r]) {
                    x = wa_score_log2(s[r], b, h, rows[r], key);
                    gs = wa_score_grad(s[r] / LOG2E, b, h, rows[r], key);
                    if MASK != 0u {
                        x = add_bias(x, mask[mask_offset(p.mask, b, h, rows[r], key)], LOG2E);
                    }
                    if tile == 2u {
                        x = select(NEG, x, wa_keep(b, h, rows[r], key));
                    }
                }
                let pr = select(exp2(x - lse[r]), 0.0, x == NEG);
                let ds = select(pr * (dp[r] - dd[r]) * gs, 0.0, pr == 0.0);
                for (var c = 0u; c < DK4; c++) { // unroll
                    dq[r][c] = fma(vec4<f32>(ds), ks[c], dq[r][c]);
                }
            }
        }
    }

    let scale = p.scale_log2 / LOG2E;
    for (var r = 0u; r < R; r++) { // unroll
        let i = rows[r];
        if i < p.n_q {
            let q_base = p.q_off + b * p.q_batch + h * p.q_head + i * p.q_row;
            for (var c = 0u; c < DK4; c++) { // unroll
                for (var e = 0u; e < 4u; e++) { // unroll
                    if c * 4u + e < p.dk_h {
                        dq_buf[q_base + c * 4u + e] = dq[r][c][e] * scale;
                    }
                }
            }
        }
    }
}
