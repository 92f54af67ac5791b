enable wgpu_cooperative_matrix;
enable f16;
alias A_T = f16;
alias B_T = f16;
alias C_T = f32;
const TB: u32 = 1u;
const KQ: u32 = 4u;
const B_KMAJOR: u32 = 0u;
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
    split_k: u32,
    split_v: u32,
    _pad0: u32,
    _pad: vec2<u32>,
}
// Register-blocked, double-buffered batched matmul for GPUs (the storage family's projections
// and scores), computing what matmul.wgsl computes:
//
//     C[g] = A[g] · B[g] (+ bias)        for every group g = batch_index · heads + head
//
// with its flags (HAS_BIAS, SKIP_UPPER, ACCUMULATE) and one more output mode: the columns of
// C may be split over three buffers (X·[W_Q W_K W_V] written as Q, K and V at once, X read
// once): columns [0, split_k) go to `c` (row stride c_row), [split_k, split_v) to `c1` and
// [split_v, n) to `c2`, each row-major at its own width. Without a split, split_k = split_v = n
// and `c1`, `c2` are small buffers of their own, never written (WebGPU rejects a writable
// binding aliasing another).
//
// Tiling: 16 × 16 threads, each computing (4·TB) × (4·TB) outputs in registers, as TB × TB
// blocks of 4 × 4 (rows 64·bi + 4·ty + 0..3, columns 64·bj + 4·tx + 0..3: whole vec4s of
// workgroup memory per thread, and neighbouring threads on neighbouring vec4s). A workgroup
// owns a (64·TB)² tile of C. The inner dimension is staged 4·KQ values at a time; each
// thread loads one aligned `vec4` of A and of B per stage (TB · KQ = 4), into registers while
// the current stage's products run, then into the other half of the double-buffered
// workgroup tiles: one barrier per stage.
//
// Layouts: A is contiguous along the inner dimension (a_col = 1) and B along its columns
// (b_col = 1), or along the inner dimension when B_KMAJOR ≠ 0 (Kᵀ for the scores); every
// other stride and offset is a multiple of 4 (the host checks, and falls back to matmul.wgsl
// otherwise). Sizes need not be multiples of anything: the lanes of a vec4 past the inner
// dimension or past the columns are zeroed, out-of-range rows load 0 and out-of-range
// writes are skipped.
//
// The grid is linear: workgroup id = x + y · num_workgroups.x; ids past the last tile return.
// Element types: `alias A_T`, `B_T` (B and the bias), `C_T` (f32 or f16); products
// accumulate in f32.
//
// The host prepends, from src/kernels/matmul_blocked.rs: the constants (TB, KQ, B_KMAJOR)
// and element-type aliases named there, shaders/prelude.wgsl, and `struct Params`,
// generated from the Rust uniform of the same fields.

const HAS_BIAS: u32 = 1u;
const SKIP_UPPER: u32 = 2u;
const ACCUMULATE: u32 = 4u;

const TILE: u32 = 64u * TB;
const TK: u32 = 4u * KQ;
// vec4s per row of a workgroup tile, and per stage of one operand.
const T4: u32 = TILE / 4u;
const STAGE: u32 = TK * T4;
// vec4 loads per thread per stage (1 with TB · KQ = 4).
const LOADS: u32 = (STAGE + 255u) / 256u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<vec4<A_T>>;
@group(0) @binding(2) var<storage, read> b: array<vec4<B_T>>;
@group(0) @binding(3) var<storage, read> bias: array<B_T>;
@group(0) @binding(4) var<storage, read_write> c: array<C_T>;
@group(0) @binding(5) var<storage, read_write> c1: array<C_T>;
@group(0) @binding(6) var<storage, read_write> c2: array<C_T>;

// [2 stages][TK][TILE] as vec4s along the tile's rows (A) or columns (B).
var<workgroup> a_s: array<vec4<f32>, 2u * STAGE>;
var<workgroup> b_s: array<vec4<f32>, 2u * STAGE>;

// Zeroes the lanes of `v` at or past `limit`, lane 0 being element `first`.
fn clip(v: vec4<f32>, first: u32, limit: u32) -> vec4<f32> {
    let e = vec4<u32>(first) + vec4<u32>(0u, 1u, 2u, 3u);
    return select(vec4<f32>(0.0), v, e < vec4<u32>(limit));
}

