// Fused attention on cooperative matrices (tensor cores), FlashAttention-2's loop order:
//
//     out = softmax(scale·Q·Kᵀ + mask)·V        per (batch, head), one pass, O(n·d) memory
//
// Same problem, uniform and bindings as flash_tiled.wgsl (src/kernels/flash_tiled.rs); runs
// only where the device has `Features::EXPERIMENTAL_COOPERATIVE_MATRIX`. The host prepends
// (src/kernels/coop_matmul.rs, `coop_header`) the enables, `const S` (one cooperative
// matrix's side, 8 or 16) and the aliases CA, CB (coop_matSxS<AB_T, A / B>, AB_T f16 or f32)
// and CC (coop_matSxS<f32, C>); src/kernels/flash_coop.rs the constants D (the head width
// rounded up to 16), BQ (query rows per workgroup, S times at most the fewest subgroups a
// workgroup may have), BKV (keys per tile), and the staging's and softmax's split (KV_FAST,
// KV_E, LPR, KPL: see below).
//
// A workgroup of 128 invocations owns BQ query rows of one (batch, head); subgroup `sid`
// owns row block `sid` (S rows): it holds that block's S × D of Q (SD matrices, loaded once)
// and of O (SD f32 accumulators) in cooperative matrices for the whole key loop, so neither
// crosses workgroup memory per tile. Per tile of BKV keys: K and V are staged together in
// workgroup memory (each invocation issues all of its loads before its stores), each
// subgroup computes its row block's S = Q·Kᵀ (f32 accumulation) into a workgroup-memory copy
// of the scores, LPR invocations a row take KPL of its scores each (scale in log2 units,
// causal and the mask applied where the tile is not wholly visible), their maxes meet in
// workgroup memory, and each writes P = exp2(s − m) as AB_T for its keys and keeps its part
// of the row's sum in f32; each subgroup then adds its row block's P·V to its O. The row's
// reference max m is raised only when the tile's passes it by more than TAU (FlashAttention-
// 4's lazy rescale); a tile that raises any row's (the first excepted: O is still zero) sets
// a workgroup flag, and only then do the subgroups store O block by block, the rows'
// invocations scale it and the subgroups load it back. Tiles of keys wholly above the
// diagonal are never visited (causal: the loop stops at the block's last row). At the end the
// rows' sums are gathered and O / l goes out block by block through workgroup memory.
//
// The host makes BQ / S at most the fewest subgroups a workgroup may have (128 over the
// widest subgroup the adapter may run it in), so every row block has an owner; a subgroup
// past the last row block (subgroups narrower than the widest) loads and multiplies the
// last block's inputs with its owner (naga rejects cooperative loads and multiplies under a
// branch on the subgroup id, which it counts as non-uniform) but stores nothing: its stores
// sit under `own`, the same in all of its lanes, which naga accepts (it checks no
// cooperative store's control flow). So each matrix in workgroup memory has one writer per
// barrier interval, and no one reads it there but its writer (strides are constants: naga
// 30's SPIR-V writer fails on a computed cooperative-store stride).
//
// In bounds, by construction (D, BQ, BKV multiples of S): a load or store of an S×S matrix
// at row r0 + S ≤ rows and column c0 + S ≤ stride touches at most (rows − 1)·stride +
// stride − 1 < rows·stride elements of its region. Every load and store starts at a
// multiple of 16 bytes and every stride is a multiple of 16 bytes, as Vulkan's
// cooperative-matrix loads want (the padded strides DP, KP, SP and OS too).

