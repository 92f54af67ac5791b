// One Adam step (Kingma & Ba, with AdamW's decoupled weight decay) on a parameter held on
// the device, in place, with its moments m and v beside it (f32, same length):
//
//     m ← β1·m + (1 − β1)·g          v ← β2·v + (1 − β2)·g²
//     w ← w − lr·λ·w − lr · (m / c1) / (sqrt(v / c2) + ε)
//
// where c1 = 1 − β1^t and c2 = 1 − β2^t are the bias corrections of step t (the host computes
// them per step) and λ the weight decay (0: plain Adam). The parameter is P_T (f32, or f16
// for an f16 layer); with MASTER = 1 an f32 master copy of it is updated (mixed precision: the
// f16 weight is the master rounded, so steps smaller than f16's spacing still add up), else
// the parameter itself is the master and `master` is a stand-in left untouched. With
// MIRROR = 1 the new value is also written into a second buffer, at the strided place a packed
// copy keeps it (a layer's W_Q | W_K | W_V in one weight): element i = (r, c) of a parameter
// `cols` wide goes to mirror[mirror_off + r·mirror_row + c], the same P_T value as `param`;
// else `mirror` is a stand-in left untouched. One invocation per element, 256 per workgroup,
// linear 2-D grid; any length.
//
// The host prepends, from src/kernels/adam.rs: MASTER, MIRROR, the alias P_T,
// shaders/prelude.wgsl and `struct Params`.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> grad: array<f32>;
@group(0) @binding(2) var<storage, read_write> param: array<P_T>;
@group(0) @binding(3) var<storage, read_write> m: array<f32>;
@group(0) @binding(4) var<storage, read_write> v: array<f32>;
@group(0) @binding(5) var<storage, read_write> master: array<f32>;
@group(0) @binding(6) var<storage, read_write> mirror: array<P_T>;

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
    let g = grad[i];
    let mi = p.beta1 * m[i] + (1.0 - p.beta1) * g;
    let vi = p.beta2 * v[i] + (1.0 - p.beta2) * (g * g);
    m[i] = mi;
    v[i] = vi;
    var w: f32;
    if MASTER == 1u {
        w = master[i];
    } else {
        w = f32(param[i]);
    }
    w = w - p.lr * p.weight_decay * w;
    w = w - p.lr * (mi / p.c1) / (sqrt(vi / p.c2) + p.eps);
    if MASTER == 1u {
        master[i] = w;
    }
    param[i] = P_T(w);
    if MIRROR == 1u {
        mirror[p.mirror_off + (i / p.cols) * p.mirror_row + i % p.cols] = P_T(w);
    }
}
