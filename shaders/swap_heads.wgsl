// Swaps the middle two axes of a 4-D array: the rows layout the projections write,
// (batch, tokens, heads, width), becomes the heads-first layout the KV cache and the decode
// kernels keep, (batch, heads, tokens, width), and back:
//
//     dst[((i0·n2 + i2)·n1 + i1)·dw + c] = src[off + i0·s0 + i1·s1 + i2·s2 + c]   (c < w)
//     dst[…, c] = 0                                                                  (w ≤ c < dw)
//
// so each destination row is zero-padded from w to dw values (whole vec4s for the cache's
// texels and the decode kernel's Q rows). The source is addressed through strides (a row of a
// wider buffer, such as one projection of a packed Q|K|V, reads as well); the destination is
// dense. One invocation per destination element, linear 2-D grid of 64-wide workgroups.
//
// The host prepends, from src/kernels/swap_heads.rs: the element-type aliases SRC_T and DST_T
// (f32 or f16; an f16 source widens to f32 and an f32 source rounds to f16 as they are copied),
// shaders/prelude.wgsl and `struct Params`.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<SRC_T>;
@group(0) @binding(2) var<storage, read_write> dst: array<DST_T>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let id = (wg.x + wg.y * nwg.x) * 64u + li;
    if id >= p.total {
        return;
    }
    let c = id % p.dw;
    let row = id / p.dw;
    let i1 = row % p.n1;
    let rest = row / p.n1;
    let i2 = rest % p.n2;
    let i0 = rest / p.n2;
    var v = DST_T(0.0);
    if c < p.w {
        v = DST_T(src[p.off + i0 * p.s0 + i1 * p.s1 + i2 * p.s2 + c]);
    }
    dst[id] = v;
}