const WG: u32 = 128u;
// Row strides of the AB_T tiles, padded by PAD elements (16 bytes): consecutive rows of a
// cooperative load start 4 banks apart instead of in the same bank, so the 16 rows of a
// 16 × 16 f16 matrix spread over all 32 banks (a multiple of 16 bytes, as Vulkan wants).
const DP: u32 = D + PAD; // Q, K and V
const KP: u32 = BKV + PAD; // P
// Row strides of the scores and of a block of O stored for the rescale or the epilogue, f32,
// padded by 16 bytes: the 16 rows of a 16 × 16 f32 matrix start 4 banks apart.
const SP: u32 = BKV + 4u;
const OS: u32 = S + 4u;
const SQ: u32 = BQ / S; // row blocks, one a subgroup
const SD: u32 = D / S; // matrices across the head width: each subgroup's Q and O
// The AB_T array's regions: Q (staged once, [BQ][DP]) over all of them; then per tile K
// ([BKV][DP]), V ([BKV][DP]) and P ([BQ][KP]).
const V0: u32 = BKV * DP;
const P0: u32 = 2u * BKV * DP;
const AB_LEN: u32 = max(BQ * DP, P0 + BQ * KP);
const KV_U: u32 = 8u; // keys' (and values') elements each invocation loads at once (general path)
// The fast staging path (KV_FAST = 1 where D divides WG): invocation li owns column li % D
// of rows li / D + e·KR of each tile, e < KV_E = BKV / KR.
const KR: u32 = WG / D;
// The softmax: LPR invocations a row (li = i·LPR + q), each KPL keys of it; the rows'
// running max is raised only when a tile's max passes it by more than TAU (log2 units), so
// that O is rescaled rarely: P = exp2(s − m) stays ≤ 2^TAU (256, exact enough in f16).
const ROWS_L: u32 = BQ * LPR;
const TAU: f32 = 8.0;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q_buf: array<Q_T>;
@group(0) @binding(2) var<storage, read> k_buf: array<KV_T>;
@group(0) @binding(3) var<storage, read> v_buf: array<KV_T>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read> mask: array<f32>;
@group(0) @binding(6) var<storage, read_write> lse: array<f32>;

var<workgroup> ab: array<AB_T, AB_LEN>;
// [BQ][SP]: the scores; then each softmax invocation's max of its keys, at its first key's
// column; while O is rescaled or written out, row block r's S × S block of O at r·S·OS
// ([S][OS]); after the key loop, the parts of the rows' sums.
var<workgroup> s_tile: array<f32, BQ * SP>;
// Each row's sum l, then its max m.
var<workgroup> stats: array<f32, 2u * BQ>;
// 1 when this tile raised some row's max (reset on the next).
var<workgroup> rescale: atomic<u32>;

// Element t of the [BKV][D] tile of keys (or values, `is_v`) from key j0, as f32: zero
// past the tile, the keys and the head width.
fn kv_at(is_v: bool, t: u32, j0: u32, base: u32) -> f32 {
    let j = j0 + t / D;
    let col = t % D;
    var x = 0.0;
    if t < BKV * D && j < p.n_kv && col < select(p.dk_h, p.dv_h, is_v) {
        if is_v {
            x = f32(v_buf[base + j * p.v_row + col]);
        } else {
            x = f32(k_buf[base + j * p.k_row + col]);
        }
    }
    return x;
}

// Keys (or values, `is_v`) j0 … j0 + BKV − 1 into `ab` from `at0`, as AB_T: the general
// loop, each trip issuing KV_U loads before its stores.
fn stage_general(is_v: bool, li: u32, j0: u32, base: u32, at0: u32) {
    for (var t = li; t < BKV * D; t += KV_U * WG) {
        let x0 = kv_at(is_v, t, j0, base);
        let x1 = kv_at(is_v, t + WG, j0, base);
        let x2 = kv_at(is_v, t + 2u * WG, j0, base);
        let x3 = kv_at(is_v, t + 3u * WG, j0, base);
        let x4 = kv_at(is_v, t + 4u * WG, j0, base);
        let x5 = kv_at(is_v, t + 5u * WG, j0, base);
        let x6 = kv_at(is_v, t + 6u * WG, j0, base);
        let x7 = kv_at(is_v, t + 7u * WG, j0, base);
        put_kv(at0, t, x0);
        put_kv(at0, t + WG, x1);
        put_kv(at0, t + 2u * WG, x2);
        put_kv(at0, t + 3u * WG, x3);
        put_kv(at0, t + 4u * WG, x4);
        put_kv(at0, t + 5u * WG, x5);
        put_kv(at0, t + 6u * WG, x6);
        put_kv(at0, t + 7u * WG, x7);
    }
}

fn put_kv(at0: u32, t: u32, x: f32) {
    if t < BKV * D {
        ab[at0 + t + t / D * PAD] = AB_T(x);
    }
}

