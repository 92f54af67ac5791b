// Decode, step 1 of 2, for GPUs: as decode_partial.wgsl (same problem, uniform, bindings and
// partial results; decode_combine.wgsl merges them), but no thread keeps a whole Q or output
// row, so registers stay bounded at every head size (decode_partial.wgsl's GC·(DK4 + DV4)
// vec4s per thread spill on a GPU: 83–502 registers on RDNA3).
//
// A workgroup of WG threads takes one key block of GC query rows (rows of one K/V head, as in
// decode_partial.wgsl: g = r·m + i) and walks it in tiles of WG keys:
//
// 1. Scores: thread t computes key t of the tile against all GC rows (its K row staged from
//    the texture through `ko_sh` KU texels at a time, read side by side so that a subgroup's
//    loads cover whole sectors; the rows' scaled Q from workgroup memory, read by every
//    thread alike) and writes them to `s_sh` (NEG where the row may not see the key).
// 2. Output: the head dimension is split over CT = min(DV4, WG) threads and the tile's keys
//    over KG = WG / CT key groups: thread (kg, c) walks keys kg, kg + KG, … of the tile, VU
//    at a time, and keeps, for each row, an online softmax (running max, sum) and output
//    vec4 columns c, c + CT, … (OC of them): GC·(OC + 1) vec4s of registers.
//
// Each step's loads (KU texels of K in 1., VU keys' V in 2.) are issued before the first is
// used, so a thread waits one memory latency per step, not per texel or key: decode reads
// the whole cache once, and what bounds it is how many loads are in flight.
//
// At the end the KG key groups' partials are merged through workgroup memory by the threads of
// key group 0, and written as decode_partial.wgsl writes them.
//
// Modifiers as in decode_partial.wgsl: `wa_score_log2` and `wa_keep` at each
// row's position; keys before `kv0` are in no block.
//
// The host prepends, from src/kernels/decode_partial_gpu.rs: the constants WG, GC, DK4, DV4,
// CT, KG, OC, KU, KP, KS, VU, shaders/prelude.wgsl and `struct Params` (decode_partial.rs's); and appends the
// modifiers' code.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q_buf: array<vec4<f32>>;
@group(0) @binding(2) var k_tex: texture_2d<f32>;
@group(0) @binding(3) var v_tex: texture_2d<f32>;
@group(0) @binding(4) var<storage, read_write> o_part: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> ml_part: array<vec2<f32>>;

