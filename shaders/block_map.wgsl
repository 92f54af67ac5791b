// The block map of a mask modifier, for block sparsity. For each (batch, head) the
// modifier can tell apart, each block of QR query rows and each block of KB keys: whether no
// pair in it is visible (0, empty: the fused kernels skip those keys), every pair is (1,
// full: they skip the modifier there) or some are (2, partial: they evaluate it per pair);
// and per query block the span of keys [lo, hi) from its first to its last block that is
// not empty, in keys (multiples of KB; lo = hi = 0 when none), which bounds the kernels' key
// loops.
//
// "Visible" is what the fused kernels apply: causal (when set) lets the query see the key,
// and `wa_keep` (every mask modifier, and-ed; see src/kernels/mods.rs) says true. Rows past
// n_q and keys past n_kv are not pairs.
//
// One workgroup per query block: thread t evaluates keys k0 + t, k0 + t + WG, … of each key
// block against every row of the query block (adjacent threads, adjacent keys: the same
// code for all lanes), then or-s what it saw into the block's flags in workgroup memory (bit
// 0: a visible pair, bit 1: a hidden one), CHUNK key blocks at a time. Under causal, the key
// blocks right of the query block's last row are empty without a look.
//
// Layout of `blocks`: the states at `(g · nqb + qb) · nkb + kb`, then from `span_base` the
// spans, two words per query block `g · nqb + qb`, over the map's groups `g = b · gh + h`
// (gb or gh is 1 along an axis the modifiers do not read: one map serves every batch or head
// then, and b or h is passed as 0).
//
// The host prepends, from src/kernels/block_map.rs: the constants QR (query rows per block)
// and KB (keys per block), shaders/prelude.wgsl, `struct Params`, generated from the Rust
// uniform of the same fields, and the modifiers' code.

const WG: u32 = 64u;
const CHUNK: u32 = 256u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> blocks: array<u32>;

var<workgroup> flags: array<atomic<u32>, CHUNK>;
var<workgroup> first: atomic<u32>;
var<workgroup> last: atomic<u32>;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let id = wg.x + wg.y * nwg.x;
    if id >= p.query_blocks {
        return;
    }
    let g = id / p.nqb;
    let b = g / p.gh;
    let h = g % p.gh;
    let q0 = (id % p.nqb) * QR;
    let q1 = min(q0 + QR, p.n_q);
    if li == 0u {
        atomicStore(&first, 0xffffffffu);
        atomicStore(&last, 0u);
    }
    for (var c0 = 0u; c0 < p.nkb; c0 += CHUNK) {
        for (var t = li; t < CHUNK; t += WG) {
            atomicStore(&flags[t], 0u);
        }
        workgroupBarrier();
        let c1 = min(c0 + CHUNK, p.nkb);
        for (var kb = c0; kb < c1; kb++) {
            let k0 = kb * KB;
            if p.causal != 0u && k0 >= q1 {
                break;
            }
            let k1 = min(k0 + KB, p.n_kv);
            var f = 0u;
            for (var j = k0 + li; j < k1; j += WG) {
                for (var q = q0; q < q1; q++) {
                    let visible = (p.causal == 0u || j <= q) && wa_keep(b, h, q, j);
                    f |= select(2u, 1u, visible);
                }
            }
            if f != 0u {
                atomicOr(&flags[kb - c0], f);
            }
        }
        workgroupBarrier();
        for (var t = li; t < c1 - c0; t += WG) {
            let f = atomicLoad(&flags[t]);
            // Only visible pairs: full; both kinds: partial; none visible: empty.
            let state = select(select(0u, 1u, f == 1u), 2u, f == 3u);
            blocks[id * p.nkb + c0 + t] = state;
            if state != 0u {
                atomicMin(&first, c0 + t);
                atomicMax(&last, c0 + t + 1u);
            }
        }
        workgroupBarrier();
    }
    if li == 0u {
        let hi = atomicLoad(&last);
        let lo = select(atomicLoad(&first), 0u, hi == 0u);
        blocks[p.span_base + 2u * id] = lo * KB;
        blocks[p.span_base + 2u * id + 1u] = hi * KB;
    }
}
