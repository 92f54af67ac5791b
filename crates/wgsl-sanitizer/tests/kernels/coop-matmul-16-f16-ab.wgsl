enable wgpu_cooperative_matrix;
enable f16;
alias A_T = f16;
alias B_T = f16;
alias C_T = f32;
alias AB_T = f16;
const S: u32 = 16u;
// Shared by every kernel: the host prepends this file (after the constants and element-type
// aliases, before the generated `struct Params`), so each helper is written once.

// A score masked out, and where a running max starts: exp(NEG − m) and exp2(NEG − m) are
// exactly 0 for every m ≥ FLOOR, and never NaN (unlike −∞ − −∞).
const NEG: f32 = -3.0e38;
const FLOOR: f32 = -1.0e38;
// The log-sum-exp a fused forward saves for a row with nothing to attend to: exp2(s − LSE_EMPTY)
// is exactly 0 for every score s, so such a row gets zero probabilities in the backward pass.
const LSE_EMPTY: f32 = 3.0e38;
// Scores in the log2 domain (exp2 instead of exp) are the natural-log ones times LOG2E.
const LOG2E: f32 = 1.4426950408889634;

// Index of a mask's element for (batch b, head h, query i, key j), through its element
// strides `s` over those four axes (0 along broadcast axes, so a broadcast mask is never
// expanded in memory).
fn mask_offset(s: vec4<u32>, b: u32, h: u32, i: u32, j: u32) -> u32 {
    return b * s.x + h * s.y + i * s.z + j * s.w;
}

// Score `x` with a mask's `bias` added in units of `unit` (1.0 for natural-log scores, LOG2E
// in the log2 domain); NEG where the bias marks the key masked out (the host stores f32::MIN
// there, and clamps finite biases to -1e37).
fn add_bias(x: f32, bias: f32, unit: f32) -> f32 {
    return select(x + bias * unit, NEG, bias < FLOOR);
}
struct Params {
    m: u32,
    n: u32,
    k: u32,
    heads: u32,
    groups: u32,
    tiles_m: u32,
    tiles_n: u32,
    flags: u32,
    a_off: u32,
    a_batch: u32,
    a_head: u32,
    a_row: u32,
    a_col: u32,
    b_off: u32,
    b_batch: u32,
    b_head: u32,
    b_row: u32,
    b_col: u32,
    c_off: u32,
    c_batch: u32,
    c_head: u32,
    c_row: u32,
    b_ratio: u32,
    _pad: u32,
}
// Batched, strided matrix product with optional bias on cooperative matrices (tensor cores):
//
//     C[g] = A[g] · B[g] (+ bias)        for every group g = batch_index · heads + head
//
// The same problem, uniform block and bindings as matmul.wgsl (src/kernels/matmul.rs), so
// either kernel computes any `Matmul`; this one only where the device has
// `Features::EXPERIMENTAL_COOPERATIVE_MATRIX` (WGSL `enable wgpu_cooperative_matrix;`).
//
// The host prepends (src/kernels/coop_matmul.rs, `coop_header`): the enables, `const S` (the
// side of one cooperative matrix: 8 or 16, as the adapter reports), and the aliases
//     CA = coop_matSxS<AB_T, A>, CB = coop_matSxS<AB_T, B>, CC = coop_matSxS<f32, C>
// where AB_T is f16 (f16 inputs, f32 accumulation) or f32 (adapters whose only shape is
// 8×8 f32). A_T, B_T, C_T are the storage element types, as in matmul.wgsl.
//
// Tiling: a workgroup of 128 invocations computes a 64×64 tile of C. The tile is cut into
// BLOCKS squares of 2×2 cooperative matrices (32×32 at S = 16); subgroup `sid` owns block
// `r·nsg + sid` in round r, holding its four accumulators for the whole inner loop. A and B
// are staged through workgroup memory BK = 16 values of the inner dimension at a time,
// converted to AB_T, zero outside the matrices (so sizes need not be multiples of anything
// and no cooperative load ever reads past the staged tiles). The accumulators leave through
// workgroup memory, one of the four at a time, and every invocation writes the in-range
// elements (bias and accumulation added in f32).
//
// Uniformity: cooperative operations run in subgroup-uniform control flow and barriers in
// workgroup-uniform control flow, so the number of subgroups is read through
// `workgroupUniformLoad`. A subgroup without a block this round (more subgroups than
// blocks) loads and multiplies block BLOCKS − 1's inputs with the others (naga rejects
// cooperative loads and multiplies under a branch on the subgroup id, which it counts as
// non-uniform) but stores nothing: its store sits under `q < BLOCKS`, the same in all of
// its lanes, which naga accepts (it checks no cooperative store's control flow). Each slot
// of `c_tile` has one writer per barrier interval, so no two subgroups ever race on one.
//
// In bounds, by construction: a block's rows br + 2S ≤ 64 = TILE and kk + S ≤ BK, so A
// loads touch at most (TILE − 1)·BK + BK − 1 < TILE·BK; B loads at most
// (BK − 1)·TILE + TILE − 1 < BK·TILE; stores q·S·S + S·S ≤ BLOCKS·S·S (q < BLOCKS). Every
// load and store starts at a multiple of S elements, with strides of at least 16 bytes.

// flags (as matmul.wgsl)
const HAS_BIAS: u32 = 1u;
const SKIP_UPPER: u32 = 2u;
const ACCUMULATE: u32 = 4u;

