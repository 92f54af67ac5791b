// Fused attention on cooperative matrices (tensor cores), FlashAttention-2's loop order:
//
//     out = softmax(scale·Q·Kᵀ + mask)·V        per (batch, head), one pass, O(n·d) memory
//
// Same problem, uniform and bindings as flash_tiled.wgsl (src/kernels/flash_tiled.rs); runs
// only where the device has `Features::EXPERIMENTAL_COOPERATIVE_MATRIX`. The host prepends
// (src/kernels/coop_matmul.rs, `coop_header`) the enables, `const S` (one cooperative
// matrix's side, 8 or 16) and the aliases CA, CB (coop_matSxS<AB_T, A / B>, AB_T f16 or f32)
// and CC (coop_matSxS<f32, C>); src/kernels/flash_coop.rs the constants D (the head width
// rounded up to 16), BQ (query rows per workgroup) and BKV (keys per tile), multiples of 16.
//
// A workgroup of 128 invocations owns BQ query rows of one (batch, head). Q is staged once
// in workgroup memory (as AB_T, zero-padded to D columns and BQ rows); then per tile of BKV
// keys: K is staged, S = Q·Kᵀ is computed on cooperative matrices (f32 accumulation) into a
// workgroup-memory copy of the scores, one invocation per row takes the row's running max
// and sum in f32 (scale in log2 units, exp2; causal and the mask applied there) and writes
// P = exp2(s − m) as AB_T, V is staged over K, the output accumulator O (f32, in workgroup
// memory) is rescaled per row and O += P·V on cooperative matrices. Tiles of keys wholly
// above the diagonal are never visited (causal: the loop stops at the block's last row).
// At the end every invocation writes its share of O / l.
//
// Subgroups share out the S×S output matrices of each product: in round r subgroup `sid`
// takes matrix r·nsg + sid. The subgroup count is read through workgroupUniformLoad so the
// rounds are workgroup-uniform (barriers, cooperative operations). A subgroup past the last
// matrix loads and multiplies the last one's inputs with the others (naga rejects
// cooperative loads and multiplies under a branch on the subgroup id, which it counts as
// non-uniform) but stores nothing: its stores sit under `mine`, the same in all of its
// lanes, which naga accepts (it checks no cooperative store's control flow). Its O += P·V
// starts from S spare rows of O, zeroed once and never written again, not from the last
// matrix, which that matrix's owner stores in the same barrier interval. So each matrix of
// S and O has one writer per interval, and no one reads it there but that writer (strides
// are constants: naga 30's SPIR-V writer fails on a computed cooperative-store stride).
//
// In bounds, by construction (D, BQ, BKV multiples of S): a load or store of an S×S matrix
// at row r0 + S ≤ rows and column c0 + S ≤ stride touches at most (rows − 1)·stride +
// stride − 1 < rows·stride elements of its array; O's spare rows follow its BQ rows.
// Every load and store starts at a multiple of 16 bytes and every stride is a multiple of 16
// bytes, as Vulkan's cooperative-matrix loads want (the padded strides DP and KP too).

const WG: u32 = 128u;
// Row strides of the AB_T tiles, padded by PAD elements (16 bytes): consecutive rows of a
// cooperative load start 4 banks apart instead of in the same bank, so the 16 rows of a
// 16 × 16 f16 matrix spread over all 32 banks (a multiple of 16 bytes, as Vulkan wants).
const DP: u32 = D + PAD; // Q and K/V
const KP: u32 = BKV + PAD; // P
const SQ: u32 = BQ / S; // matrices per column of a BQ-row block
const SK: u32 = BKV / S; // matrices per row of S = Q·Kᵀ
const SD: u32 = D / S; // matrices per row of O
const TS: u32 = SQ * SK; // matrices of S, one a work item
// O's work items: one row block by two neighbouring column blocks, which share the row
// block's loads of P; the second is the first again where a row has one block.
const PO: u32 = SQ * ((SD + 1u) / 2u);
const KV_U: u32 = 8u; // keys' (and values') elements each invocation loads at once

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q_buf: array<Q_T>;
@group(0) @binding(2) var<storage, read> k_buf: array<KV_T>;
@group(0) @binding(3) var<storage, read> v_buf: array<KV_T>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read> mask: array<f32>;
@group(0) @binding(6) var<storage, read_write> lse: array<f32>;

var<workgroup> q_tile: array<AB_T, BQ * DP>; // [BQ][DP]
var<workgroup> kv_tile: array<AB_T, BKV * DP>; // [BKV][DP]: K, then V
var<workgroup> s_tile: array<f32, BQ * BKV>; // [BQ][BKV]
var<workgroup> p_tile: array<AB_T, BQ * KP>; // [BQ][KP]
var<workgroup> o_tile: array<f32, (BQ + S) * D>; // [BQ][D] + S spare rows, all zero
var<workgroup> row_m: array<f32, BQ>;
var<workgroup> row_l: array<f32, BQ>;
var<workgroup> row_a: array<f32, BQ>;
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

