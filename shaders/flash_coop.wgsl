// Fused attention on cooperative matrices (tensor cores), FlashAttention-2's loop order:
//
//     out = softmax(scale·Q·Kᵀ + mask)·V        per (batch, head), one pass, O(n·d) memory
//
// Same problem, uniform and bindings as flash_tiled.wgsl (src/kernels/flash_tiled.rs); runs
// only where the device has `Features::EXPERIMENTAL_COOPERATIVE_MATRIX`. The host prepends
// (src/kernels/coop_matmul.rs, `coop_header`) the enables, `const S` (one cooperative
// matrix's side, 8 or 16) and the aliases CA, CB (coop_matSxS<AB_T, A / B>, AB_T f16 or f32)
// and CC (coop_matSxS<f32, C>); src/kernels/flash_coop.rs the constants D (the head width
// rounded up to 16), BQ (query rows per workgroup) and BKV (keys per tile), multiples of 16,
// and the staging's and softmax's split (KV_FAST, KV_E, LPR, KPL: see below).
//
// A workgroup of 128 invocations owns BQ query rows of one (batch, head). Q is staged once
// in workgroup memory (as AB_T, zero-padded to D columns and BQ rows); then per tile of BKV
// keys: K is staged (each invocation issues all of its loads before its stores), S = Q·Kᵀ
// is computed on cooperative matrices (f32 accumulation) into a workgroup-memory copy of
// the scores, LPR invocations a row take KPL of its scores each (scale in log2 units, causal
// and the mask applied where the tile is not wholly visible), their maxes meet in workgroup
// memory, and each writes P = exp2(s − m) as AB_T for its keys and keeps its part of the
// row's sum in f32. The row's reference max m is raised only when the tile's passes it by
// more than TAU (FlashAttention-4's lazy rescale): only then is O (f32, in workgroup memory)
// rescaled, each invocation its share of the row. V is staged over K, and O += P·V on
// cooperative matrices. Tiles of keys wholly above the diagonal are never visited (causal:
// the loop stops at the block's last row). At the end the rows' sums are gathered and every
// invocation writes its share of O / l.
//
// Subgroups share out the S×S output matrices of each product: in round r subgroup `sid`
// takes matrix r·nsg + sid. The subgroup count is read through workgroupUniformLoad so the
// rounds are workgroup-uniform (barriers, cooperative operations). A subgroup past the last
// matrix loads and multiplies the last one's inputs with the others (naga rejects
// cooperative loads and multiplies under a branch on the subgroup id, which it counts as
// non-uniform) but stores nothing: its stores sit under `own`, the same in all of its
// lanes, which naga accepts (it checks no cooperative store's control flow). Its O += P·V
// starts from S spare rows of O, zeroed once and never written again, not from the last
// matrix, which that matrix's owner stores in the same barrier interval. So each matrix of
// S and O has one writer per interval, and no one reads it there but that writer (strides
// are constants: naga 30's SPIR-V writer fails on a computed cooperative-store stride).
//
// In bounds, by construction (D, BQ, BKV multiples of S): a load or store of an S×S matrix
// at row r0 + S ≤ rows and column c0 + S ≤ stride touches at most (rows − 1)·stride +
// stride − 1 < rows·stride elements of its array; O's spare rows follow its BQ rows, the
// array ending at the last element the spare load reads ((S − 1)·OP + S − 1 past them).
// Every load and store starts at a multiple of 16 bytes and every stride is a multiple of 16
// bytes, as Vulkan's cooperative-matrix loads want (the padded strides DP, KP and OP too).

const WG: u32 = 128u;
// Row strides of the AB_T tiles, padded by PAD elements (16 bytes): consecutive rows of a
// cooperative load start 4 banks apart instead of in the same bank, so the 16 rows of a
// 16 × 16 f16 matrix spread over all 32 banks (a multiple of 16 bytes, as Vulkan wants).
const DP: u32 = D + PAD; // Q and K/V
const KP: u32 = BKV + PAD; // P
// O's row stride, padded by 16 bytes: the 16 rows of a 16 × 16 f32 matrix start 4 banks
// apart (unpadded, every row starts in the same bank: twice the wavefronts).
const OP: u32 = D + 4u;
const SQ: u32 = BQ / S; // matrices per column of a BQ-row block
const SK: u32 = BKV / S; // matrices per row of S = Q·Kᵀ
const SD: u32 = D / S; // matrices per row of O
const TS: u32 = SQ * SK; // matrices of S, one a work item
// O's work items: one row block by two neighbouring column blocks, which share the row
// block's loads of P; the second is the first again where a row has one block.
const PO: u32 = SQ * ((SD + 1u) / 2u);
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

