// The fused backward's dQ (FlashAttention-2's loop order), no n × n matrix in memory:
//
//     P_ij  = exp2(s_ij − lse_i),  s_ij = log2 e · (mod(scale·q_i·k_j) + bias_ij)
//     dS_ij = P_ij · (dO_i·v_j − D_i) · mod'(scale·q_i·k_j)
//     dQ_i  = scale · Σ_j dS_ij · k_j
//
// lse_i (saved by the fused forward) and D_i (flash_backward_dot.wgsl) as in
// flash_backward_kv.wgsl. dQ is a pass of its own rather than accumulated by the dK/dV
// kernel: that kernel's threads each own a key, so adding into dQ_i from all of them would
// need atomic float adds, which WGSL does not have (only atomic<i32> and atomic<u32>).
//
// A workgroup owns BR consecutive query rows of one (batch, head), CT threads per row: each
// holds the vec4 columns t + CT·c of its row's q (pre-scaled by scale·log2 e), dO and dQ
// accumulator in registers, and the row's lse and D (CT = 1 on lavapipe; more on GPUs, so
// registers stay bounded). K and V stream through workgroup memory in tiles of BC keys; per
// tile each thread writes its partial scores and dP there, and every thread sums its row's
// CT partials. Causal: tiles
// past the block's last row are skipped, keys past a row inside a tile weigh 0. Masks and
// the score/mask modifiers (`mod`, its derivative mod': wa_score_log2, wa_keep and
// wa_score_grad, from src/kernels/mods.rs; identity stubs without any) as the forward
// applies them, and its block map (wa_span, wa_block) for this kernel's blocks of rows and
// tiles of keys: tiles no row of the block sees are skipped; a row with nothing visible (lse = LSE_EMPTY) gets dQ = 0.
//
// VEC ≠ 0 (the host checks that d_k, d_v and every offset and stride of Q, K, V and dO, which
// dQ shares with Q, are multiples of 4): every buffer is bound as an array of vec4s, and each
// 4 values of a row are one vector load or store.
//
// The host prepends, from src/kernels/flash_backward_q.rs: the constants BR (rows per
// workgroup), CT (threads per row), WG = BR·CT, BC (keys per tile), DK4, DV4, KC and VC (vec4
// columns of Q and dO per thread, ⌈DK4 / CT⌉ and ⌈DV4 / CT⌉: host constants, so that its
// `// unroll` loops over them are unrolled), MASK, VEC, the element types Q_T and KV_T,
// shaders/prelude.wgsl, and the `struct Params` of the fused forward (flash_tiled.rs).
// Bindings 1-4 (Q, K, V, dO) and `load4` are in shaders/flash_backward_io.wgsl, which the
// kernel registry appends.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(5) var<storage, read> stats: array<f32>;
@group(0) @binding(6) var<storage, read_write> dq_buf: array<f32>; // if !VEC
@group(0) @binding(6) var<storage, read_write> dq_buf: array<vec4<f32>>; // if VEC
@group(0) @binding(7) var<storage, read> mask: array<f32>;

// Stores values 4c..4c+3 of `x` into the row at `base` of dQ, those below `width`.
fn store4(base: u32, c: u32, width: u32, x: vec4<f32>) { // if !VEC
    for (var e = 0u; e < 4u; e++) { // unroll
        let col = c * 4u + e;
        if col < width {
            dq_buf[base + col] = x[e];
        }
    }
}

// As the scalar `store4`, for VEC ≠ 0: `base` is a multiple of 4 and a column 4c < width
// holds all of 4c..4c+3 (width is a multiple of 4).
fn store4(base: u32, c: u32, width: u32, x: vec4<f32>) { // if VEC
    if c * 4u < width {
        dq_buf[base / 4u + c] = x;
    }
}

// (q·k, dO·v) of key `jj` of the tile over the vec4 columns t + CT·c that `q` and `d_o` hold.
fn partial(q: array<vec4<f32>, KC>, d_o: array<vec4<f32>, VC>, jj: u32, t: u32) -> vec2<f32> {
    var sd = vec2<f32>(0.0);
    for (var c = 0u; c < KC; c++) { // unroll
        if t + CT * c < DK4 {
            sd.x += dot(q[c], k_tile[jj * DK4 + t + CT * c]);
        }
    }
    for (var c = 0u; c < VC; c++) { // unroll
        if t + CT * c < DV4 {
            sd.y += dot(d_o[c], v_tile[jj * DV4 + t + CT * c]);
        }
    }
    return sd;
}

var<workgroup> k_tile: array<vec4<f32>, BC * DK4>;
var<workgroup> v_tile: array<vec4<f32>, BC * DV4>;
// Each thread's partial (s, dP) of its columns, per key of the tile.
var<workgroup> part: array<vec2<f32>, select(1u, WG * BC, CT > 1u)>;

