// T1: cooperative loads/stores straight from/to storage buffers, one subgroup, no workgroup
// memory and no barrier: checks naga's layout/stride/use lowering on the driver by itself.
// a, b: 16x16 f16 row-major (small integers, exact); c: 4 16x16 f32 blocks:
//   c[0..256)   = A·B      (coopLoadT A, coopLoadT B, coopStoreT)
//   c[256..512) = A·Bᵀ     (coopLoad B: column-major read of row-major B is Bᵀ)
//   c[512..768) = (A·B)ᵀ   (coopStore: column-major write)
//   c[768..1024)= A[:, 0:16 of a 16x32 row]·B with stride 32 (a2 is 16x32 row-major; left half)
enable f16;
enable wgpu_cooperative_matrix;
@group(0) @binding(0) var<storage, read> a: array<f16>;
@group(0) @binding(1) var<storage, read> b: array<f16>;
@group(0) @binding(2) var<storage, read> a2: array<f16>;
@group(0) @binding(3) var<storage, read_write> c: array<f32>;
@compute @workgroup_size(32)
fn main() {
    let am = coopLoadT<coop_mat16x16<f16, A>>(&a[0], 16u);
    let bm = coopLoadT<coop_mat16x16<f16, B>>(&b[0], 16u);
    let r = coopMultiplyAdd(am, bm, coop_mat16x16<f32, C>());
    coopStoreT(r, &c[0], 16u);
    let bt = coopLoad<coop_mat16x16<f16, B>>(&b[0], 16u);
    coopStoreT(coopMultiplyAdd(am, bt, coop_mat16x16<f32, C>()), &c[256], 16u);
    coopStore(r, &c[512], 16u);
    let a2m = coopLoadT<coop_mat16x16<f16, A>>(&a2[0], 32u);
    coopStoreT(coopMultiplyAdd(a2m, bm, coop_mat16x16<f32, C>()), &c[768], 16u);
}