const TILE: u32 = 64u;
const BK: u32 = 16u;
const WG: u32 = 128u;
// A subgroup's square of 2×2 cooperative matrices, and how many tile a workgroup's tile.
const BLOCK: u32 = 2u * S;
const BLOCKS_SIDE: u32 = TILE / BLOCK;
const BLOCKS: u32 = BLOCKS_SIDE * BLOCKS_SIDE;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<A_T>;
@group(0) @binding(2) var<storage, read> b: array<B_T>;
@group(0) @binding(3) var<storage, read> bias: array<B_T>;
@group(0) @binding(4) var<storage, read_write> c: array<C_T>;

var<workgroup> a_tile: array<AB_T, TILE * BK>; // [TILE rows][BK], row-major
var<workgroup> b_tile: array<AB_T, BK * TILE>; // [BK][TILE cols], row-major
var<workgroup> c_tile: array<f32, BLOCKS * S * S>; // one S×S slot per block
var<workgroup> subgroups: u32;

@compute @workgroup_size(128, 1, 1)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_id) sid: u32,
    @builtin(num_subgroups) nsg_lane: u32,
) {
    let wid = wg.x + wg.y * nwg.x;
    let per_group = p.tiles_m * p.tiles_n;
    if wid >= per_group * p.groups {
        return;
    }
    let g = wid / per_group;
    let t = wid % per_group;
    let m0 = (t / p.tiles_n) * TILE;
    let n0 = (t % p.tiles_n) * TILE;
    // Not `&&`: naga lowers it through a local variable, which its uniformity analysis counts
    // as non-uniform, and cooperative operations after a non-uniform return are rejected.
    if select(0u, 1u, n0 > m0 + TILE - 1u) * (p.flags & SKIP_UPPER) != 0u {
        return;
    }
    let bi = g / p.heads;
    let hi = g % p.heads;
    let a_base = p.a_off + bi * p.a_batch + hi * p.a_head;
    let b_base = p.b_off + bi * p.b_batch + (hi / p.b_ratio) * p.b_head;
    let c_base = p.c_off + bi * p.c_batch + hi * p.c_head;

    if li == 0u {
        subgroups = nsg_lane;
    }
    let nsg = max(workgroupUniformLoad(&subgroups), 1u);
    let rounds = (BLOCKS + nsg - 1u) / nsg;

    for (var r = 0u; r < rounds; r++) {
        let q = r * nsg + sid;
        let qc = min(q, BLOCKS - 1u);
        let br = (qc / BLOCKS_SIDE) * BLOCK;
        let bc = (qc % BLOCKS_SIDE) * BLOCK;
        var c00 = CC();
        var c01 = CC();
        var c10 = CC();
        var c11 = CC();

        for (var k0 = 0u; k0 < p.k; k0 += BK) {
            for (var e = 0u; e < TILE * BK / WG; e++) {
                let idx = li + e * WG;
                let ar = idx / BK;
                let ak = idx % BK;
                var av = 0.0;
                if m0 + ar < p.m && k0 + ak < p.k {
                    av = f32(a[a_base + (m0 + ar) * p.a_row + (k0 + ak) * p.a_col]);
                }
                a_tile[idx] = AB_T(av);
                let bk = idx / TILE;
                let bcol = idx % TILE;
                var bv = 0.0;
                if k0 + bk < p.k && n0 + bcol < p.n {
                    bv = f32(b[b_base + (k0 + bk) * p.b_row + (n0 + bcol) * p.b_col]);
                }
                b_tile[idx] = AB_T(bv);
            }
            workgroupBarrier();
            for (var kk = 0u; kk < BK; kk += S) {
                let a0 = coopLoadT<CA>(&a_tile[br * BK + kk], BK);
                let a1 = coopLoadT<CA>(&a_tile[(br + S) * BK + kk], BK);
                let b0 = coopLoadT<CB>(&b_tile[kk * TILE + bc], TILE);
                let b1 = coopLoadT<CB>(&b_tile[kk * TILE + bc + S], TILE);
                c00 = coopMultiplyAdd(a0, b0, c00);
                c01 = coopMultiplyAdd(a0, b1, c01);
                c10 = coopMultiplyAdd(a1, b0, c10);
                c11 = coopMultiplyAdd(a1, b1, c11);
            }
            workgroupBarrier();
        }

        // The blocks of this round, one of the four matrices at a time.
        let q_lo = r * nsg;
        let q_hi = min(q_lo + nsg, BLOCKS);
        for (var part = 0u; part < 4u; part++) {
            var cm = c00;
            if part == 1u {
                cm = c01;
            } else if part == 2u {
                cm = c10;
            } else if part == 3u {
                cm = c11;
            }
            if q < BLOCKS {
                coopStoreT(cm, &c_tile[q * S * S], S);
            }
            workgroupBarrier();
            for (var e = q_lo * S * S + li; e < q_hi * S * S; e += WG) {
                let qq = e / (S * S);
                let w = e % (S * S);
                let row = m0 + (qq / BLOCKS_SIDE) * BLOCK + (part / 2u) * S + w / S;
                let col = n0 + (qq % BLOCKS_SIDE) * BLOCK + (part % 2u) * S + w % S;
                if row < p.m && col < p.n {
                    var v = c_tile[e];
                    if (p.flags & HAS_BIAS) != 0u {
                        v += f32(bias[col]);
                    }
                    let at = c_base + row * p.c_row + col;
                    if (p.flags & ACCUMULATE) != 0u {
                        v += f32(c[at]);
                    }
                    c[at] = C_T(v);
                }
            }
            workgroupBarrier();
        }
    }
}

alias CA = coop_mat16x16<AB_T, A>;
alias CB = coop_mat16x16<AB_T, B>;
alias CC = coop_mat16x16<f32, C>;
