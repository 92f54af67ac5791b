// Row-wise scaled softmax with an optional causal mask, in place:
//
//     s[r, j] ← exp(scale·s[r, j] − m_r) / Σ_j' exp(scale·s[r, j'] − m_r),   m_r = max_j scale·s[r, j]
//
// over the visible columns j of row r; masked columns are written as 0 and never read.
// Rows are the query positions of every (batch, head) group stacked: row r is query
// i = r mod n_q. Causal (top-left aligned, as PyTorch's is_causal): i sees j ≤ i.
//
// One workgroup of 64 threads per row: each thread strides over the row, then the
// workgroup reduces the max and the sum through workgroup memory. Subtracting the row max
// keeps exp() in range for logits in the thousands. Linear grid as in matmul.wgsl.
//
// Mask (when MASK ≠ 0): a bias added to the scaled scores, read through its strides over
// (batch, head, query, key), 0 along broadcast axes; f32::MIN marks a key masked out, which
// weighs exactly 0. A row with nothing visible is all 0. The host prepends MASK.
//
// Modifiers (src/kernels/mods.rs): on the scaled score, the score modifier (`wa_score_ln`,
// natural-log scores), then the bias, then the mask modifier (`wa_keep`: a key it hides weighs
// exactly 0), as the fused kernels apply them; causal hides the future first. Identity stubs
// without modifiers.
//
// The host prepends, from src/kernels/softmax.rs: the constants and element-type aliases
// named there, shaders/prelude.wgsl (NEG, FLOOR, LOG2E, mask_offset, add_bias), and
// `struct Params`, generated from the Rust uniform of the same fields.

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> s: array<f32>;
@group(0) @binding(2) var<storage, read> mask: array<f32>;

var<workgroup> red: array<f32, 64>;

fn reduce_max(v: f32, li: u32) -> f32 {
    red[li] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if li < stride {
            red[li] = max(red[li], red[li + stride]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn reduce_sum(v: f32, li: u32) -> f32 {
    red[li] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if li < stride {
            red[li] = red[li] + red[li + stride];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(64, 1, 1)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let row = wg.x + wg.y * nwg.x;
    if row >= p.rows {
        return;
    }
    let base = row * p.cols;
    let i = row % p.n_q;
    var visible = p.cols;
    if p.causal != 0u {
        visible = min(i + 1u, p.cols);
    }
    let g = row / p.n_q;
    let b = g / p.heads;
    let h = g % p.heads;
    let r = Row(base, b, h, i, mask_offset(p.mask, b, h, i, 0u));

    var m = FLOOR;
    for (var j = li; j < visible; j += WG) {
        m = max(m, score(r, j));
    }
    m = reduce_max(m, li);

    var sum = 0.0;
    for (var j = li; j < visible; j += WG) {
        sum += exp(score(r, j) - m);
    }
    sum = reduce_sum(sum, li);

    // Nothing visible (every key masked out): zeros, not 0/0.
    let inv = select(1.0 / sum, 0.0, sum == 0.0);
    for (var j = li; j < p.cols; j += WG) {
        var w = 0.0;
        if j < visible {
            let x = score(r, j);
            w = select(exp(x - m) * inv, 0.0, x <= NEG);
        }
        s[base + j] = w;
    }
}

// One row: its scores start at `base`, it is query `i` of (batch `b`, head `h`), and its mask
// elements start at `m_base`.
struct Row {
    base: u32,
    b: u32,
    h: u32,
    i: u32,
    m_base: u32,
}

// The scaled score of column j of row `r`, as the fused kernels form it (in the natural-log
// domain here): the score modifier (identity stubs without modifiers; see
// src/kernels/mods.rs), the mask's bias, then the mask modifier (NEG where it hides the key).
fn score(r: Row, j: u32) -> f32 {
    var x = wa_score_ln(p.scale * s[r.base + j], r.b, r.h, r.i, j);
    if MASK != 0u {
        x = add_bias(x, mask[r.m_base + j * p.mask.w], 1.0);
    }
    return select(NEG, x, wa_keep(r.b, r.h, r.i, j));
}
