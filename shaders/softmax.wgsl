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

struct Params {
    rows: u32,
    cols: u32,
    n_q: u32,
    causal: u32,
    scale: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> s: array<f32>;

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
    var visible = p.cols;
    if p.causal != 0u {
        visible = min(row % p.n_q + 1u, p.cols);
    }

    var m = -3.4028235e38;
    for (var j = li; j < visible; j += WG) {
        m = max(m, p.scale * s[base + j]);
    }
    m = reduce_max(m, li);

    var sum = 0.0;
    for (var j = li; j < visible; j += WG) {
        sum += exp(p.scale * s[base + j] - m);
    }
    sum = reduce_sum(sum, li);

    let inv = 1.0 / sum;
    for (var j = li; j < p.cols; j += WG) {
        var w = 0.0;
        if j < visible {
            w = exp(p.scale * s[base + j] - m) * inv;
        }
        s[base + j] = w;
    }
}
