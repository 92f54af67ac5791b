// Batched matmul C[g] = A[g]·B[g] for adapters where textures and subgroup operations are
// fast and storage/workgroup memory is slow (lavapipe), with three epilogues:
//
//     HAS_BIAS:  C[g, i, j] = (A·B)[i, j] + bias[j]
//     STATS:     per row i and column tile t, with s_ij = scale_log2 · (A·B)[i, j] over the
//                tile's visible columns: C[((g·m + i)·tiles_n + t)·2 + {0, 1}] =
//                (max_j s_ij, Σ_j exp2(s_ij − max))                         (the partial softmax)
//     SOFTMAX:   C[g, i, j] = exp2(s_ij − M) / L, (M, L) = row_stats[g·m + i]   (0 where masked)
//
// STATS, then row_stats.wgsl (each row's max M and sum L over the tiles), then SOFTMAX turn Q·Kᵀ into the
// attention weights without an n × n round trip through a softmax kernel. Both passes compute
// every logit with the same instructions, so the weights are normalized by exactly the logits
// they are made of (a row with one dominant key gets weight 1 to the last bit or two).
//
// A and B are packed by pack.wgsl into rgba32float textures (rgba16float from f16): row r
// of group g, values 4c..4c+3, at texel ((r & mask)·D4 + c, g·rows + (r >> shift)). One
// workgroup is one subgroup of SG lanes and computes an (SG·T) × (4·SG) tile of C: lane `l` owns output
// columns 4·(tile_col·SG + l) .. +3 of every tile row. Per step of 4 along k, each lane
// loads one texel of A for T rows and four texels of B, and subgroupShuffle shares the
// A values; loops marked `// unroll` are unrolled by the host, so the lanes are constants.
//
// Mask (STATS and SOFTMAX, when MASK ≠ 0): a bias added to the scaled scores, read through its
// strides over (batch, head, row, column), 0 along broadcast axes; f32::MIN marks a column
// masked out, which weighs exactly 0 (a row with nothing visible is all 0). Modifiers (STATS
// and SOFTMAX; src/kernels/mods.rs), as the fused kernels apply them: the score modifier
// (`wa_score_log2`) on the scaled score, then the bias, then the mask modifier (`wa_keep`);
// causal hides the future first. Row i of group g is query i of (batch g / heads, head
// g % heads), column j key j.
//
// Split output (plain epilogue): columns [0, split_k) go to `c` at its strides, [split_k,
// split_v) to `c1` and [split_v, n) to `c2`, each row-major at its own width (one group);
// without a split (SPLIT = 0, the constant: no per-element branch), split_k = split_v = n and
// `c1`, `c2` are small buffers of their own, never written.
//
// The host prepends: const SG (subgroup size), T (tile rows per lane), MASK (1 when there is
// a mask), SPLIT (1 for a split output), and the element types `alias B_T` (the bias) and
// `C_T` (f32 or f16; STATS needs f32).
//
// The host prepends, from src/kernels/matmul_subgroup.rs: the constants and element-type aliases
// named there, shaders/prelude.wgsl (NEG, FLOOR, LOG2E, mask_offset, add_bias), and
// `struct Params`, generated from the Rust uniform of the same fields.

const HAS_BIAS: u32 = 1u;
const CAUSAL: u32 = 2u;
const SOFTMAX: u32 = 4u;
const STATS: u32 = 8u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var a_tex: texture_2d<f32>;
@group(0) @binding(2) var b_tex: texture_2d<f32>;
@group(0) @binding(3) var<storage, read> bias: array<B_T>;
@group(0) @binding(4) var<storage, read> row_stats: array<vec2<f32>>;
@group(0) @binding(5) var<storage, read_write> c: array<C_T>;
@group(0) @binding(6) var<storage, read> mask: array<f32>;
@group(0) @binding(7) var<storage, read_write> c1: array<C_T>;
@group(0) @binding(8) var<storage, read_write> c2: array<C_T>;

fn texel_a(g: u32, r: u32, c4: u32) -> vec2<u32> {
    let mask = (1u << p.a_shift) - 1u;
    return vec2<u32>((r & mask) * p.a_d4 + c4, g * p.a_rows + (r >> p.a_shift));
}

fn texel_b(g: u32, r: u32, c4: u32) -> vec2<u32> {
    let mask = (1u << p.b_shift) - 1u;
    return vec2<u32>((r & mask) * p.b_d4 + c4, g * p.b_rows + (r >> p.b_shift));
}

