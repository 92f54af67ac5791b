// The gradient of a relative position bias, second pass: the table's gradient
//
//     dT[k, h] = Σ_b Σ_{d : bucket(d) = k} G[b, h, d]
//
// from bias_grad.wgsl's diagonal sums G (`(batch·heads, diags)`) and the bucket of each
// diagonal (`bucket_of`, from the host: T5's bucketing of d = t − (n_q − 1)). One thread per
// (bucket, head), summing in a fixed order: no atomics, the same result on every run.
//
// The host prepends, from src/kernels/bias_grad.rs: shaders/prelude.wgsl and `struct Params`.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> diag: array<f32>;
@group(0) @binding(2) var<storage, read> bucket_of: array<u32>;
@group(0) @binding(3) var<storage, read_write> table: array<f32>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let id = (wg.x + wg.y * nwg.x) * 64u + li;
    if id >= p.buckets * p.heads {
        return;
    }
    let k = id / p.heads;
    let h = id % p.heads;
    var acc = 0.0;
    for (var b = 0u; b < p.batch; b++) {
        let row = (b * p.heads + h) * p.diags;
        for (var t = 0u; t < p.diags; t++) {
            if bucket_of[t] == k {
                acc += diag[row + t];
            }
        }
    }
    table[id] = acc;
}
