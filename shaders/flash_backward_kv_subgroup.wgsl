// The fused backward's dK and dV for adapters where textures and subgroup operations are fast
// and storage/workgroup memory is slow (lavapipe): the same arithmetic as
// flash_backward_kv.wgsl,
//
//     P_ij  = exp2(s_ij − lse_i),  s_ij = scale·log2 e · q_i·k_j + log2 e · bias_ij
//     dV_j  = Σ_i P_ij · dO_i,     dS_ij = P_ij · (dO_i·v_j − D_i),    dK_j = scale · Σ_i dS_ij · q_i
//
// with the loop order of flash_subgroup.wgsl turned around: one subgroup per workgroup, lane
// `l` owns the R keys key0 + r·SG + l (k pre-scaled by scale·log2 e, v, and the dK, dV
// accumulators in its registers). The query rows stream in tiles of SG: lane `l` loads row
// i0 + l of Q and dO from their textures (packed by pack.wgsl, one textureLoad per 4 values)
// and its lse and D, and subgroupShuffle hands each row to every lane. With grouped-query
// attention the lanes walk the rows of every query head reading their K/V head, so a shared
// head's gradient is their sum. Causal: rows before the block's first key are skipped; masks
// and the score/mask modifiers (wa_score_log2, wa_keep, and wa_score_grad for dS; see
// src/kernels/mods.rs) as the forward applies them; a row with nothing visible (lse = LSE_EMPTY) adds nothing.
//
// Textures: Q's layout is (k_shift, k_rows) of Params, dO's (v_shift, v_rows); row i of query
// group g, values 4c..4c+3, at texel ((i & mask)·D4 + c, g·rows + (i >> shift)).
//
// The host prepends, from src/kernels/flash_backward_kv_subgroup.rs: the constants SG
// (subgroup size), R (keys per lane), DK4, DV4, MASK, the element type KV_T (f32 or f16),
// shaders/prelude.wgsl, and the `struct Params` of the fused forward (flash_tiled.rs).

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var q_tex: texture_2d<f32>;
@group(0) @binding(2) var do_tex: texture_2d<f32>;
@group(0) @binding(3) var<storage, read> k_buf: array<KV_T>;
@group(0) @binding(4) var<storage, read> v_buf: array<KV_T>;
@group(0) @binding(5) var<storage, read> stats: array<f32>;
@group(0) @binding(6) var<storage, read_write> dk_buf: array<f32>;
@group(0) @binding(7) var<storage, read_write> dv_buf: array<f32>;
@group(0) @binding(8) var<storage, read> mask: array<f32>;