var<workgroup> q_tile: array<AB_T, BQ * DP>; // [BQ][DP]
var<workgroup> kv_tile: array<AB_T, BKV * DP>; // [BKV][DP]: K, then V
// [BQ][BKV]: the scores; then each softmax invocation's max of its keys, at its first
// key's column; after the key loop, its sum there, then rows' l and m.
var<workgroup> s_tile: array<f32, BQ * BKV>;
var<workgroup> p_tile: array<AB_T, BQ * KP>; // [BQ][KP]
// [BQ][OP], then S spare rows of which a cooperative load reads the first S columns: all
// zero (the array ends there).
var<workgroup> o_tile: array<f32, (BQ + S - 1u) * OP + S>;
var<workgroup> subgroups: u32;

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

// Keys (or values, `is_v`) j0 … j0 + BKV − 1 into kv_tile as AB_T. Where D divides WG and
// the tile is whole, each invocation issues all of its KV_E loads before it stores any (one
// memory latency a tile), its column and row steps fixed; else each trip of the general
// loop issues KV_U loads before its stores.
fn stage_kv(is_v: bool, li: u32, j0: u32, base: u32) {
    if KV_FAST != 0u && j0 + BKV <= p.n_kv {
        let col = li % D;
        let r = li / D;
        let stride = select(p.k_row, p.v_row, is_v);
        let step = KR * stride;
        var g = base + (j0 + r) * stride + col;
        var xs: array<AB_T, KV_E>;
        if col < select(p.dk_h, p.dv_h, is_v) {
            if is_v {
                for (var e = 0u; e < KV_E; e++) { // unroll
                    xs[e] = AB_T(v_buf[g]);
                    g += step;
                }
            } else {
                for (var e = 0u; e < KV_E; e++) { // unroll
                    xs[e] = AB_T(k_buf[g]);
                    g += step;
                }
            }
        }
        let at = r * DP + col;
        for (var e = 0u; e < KV_E; e++) { // unroll
            kv_tile[at + e * (KR * DP)] = xs[e];
        }
        return;
    }
    for (var t = li; t < BKV * D; t += KV_U * WG) {
        let x0 = kv_at(is_v, t, j0, base);
        let x1 = kv_at(is_v, t + WG, j0, base);
        let x2 = kv_at(is_v, t + 2u * WG, j0, base);
        let x3 = kv_at(is_v, t + 3u * WG, j0, base);
        let x4 = kv_at(is_v, t + 4u * WG, j0, base);
        let x5 = kv_at(is_v, t + 5u * WG, j0, base);
        let x6 = kv_at(is_v, t + 6u * WG, j0, base);
        let x7 = kv_at(is_v, t + 7u * WG, j0, base);
        put_kv(t, x0);
        put_kv(t + WG, x1);
        put_kv(t + 2u * WG, x2);
        put_kv(t + 3u * WG, x3);
        put_kv(t + 4u * WG, x4);
        put_kv(t + 5u * WG, x5);
        put_kv(t + 6u * WG, x6);
        put_kv(t + 7u * WG, x7);
    }
}

fn put_kv(t: u32, x: f32) {
    if t < BKV * D {
        kv_tile[t + t / D * PAD] = AB_T(x);
    }
}