// Where the thread of row `o` and column share `t` keeps its partial of a tile entry:
// per entry, share-major and rows side by side within a share, so a subgroup's reads of
// share `u` (its rows' partials) are contiguous words; the rows XOR-swizzled per share
// (where BR is a power of two: the XOR stays within the share's BR slots) so that a
// subgroup's writes (every share of a few rows) fall on distinct banks, not on the same
// ones BR · 2 words apart. (Was `o · CT + t` major: 3.4-4 ways on 32 banks.)
// Entry `e`'s slot is at `e · WG + part_slot(o, t)`.
fn part_slot(o: u32, t: u32) -> u32 {
    let sw = select(0u, (t * (32u / CT)) % BR, (BR & (BR - 1u)) == 0u);
    return t * BR + (o ^ sw);
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
    let row0 = (id % p.blocks) * BR;
    let rr = li / CT;
    let t = li % CT;
    // This thread's slot of `part`, and those of its row's CT shares.
    let mine = part_slot(rr, t);
    var theirs: array<u32, CT>;
    for (var u = 0u; u < CT; u++) { // unroll
        theirs[u] = part_slot(rr, u);
    }
    let i = row0 + rr;
    let b = g / p.heads;
    let h = g % p.heads;
    let hk = h / p.kv_ratio;
    let rows = p.groups * p.n_q;

    // This thread's columns of its row: vec4 column t + CT·c.
    var q: array<vec4<f32>, KC>;
    var d_o: array<vec4<f32>, VC>;
    var dq: array<vec4<f32>, KC>;
    let q_base = p.q_off + b * p.q_batch + h * p.q_head + i * p.q_row;
    let o_base = p.o_off + b * p.o_batch + h * p.o_head + i * p.o_row;
    for (var c = 0u; c < KC; c++) { // unroll
        q[c] = load4(0u, i < p.n_q, q_base, t + CT * c, p.dk_h) * p.scale_log2;
        dq[c] = vec4<f32>(0.0);
    }
    for (var c = 0u; c < VC; c++) { // unroll
        d_o[c] = load4(3u, i < p.n_q, o_base, t + CT * c, p.dv_h);
    }
    var lse = LSE_EMPTY;
    var d_i = 0.0;
    if i < p.n_q {
        lse = stats[g * p.n_q + i];
        d_i = stats[rows + g * p.n_q + i];
    }

    var kv_end = p.n_kv;
    if p.causal != 0u {
        kv_end = min(kv_end, min(row0 + BR, p.n_q));
    }
    let k_base = p.k_off + b * p.k_batch + hk * p.k_head;
    let v_base = p.v_off + b * p.v_batch + hk * p.v_head;
    // The mask modifiers' block map, as the forward reads it (src/kernels/mods.rs): only
    // the keys that hold a visible pair for this block's rows, tiles 0 = none visible
    // (skipped), 1 = all (no mask modifier to evaluate), 2 = some.
    let span = wa_span(b, h, row0);
    kv_end = min(kv_end, span.y);
    for (var j0 = span.x; j0 < kv_end; j0 += BC) {
        let tile = wa_block(b, h, row0, j0);
        if tile == 0u {
            continue;
        }
        for (var x = li; x < BC * DK4; x += WG) {
            let j = j0 + x / DK4;
            k_tile[x] = load4(1u, j < p.n_kv, k_base + j * p.k_row, x % DK4, p.dk_h);
        }
        for (var x = li; x < BC * DV4; x += WG) {
            let j = j0 + x / DV4;
            v_tile[x] = load4(2u, j < p.n_kv, v_base + j * p.v_row, x % DV4, p.dv_h);
        }
        workgroupBarrier();

        // Partial scores and dP over this thread's columns, summed over the CT threads of the
        // row through workgroup memory (with CT = 1, computed where they are used).
        let count = min(BC, kv_end - j0);
        if CT > 1u {
            for (var jj = 0u; jj < count; jj++) {
                part[jj * WG + mine] = partial(q, d_o, jj, t);
            }
            workgroupBarrier();
        }

        for (var jj = 0u; jj < count; jj++) {
            let j = j0 + jj;
            var sd = vec2<f32>(0.0);
            if CT == 1u {
                sd = partial(q, d_o, jj, t);
            } else {
                for (var u = 0u; u < CT; u++) { // unroll
                    sd += part[jj * WG + theirs[u]];
                }
            }
            // As the forward: the score modifiers on the scaled score, the bias, then the
            // mask modifiers (src/kernels/mods.rs).
            var x = NEG;
            if i < p.n_q && (p.causal == 0u || j <= i) {
                x = wa_score_log2(sd.x, b, h, i, j);
                if MASK != 0u {
                    x = add_bias(x, mask[mask_offset(p.mask, b, h, i, j)], LOG2E);
                }
                if tile == 2u {
                    x = select(NEG, x, wa_keep(b, h, i, j));
                }
            }
            let pr = select(exp2(x - lse), 0.0, x == NEG);
            if !(pr == 0.0) {
                // dS of the raw scaled score: through the score modifiers' derivative.
                let ds = pr * (sd.y - d_i) * wa_score_grad(sd.x / LOG2E, b, h, i, j);
                for (var c = 0u; c < KC; c++) { // unroll
                    if t + CT * c < DK4 {
                        dq[c] = fma(vec4<f32>(ds), k_tile[jj * DK4 + t + CT * c], dq[c]);
                    }
                }
            }
        }
        workgroupBarrier();
    }

    if i < p.n_q {
        let scale = p.scale_log2 / LOG2E;
        for (var c = 0u; c < KC; c++) { // unroll
            store4(q_base, t + CT * c, p.dk_h, dq[c] * scale);
        }
    }
}
