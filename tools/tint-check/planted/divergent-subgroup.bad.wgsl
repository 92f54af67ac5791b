// Planted: a subgroup shuffle inside an `if` on local_invocation_id, as a kernel calling the
// crate's `sg_xor4` helper (src/gpu/subgroups.rs) from divergent code would. Tint must reject
// it for uniformity; naga 30 accepts it. The gate's self-test.
@group(0) @binding(0) var<storage, read_write> data: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>) {
    var x = data[lid.x];
    if lid.x % 3u == 0u {
        x += subgroupShuffleXor(x, 1u);
    }
    data[lid.x] = x;
}
