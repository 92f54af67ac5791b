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
// g = r·m + i for query head hk·ratio + r and new row i; K and V are read once for all of them.
// Causal, aligned to the end (PyTorch's bottom-right alignment): new row i is at position
// len − m + i and sees keys j ≤ len − m + i.
//
// Inside the block, keys go in tiles of WG (one key per thread) with an online softmax:
// 1. thread t: the scores of key j0 + t against the chunk's rows (Q in workgroup memory);
// 2. thread g < GC: row g's tile max, the running max and its correction, exp2(s − m);
// 3. thread (column c, key lane kp): o_g[c] += Σ p_g,j · v_j[c] over the tile's keys j ≡ kp
//    (mod KP), the head dimension spread over CW threads, the keys over KP lanes;
// the KP lanes' partial outputs are summed through workgroup memory at the end.
//
// Cache layout (src/decode/cache.rs): token-major, element (t, b, hk, c) of K at
// t·k_tok + (b·kv_heads + hk)·DK4 + c in vec4s, rows padded with zeros to whole vec4s.
//
// The host prepends, from src/kernels/decode_partial.rs: the constants WG, GC, DK4, DV4, CW,
// KP, OC (CW = min(DV4, WG) threads across the head dimension, KP = WG / CW key lanes,
// OC = ⌈DV4 / CW⌉ vec4 columns per thread), the element-type alias KV_T (f32 or f16; all
// arithmetic is f32), shaders/prelude.wgsl and `struct Params`.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q_buf: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> k_buf: array<vec4<KV_T>>;
@group(0) @binding(3) var<storage, read> v_buf: array<vec4<KV_T>>;
@group(0) @binding(4) var<storage, read_write> o_part: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> ml_part: array<vec2<f32>>;

var<workgroup> q_sh: array<vec4<f32>, GC * DK4>;
var<workgroup> s_sh: array<f32, GC * WG>;
var<workgroup> corr_sh: array<f32, GC>;
var<workgroup> o_sh: array<vec4<f32>, KP * GC * DV4>;

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

    // The chunk's query rows into workgroup memory (zeros past the last row).
    for (var x = t; x < GC * DK4; x += WG) {
        let g = g0 + x / DK4;
        var q = vec4<f32>(0.0);
        if g < rows {
            let h = hk * p.ratio + g / p.m;
            q = q_buf[((b * p.heads + h) * p.m + g % p.m) * DK4 + x % DK4];
        }
        q_sh[x] = q;
    }
    workgroupBarrier();

    let j_begin = blk * p.block;
    let kv_end = min(j_begin + p.block, p.len);
    let k_base = bh * DK4;
    let v_base = bh * DV4;
    let c0 = t % CW;
    let kp = t / CW;

    var m_run = FLOOR;
    var l_run = 0.0;
    var acc: array<vec4<f32>, GC * OC>;

    for (var j0 = j_begin; j0 < kv_end; j0 += WG) {
        // 1. Scores of key j0 + t.
        let j = j0 + t;
        var sc: array<f32, GC>;
        if j < kv_end {
            let kr = j * p.k_tok + k_base;
            for (var c = 0u; c < DK4; c++) {
                let kv = vec4<f32>(k_buf[kr + c]);
                for (var g = 0u; g < GC; g++) { // unroll
                    sc[g] += dot(q_sh[g * DK4 + c], kv);
                }
            }
        }
        for (var g = 0u; g < GC; g++) { // unroll
            let row = g0 + g;
            let visible = j < kv_end && row < rows && j + p.m <= p.len + row % p.m;
            s_sh[g * WG + t] = select(NEG, sc[g] * p.scale_log2, visible);
        }
        workgroupBarrier();

        // 2. Row t's running max, correction and weights.
        if t < GC {
            var mt = NEG;
            for (var x = 0u; x < WG; x++) {
                mt = max(mt, s_sh[t * WG + x]);
            }
            let m_new = max(m_run, mt);
            let corr = exp2(m_run - m_new);
            var sum = 0.0;
            for (var x = 0u; x < WG; x++) {
                let e = exp2(s_sh[t * WG + x] - m_new);
                s_sh[t * WG + x] = e;
                sum += e;
            }
            l_run = l_run * corr + sum;
            m_run = m_new;
            corr_sh[t] = corr;
        }
        workgroupBarrier();

        // 3. O += P·V over this lane's keys of the tile.
        if kp < KP {
            for (var g = 0u; g < GC; g++) { // unroll
                for (var k = 0u; k < OC; k++) { // unroll
                    acc[g * OC + k] *= corr_sh[g];
                }
            }
            let count = min(WG, kv_end - j0);
            for (var x = kp; x < count; x += KP) {
                let vr = (j0 + x) * p.v_tok + v_base;
                for (var k = 0u; k < OC; k++) { // unroll
                    let c = c0 + k * CW;
                    if c < DV4 {
                        let v = vec4<f32>(v_buf[vr + c]);
                        for (var g = 0u; g < GC; g++) { // unroll
                            acc[g * OC + k] += s_sh[g * WG + x] * v;
                        }
                    }
                }
            }
        }
        workgroupBarrier();
    }

    // The KP lanes' partial outputs, summed.
    if kp < KP {
        for (var g = 0u; g < GC; g++) { // unroll
            for (var k = 0u; k < OC; k++) { // unroll
                let c = c0 + k * CW;
                if c < DV4 {
                    o_sh[(kp * GC + g) * DV4 + c] = acc[g * OC + k];
                }
            }
        }
    }
    workgroupBarrier();
    for (var x = t; x < GC * DV4; x += WG) {
        let g = g0 + x / DV4;
        if g < rows {
            var o = vec4<f32>(0.0);
            for (var lane = 0u; lane < KP; lane++) {
                o += o_sh[lane * GC * DV4 + x];
            }
            let h = hk * p.ratio + g / p.m;
            let row = (b * p.heads + h) * p.m + g % p.m;
            o_part[(row * p.blocks + blk) * DV4 + x % DV4] = o;
        }
    }
    if t < GC && g0 + t < rows {
        let g = g0 + t;
        let h = hk * p.ratio + g / p.m;
        let row = (b * p.heads + h) * p.m + g % p.m;
        ml_part[row * p.blocks + blk] = vec2<f32>(m_run, l_run);
    }
}
