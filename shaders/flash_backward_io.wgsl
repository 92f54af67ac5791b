// The fused backward's inputs, shared by flash_backward_q.wgsl and flash_backward_kv.wgsl
// (appended to each by the kernel registry, src/kernels/mod.rs): Q, K, V and dO bound as
// scalars, or as vec4s with VEC ≠ 0 (the host checks that d_k, d_v and every offset and
// stride of Q, K, V and dO are multiples of 4), and `load4`, which reads 4 values of a row.

@group(0) @binding(1) var<storage, read> q_buf: array<Q_T>; // if !VEC
@group(0) @binding(2) var<storage, read> k_buf: array<KV_T>; // if !VEC
@group(0) @binding(3) var<storage, read> v_buf: array<KV_T>; // if !VEC
@group(0) @binding(4) var<storage, read> do_buf: array<f32>; // if !VEC
@group(0) @binding(1) var<storage, read> q_buf: array<vec4<Q_T>>; // if VEC
@group(0) @binding(2) var<storage, read> k_buf: array<vec4<KV_T>>; // if VEC
@group(0) @binding(3) var<storage, read> v_buf: array<vec4<KV_T>>; // if VEC
@group(0) @binding(4) var<storage, read> do_buf: array<vec4<f32>>; // if VEC

// Values 4c..4c+3 of the row at `base` of Q (which = 0), K (1), V (2) or dO (3), zero past
// `width` or when `inside` is false.
fn load4(which: u32, inside: bool, base: u32, c: u32, width: u32) -> vec4<f32> { // if !VEC
    var x = vec4<f32>(0.0);
    for (var e = 0u; e < 4u; e++) { // unroll
        let col = c * 4u + e;
        if inside && col < width {
            switch which {
                case 0u: { x[e] = f32(q_buf[base + col]); }
                case 1u: { x[e] = f32(k_buf[base + col]); }
                case 2u: { x[e] = f32(v_buf[base + col]); }
                default: { x[e] = do_buf[base + col]; }
            }
        }
    }
    return x;
}

// As the scalar `load4`, for VEC ≠ 0: `base` is a multiple of 4 and a column 4c < width holds
// all of 4c..4c+3 (width is a multiple of 4).
fn load4(which: u32, inside: bool, base: u32, c: u32, width: u32) -> vec4<f32> { // if VEC
    var x = vec4<f32>(0.0);
    if inside && c * 4u < width {
        let at = base / 4u + c;
        switch which {
            case 0u: { x = vec4<f32>(q_buf[at]); }
            case 1u: { x = vec4<f32>(k_buf[at]); }
            case 2u: { x = vec4<f32>(v_buf[at]); }
            default: { x = do_buf[at]; }
        }
    }
    return x;
}
