// The control of divergent-barrier.bad.wgsl: the same code with the barrier in uniform
// control flow. Tint must accept it (so the planted file fails for its barrier alone).
@group(0) @binding(0) var<storage, read_write> data: array<f32>;
var<workgroup> tile: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>) {
    tile[lid.x] = data[lid.x];
    workgroupBarrier();
    if lid.x < 32u {
        tile[lid.x] += tile[lid.x + 32u];
    }
    data[lid.x] = tile[lid.x];
}
