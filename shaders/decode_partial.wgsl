// Decode, step 1 of 2 (flash-decoding): new query rows against one block of a KV cache.
//
// For every (batch b, K/V head hk, chunk of GC query rows, key block) one workgroup computes,
// per query row, over the keys j of its block that the row may see:
//
//     m = max_j s_j,   l = Σ_j exp2(s_j − m),   o = Σ_j exp2(s_j − m) · v_j,
//     s_j = scale · log2(e) · q·k_j          (log2 e folded into the scale: exp2, not exp)
//
// and writes o (not yet divided by l) and (m, l); decode_combine.wgsl merges the blocks. So a
// single query row is still spread over batch · kv_heads · blocks workgroups.
//
// Rows: the GC rows of a chunk are rows g of the ratio · m rows that share K/V head hk (the
// query heads hk·ratio … hk·ratio + ratio − 1, grouped-query attention, each with m new rows),
// g = r·m + i for query head hk·ratio + r and new row i; each K and V row is read once for all
// of them. Causal, aligned to the end (PyTorch's bottom-right alignment): new row i is at
// position len − m + i and sees keys j ≤ len − m + i.
//
// Inside the block, thread t takes a run of consecutive keys and keeps its own online softmax in
// registers (the chunk's rows of Q, scaled; per row a running max, sum and output): no
// workgroup memory and no barrier per key. At the end the WG threads' partials are merged
// pairwise through workgroup memory, one row at a time (log2 WG rounds).
//
// Cache layout (src/decode/cache.rs): K and V are textures (rgba32float or rgba16float: read
// as vec4<f32> either way), one texel per 4 values. Cache row r = (b·kv_heads + hk)·capacity
// + t (head-major; token j at t = j mod capacity, which a rolling cache wraps) of K is texels (r mod k_line)·DK4 + c, c < DK4, of line r / k_line (V alike
// with DV4 and v_line): rows never straddle lines, and a workgroup's keys are one contiguous
// range. (Texel fetches are several times cheaper than storage-buffer loads on lavapipe.)
//
// Modifiers: each score goes through `wa_score_log2` and `wa_keep` at the row's
// position; keys before `kv0` (outside every row's window) are not in any block.
//
// The host prepends, from src/kernels/decode_partial.rs: the constants WG, GC, DK4, DV4,
// shaders/prelude.wgsl and `struct Params`; and appends the modifiers' code. All arithmetic
// is f32.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q_buf: array<vec4<f32>>;
@group(0) @binding(2) var k_tex: texture_2d<f32>;
@group(0) @binding(3) var v_tex: texture_2d<f32>;
@group(0) @binding(4) var<storage, read_write> o_part: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> ml_part: array<vec2<f32>>;

