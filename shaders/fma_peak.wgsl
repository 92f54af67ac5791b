// The adapter's f32 arithmetic ceiling, for `bench`: every invocation runs `iters` rounds of
// eight independent vec4 multiply-adds (64 FLOP per round) with no memory traffic, then
// writes one value so the work cannot be optimized away. FLOP = invocations · iters · 64.
//
// The host prepends, from src/kernels/fma_peak.rs: the constants and element-type aliases
// named there, shaders/prelude.wgsl (NEG, FLOOR, LOG2E, mask_offset, add_bias), and
// `struct Params`, generated from the Rust uniform of the same fields.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let id = (wg.x + wg.y * nwg.x) * 64u + li;
    if id >= p.invocations {
        return;
    }
    let x = f32(id) * 1.0e-9;
    let m = vec4<f32>(0.999999, 0.999998, 0.999997, 0.999996);
    let c = vec4<f32>(x, 1.0e-7, 2.0e-7, 3.0e-7);
    var a0 = vec4<f32>(x);
    var a1 = a0 + 0.1;
    var a2 = a0 + 0.2;
    var a3 = a0 + 0.3;
    var a4 = a0 + 0.4;
    var a5 = a0 + 0.5;
    var a6 = a0 + 0.6;
    var a7 = a0 + 0.7;
    for (var i = 0u; i < p.iters; i++) {
        a0 = fma(a0, m, c);
        a1 = fma(a1, m, c);
        a2 = fma(a2, m, c);
        a3 = fma(a3, m, c);
        a4 = fma(a4, m, c);
        a5 = fma(a5, m, c);
        a6 = fma(a6, m, c);
        a7 = fma(a7, m, c);
    }
    let s = (a0 + a1) + (a2 + a3) + (a4 + a5) + (a6 + a7);
    out[id] = s.x + s.y + s.z + s.w;
}
