alias A_T = f32;
alias B_T = f32;
alias C_T = f32;
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
// Batched, strided matrix product with optional bias:
//
//     C[g] = A[g] · B[g] (+ bias)        for every group g = batch_index · heads + head
//
// Every operand is addressed through element strides, so one kernel serves the projections
// (X·W + b over all rows of every batch at once, W shared) and the scores Q_h·K_hᵀ (K read
// transposed through its strides, one group per batch and head).
//
// Tiling: a workgroup of 16×16 threads computes a 64×64 tile of C, each thread a 4×4 block
// of it (rows ty + 16·i, columns tx + 16·j, so stores are coalesced); A and B are staged in
// workgroup memory 16 values of the inner dimension at a time. Sizes need not be multiples
// of anything: out-of-range reads load 0 and out-of-range writes are skipped.
//
// The grid is linear: workgroup id = x + y · num_workgroups.x, so any number of tiles fits
// under the 65,535-per-dimension limit; ids past the last tile return at once.
//
// Element types: the host prepends `alias A_T`, `B_T` (B and the bias) and `C_T`, each f32 or
// f16 (with `enable f16;`). Products accumulate in f32 whatever they are.
//
// The host prepends, from src/kernels/matmul.rs: the constants and element-type aliases
// named there, shaders/prelude.wgsl (NEG, FLOOR, LOG2E, mask_offset, add_bias), and
// `struct Params`, generated from the Rust uniform of the same fields.

// flags
const HAS_BIAS: u32 = 1u;
// Causal scores: skip tiles that lie wholly above the diagonal (column > row everywhere);
// the softmax never reads them.
const SKIP_UPPER: u32 = 2u;
// Add to what C holds (C += A·B): gradients summed over several products.
const ACCUMULATE: u32 = 4u;

const TILE: u32 = 64u;
const TK: u32 = 16u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<A_T>;
@group(0) @binding(2) var<storage, read> b: array<B_T>;
@group(0) @binding(3) var<storage, read> bias: array<B_T>;
@group(0) @binding(4) var<storage, read_write> c: array<C_T>;

var<workgroup> a_tile: array<f32, 1024>; // [TK][TILE], k-major
var<workgroup> b_tile: array<f32, 1024>; // [TK][TILE]

