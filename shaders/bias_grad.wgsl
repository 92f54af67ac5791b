// The gradient of a relative position bias (T5's learned `(buckets, heads)` table, a score
// modifier preset), first pass: for every (batch, head) and every diagonal d = j − i of the
// score matrix, the sum of the bias's incoming gradient along that diagonal,
//
//     G[b, h, d] = Σ_i dS_i,i+d · tail'(i, i+d)
//     dS_ij      = P_ij · (dO_i·v_j − D_i),  P_ij = exp2(s_ij − lse_i)
//
// where s_ij is the forward's score (the score modifiers on scale·q_i·k_j, the mask's bias,
// the mask modifiers) and tail' the derivative of the score modifiers that come after the
// bias (`wa_table_grad`, src/modifiers/mod.rs; 1 when the bias is the last). Every pair of
// one diagonal has one distance, hence one bucket: bias_grad_reduce.wgsl then sums the
// diagonals of each bucket. No float atomics (WGSL has none): each thread owns one diagonal
// and writes its sum once, and the reduction is a pass of its own, so the result is the same
// on every run.
//
// One thread per diagonal, 64 diagonals per workgroup, `p.blocks` workgroups per (batch,
// head); diagonal t is d = t − (n_q − 1), from −(n_q − 1) to n_kv − 1. Each thread walks its
// diagonal's rows, recomputing q_i·k_j and dO_i·v_j (the dQ and dK/dV kernels never hold a
// whole diagonal). lse_i and D_i as the dQ kernel reads them (flash_backward_q.wgsl). Causal:
// diagonals above the main one are 0.
//
// The host prepends, from src/kernels/bias_grad.rs: the constants MASK (1 when a mask is
// bound) and DK, DV (the head widths, so that the `// unroll` loops over them are unrolled:
// lavapipe's loop cap then counts one iteration per row), the element types Q_T and KV_T,
// shaders/prelude.wgsl, and the `struct Params` of the fused forward (flash_tiled.rs),
// `blocks` being workgroups per (batch, head); it appends
// the modifiers (src/kernels/mods.rs).

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q_buf: array<Q_T>;
@group(0) @binding(2) var<storage, read> k_buf: array<KV_T>;
@group(0) @binding(3) var<storage, read> v_buf: array<KV_T>;
@group(0) @binding(4) var<storage, read> do_buf: array<f32>;
@group(0) @binding(5) var<storage, read> stats: array<f32>;
@group(0) @binding(6) var<storage, read_write> diag: array<f32>;
@group(0) @binding(7) var<storage, read> mask: array<f32>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let id = wg.x + wg.y * nwg.x;
    if id >= p.groups * p.blocks {
        return;
    }
    let g = id / p.blocks;
    let t = (id % p.blocks) * 64u + li;
    let diags = p.n_q + p.n_kv - 1u;
    if t >= diags {
        return;
    }
    let b = g / p.heads;
    let h = g % p.heads;
    let hk = h / p.kv_ratio;
    let rows = p.groups * p.n_q;
    // Rows i with 0 ≤ i < n_q and 0 ≤ i + d < n_kv, d = t − (n_q − 1): i + d = i + t + 1 − n_q.
    let first = select(0u, p.n_q - 1u - t, t < p.n_q - 1u);
    var last = min(p.n_q, p.n_kv + p.n_q - 1u - t);
    if p.causal != 0u && t > p.n_q - 1u {
        last = first;
    }
    var acc = 0.0;
    for (var i = first; i < last; i++) {
        let j = i + t + 1u - p.n_q;
        let q_base = p.q_off + b * p.q_batch + h * p.q_head + i * p.q_row;
        let o_base = p.o_off + b * p.o_batch + h * p.o_head + i * p.o_row;
        let k_base = p.k_off + b * p.k_batch + hk * p.k_head + j * p.k_row;
        let v_base = p.v_off + b * p.v_batch + hk * p.v_head + j * p.v_row;
        var qk = 0.0;
        for (var c = 0u; c < DK; c++) { // unroll
            qk = fma(f32(q_buf[q_base + c]), f32(k_buf[k_base + c]), qk);
        }
        // As the forward (in the log2 domain): the score modifiers on the scaled score, the
        // bias, then the mask modifiers.
        let raw = qk * p.scale_log2;
        var x = wa_score_log2(raw, b, h, i, j);
        if MASK != 0u {
            x = add_bias(x, mask[mask_offset(p.mask, b, h, i, j)], LOG2E);
        }
        x = select(NEG, x, wa_keep(b, h, i, j));
        let lse = stats[g * p.n_q + i];
        let pr = select(exp2(x - lse), 0.0, x == NEG);
        if !(pr == 0.0) {
            var dp = 0.0;
            for (var c = 0u; c < DV; c++) { // unroll
                dp = fma(do_buf[o_base + c], f32(v_buf[v_base + c]), dp);
            }
            let d_i = stats[rows + g * p.n_q + i];
            acc += pr * (dp - d_i) * wa_table_grad(raw / LOG2E, b, h, i, j);
        }
    }
    diag[g * diags + t] = acc;
}
