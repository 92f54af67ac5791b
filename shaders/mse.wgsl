// The mean squared error between an output O and a target T (f32, p.count elements), and its
// gradient, on the device:
//
//     dO[i] = p.scale · (O[i] − T[i])          (scale = 2 / N for the mean)
//     partial[w] = Σ_{i in workgroup w} (O[i] − T[i])²
//
// The host sums the per-workgroup partials (a few floats) and divides by N only when it reads
// the loss, so a training loop reads nothing back on the steps it does not report. One
// invocation per element, 256 per workgroup, a tree reduction in workgroup memory; linear 2-D
// grid.
//
// The host prepends, from src/kernels/mse.rs: shaders/prelude.wgsl and `struct Params`.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> o: array<f32>;
@group(0) @binding(2) var<storage, read> t: array<f32>;
@group(0) @binding(3) var<storage, read_write> d_o: array<f32>;
@group(0) @binding(4) var<storage, read_write> partial: array<f32>;

var<workgroup> sums: array<f32, 256>;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let group = wg.x + wg.y * nwg.x;
    let i = group * 256u + li;
    var sq = 0.0;
    if i < p.count {
        let diff = o[i] - t[i];
        d_o[i] = p.scale * diff;
        sq = diff * diff;
    }
    sums[li] = sq;
    workgroupBarrier();
    for (var stride = 128u; stride > 0u; stride = stride / 2u) {
        if li < stride {
            sums[li] = sums[li] + sums[li + stride];
        }
        workgroupBarrier();
    }
    if li == 0u && group < p.groups {
        partial[group] = sums[0];
    }
}