@compute @workgroup_size(16, 16, 1)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
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
    if (p.flags & SKIP_UPPER) != 0u && n0 > m0 + TILE - 1u {
        return;
    }
    let bi = g / p.heads;
    let hi = g % p.heads;
    let a_base = p.a_off + bi * p.a_batch + hi * p.a_head;
    // Grouped-query attention: b_ratio heads of A share one head of B.
    let b_base = p.b_off + bi * p.b_batch + (hi / p.b_ratio) * p.b_head;

    var acc: array<array<f32, 4>, 4>;
    {
        const i = 0u;
        {
            const j = 0u;
            acc[i][j] = 0.0;
        }
        {
            const j = 1u;
            acc[i][j] = 0.0;
        }
        {
            const j = 2u;
            acc[i][j] = 0.0;
        }
        {
            const j = 3u;
            acc[i][j] = 0.0;
        }
    }
    {
        const i = 1u;
        {
            const j = 0u;
            acc[i][j] = 0.0;
        }
        {
            const j = 1u;
            acc[i][j] = 0.0;
        }
        {
            const j = 2u;
            acc[i][j] = 0.0;
        }
        {
            const j = 3u;
            acc[i][j] = 0.0;
        }
    }
    {
        const i = 2u;
        {
            const j = 0u;
            acc[i][j] = 0.0;
        }
        {
            const j = 1u;
            acc[i][j] = 0.0;
        }
        {
            const j = 2u;
            acc[i][j] = 0.0;
        }
        {
            const j = 3u;
            acc[i][j] = 0.0;
        }
    }
    {
        const i = 3u;
        {
            const j = 0u;
            acc[i][j] = 0.0;
        }
        {
            const j = 1u;
            acc[i][j] = 0.0;
        }
        {
            const j = 2u;
            acc[i][j] = 0.0;
        }
        {
            const j = 3u;
            acc[i][j] = 0.0;
        }
    }

    for (var k0 = 0u; k0 < p.k; k0 += TK) {
        {
            const e = 0u;
            let idx = li + e * 256u;
            // A tile: idx = row · TK + kk
            let ar = idx / TK;
            let ak = idx % TK;
            var av = 0.0;
            if m0 + ar < p.m && k0 + ak < p.k {
                av = f32(a[a_base + (m0 + ar) * p.a_row + (k0 + ak) * p.a_col]);
            }
            a_tile[ak * TILE + ar] = av;
            // B tile: idx = kk · TILE + col
            let bk = idx / TILE;
            let bc = idx % TILE;
            var bv = 0.0;
            if k0 + bk < p.k && n0 + bc < p.n {
                bv = f32(b[b_base + (k0 + bk) * p.b_row + (n0 + bc) * p.b_col]);
            }
            b_tile[bk * TILE + bc] = bv;
        }
        {
            const e = 1u;
            let idx = li + e * 256u;
            // A tile: idx = row · TK + kk
            let ar = idx / TK;
            let ak = idx % TK;
            var av = 0.0;
            if m0 + ar < p.m && k0 + ak < p.k {
                av = f32(a[a_base + (m0 + ar) * p.a_row + (k0 + ak) * p.a_col]);
            }
            a_tile[ak * TILE + ar] = av;
            // B tile: idx = kk · TILE + col
            let bk = idx / TILE;
            let bc = idx % TILE;
            var bv = 0.0;
            if k0 + bk < p.k && n0 + bc < p.n {
                bv = f32(b[b_base + (k0 + bk) * p.b_row + (n0 + bc) * p.b_col]);
            }
            b_tile[bk * TILE + bc] = bv;
        }
        {
            const e = 2u;
            let idx = li + e * 256u;
            // A tile: idx = row · TK + kk
            let ar = idx / TK;
            let ak = idx % TK;
            var av = 0.0;
            if m0 + ar < p.m && k0 + ak < p.k {
                av = f32(a[a_base + (m0 + ar) * p.a_row + (k0 + ak) * p.a_col]);
            }
            a_tile[ak * TILE + ar] = av;
            // B tile: idx = kk · TILE + col
            let bk = idx / TILE;
            let bc = idx % TILE;
            var bv = 0.0;
            if k0 + bk < p.k && n0 + bc < p.n {
                bv = f32(b[b_base + (k0 + bk) * p.b_row + (n0 + bc) * p.b_col]);
            }
            b_tile[bk * TILE + bc] = bv;
        }
        {
            const e = 3u;
            let idx = li + e * 256u;
            // A tile: idx = row · TK + kk
            let ar = idx / TK;
            let ak = idx % TK;
            var av = 0.0;
            if m0 + ar < p.m && k0 + ak < p.k {
                av = f32(a[a_base + (m0 + ar) * p.a_row + (k0 + ak) * p.a_col]);
            }
            a_tile[ak * TILE + ar] = av;
            // B tile: idx = kk · TILE + col
            let bk = idx / TILE;
            let bc = idx % TILE;
            var bv = 0.0;
            if k0 + bk < p.k && n0 + bc < p.n {
                bv = f32(b[b_base + (k0 + bk) * p.b_row + (n0 + bc) * p.b_col]);
            }
            b_tile[bk * TILE + bc] = bv;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk++) {
            var ar: array<f32, 4>;
            var br: array<f32, 4>;
            {
                const i = 0u;
                ar[i] = a_tile[kk * TILE + lid.y + 16u * i];
                br[i] = b_tile[kk * TILE + lid.x + 16u * i];
            }
            {
                const i = 1u;
                ar[i] = a_tile[kk * TILE + lid.y + 16u * i];
                br[i] = b_tile[kk * TILE + lid.x + 16u * i];
            }
            {
                const i = 2u;
                ar[i] = a_tile[kk * TILE + lid.y + 16u * i];
                br[i] = b_tile[kk * TILE + lid.x + 16u * i];
            }
            {
                const i = 3u;
                ar[i] = a_tile[kk * TILE + lid.y + 16u * i];
                br[i] = b_tile[kk * TILE + lid.x + 16u * i];
            }
            {
                const i = 0u;
                {
                    const j = 0u;
                    acc[i][j] = fma(ar[i], br[j], acc[i][j]);
                }
                {
                    const j = 1u;
                    acc[i][j] = fma(ar[i], br[j], acc[i][j]);
                }
                {
                    const j = 2u;
                    acc[i][j] = fma(ar[i], br[j], acc[i][j]);
                }
                {
                    const j = 3u;
                    acc[i][j] = fma(ar[i], br[j], acc[i][j]);
                }
            }
            {
                const i = 1u;
                {
                    const j = 0u;
                    acc[i][j] = fma(ar[i], br[j], acc[i][j]);
                }
                {
                    const j = 1u;
                    acc[i][j] = fma(ar[i], br[j], acc[i][j]);
                }
                {
                    const j = 2u;
                    acc[i][j] = fma(ar[i], br[j], acc[i][j]);
                }
                {
                    const j = 3u;
                    acc[i][j] = fma(ar[i], br[j], acc[i][j]);
                }
            }
            {
                const i = 2u;
                {
                    const j = 0u;
                    acc[i][j] = fma(ar[i], br[j], acc[i][j]);
                }
                {
                    const j = 1u;
                    acc[i][j] = fma(ar[i], br[j], acc[i][j]);
                }
                {
                    const j = 2u;
                    acc[i][j] = fma(ar[i], br[j], acc[i][j]);
                }
                {
                    const j = 3u;
                    acc[i][j] = fma(ar[i], br[j], acc[i][j]);
                }
            }
            {
                const i = 3u;
                {
                    const j = 0u;
                    acc[i][j] = fma(ar[i], br[j], acc[i][j]);
                }
                {
                    const j = 1u;
                    acc[i][j] = fma(ar[i], br[j], acc[i][j]);
                }
                {
                    const j = 2u;
                    acc[i][j] = fma(ar[i], br[j], acc[i][j]);
                }
                {
                    const j = 3u;
                    acc[i][j] = fma(ar[i], br[j], acc[i][j]);
                }
            }
        }
        workgroupBarrier();
    }

    let c_base = p.c_off + bi * p.c_batch + hi * p.c_head;
    for (var i = 0u; i < 4u; i++) {
        let row = m0 + lid.y + 16u * i;
        if row >= p.m {
            continue;
        }
        for (var j = 0u; j < 4u; j++) {
            let col = n0 + lid.x + 16u * j;
            if col >= p.n {
                continue;
            }
            var v = acc[i][j];
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
}