// Keys (or values, `is_v`) j0 … j0 + BKV − 1 into kv_tile as AB_T. Each trip issues all
// of its KV_U loads before it stores any, so they are in flight together: one memory
// latency a trip, BKV·D / (KV_U·WG) trips (the 8 is KV_U).
fn stage_kv(is_v: bool, li: u32, j0: u32, base: u32) {
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
        o_tile[t] = 0.0;
    }
    for (var t = li; t < S * D; t += WG) {
        o_tile[BQ * D + t] = 0.0;
    }
    if li < BQ {
        row_m[li] = FLOOR;
        row_l[li] = 0.0;
    }
    let nsg = max(workgroupUniformLoad(&subgroups), 1u);

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

        // The rows' running max and sum, in f32; P as AB_T. Each invocation walks its row
        // from its own column on (c = (jj + li) mod BKV), so the 32 rows a subgroup reads at
        // once fall in 32 different banks, not all in one.
        if li < BQ {
            let row = row0 + li;
            var tile_max = NEG;
            for (var jj = 0u; jj < BKV; jj++) {
                let c = (jj + li) % BKV;
                let j = j0 + c;
                var x = s_tile[li * BKV + c] * p.scale_log2;
                if j >= kv_end || (p.causal != 0u && j > row) {
                    x = NEG;
                } else if MASK != 0u && row < p.n_q {
                    x = add_bias(x, mask[mask_offset(p.mask, b, h, row, j)], LOG2E);
                }
                s_tile[li * BKV + c] = x;
                tile_max = max(tile_max, x);
            }
            let m_old = row_m[li];
            let m_new = max(m_old, tile_max);
            var sum = 0.0;
            for (var jj = 0u; jj < BKV; jj++) {
                let c = (jj + li) % BKV;
                let pr = exp2(s_tile[li * BKV + c] - m_new);
                sum += pr;
                p_tile[li * KP + c] = AB_T(pr);
            }
            let alpha = exp2(m_old - m_new);
            row_a[li] = alpha;
            row_m[li] = m_new;
            row_l[li] = row_l[li] * alpha + sum;
        }
        workgroupBarrier();
        stage_kv(true, li, j0, v_base);
        for (var t = li; t < BQ * D; t += WG) {
            o_tile[t] *= row_a[t / D];
        }
        workgroupBarrier();

        // O += P·V.
        for (var r = 0u; r < (PO + nsg - 1u) / nsg; r++) {
            let t = r * nsg + sid;
            let tc = min(t, PO - 1u);
            let ti = tc / ((SD + 1u) / 2u);
            let tj = 2u * (tc % ((SD + 1u) / 2u));
            let tj1 = min(tj + 1u, SD - 1u);
            let mine = t < PO;
            let two = mine && tj + 1u < SD;
            var acc0 = coopLoadT<CC>(&o_tile[select(BQ * D, ti * S * D + tj * S, mine)], D);
            var acc1 = coopLoadT<CC>(&o_tile[select(BQ * D, ti * S * D + tj1 * S, two)], D);
            for (var kk = 0u; kk < BKV; kk += S) {
                let pa = coopLoadT<CA>(&p_tile[ti * S * KP + kk], KP);
                let vb0 = coopLoadT<CB>(&kv_tile[kk * DP + tj * S], DP);
                let vb1 = coopLoadT<CB>(&kv_tile[kk * DP + tj1 * S], DP);
                acc0 = coopMultiplyAdd(pa, vb0, acc0);
                acc1 = coopMultiplyAdd(pa, vb1, acc1);
            }
            if mine {
                coopStoreT(acc0, &o_tile[ti * S * D + tj * S], D);
            }
            if two {
                coopStoreT(acc1, &o_tile[ti * S * D + tj1 * S], D);
            }
        }
        workgroupBarrier();
    }

    for (var t = li; t < BQ * D; t += WG) {
        let i = t / D;
        let row = row0 + i;
        let col = t % D;
        if row < p.n_q && col < p.dv_h {
            let l = row_l[i];
            // Nothing visible (every key masked out): zeros, not 0/0.
            let inv = select(1.0 / l, 0.0, l == 0.0);
            out[p.o_off + b * p.o_batch + h * p.o_head + row * p.o_row + col] = o_tile[t] * inv;
        }
    }
    if LSE != 0u && li < BQ && row0 + li < p.n_q {
        let l = row_l[li];
        lse[g * p.n_q + row0 + li] = select(row_m[li] + log2(l), LSE_EMPTY, l == 0.0);
    }
}
