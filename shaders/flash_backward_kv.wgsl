// The fused backward's dK and dV (FlashAttention-2's loop order), no n × n matrix in memory:
//
//     P_ij  = exp2(s_ij − lse_i),  s_ij = log2 e · (mod(scale·q_i·k_j) + bias_ij)
//     dV_j  = Σ_i P_ij · dO_i
//     dS_ij = P_ij · (dO_i·v_j − D_i) · mod'(scale·q_i·k_j)
//     dK_j  = scale · Σ_i dS_ij · q_i
//
// with lse_i the log-sum-exp of row i's log2-domain scores, saved by the fused forward
// (the first half of `stats`), and D_i = dO_i·O_i from flash_backward_dot.wgsl (the second
// half). The probabilities are recomputed tile by tile, never stored.
//
// A workgroup owns BC consecutive keys of one (batch, K/V head), CT threads per key: each
// holds the vec4 columns t + CT·c of its key's k (pre-scaled by scale·log2 e) and v and of
// its dK and dV accumulators in registers (CT = 1 on lavapipe; more on GPUs, so registers
// stay bounded). It walks the query rows in tiles of BR, their q, dO, lse and D loaded into
// workgroup memory together; per tile each thread writes its partial scores and dP there,
// and every thread sums its key's CT partials. With grouped-query attention it walks the
// rows of every query head that reads this K/V head, so a shared head's gradient is the sum
// over them (no second pass and no atomics: each key's columns belong to one thread).
//
// Causal (top-left, PyTorch's is_causal): rows before the block's first key see none of its
// keys, so their tiles are skipped; inside a tile, key j > i weighs 0. Mask (MASK ≠ 0): the
// bias is read and applied exactly as the forward reads it (mask_offset, add_bias); a
// masked key (NEG) weighs exactly 0. Score and mask modifiers (`mod` above, with its
// derivative mod'): wa_score_log2, wa_keep and wa_score_grad from src/kernels/mods.rs,
// in the forward's order (identity stubs without any). A row with nothing visible has lse = LSE_EMPTY, so all
// its P are 0 and it adds nothing.
//
// VEC ≠ 0 (the host checks that d_k, d_v and every offset and stride of Q, K, V and dO, which
// dK and dV share with K and V, are multiples of 4): every buffer is bound as an array of
// vec4s, and each 4 values of a row are one vector load or store.
//
// The host prepends, from src/kernels/flash_backward_kv.rs: the constants BC (keys per
// workgroup), CT (threads per key), WG = BC·CT, BR (query rows per tile), DK4, DV4 (per-head
// widths in vec4s, rounded up), KC and VC (vec4 columns of K and V per thread, ⌈DK4 / CT⌉
// and ⌈DV4 / CT⌉: host constants, so that its `// unroll` loops over them are unrolled), MASK,
// VEC, the element types Q_T and KV_T (f32 or f16; all arithmetic is f32),
// shaders/prelude.wgsl, and the `struct Params` of the fused forward (flash_tiled.rs).
// Bindings 1-4 (Q, K, V, dO) and `load4` are in shaders/flash_backward_io.wgsl, which the
// kernel registry appends.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(5) var<storage, read> stats: array<f32>;
@group(0) @binding(6) var<storage, read_write> dk_buf: array<f32>; // if !VEC
@group(0) @binding(7) var<storage, read_write> dv_buf: array<f32>; // if !VEC
@group(0) @binding(6) var<storage, read_write> dk_buf: array<vec4<f32>>; // if VEC
@group(0) @binding(7) var<storage, read_write> dv_buf: array<vec4<f32>>; // if VEC
@group(0) @binding(8) var<storage, read> mask: array<f32>;

// Stores values 4c..4c+3 of `x` into the row at `base` of dK (`is_k`) or dV, those
// below `width`.
fn store4(is_k: bool, base: u32, c: u32, width: u32, x: vec4<f32>) { // if !VEC
    for (var e = 0u; e < 4u; e++) { // unroll
        let col = c * 4u + e;
        if col < width {
            if is_k {
                dk_buf[base + col] = x[e];
            } else {
                dv_buf[base + col] = x[e];
            }
        }
    }
}

// As the scalar `store4`, for VEC ≠ 0: `base` is a multiple of 4 and a column 4c < width
// holds all of 4c..4c+3 (width is a multiple of 4).
fn store4(is_k: bool, base: u32, c: u32, width: u32, x: vec4<f32>) { // if VEC
    if c * 4u < width {
        if is_k {
            dk_buf[base / 4u + c] = x;
        } else {
            dv_buf[base / 4u + c] = x;
        }
    }
}


// (q·k, dO·v) of row `r` of the tile over the vec4 columns t + CT·c that `k` and `v` hold.
fn partial(k: array<vec4<f32>, KC>, v: array<vec4<f32>, VC>, r: u32, t: u32) -> vec2<f32> {
    var sd = vec2<f32>(0.0);
    for (var c = 0u; c < KC; c++) { // unroll
        if t + CT * c < DK4 {
            sd.x += dot(k[c], q_tile[r * DK4 + t + CT * c]);
        }
    }
    for (var c = 0u; c < VC; c++) { // unroll
        if t + CT * c < DV4 {
            sd.y += dot(v[c], do_tile[r * DV4 + t + CT * c]);
        }
    }
    return sd;
}

var<workgroup> q_tile: array<vec4<f32>, BR * DK4>;
var<workgroup> do_tile: array<vec4<f32>, BR * DV4>;
// (lse_i, D_i) of the tile's rows.
var<workgroup> st_tile: array<vec2<f32>, BR>;
// Each thread's partial (s, dP) of its columns, per row of the tile.
var<workgroup> part: array<vec2<f32>, select(1u, WG * BR, CT > 1u)>;