@compute @workgroup_size(16, 16, 1)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    var vmm_canary = coop_mat16x16<f32, C>();
    let wid = wg.x + wg.y * nwg.x;
    let per_group = p.tiles_m * p.tiles_n;
    if wid >= per_group * p.groups {
        return;
    }
    let g = wid / per_group;
    let t = wid % per_group;
    let m0 = (t / p.tiles_n) * TILE;
    let n0 = (t % p.tiles_n) * TILE;
    if (p.flags & SKIP_UPPER) != 0u && n0 > m0 + TILE - 1u {
        return;
    }
    let bi = g / p.heads;
    let hi = g % p.heads;
    // In vec4s: every offset and stride is a multiple of 4.
    let a_base = (p.a_off + bi * p.a_batch + hi * p.a_head) / 4u;
    // Grouped-query attention: b_ratio heads of A share one head of B.
    let b_base = (p.b_off + bi * p.b_batch + (hi / p.b_ratio) * p.b_head) / 4u;
    let a_row4 = p.a_row / 4u;
    let b_step4 = select(p.b_row, p.b_col, B_KMAJOR != 0u) / 4u;

    var acc: array<vec4<f32>, 4u * TB * TB>;
    for (var i = 0u; i < 4u * TB * TB; i++) {
        acc[i] = vec4<f32>(0.0);
    }

    // This thread's loads: A row `ar`, inner offset 4·`aq`; B inner row `bk`, columns from
    // 4·`bq` (or, k-major, column `ar`, inner offset 4·`aq`).
    var ra: array<vec4<f32>, LOADS>;
    var rb: array<vec4<f32>, LOADS>;
    let stages = (p.k + TK - 1u) / TK;

    for (var s = 0u; s <= stages; s++) {
        // Stage s: fetch it into registers (s < stages), multiply stage s − 1 (s > 0), then
        // store the fetched stage into the half just freed.
        let cur = (s + 1u) & 1u;
        if s < stages {
            let k0 = s * TK;
            for (var l = 0u; l < LOADS; l++) {
                let idx = li + 256u * l;
                let ar = idx / KQ;
                let ak = k0 + 4u * (idx % KQ);
                var av = vec4<f32>(0.0);
                if m0 + ar < p.m && ak < p.k && idx < STAGE {
                    av = clip(vec4<f32>(a[a_base + (m0 + ar) * a_row4 + ak / 4u]), ak, p.k);
                }
                ra[l] = av;
                var bv = vec4<f32>(0.0);
                if B_KMAJOR != 0u {
                    if n0 + ar < p.n && ak < p.k && idx < STAGE {
                        bv = clip(vec4<f32>(b[b_base + (n0 + ar) * b_step4 + ak / 4u]), ak, p.k);
                    }
                } else {
                    let bk = k0 + idx / T4;
                    let bn = n0 + 4u * (idx % T4);
                    if bk < p.k && bn < p.n && idx < STAGE {
                        bv = clip(vec4<f32>(b[b_base + bk * b_step4 + bn / 4u]), bn, p.n);
                    }
                }
                rb[l] = bv;
            }
        }
        if s > 0u {
            let base = cur * STAGE;
            for (var kk = 0u; kk < TK; kk++) {
                var av: array<vec4<f32>, TB>;
                var bv: array<vec4<f32>, TB>;
                for (var i = 0u; i < TB; i++) {
                    av[i] = a_s[base + kk * T4 + 16u * i + lid.y];
                    bv[i] = b_s[base + kk * T4 + 16u * i + lid.x];
                }
                for (var i = 0u; i < TB; i++) {
                    for (var r = 0u; r < 4u; r++) {
                        let x = vec4<f32>(av[i][r]);
                        for (var j = 0u; j < TB; j++) {
                            let at = (4u * i + r) * TB + j;
                            acc[at] = fma(x, bv[j], acc[at]);
                        }
                    }
                }
            }
        }
        if s < stages {
            // The half that stage s − 1 was read from is free after the barrier that ended
            // stage s − 2's products; the other half is being read now.
            let base = (1u - cur) * STAGE;
            for (var l = 0u; l < LOADS; l++) {
                let idx = li + 256u * l;
                if idx < STAGE {
                    let ar = idx / KQ;
                    let kq = 4u * (idx % KQ);
                    // Transposed into [kk][row]: four scalar stores.
                    for (var e = 0u; e < 4u; e++) {
                        a_s[base + (kq + e) * T4 + ar / 4u][ar % 4u] = ra[l][e];
                    }
                    if B_KMAJOR != 0u {
                        for (var e = 0u; e < 4u; e++) {
                            b_s[base + (kq + e) * T4 + ar / 4u][ar % 4u] = rb[l][e];
                        }
                    } else {
                        b_s[base + idx] = rb[l];
                    }
                }
            }
        }
        workgroupBarrier();
    }

    let c_base = p.c_off + bi * p.c_batch + hi * p.c_head;
    let bias_on = (p.flags & HAS_BIAS) != 0u;
    let accumulate = (p.flags & ACCUMULATE) != 0u;
    for (var i = 0u; i < TB; i++) {
        for (var r = 0u; r < 4u; r++) {
            let row = m0 + 64u * i + 4u * lid.y + r;
            if row >= p.m {
                continue;
            }
            for (var j = 0u; j < TB; j++) {
                let v4 = acc[(4u * i + r) * TB + j];
                for (var e = 0u; e < 4u; e++) {
                    let col = n0 + 64u * j + 4u * lid.x + e;
                    if col >= p.n {
                        continue;
                    }
                    var v = v4[e];
                    if bias_on {
                        v += f32(bias[col]);
                    }
                    if col < p.split_k {
                        let at = c_base + row * p.c_row + col;
                        if accumulate {
                            v += f32(c[at]);
                        }
                        c[at] = C_T(v);
                    } else if col < p.split_v {
                        c1[row * (p.split_v - p.split_k) + col - p.split_k] = C_T(v);
                    } else {
                        c2[row * (p.n - p.split_v) + col - p.split_v] = C_T(v);
                    }
                }
            }
        }
    }
}
