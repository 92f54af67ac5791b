// The fused backward's dK and dV (FlashAttention-2's loop order), no n × n matrix in memory:
//
//     P_ij  = exp2(s_ij − lse_i),  s_ij = scale·log2 e · q_i·k_j + log2 e · bias_ij
//     dV_j  = Σ_i P_ij · dO_i
//     dS_ij = P_ij · (dO_i·v_j − D_i)
//     dK_j  = scale · Σ_i dS_ij · q_i
//
// with lse_i the log-sum-exp of row i's log2-domain scores, saved by the fused forward
// (the first half of `stats`), and D_i = dO_i·O_i from flash_backward_dot.wgsl (the second
// half). The probabilities are recomputed tile by tile, never stored.
//
// A workgroup of BC threads owns BC consecutive keys of one (batch, K/V head), one key per
// thread: its k (pre-scaled by scale·log2 e) and v rows and its dK and dV accumulators live
// in registers. It walks the query rows in tiles of BR, their q, dO, lse and D loaded into
// workgroup memory together; with grouped-query attention it walks the rows of every query
// head that reads this K/V head, so a shared head's gradient is the sum over them (no second
// pass and no atomics needed: each key is owned by one thread).
//
// Causal (top-left, PyTorch's is_causal): rows before the block's first key see none of its
// keys, so their tiles are skipped; inside a tile, key j > i weighs 0. Mask (MASK ≠ 0): the
// bias is read and applied exactly as the forward reads it (mask_offset, add_bias); a
// masked key (NEG) weighs exactly 0. A row with nothing visible has lse = LSE_EMPTY, so all
// its P are 0 and it adds nothing.
//
// The host prepends, from src/kernels/flash_backward_kv.rs: the constants BC (keys and
// threads per workgroup), BR (query rows per tile), DK4, DV4 (per-head widths in vec4s,
// rounded up), MASK, the element types Q_T and KV_T (f32 or f16; all arithmetic is f32),
// shaders/prelude.wgsl, and the `struct Params` of the fused forward (flash_tiled.rs).

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q_buf: array<Q_T>;
@group(0) @binding(2) var<storage, read> k_buf: array<KV_T>;
@group(0) @binding(3) var<storage, read> v_buf: array<KV_T>;
@group(0) @binding(4) var<storage, read> do_buf: array<f32>;
@group(0) @binding(5) var<storage, read> stats: array<f32>;
@group(0) @binding(6) var<storage, read_write> dk_buf: array<f32>;
@group(0) @binding(7) var<storage, read_write> dv_buf: array<f32>;
@group(0) @binding(8) var<storage, read> mask: array<f32>;

var<workgroup> q_tile: array<vec4<f32>, BR * DK4>;
var<workgroup> do_tile: array<vec4<f32>, BR * DV4>;
// (lse_i, D_i) of the tile's rows.
var<workgroup> st_tile: array<vec2<f32>, BR>;

// Values 4c..4c+3 of the row at `base` of Q (which = 0), K (1), V (2) or dO (3), zero past
// `width` or when `inside` is false.
fn load4(which: u32, inside: bool, base: u32, c: u32, width: u32) -> vec4<f32> {
    var x = vec4<f32>(0.0);
    for (var e = 0u; e < 4u; e++) { // unroll
        let col = c * 4u + e;
        if inside && col < width {
            switch which {
                case 0u: { x[e] = f32(q_buf[base + col]); }
                case 1u: { x[e] = f32(k_buf[base + col]); }
                case 2u: { x[e] = f32(v_buf[base + col]); }
                default: { x[e] = do_buf[base + col]; }
            }
        }
    }
    return x;
}