@compute @workgroup_size(128, 1, 1)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_id) sid: u32,
    @builtin(num_subgroups) nsg_lane: u32,
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

    if li == 0u {
        subgroups = nsg_lane;
    }
    for (var t = li; t < BQ * D; t += WG) {
        let row = row0 + t / D;
        let col = t % D;
        var x = 0.0;
        if row < p.n_q && col < p.dk_h {
            x = f32(q_buf[q_base + row * p.q_row + col]);
        }
        q_tile[t / D * DP + col] = AB_T(x);
    }
    for (var t = li; t < (BQ + S - 1u) * OP + S; t += WG) {
        o_tile[t] = 0.0;
    }
    let nsg = max(workgroupUniformLoad(&subgroups), 1u);

    // This invocation's share of the softmax: row i (of the block), keys q·KPL + k, walked
    // from k = i mod KPL on so that the rows a subgroup reads at once spread over the banks;
    // the row's reference max m (the same in its LPR invocations) and its own part of the
    // row's sum, l. Its max (and at the end its sum) goes to s_tile at `mine`, its first
    // key's column: the LPR parts of a row are i mod KPL past a multiple of KPL, so the rows
    // a subgroup reads at once fall in different banks.
    let i = li / LPR;
    let q = li % LPR;
    let row = row0 + i;
    let srow = i * BKV + q * KPL;
    let prow = i * KP + q * KPL;
    let mine = srow + i % KPL;
    let parts = i * BKV + i % KPL;
    var m = FLOOR;
    var l = 0.0;

    // A `let`, so the key loop stays workgroup-uniform in naga's analysis (locals are not).
    let kv_end = select(p.n_kv, min(p.n_kv, min(row0 + BQ, p.n_q)), p.causal != 0u);
    for (var j0 = 0u; j0 < kv_end; j0 += BKV) {
        stage_kv(false, li, j0, k_base);
        workgroupBarrier();

        // S = Q·Kᵀ: K read column-major is Kᵀ.
        for (var r = 0u; r < (TS + nsg - 1u) / nsg; r++) {
            let t = r * nsg + sid;
            let tc = min(t, TS - 1u);
            let ti = tc / SK;
            let tj = tc % SK;
            var acc = CC();
            for (var kk = 0u; kk < D; kk += S) {
                let qa = coopLoadT<CA>(&q_tile[ti * S * DP + kk], DP);
                let kb = coopLoad<CB>(&kv_tile[tj * S * DP + kk], DP);
                acc = coopMultiplyAdd(qa, kb, acc);
            }
            if t < TS {
                coopStoreT(acc, &s_tile[ti * S * BKV + tj * S], BKV);
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
        workgroupBarrier();

        // P = exp2(s − m) as AB_T, the row's max raised (and this invocation's share of O
        // rescaled) only when the tile's passes it by more than TAU.
        if li < ROWS_L {
            var tile_max = NEG;
            for (var e = 0u; e < LPR; e++) { // unroll
                tile_max = max(tile_max, s_tile[parts + e * KPL]);
            }
            var alpha = 1.0;
            if tile_max > m + TAU {
                alpha = exp2(m - tile_max);
                m = tile_max;
            }
            var sum = 0.0;
            for (var k = 0u; k < KPL; k++) { // unroll
                let pr = exp2(xs[k] - m);
                sum += pr;
                p_tile[prow + (k + i) % KPL] = AB_T(pr);
            }
            l = l * alpha + sum;
            if alpha != 1.0 {
                // Columns q + LPR·c', c' walked from i on: the rows a subgroup rescales at
                // once fall in different banks.
                for (var k = 0u; k < D / LPR; k++) {
                    o_tile[i * OP + q + LPR * ((k + i) % (D / LPR))] *= alpha;
                }
            }
        }
        stage_kv(true, li, j0, v_base);
        workgroupBarrier();

        // O += P·V.
        for (var r = 0u; r < (PO + nsg - 1u) / nsg; r++) {
            let t = r * nsg + sid;
            let tc = min(t, PO - 1u);
            let ti = tc / ((SD + 1u) / 2u);
            let tj = 2u * (tc % ((SD + 1u) / 2u));
            let tj1 = min(tj + 1u, SD - 1u);
            let own = t < PO;
            let two = own && tj + 1u < SD;
            var acc0 = coopLoadT<CC>(&o_tile[select(BQ * OP, ti * S * OP + tj * S, own)], OP);
            var acc1 = coopLoadT<CC>(&o_tile[select(BQ * OP, ti * S * OP + tj1 * S, two)], OP);
            for (var kk = 0u; kk < BKV; kk += S) {
                let pa = coopLoadT<CA>(&p_tile[ti * S * KP + kk], KP);
                let vb0 = coopLoadT<CB>(&kv_tile[kk * DP + tj * S], DP);
                let vb1 = coopLoadT<CB>(&kv_tile[kk * DP + tj1 * S], DP);
                acc0 = coopMultiplyAdd(pa, vb0, acc0);
                acc1 = coopMultiplyAdd(pa, vb1, acc1);
            }
            if own {
                coopStoreT(acc0, &o_tile[ti * S * OP + tj * S], OP);
            }
            if two {
                coopStoreT(acc1, &o_tile[ti * S * OP + tj1 * S], OP);
            }
        }
        workgroupBarrier();
    }

    // Each row's sum from its invocations' parts (at `mine`), then l and m of row i in
    // O's columns D and D + 1, the row's padding (BQ rows of O: every row has its own).
    if li < ROWS_L {
        s_tile[mine] = l;
        if q == 0u {
            o_tile[i * OP + D + 1u] = m;
        }
    }
    workgroupBarrier();
    if li < BQ {
        var sum = 0.0;
        for (var e = 0u; e < LPR; e++) { // unroll
            sum += s_tile[li * BKV + li % KPL + e * KPL];
        }
        o_tile[li * OP + D] = sum;
    }
    workgroupBarrier();

    for (var t = li; t < BQ * D; t += WG) {
        let ot = t / D;
        let orow = row0 + ot;
        let col = t % D;
        if orow < p.n_q && col < p.dv_h {
            let ol = o_tile[ot * OP + D];
            // Nothing visible (every key masked out): zeros, not 0/0.
            let inv = select(1.0 / ol, 0.0, ol == 0.0);
            out[p.o_off + b * p.o_batch + h * p.o_head + orow * p.o_row + col] =
                o_tile[ot * OP + col] * inv;
        }
    }
    if LSE != 0u && li < BQ && row0 + li < p.n_q {
        let ol = o_tile[li * OP + D];
        lse[g * p.n_q + row0 + li] = select(o_tile[li * OP + D + 1u] + log2(ol), LSE_EMPTY, ol == 0.0);
    }
}