@compute @workgroup_size(SG)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let per_group = p.tiles_m * p.tiles_n;
    let id = wg.x + wg.y * nwg.x;
    if id >= p.groups * per_group {
        return;
    }
    let g = id / per_group;
    let t = id % per_group;
    let row0 = (t / p.tiles_n) * SG * T;
    let col4 = (t % p.tiles_n) * SG + lane;
    // Grouped-query attention: b_ratio heads of A share one head of B (its texture rows).
    let g_b = (g / p.heads) * (p.heads / p.b_ratio) + (g % p.heads) / p.b_ratio;
    let softmax = (p.flags & SOFTMAX) != 0u;
    let stats = (p.flags & STATS) != 0u;
    let causal = (p.flags & CAUSAL) != 0u;
    let b_idx = g / p.heads;
    let h = g % p.heads;

    var acc: array<vec4<f32>, SG * T>;
    // A causal tile wholly above the diagonal is all masked: skip the products.
    let skip = (softmax || stats) && causal && (t % p.tiles_n) * SG * 4u > row0 + SG * T - 1u;
    let k4s = select((p.k + 3u) / 4u, 0u, skip);
    for (var k4 = 0u; k4 < k4s; k4++) {
        var a: array<vec4<f32>, T>;
        for (var r = 0u; r < T; r++) { // unroll
            let row = row0 + r * SG + lane;
            if row < p.m {
                a[r] = textureLoad(a_tex, texel_a(g, row, k4), 0);
            }
        }
        var b: array<vec4<f32>, 4>;
        for (var e = 0u; e < 4u; e++) { // unroll
            let kk = k4 * 4u + e;
            if kk < p.k && col4 < p.b_d4 {
                b[e] = textureLoad(b_tex, texel_b(g_b, kk, col4), 0);
            }
        }
        for (var r = 0u; r < T; r++) { // unroll
            for (var l = 0u; l < SG; l++) { // unroll
                let av = sg_shuffle4(a[r], l);
                let i = r * SG + l;
                acc[i] += av.x * b[0] + av.y * b[1] + av.z * b[2] + av.w * b[3];
            }
        }
    }

    if stats {
        // Each row's max and sum of exp2 over this tile's visible columns, across the lanes.
        for (var r = 0u; r < T; r++) { // unroll
            for (var l = 0u; l < SG; l++) { // unroll
                let i = r * SG + l;
                let row = row0 + i;
                var v: array<f32, 4>;
                var local_max = NEG;
                for (var e = 0u; e < 4u; e++) { // unroll
                    let col = col4 * 4u + e;
                    var x = NEG;
                    if col < p.n && row < p.m && !(causal && col > row) {
                        x = logit(acc[i][e], b_idx, h, row, col);
                    }
                    v[e] = x;
                    local_max = max(local_max, x);
                }
                let tile_max = sg_max1(local_max);
                var local_sum = 0.0;
                for (var e = 0u; e < 4u; e++) { // unroll
                    local_sum += exp2(v[e] - tile_max);
                }
                // A tile with nothing visible sums 0 (exp2 of NEG − NEG would be 1).
                let tile_sum = select(sg_add1(local_sum), 0.0, tile_max == NEG);
                if lane == 0u && row < p.m {
                    let at = ((g * p.m + row) * p.tiles_n + t % p.tiles_n) * 2u;
                    c[at] = C_T(tile_max);
                    c[at + 1u] = C_T(tile_sum);
                }
            }
        }
        return;
    }

    let base = p.c_off + b_idx * p.c_batch + h * p.c_head;
    for (var r = 0u; r < T; r++) { // unroll
        for (var l = 0u; l < SG; l++) { // unroll
            let i = r * SG + l;
            let row = row0 + i;
            if row < p.m {
                // The row's max and 1 / sum (a row with nothing visible: all masked, never read).
                var shift = 0.0;
                var inv = 1.0;
                if softmax {
                    let st = row_stats[g * p.m + row];
                    shift = st.x;
                    inv = 1.0 / st.y;
                }
                for (var e = 0u; e < 4u; e++) { // unroll
                    let col = col4 * 4u + e;
                    if col < p.n {
                        var v = acc[i][e];
                        if (p.flags & HAS_BIAS) != 0u {
                            v += f32(bias[col]);
                        }
                        if softmax {
                            var x = NEG;
                            if !(causal && col > row) {
                                x = logit(v, b_idx, h, row, col);
                            }
                            v = select(exp2(x - shift) * inv, 0.0, x <= NEG);
                        }
                        // Split output (Q, K, V from one X·[W_Q W_K W_V]): columns past
                        // split_k go to c1, past split_v to c2, each at its own width.
                        if SPLIT == 0u || col < p.split_k {
                            c[base + row * p.c_row + col] = C_T(v);
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
}

// The log2-domain logit of product `v` at (batch b, head h, row, col) in STATS and SOFTMAX,
// formed by the same instructions in both: the scaled score, the score modifier (identity
// stubs without modifiers; see src/kernels/mods.rs), the mask's bias, then the mask modifier
// (NEG where it hides the column).
fn logit(v: f32, b: u32, h: u32, row: u32, col: u32) -> f32 {
    var x = wa_score_log2(v * p.scale_log2, b, h, row, col);
    if MASK != 0u {
        x = add_bias(x, mask[mask_offset(p.mask, b, h, row, col)], LOG2E);
    }
    return select(NEG, x, wa_keep(b, h, row, col));
}