var<workgroup> q_sh: array<vec4<f32>, GC * DK4>;
var<workgroup> s_sh: array<f32, GC * WG>;
// The key groups' (max, sum), per row.
var<workgroup> ml_sh: array<vec2<f32>, GC * KG>;
// Two uses, one after the other (KS = the larger): in the key loop, one step's K texels of the
// tile's keys, KP (odd, ≥ KU + 1) vec4s per key, so that a thread's reads of its own key's,
// 4·KP words apart, fall on distinct banks; after it, the key groups' output columns per row
// (GC · KG · DV4). Sharing keeps rows and occupancy where they were before K was staged.
var<workgroup> ko_sh: array<vec4<f32>, KS>;

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
    let b = bh / p.kv_heads;
    let hk = bh % p.kv_heads;
    let g0 = chunk * GC;
    let rows = p.ratio * p.m;

    // The chunk's query rows, scaled (zeros past the last row).
    for (var x = t; x < GC * DK4; x += WG) {
        let g = x / DK4;
        var v = vec4<f32>(0.0);
        if g0 + g < rows {
            let h = hk * p.ratio + (g0 + g) / p.m;
            let row = (b * p.heads + h) * p.m + (g0 + g) % p.m;
            v = q_buf[row * DK4 + x % DK4] * p.scale_log2;
        }
        q_sh[x] = v;
    }

    let kg = t / CT;
    let c0 = t % CT;
    let busy = kg < KG;
    var o: array<vec4<f32>, GC * OC>;
    var m: array<f32, GC>;
    var l: array<f32, GC>;
    for (var g = 0u; g < GC; g++) { // unroll
        m[g] = FLOOR;
    }
    // Blocks start at key kv0: the keys before it are outside every row's window.
    let blk0 = p.kv0 + blk * p.block;
    let kv_end = min(blk0 + p.block, p.len);
    for (var j0 = blk0; j0 < kv_end; j0 += WG) {
        workgroupBarrier();
        // 1. Scores of key j0 + t, KU texels of K (KU divides DK4) per step. The step's
        //    texels of the tile's keys are read side by side (load f of the workgroup: key
        //    f / KU, texel f % KU, so a subgroup's lanes read whole sectors of a key's row),
        //    each thread's KU loads issued before the first is used (one wait per step),
        //    and staged in ko_sh, where thread t reads its own key's.
        let j = j0 + t;
        var s: array<f32, GC>;
        for (var c0 = 0u; c0 < DK4; c0 += KU) {
            var kv: array<vec4<f32>, KU>;
            for (var u = 0u; u < KU; u++) { // unroll
                let f = t + u * WG;
                let jk = j0 + f / KU;
                if jk < kv_end {
                    let r = bh * p.capacity + jk % p.capacity;
                    let kx = (r % p.k_line) * DK4 + c0 + f % KU;
                    kv[u] = textureLoad(k_tex, vec2<i32>(i32(kx), i32(r / p.k_line)), 0);
                }
            }
            for (var u = 0u; u < KU; u++) { // unroll
                let f = t + u * WG;
                ko_sh[(f / KU) * KP + f % KU] = kv[u];
            }
            workgroupBarrier();
            if j < kv_end {
                for (var u = 0u; u < KU; u++) { // unroll
                    let k = ko_sh[t * KP + u];
                    for (var g = 0u; g < GC; g++) { // unroll
                        s[g] += dot(q_sh[g * DK4 + c0 + u], k);
                    }
                }
            }
            workgroupBarrier();
        }
        for (var g = 0u; g < GC; g++) { // unroll
            // Row g is query head h's new row at position `at`; the modifiers (identity
            // stubs without any; see src/kernels/mods.rs) see (b, h, at, j).
            let h = hk * p.ratio + (g0 + g) / p.m;
            let at = p.len - p.m + (g0 + g) % p.m;
            var x = NEG;
            if j < kv_end && g0 + g < rows && j <= at {
                let y = wa_score_log2(s[g], b, h, at, j);
                x = select(NEG, y, wa_keep(b, h, at, j));
            }
            s_sh[g * WG + t] = x;
        }
        workgroupBarrier();
        // 2. Output columns of the keys of this thread's key group, VU keys per step: their
        //    V texels all loaded before the first is used (VU·OC loads in flight, one wait
        //    per step), one rescale per row for the step's largest score.
        if busy {
            for (var jj0 = kg; jj0 < WG && j0 + jj0 < kv_end; jj0 += KG * VU) {
                var v: array<vec4<f32>, VU * OC>;
                for (var u = 0u; u < VU; u++) { // unroll
                    let jj = jj0 + u * KG;
                    let r = bh * p.capacity + (j0 + jj) % p.capacity;
                    let vy = i32(r / p.v_line);
                    let vx = (r % p.v_line) * DV4;
                    for (var k = 0u; k < OC; k++) { // unroll
                        let c = c0 + CT * k;
                        if jj < WG && j0 + jj < kv_end && c < DV4 {
                            v[u * OC + k] = textureLoad(v_tex, vec2<i32>(i32(vx + c), vy), 0);
                        }
                    }
                }
                for (var g = 0u; g < GC; g++) { // unroll
                    var x: array<f32, VU>;
                    var mx = m[g];
                    for (var u = 0u; u < VU; u++) { // unroll
                        let jj = jj0 + u * KG;
                        x[u] = NEG;
                        if jj < WG && j0 + jj < kv_end {
                            x[u] = s_sh[g * WG + jj];
                        }
                        mx = max(mx, x[u]);
                    }
                    if mx > m[g] {
                        let corr = exp2(m[g] - mx);
                        l[g] *= corr;
                        for (var k = 0u; k < OC; k++) { // unroll
                            o[g * OC + k] *= corr;
                        }
                        m[g] = mx;
                    }
                    for (var u = 0u; u < VU; u++) { // unroll
                        let w = exp2(x[u] - m[g]);
                        l[g] += w;
                        for (var k = 0u; k < OC; k++) { // unroll
                            o[g * OC + k] += w * v[u * OC + k];
                        }
                    }
                }
            }
        }
    }

    // Merge the key groups: each writes its partials, key group 0 adds them up.
    if busy {
        for (var g = 0u; g < GC; g++) { // unroll
            if c0 == 0u {
                ml_sh[g * KG + kg] = vec2<f32>(m[g], l[g]);
            }
            for (var k = 0u; k < OC; k++) { // unroll
                let c = c0 + CT * k;
                if c < DV4 {
                    ko_sh[(g * KG + kg) * DV4 + c] = o[g * OC + k];
                }
            }
        }
    }
    workgroupBarrier();
    if kg == 0u {
        for (var g = 0u; g < GC; g++) {
            if g0 + g < rows {
                var mx = FLOOR;
                for (var e = 0u; e < KG; e++) {
                    mx = max(mx, ml_sh[g * KG + e].x);
                }
                var sum = 0.0;
                for (var e = 0u; e < KG; e++) {
                    let ml = ml_sh[g * KG + e];
                    sum += ml.y * exp2(ml.x - mx);
                }
                let h = hk * p.ratio + (g0 + g) / p.m;
                let slot = ((b * p.heads + h) * p.m + (g0 + g) % p.m) * p.blocks + blk;
                for (var k = 0u; k < OC; k++) { // unroll
                    let c = c0 + CT * k;
                    if c < DV4 {
                        var acc = vec4<f32>(0.0);
                        for (var e = 0u; e < KG; e++) {
                            acc += ko_sh[(g * KG + e) * DV4 + c] * exp2(ml_sh[g * KG + e].x - mx);
                        }
                        o_part[slot * DV4 + c] = acc;
                    }
                }
                if c0 == 0u {
                    ml_part[slot] = vec2<f32>(mx, sum);
                }
            }
        }
    }
}