// Keys and values j0 … j0 + BKV − 1 into their regions of `ab` as AB_T. Where D divides WG
// and the tile is whole, each invocation issues all of its 2·KV_E loads (K's, then V's)
// before it stores any (one memory latency a tile), its column and row steps fixed; else
// the general loop, K's then V's.
fn stage_kv(li: u32, j0: u32, k_base: u32, v_base: u32) {
    if KV_FAST != 0u && j0 + BKV <= p.n_kv {
        let col = li % D;
        let r = li / D;
        var gk = k_base + (j0 + r) * p.k_row + col;
        var gv = v_base + (j0 + r) * p.v_row + col;
        let sk = KR * p.k_row;
        let sv = KR * p.v_row;
        var xk: array<AB_T, KV_E>;
        var xv: array<AB_T, KV_E>;
        if col < p.dk_h {
            for (var e = 0u; e < KV_E; e++) { // unroll
                xk[e] = AB_T(k_buf[gk]);
                gk += sk;
            }
        }
        if col < p.dv_h {
            for (var e = 0u; e < KV_E; e++) { // unroll
                xv[e] = AB_T(v_buf[gv]);
                gv += sv;
            }
        }
        let at = r * DP + col;
        for (var e = 0u; e < KV_E; e++) { // unroll
            ab[at + e * (KR * DP)] = xk[e];
            ab[V0 + at + e * (KR * DP)] = xv[e];
        }
        return;
    }
    stage_general(false, li, j0, k_base, 0u);
    stage_general(true, li, j0, v_base, V0);
}

