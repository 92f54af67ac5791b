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
    for (var i = 0u; i < 4u; i++) { // unroll
        for (var j = 0u; j < 4u; j++) { // unroll
            acc[i][j] = 0.0;
        }
    }

    for (var k0 = 0u; k0 < p.k; k0 += TK) {
        for (var e = 0u; e < 4u; e++) { // unroll
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
            for (var i = 0u; i < 4u; i++) { // unroll
                ar[i] = a_tile[kk * TILE + lid.y + 16u * i];
                br[i] = b_tile[kk * TILE + lid.x + 16u * i];
            }
            for (var i = 0u; i < 4u; i++) { // unroll
                for (var j = 0u; j < 4u; j++) { // unroll
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