@compute @workgroup_size(BC)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let id = wg.x + wg.y * nwg.x;
    if id >= p.groups * p.blocks {
        return;
    }
    // p.groups counts (batch, K/V head) pairs here.
    let kv_heads = p.heads / p.kv_ratio;
    let g = id / p.blocks;
    let key0 = (id % p.blocks) * BC;
    let j = key0 + li;
    let b = g / kv_heads;
    let hk = g % kv_heads;
    let rows = p.groups * p.kv_ratio * p.n_q;

    var k: array<vec4<f32>, DK4>;
    var v: array<vec4<f32>, DV4>;
    var dk: array<vec4<f32>, DK4>;
    var dv: array<vec4<f32>, DV4>;
    let k_base = p.k_off + b * p.k_batch + hk * p.k_head + j * p.k_row;
    let v_base = p.v_off + b * p.v_batch + hk * p.v_head + j * p.v_row;
    for (var c = 0u; c < DK4; c++) { // unroll
        k[c] = load4(1u, j < p.n_kv, k_base, c, p.dk_h) * p.scale_log2;
        dk[c] = vec4<f32>(0.0);
    }
    for (var c = 0u; c < DV4; c++) { // unroll
        v[c] = load4(2u, j < p.n_kv, v_base, c, p.dv_h);
        dv[c] = vec4<f32>(0.0);
    }

    // Causal: rows before the block's first key see none of its keys.
    var i_start = 0u;
    if p.causal != 0u {
        i_start = min(key0, p.n_q);
    }
    for (var hh = 0u; hh < p.kv_ratio; hh++) {
        let h = hk * p.kv_ratio + hh;
        let gq = b * p.heads + h;
        let q_base = p.q_off + b * p.q_batch + h * p.q_head;
        let o_base = p.o_off + b * p.o_batch + h * p.o_head;
        for (var i0 = i_start; i0 < p.n_q; i0 += BR) {
            for (var t = li; t < BR * DK4; t += BC) {
                let i = i0 + t / DK4;
                let c = t % DK4;
                q_tile[t] = load4(0u, i < p.n_q, q_base + i * p.q_row, c, p.dk_h);
            }
            for (var t = li; t < BR * DV4; t += BC) {
                let i = i0 + t / DV4;
                let c = t % DV4;
                do_tile[t] = load4(3u, i < p.n_q, o_base + i * p.o_row, c, p.dv_h);
            }
            for (var t = li; t < BR; t += BC) {
                let i = i0 + t;
                var st = vec2<f32>(LSE_EMPTY, 0.0);
                if i < p.n_q {
                    st = vec2<f32>(stats[gq * p.n_q + i], stats[rows + gq * p.n_q + i]);
                }
                st_tile[t] = st;
            }
            workgroupBarrier();

            let count = min(BR, p.n_q - i0);
            for (var r = 0u; r < count; r++) {
                let i = i0 + r;
                var x = 0.0;
                for (var c = 0u; c < DK4; c++) { // unroll
                    x += dot(k[c], q_tile[r * DK4 + c]);
                }
                if j >= p.n_kv || (p.causal != 0u && j > i) {
                    x = NEG;
                } else if MASK != 0u {
                    x = add_bias(x, mask[mask_offset(p.mask, b, h, i, j)], LOG2E);
                }
                let st = st_tile[r];
                let pr = select(exp2(x - st.x), 0.0, x == NEG);
                if !(pr == 0.0) {
                    var dp = 0.0;
                    for (var c = 0u; c < DV4; c++) { // unroll
                        let d_o = do_tile[r * DV4 + c];
                        dp += dot(v[c], d_o);
                        dv[c] = fma(vec4<f32>(pr), d_o, dv[c]);
                    }
                    let ds = pr * (dp - st.y);
                    for (var c = 0u; c < DK4; c++) { // unroll
                        dk[c] = fma(vec4<f32>(ds), q_tile[r * DK4 + c], dk[c]);
                    }
                }
            }
            workgroupBarrier();
        }
    }

    if j < p.n_kv {
        // dS is the gradient of the natural-log scores, scale·q·k: dK = scale·dSᵀ·Q.
        let scale = p.scale_log2 / LOG2E;
        for (var c = 0u; c < DK4; c++) { // unroll
            for (var e = 0u; e < 4u; e++) { // unroll
                if c * 4u + e < p.dk_h {
                    dk_buf[k_base + c * 4u + e] = dk[c][e] * scale;
                }
            }
        }
        for (var c = 0u; c < DV4; c++) { // unroll
            for (var e = 0u; e < 4u; e++) { // unroll
                if c * 4u + e < p.dv_h {
                    dv_buf[v_base + c * 4u + e] = dv[c][e];
                }
            }
        }
    }
}