@compute @workgroup_size(128, 1, 1)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_id) sid: u32,
) {
    let id = wg.x + wg.y * nwg.x;
    if id >= p.groups * p.blocks {
        return;
    }
    let g = id / p.blocks;
    // Causal: last rows (the heaviest blocks) first, the lightest ending the dispatch.
    let blk = select(id % p.blocks, p.blocks - 1u - id % p.blocks, p.causal != 0u);
    let row0 = blk * BQ;
    let b = g / p.heads;
    let h = g % p.heads;
    let hk = h / p.kv_ratio;
    let q_base = p.q_off + b * p.q_batch + h * p.q_head;
    let k_base = p.k_off + b * p.k_batch + hk * p.k_head;
    let v_base = p.v_off + b * p.v_batch + hk * p.v_head;

    for (var t = li; t < BQ * D; t += WG) {
        let row = row0 + t / D;
        let col = t % D;
        var x = 0.0;
        if row < p.n_q && col < p.dk_h {
            x = f32(q_buf[q_base + row * p.q_row + col]);
        }
        ab[t / D * DP + col] = AB_T(x);
    }
    workgroupBarrier();

    // This subgroup's row block (the last one's, past it: loaded and multiplied, never
    // stored), its Q and its O.
    let own = sid < SQ;
    let ti = min(sid, SQ - 1u);
    var qm: array<CA, SD>;
    var om: array<CC, SD>;
    for (var c = 0u; c < D / S; c++) { // unroll
        qm[c] = coopLoadT<CA>(&ab[ti * S * DP + c * S], DP);
    }
    // Q read before K overwrites it.
    workgroupBarrier();

    // This invocation's share of the softmax: row i (of the block), keys q·KPL + k, walked
    // from k = i mod KPL on so that the rows a subgroup reads at once spread over the banks;
    // the row's reference max m (the same in its LPR invocations) and its own part of the
    // row's sum, l. Its max (and at the end its sum) goes to s_tile at `mine`, its first
    // key's column: the LPR parts of a row are i mod KPL past a multiple of KPL, so the rows
    // a subgroup reads at once fall in different banks.
    let i = li / LPR;
    let q = li % LPR;
    let row = row0 + i;
    let srow = i * SP + q * KPL;
    let prow = P0 + i * KP + q * KPL;
    let mine = srow + i % KPL;
    let parts = i * SP + i % KPL;
    var m = FLOOR;
    var l = 0.0;
    var alpha = 1.0;

    // A `let`, so the key loop stays workgroup-uniform in naga's analysis (locals are not).
    let kv_end = select(p.n_kv, min(p.n_kv, min(row0 + BQ, p.n_q)), p.causal != 0u);
    for (var j0 = 0u; j0 < kv_end; j0 += BKV) {
        stage_kv(li, j0, k_base, v_base);
        workgroupBarrier();

        // S = Q·Kᵀ for this row block: K read column-major is Kᵀ.
        for (var tj = 0u; tj < BKV / S; tj++) { // unroll
            var acc = CC();
            for (var c = 0u; c < D / S; c++) { // unroll
                let kb = coopLoad<CB>(&ab[tj * S * DP + c * S], DP);
                acc = coopMultiplyAdd(qm[c], kb, acc);
            }
            if own {
                coopStoreT(acc, &s_tile[ti * S * SP + tj * S], SP);
            }
        }
        workgroupBarrier();

        // The scores in log2 units (the mask, causal and the keys' end applied where the
        // tile is not wholly visible), and each invocation's max of its keys.
        let whole = j0 + BKV <= kv_end && (p.causal == 0u || j0 + BKV <= row0 + 1u) && MASK == 0u;
        var xs: array<f32, KPL>;
        if li < ROWS_L {
            var mx = NEG;
            for (var k = 0u; k < KPL; k++) { // unroll
                let c = (k + i) % KPL;
                var x = s_tile[srow + c] * p.scale_log2;
                if !whole {
                    let j = j0 + q * KPL + c;
                    if j >= kv_end || (p.causal != 0u && j > row) {
                        x = NEG;
                    } else if MASK != 0u && row < p.n_q {
                        x = add_bias(x, mask[mask_offset(p.mask, b, h, row, j)], LOG2E);
                    }
                }
                xs[k] = x;
                mx = max(mx, x);
            }
            // Over one of its own scores, which no other invocation reads.
            s_tile[mine] = mx;
        }
        // Last read (below) two barriers ago; next written after the barrier below.
        if li == 0u {
            atomicStore(&rescale, 0u);
        }
        workgroupBarrier();

        // P = exp2(s − m) as AB_T, the row's max raised (and the workgroup told that O needs
        // rescaling) only when the tile's passes it by more than TAU.
        if li < ROWS_L {
            var tile_max = NEG;
            for (var e = 0u; e < LPR; e++) { // unroll
                tile_max = max(tile_max, s_tile[parts + e * KPL]);
            }
            alpha = 1.0;
            if tile_max > m + TAU {
                alpha = exp2(m - tile_max);
                m = tile_max;
                if j0 != 0u {
                    atomicStore(&rescale, 1u);
                }
            }
            var sum = 0.0;
            for (var k = 0u; k < KPL; k++) { // unroll
                let pr = exp2(xs[k] - m);
                sum += pr;
                ab[prow + (k + i) % KPL] = AB_T(pr);
            }
            l = l * alpha + sum;
        }
        // Workgroup-uniform, and P written before it is read.
        if workgroupUniformLoad(&rescale) != 0u {
            // Each subgroup stores a block of its O, the rows' invocations scale it, the
            // subgroup loads it back; one block of each row block at a time.
            for (var c = 0u; c < SD; c++) {
                if own {
                    coopStoreT(om[c], &s_tile[ti * S * OS], OS);
                }
                workgroupBarrier();
                if li < ROWS_L && alpha != 1.0 {
                    for (var k = q; k < S; k += LPR) {
                        s_tile[i * OS + k] *= alpha;
                    }
                }
                workgroupBarrier();
                om[c] = coopLoadT<CC>(&s_tile[ti * S * OS], OS);
                workgroupBarrier();
            }
        }

        // O += P·V for this row block.
        for (var kk = 0u; kk < BKV / S; kk++) { // unroll
            let pa = coopLoadT<CA>(&ab[P0 + ti * S * KP + kk * S], KP);
            for (var c = 0u; c < D / S; c++) { // unroll
                let vb = coopLoadT<CB>(&ab[V0 + kk * S * DP + c * S], DP);
                om[c] = coopMultiplyAdd(pa, vb, om[c]);
            }
        }
        // K and V read before the next tile's overwrite them (P and the scores too).
        workgroupBarrier();
    }

    // Each row's sum from its invocations' parts (at `mine`) and its max, in `stats`.
    if li < ROWS_L {
        s_tile[mine] = l;
        if q == 0u {
            stats[BQ + i] = m;
        }
    }
    workgroupBarrier();
    if li < BQ {
        var sum = 0.0;
        for (var e = 0u; e < LPR; e++) { // unroll
            sum += s_tile[li * SP + li % KPL + e * KPL];
        }
        stats[li] = sum;
    }
    workgroupBarrier();

    // O / l, one block of each row block at a time through s_tile: invocation t takes
    // elements t + k·WG of the BQ × S column block (neighbouring invocations, neighbouring
    // columns of out).
    for (var c = 0u; c < SD; c++) {
        if own {
            coopStoreT(om[c], &s_tile[ti * S * OS], OS);
        }
        workgroupBarrier();
        for (var t = li; t < BQ * S; t += WG) {
            let r = t / S;
            let orow = row0 + r;
            let col = c * S + t % S;
            if orow < p.n_q && col < p.dv_h {
                let ol = stats[r];
                // Nothing visible (every key masked out): zeros, not 0/0.
                let inv = select(1.0 / ol, 0.0, ol == 0.0);
                out[p.o_off + b * p.o_batch + h * p.o_head + orow * p.o_row + col] =
                    s_tile[r * OS + t % S] * inv;
            }
        }
        workgroupBarrier();
    }
    if LSE != 0u && li < BQ && row0 + li < p.n_q {
        let ol = stats[li];
        lse[g * p.n_q + row0 + li] = select(stats[BQ + li] + log2(ol), LSE_EMPTY, ol == 0.0);
    }
}
