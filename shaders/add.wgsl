// y[i] += x[i] for i < p.count, in f32: the parameter-free layer's dX = dQ + dK + dV on the
// device (the tensor form of its backward), added in the order the host adds them, so the
// result is the array backward's bit for bit. One invocation per element, 256 per
// workgroup, linear 2-D grid.
//
// The host prepends, from src/kernels/add.rs: shaders/prelude.wgsl and `struct Params`.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let i = (wg.x + wg.y * nwg.x) * 256u + li;
    if i >= p.count {
        return;
    }
    y[i] = y[i] + x[i];
}