// Values 4c..4c+3 of the row at `base` of K (`is_k`) or V, zero past `width` or when
// `inside` is false.
fn load4(is_k: bool, inside: bool, base: u32, c: u32, width: u32) -> vec4<f32> {
    var x = vec4<f32>(0.0);
    for (var e = 0u; e < 4u; e++) { // unroll
        let col = c * 4u + e;
        if inside && col < width {
            if is_k {
                x[e] = f32(k_buf[base + col]);
            } else {
                x[e] = f32(v_buf[base + col]);
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
    // p.groups counts (batch, K/V head) pairs here.
    let kv_heads = p.heads / p.kv_ratio;
    let g = id / p.blocks;
    let key0 = (id % p.blocks) * SG * R;
    let b = g / kv_heads;
    let hk = g % kv_heads;
    let rows = p.groups * p.kv_ratio * p.n_q;

    var k: array<array<vec4<f32>, DK4>, R>;
    var v: array<array<vec4<f32>, DV4>, R>;
    var dk: array<array<vec4<f32>, DK4>, R>;
    var dv: array<array<vec4<f32>, DV4>, R>;
    var keys: array<u32, R>;
    for (var r = 0u; r < R; r++) { // unroll
        let j = key0 + r * SG + lane;
        keys[r] = j;
        let k_base = p.k_off + b * p.k_batch + hk * p.k_head + j * p.k_row;
        let v_base = p.v_off + b * p.v_batch + hk * p.v_head + j * p.v_row;
        for (var c = 0u; c < DK4; c++) { // unroll
            k[r][c] = load4(true, j < p.n_kv, k_base, c, p.dk_h) * p.scale_log2;
            dk[r][c] = vec4<f32>(0.0);
        }
        for (var c = 0u; c < DV4; c++) { // unroll
            v[r][c] = load4(false, j < p.n_kv, v_base, c, p.dv_h);
            dv[r][c] = vec4<f32>(0.0);
        }
    }

    // Causal: rows before the block's first key see none of its keys (the same for every
    // lane, so the loops stay uniform).
    var i_start = 0u;
    if p.causal != 0u {
        i_start = min(key0, p.n_q);
    }
    let q_mask = (1u << p.k_shift) - 1u;
    let do_mask = (1u << p.v_shift) - 1u;
    for (var hh = 0u; hh < p.kv_ratio; hh++) {
        let h = hk * p.kv_ratio + hh;
        let gq = b * p.heads + h;
        for (var i0 = i_start; i0 < p.n_q; i0 += SG) {
            // Lane `lane` fetches query row i0 + lane.
            let i = i0 + lane;
            var qr: array<vec4<f32>, DK4>;
            var dor: array<vec4<f32>, DV4>;
            var st = vec2<f32>(LSE_EMPTY, 0.0);
            if i < p.n_q {
                let qx = (i & q_mask) * DK4;
                let qy = gq * p.k_rows + (i >> p.k_shift);
                for (var c = 0u; c < DK4; c++) { // unroll
                    qr[c] = textureLoad(q_tex, vec2<u32>(qx + c, qy), 0);
                }
                let dx = (i & do_mask) * DV4;
                let dy = gq * p.v_rows + (i >> p.v_shift);
                for (var c = 0u; c < DV4; c++) { // unroll
                    dor[c] = textureLoad(do_tex, vec2<u32>(dx + c, dy), 0);
                }
                st = vec2<f32>(stats[gq * p.n_q + i], stats[rows + gq * p.n_q + i]);
            }
            let count = min(SG, p.n_q - i0);

            for (var ii = 0u; ii < SG; ii++) { // unroll
                let row = i0 + ii;
                let lse = sg_shuffle1(st.x, ii);
                let dd = sg_shuffle1(st.y, ii);
                var qs: array<vec4<f32>, DK4>;
                var s: array<f32, R>;
                for (var c = 0u; c < DK4; c++) { // unroll
                    qs[c] = sg_shuffle4(qr[c], ii);
                    for (var r = 0u; r < R; r++) { // unroll
                        s[r] += dot(k[r][c], qs[c]);
                    }
                }
                // As the forward: the score modifiers on the scaled score, the bias, then
                // the mask modifiers; dS through the score modifiers' derivative `gs`.
                var pr: array<f32, R>;
                var gs: array<f32, R>;
                for (var r = 0u; r < R; r++) { // unroll
                    var x = NEG;
                    gs[r] = 0.0;
                    if ii < count && keys[r] < p.n_kv && (p.causal == 0u || keys[r] <= row) {
                        x = wa_score_log2(s[r], b, h, row, keys[r]);
                        gs[r] = wa_score_grad(s[r] / LOG2E, b, h, row, keys[r]);
                        if MASK != 0u {
                            x = add_bias(x, mask[mask_offset(p.mask, b, h, row, keys[r])], LOG2E);
                        }
                        x = select(NEG, x, wa_keep(b, h, row, keys[r]));
                    }
                    pr[r] = select(exp2(x - lse), 0.0, x == NEG);
                }
                // dV += P·dO and dP = dO·v, one dO column at a time.
                var dp: array<f32, R>;
                for (var c = 0u; c < DV4; c++) { // unroll
                    let dc = sg_shuffle4(dor[c], ii);
                    for (var r = 0u; r < R; r++) { // unroll
                        dp[r] += dot(v[r][c], dc);
                        dv[r][c] = fma(vec4<f32>(pr[r]), dc, dv[r][c]);
                    }
                }
                for (var r = 0u; r < R; r++) { // unroll
                    let ds = select(pr[r] * (dp[r] - dd) * gs[r], 0.0, pr[r] == 0.0);
                    for (var c = 0u; c < DK4; c++) { // unroll
                        dk[r][c] = fma(vec4<f32>(ds), qs[c], dk[r][c]);
                    }
                }
            }
        }
    }

    let scale = p.scale_log2 / LOG2E;
    for (var r = 0u; r < R; r++) { // unroll
        let j = keys[r];
        if j < p.n_kv {
            let k_base = p.k_off + b * p.k_batch + hk * p.k_head + j * p.k_row;
            let v_base = p.v_off + b * p.v_batch + hk * p.v_head + j * p.v_row;
            for (var c = 0u; c < DK4; c++) { // unroll
                for (var e = 0u; e < 4u; e++) { // unroll
                    if c * 4u + e < p.dk_h {
                        dk_buf[k_base + c * 4u + e] = dk[r][c][e] * scale;
                    }
                }
            }
            for (var c = 0u; c < DV4; c++) { // unroll
                for (var e = 0u; e < 4u; e++) { // unroll
                    if c * 4u + e < p.dv_h {
                        dv_buf[v_base + c * 4u + e] = dv[r][c][e];
                    }
                }
            }
        }
    }
}