// Where the thread of key `o` and column share `t` keeps its partial of a tile entry:
// per entry, share-major and keys side by side within a share, so a subgroup's reads of
// share `u` (its keys' partials) are contiguous words; the keys XOR-swizzled per share
// (where BC is a power of two: the XOR stays within the share's BC slots) so that a
// subgroup's writes (every share of a few keys) fall on distinct banks, not on the same
// ones BC · 2 words apart. (Was `o · CT + t` major: 3.4-4 ways on 32 banks.)
// Entry `e`'s slot is at `e · WG + part_slot(o, t)`.
fn part_slot(o: u32, t: u32) -> u32 {
    let sw = select(0u, (t * (32u / CT)) % BC, (BC & (BC - 1u)) == 0u);
    return t * BC + (o ^ sw);
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
    // p.groups counts (batch, K/V head) pairs here.
    let kv_heads = p.heads / p.kv_ratio;
    let g = id / p.blocks;
    let key0 = (id % p.blocks) * BC;
    let kk = li / CT;
    let t = li % CT;
    // This thread's slot of `part`, and those of its key's CT shares.
    let mine = part_slot(kk, t);
    var theirs: array<u32, CT>;
    for (var u = 0u; u < CT; u++) { // unroll
        theirs[u] = part_slot(kk, u);
    }
    let j = key0 + kk;
    let b = g / kv_heads;
    let hk = g % kv_heads;
    let rows = p.groups * p.kv_ratio * p.n_q;

    // This thread's columns of its key: vec4 column t + CT·c.
    var k: array<vec4<f32>, KC>;
    var v: array<vec4<f32>, VC>;
    var dk: array<vec4<f32>, KC>;
    var dv: array<vec4<f32>, VC>;
    let k_base = p.k_off + b * p.k_batch + hk * p.k_head + j * p.k_row;
    let v_base = p.v_off + b * p.v_batch + hk * p.v_head + j * p.v_row;
    for (var c = 0u; c < KC; c++) { // unroll
        k[c] = load4(1u, j < p.n_kv, k_base, t + CT * c, p.dk_h) * p.scale_log2;
        dk[c] = vec4<f32>(0.0);
    }
    for (var c = 0u; c < VC; c++) { // unroll
        v[c] = load4(2u, j < p.n_kv, v_base, t + CT * c, p.dv_h);
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
            for (var x = li; x < BR * DK4; x += WG) {
                let i = i0 + x / DK4;
                q_tile[x] = load4(0u, i < p.n_q, q_base + i * p.q_row, x % DK4, p.dk_h);
            }
            for (var x = li; x < BR * DV4; x += WG) {
                let i = i0 + x / DV4;
                do_tile[x] = load4(3u, i < p.n_q, o_base + i * p.o_row, x % DV4, p.dv_h);
            }
            for (var x = li; x < BR; x += WG) {
                let i = i0 + x;
                var st = vec2<f32>(LSE_EMPTY, 0.0);
                if i < p.n_q {
                    st = vec2<f32>(stats[gq * p.n_q + i], stats[rows + gq * p.n_q + i]);
                }
                st_tile[x] = st;
            }
            workgroupBarrier();

            // Partial scores and dP over this thread's columns, summed over the CT threads of
            // the key through workgroup memory (with CT = 1, computed where they are used).
            let count = min(BR, p.n_q - i0);
            if CT > 1u {
                for (var r = 0u; r < count; r++) {
                    part[r * WG + mine] = partial(k, v, r, t);
                }
                workgroupBarrier();
            }

            for (var r = 0u; r < count; r++) {
                let i = i0 + r;
                var sd = vec2<f32>(0.0);
                if CT == 1u {
                    sd = partial(k, v, r, t);
                } else {
                    for (var u = 0u; u < CT; u++) { // unroll
                        sd += part[r * WG + theirs[u]];
                    }
                }
                // As the forward: the score modifiers on the scaled score, the bias, then
                // the mask modifiers (src/kernels/mods.rs).
                var x = NEG;
                if j < p.n_kv && (p.causal == 0u || j <= i) {
                    x = wa_score_log2(sd.x, b, h, i, j);
                    if MASK != 0u {
                        x = add_bias(x, mask[mask_offset(p.mask, b, h, i, j)], LOG2E);
                    }
                    x = select(NEG, x, wa_keep(b, h, i, j));
                }
                let st = st_tile[r];
                let pr = select(exp2(x - st.x), 0.0, x == NEG);
                if !(pr == 0.0) {
                    // dS of the raw scaled score: through the score modifiers' derivative.
                    let ds = pr * (sd.y - st.y) * wa_score_grad(sd.x / LOG2E, b, h, i, j);
                    for (var c = 0u; c < VC; c++) { // unroll
                        if t + CT * c < DV4 {
                            dv[c] = fma(vec4<f32>(pr), do_tile[r * DV4 + t + CT * c], dv[c]);
                        }
                    }
                    for (var c = 0u; c < KC; c++) { // unroll
                        if t + CT * c < DK4 {
                            dk[c] = fma(vec4<f32>(ds), q_tile[r * DK4 + t + CT * c], dk[c]);
                        }
                    }
                }
            }
            workgroupBarrier();
        }
    }

    if j < p.n_kv {
        // dS is the gradient of the natural-log scores, scale·q·k: dK = scale·dSᵀ·Q.
        let scale = p.scale_log2 / LOG2E;
        for (var c = 0u; c < KC; c++) { // unroll
            store4(true, k_base, t + CT * c, p.dk_h, dk[c] * scale);
        }
        for (var c = 0u; c < VC; c++) { // unroll
            store4(false, v_base, t + CT * c, p.dv_h, dv[c]);
        }
    }
}
