// The control of divergent-subgroup.bad.wgsl: the shuffle in uniform control flow, its
// result used under the `if`. Tint must accept it.
@group(0) @binding(0) var<storage, read_write> data: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>) {
    var x = data[lid.x];
    let y = subgroupShuffleXor(x, 1u);
    if lid.x % 3u == 0u {
        x += y;
    }
    data[lid.x] = x;
}