// One row's partials of every thread: (max, sum) and the output.
var<workgroup> ml_sh: array<vec2<f32>, WG>;
var<workgroup> o_sh: array<vec4<f32>, WG * DV4>;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let id = wg.x + wg.y * nwg.x;
    if id >= p.workgroups {
        return;
    }
    let blk = id % p.blocks;
    let rest = id / p.blocks;
    let chunk = rest % p.chunks;
    let bh = rest / p.chunks;
    // bh = b · kv_heads + hk.
    let b = bh / p.kv_heads;
    let hk = bh % p.kv_heads;
    let g0 = chunk * GC;
    let rows = p.ratio * p.m;

    // The chunk's query rows, scaled (zeros past the last row); each row's output index.
    var q: array<vec4<f32>, GC * DK4>;
    var out_row: array<u32, GC>;
    for (var g = 0u; g < GC; g++) { // unroll
        if g0 + g < rows {
            let h = hk * p.ratio + (g0 + g) / p.m;
            out_row[g] = (b * p.heads + h) * p.m + (g0 + g) % p.m;
            for (var c = 0u; c < DK4; c++) { // unroll
                q[g * DK4 + c] = q_buf[out_row[g] * DK4 + c] * p.scale_log2;
            }
        }
    }

    // Blocks start at key kv0: the keys before it are outside every row's window.
    let blk0 = p.kv0 + blk * p.block;
    let kv_end = min(blk0 + p.block, p.len);
    var o: array<vec4<f32>, GC * DV4>;
    var m: array<f32, GC>;
    var l: array<f32, GC>;
    for (var g = 0u; g < GC; g++) { // unroll
        m[g] = FLOOR;
    }
    // Thread t walks its own run of consecutive keys: each thread streams one contiguous range
    // of K and V (what CPU adapters such as lavapipe, which run a subgroup's lanes as one SIMD
    // loop, prefetch well).
    let span = (kv_end - blk0 + WG - 1u) / WG;
    let j_lo = blk0 + t * span;
    let j_hi = min(j_lo + span, kv_end);
    for (var j = j_lo; j < j_hi; j++) {
        let r = bh * p.capacity + j % p.capacity;
        let ky = i32(r / p.k_line);
        let kx = (r % p.k_line) * DK4;
        var s: array<f32, GC>;
        for (var c = 0u; c < DK4; c++) { // unroll
            let kv = textureLoad(k_tex, vec2<i32>(i32(kx + c), ky), 0);
            for (var g = 0u; g < GC; g++) { // unroll
                s[g] += dot(q[g * DK4 + c], kv);
            }
        }
        let vy = i32(r / p.v_line);
        let vx = (r % p.v_line) * DV4;
        var v: array<vec4<f32>, DV4>;
        for (var c = 0u; c < DV4; c++) { // unroll
            v[c] = textureLoad(v_tex, vec2<i32>(i32(vx + c), vy), 0);
        }
        for (var g = 0u; g < GC; g++) { // unroll
            // Row g is query head h's new row at position `at`; the modifiers (identity
            // stubs without any; see src/kernels/mods.rs) see (b, h, at, j).
            let h = hk * p.ratio + (g0 + g) / p.m;
            let at = p.len - p.m + (g0 + g) % p.m;
            var x = NEG;
            if g0 + g < rows && j <= at {
                let y = wa_score_log2(s[g], b, h, at, j);
                x = select(NEG, y, wa_keep(b, h, at, j));
            }
            // A new running max (rare after the first keys): rescale what is summed so far.
            if x > m[g] {
                let corr = exp2(m[g] - x);
                l[g] *= corr;
                for (var c = 0u; c < DV4; c++) { // unroll
                    o[g * DV4 + c] *= corr;
                }
                m[g] = x;
            }
            let w = exp2(x - m[g]);
            l[g] += w;
            for (var c = 0u; c < DV4; c++) { // unroll
                o[g * DV4 + c] += w * v[c];
            }
        }
    }

    // Merge the threads' partials, row by row: after the round of span s, thread t (a multiple
    // of 2s) holds the merge of threads t … t + 2s − 1.
    for (var g = 0u; g < GC; g++) { // unroll
        ml_sh[t] = vec2<f32>(m[g], l[g]);
        for (var c = 0u; c < DV4; c++) { // unroll
            o_sh[t * DV4 + c] = o[g * DV4 + c];
        }
        workgroupBarrier();
        for (var span = 1u; span < WG; span *= 2u) {
            if t % (2u * span) == 0u && t + span < WG {
                let a = ml_sh[t];
                let z = ml_sh[t + span];
                let mx = max(a.x, z.x);
                let wa = exp2(a.x - mx);
                let wz = exp2(z.x - mx);
                ml_sh[t] = vec2<f32>(mx, a.y * wa + z.y * wz);
                for (var c = 0u; c < DV4; c++) { // unroll
                    o_sh[t * DV4 + c] = o_sh[t * DV4 + c] * wa + o_sh[(t + span) * DV4 + c] * wz;
                }
            }
            workgroupBarrier();
        }
        if g0 + g < rows {
            let slot = out_row[g] * p.blocks + blk;
            for (var c = t; c < DV4; c += WG) {
                o_part[slot * DV4 + c] = o_sh[c];
            }
            if t == 0u {
                ml_part[slot] = ml_sh[0];
            }
        }
        workgroupBarrier();
    }
}
