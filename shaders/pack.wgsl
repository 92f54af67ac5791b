// Copies per-group matrices out of a storage buffer into an rgba32float texture (rgba16float
// when TEX_T is f16: the host rewrites the format, src/kernels/pack.rs) for the
// subgroup kernels (flash_subgroup.wgsl, matmul_subgroup.wgsl), zero-padding each row to a
// multiple of 4 values:
//
//     row j of group g, values 4c..4c+3  →  texel ((j & mask)·D4 + c, g·rows + (j >> shift))
//
// (2^shift rows side by side per texture row, so long sequences fit the texture limits).
// Element (j, col) of group g = (batch index b, head h) is src[off + b·batch + h·head +
// j·row + col·col_stride], so a transposed operand packs as well. One invocation per texel,
// linear 2-D grid of 64-wide workgroups. The host prepends `alias SRC_T` (f32 or f16) and
// `alias TEX_T` (the texels' type: an f16 operand's values go into half-float texels as they
// are, or widened into the f32 texture a layer's weight was first packed into).
//
// The host prepends, from src/kernels/pack.rs: the constants and element-type aliases
// named there, shaders/prelude.wgsl (NEG, FLOOR, LOG2E, mask_offset, add_bias), and
// `struct Params`, generated from the Rust uniform of the same fields.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<SRC_T>;
@group(0) @binding(2) var dst: texture_storage_2d<rgba32float, write>;
// The same buffer seen as vec4s: with `aligned` (unit column stride, every offset and stride
// and the width multiples of 4) a texel is one load instead of four.
@group(0) @binding(3) var<storage, read> src4: array<vec4<SRC_T>>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let id = (wg.x + wg.y * nwg.x) * 64u + li;
    if id >= p.groups * p.n * p.d4 {
        return;
    }
    let c = id % p.d4;
    let t = id / p.d4;
    let j = t % p.n;
    let g = t / p.n;
    let base = p.off + (g / p.heads) * p.batch + (g % p.heads) * p.head + j * p.row;
    var v = vec4<f32>(0.0);
    if p.aligned != 0u {
        v = vec4<f32>(src4[base / 4u + c]);
    } else {
        for (var e = 0u; e < 4u; e++) {
            let col = c * 4u + e;
            if col < p.width {
                v[e] = f32(src[base + col * p.col]);
            }
        }
    }
    let mask = (1u << p.shift) - 1u;
    textureStore(dst, vec2<u32>((j & mask) * p.d4 + c, g * p.rows + (j >> p.shift)), v);
}
