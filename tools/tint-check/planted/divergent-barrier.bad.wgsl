// Planted: a workgroup barrier inside an `if` on local_invocation_id (divergent control
// flow). Tint must reject it for uniformity; naga 30 accepts it. The gate's self-test.
@group(0) @binding(0) var<storage, read_write> data: array<f32>;
var<workgroup> tile: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>) {
    tile[lid.x] = data[lid.x];
    if lid.x < 32u {
        workgroupBarrier();
        tile[lid.x] += tile[lid.x + 32u];
    }
    data[lid.x] = tile[lid.x];
}
