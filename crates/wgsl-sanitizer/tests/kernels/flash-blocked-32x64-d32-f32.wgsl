// runtime checks: off
alias Q_T = f32;
alias KV_T = f32;
alias H_T = f32;
const BR: u32 = 32u;
const BC: u32 = 64u;
const WG: u32 = 128u;
const DK4: u32 = 8u;
const DV4: u32 = 8u;
const DC4: u32 = 8u;
const VC: u32 = 64u;
const OC: u32 = 1u;
const MASK: u32 = 0u;
const SKIP_ZERO: u32 = 0u;
const LSE: u32 = 0u;
const SPLIT: u32 = 0u;
const DBUF: u32 = 0u;
const SGR: u32 = 0u;
const HMUL: u32 = 0u;
const VEC: u32 = 1u;
const QRES: u32 = 0u;
// Shared by every kernel: the host prepends this file (after the constants and element-type
// aliases, before the generated `struct Params`), so each helper is written once.

// A score masked out, and where a running max starts: exp(NEG − m) and exp2(NEG − m) are
// exactly 0 for every m ≥ FLOOR, and never NaN (unlike −∞ − −∞).
const NEG: f32 = -3.0e38;
const FLOOR: f32 = -1.0e38;
// The log-sum-exp a fused forward saves for a row with nothing to attend to: exp2(s − LSE_EMPTY)
// is exactly 0 for every score s, so such a row gets zero probabilities in the backward pass.
const LSE_EMPTY: f32 = 3.0e38;
// Scores in the log2 domain (exp2 instead of exp) are the natural-log ones times LOG2E.
const LOG2E: f32 = 1.4426950408889634;

// Index of a mask's element for (batch b, head h, query i, key j), through its element
// strides `s` over those four axes (0 along broadcast axes, so a broadcast mask is never
// expanded in memory).
fn mask_offset(s: vec4<u32>, b: u32, h: u32, i: u32, j: u32) -> u32 {
    return b * s.x + h * s.y + i * s.z + j * s.w;
}

// Score `x` with a mask's `bias` added in units of `unit` (1.0 for natural-log scores, LOG2E
// in the log2 domain); NEG where the bias marks the key masked out (the host stores f32::MIN
// there, and clamps finite biases to -1e37).
fn add_bias(x: f32, bias: f32, unit: f32) -> f32 {
    return select(x + bias * unit, NEG, bias < FLOOR);
}
struct Params {
    n_q: u32,
    n_kv: u32,
    heads: u32,
    groups: u32,
    blocks: u32,
    causal: u32,
    dk_h: u32,
    dv_h: u32,
    q_off: u32,
    q_batch: u32,
    q_head: u32,
    q_row: u32,
    o_off: u32,
    o_batch: u32,
    o_head: u32,
    o_row: u32,
    k_off: u32,
    k_batch: u32,
    k_head: u32,
    k_row: u32,
    v_off: u32,
    v_batch: u32,
    v_head: u32,
    v_row: u32,
    k_shift: u32,
    k_rows: u32,
    v_shift: u32,
    v_rows: u32,
    scale_log2: f32,
    kv_ratio: u32,
    splits: u32,
    split_keys: u32,
    mask: vec4<u32>,
}
// Fused attention for GPUs (FlashAttention-2's loop order), from storage buffers:
// runtime checks: off (every index below is proven in bounds: see "Bounds" at the end)
//
//     o_i = Σ_j exp(s_ij − m_i) · v_j / Σ_j exp(s_ij − m_i),   s_ij = scale · q_i·k_j + bias_ij
//
// A workgroup of WG = (BR/4)·(BC/4) threads owns BR query rows of one (batch, head) and walks
// the keys in tiles of BC. Thread (ty, tx) (TY = BR/4, TX = BC/4) owns rows ty + TY·r (r < 4:
// the row groups of one subgroup read neighbouring rows) and, of each key tile, keys 4tx + e
// (e < 4). Every operand a thread reads from workgroup memory serves 4 multiply-adds or
// more, and its address is one add (a base kept in a register + a constant offset):
//
// 1. S = Q·Kᵀ for its 4×4 block, in registers: Q and K stream through workgroup memory in
//    chunks of DC4 vec4 columns (Q is read again for every key tile, from the cache; this keeps
//    workgroup memory independent of the head size). Q is pre-scaled by scale·log2 e as it is
//    staged. A chunk's K rows are permuted (row tx + TX·e holds key 4tx + e) so that
//    neighbouring threads read neighbouring rows, in other banks. Per chunk column: 4 + 4 vec4
//    loads, 16 dot products (64 multiply-adds).
// 2. Causal, the key range, mask bias and modifiers; each thread's row maxima go through
//    workgroup memory (`red`), every thread reads its rows' TX partial maxima and computes the
//    same new running max m and correction exp2(m_old − m_new) itself.
// 3. P = exp2(S − m) into workgroup memory (`p_sh`, one vec4 of 4 neighbouring keys per row,
//    rows padded by a vec4 against bank conflicts); each thread keeps partial row sums of its
//    own keys, rescaled like the output and added up across threads once at the end.
// 4. O += P·V: the thread's 4 rows × OC vec4 columns (tx + TX·k, so the head dimension is
//    split across the TX threads of a row group and registers stay bounded for d = 256); V
//    streams through workgroup memory in chunks of VC keys. Per 4 keys: 4 + 4·OC vec4 loads,
//    16·OC vector fma (64·OC multiply-adds).
//
// Inner-loop variants (constants, each off keeps the plain loop above):
// - DBUF ≠ 0: two chunk buffers; the next Q/K chunk (after the last one: the tile's first V
//   chunk; after the last V chunk: the next tile's first Q/K chunk) is staged into one while
//   the other is used, so each chunk costs one barrier instead of two (plus one per tile
//   before P·V reads `p_sh`).
// - SGR ≠ 0 (the host checks Features::SUBGROUP, TX a power of 2, every subgroup size the
//   adapter may use ≥ TX and dividing WG): threads are numbered by `rank` (lane + the sizes
//   of the subgroups ranked before), so a row group's TX threads are TX aligned lanes of
//   one subgroup, and the row maxima and sums are reduced by subgroupShuffleXor butterflies
//   (identical in every lane) instead of going through `red`.
// - HMUL ≠ 0 (f16 operands, SHADER_F16): H_T = f16, so the chunks and P sit in workgroup
//   memory as vec4<f16> (half the bytes and wavefronts); Q·Kᵀ and P·V widen their f16
//   operands to f32 as they read them (`widen`: exact products, f32 sums: each V vec4
//   widened once serves 4 rows), and scores, m, l and O accumulate in f32. Without HMUL,
//   `widen` and `narrow` are no conversion at all.
// - VEC ≠ 0 (the host checks that d_k, d_v and every offset and stride of Q, K, V and the
//   output are multiples of 4): Q, K, V and the output are bound as arrays of vec4s, and
//   each 4 values of a row come in one vector load (128 bits in f32, 64 in f16) instead of
//   4 scalar ones, and go out in one vector store.
// - QRES ≠ 0 (where workgroup memory holds it): the block's Q rows are staged once, whole,
//   into `q_sh` before the first key tile and stay there; the chunks then hold K alone, so
//   each key tile loads BC rows from memory instead of BR + BC.
//
// Causal (top-left, PyTorch's is_causal): key tiles past the block's last row are never
// visited; keys past a row inside a tile weigh 0; a group's query blocks are dispatched last
// rows first (the heaviest first, the lightest at the end of the grid). Mask (MASK ≠ 0): a bias read through its
// strides, f32::MIN marks a key masked out; the running max starts at FLOOR, so masked keys
// weigh exactly 0 and a row with nothing visible is written as zeros. SKIP_ZERO ≠ 0: keys of
// weight exactly 0 are left out of the sum (NaN/Inf values there never reach the row).
// LSE ≠ 0 (a forward saved for the backward pass): each row's log-sum-exp of its log2-domain
// scores, m + log2(l), is written to `lse[(b·heads + h)·n_q + i]` (LSE_EMPTY for a row with
// nothing visible); without LSE and SPLIT the host binds a stand-in there, never touched.
// SPLIT ≠ 0 (flash-decoding's split, for calls with too few query blocks to fill a GPU): the
// keys are cut into `p.splits` ranges of `p.split_keys` (a multiple of BC); each workgroup
// takes one range of one query block and writes, instead of the output, its rows' partial
// (m, l) to `lse` (as vec2s) and unnormalised output (DV4 vec4s) to `out`, slot
// (g·n_q + i)·splits + part (LSE is 0 then); flash_combine.wgsl merges them and writes the
// output and the log-sum-exp. A causal range wholly above a block's diagonal runs no tile and
// writes (FLOOR, 0, 0), which the combine weighs 0.
//
// Bounds (why the module is created without naga's runtime checks): every storage access is
// guarded by the row, key or column it reads being inside the problem (row < n_q, key < n_kv
// or kv_end ≤ n_kv, column < dk_h or dv_h), and the host lays each buffer out to hold every
// element its strides address inside the problem (with VEC ≠ 0, the vec4 at (base + col)/4,
// loaded or stored, holds elements base + col .. base + col + 3 of one row: base + col is a multiple of 4 and
// col + 3 < width); the mask is read only with MASK ≠ 0, at a row < n_q and a key < kv_end.
// Workgroup and private arrays: with BR, BC multiples of 4, WG = (BR/4)·(BC/4), TX = BC/4,
// VC a multiple of 4 dividing BC (flash_blocked.rs enforces these), ty < TY and tx < TX,
// so ty + TY·r < BR, 4tx + e < BC and tx + TX·e < BC (pool rows < QR + BC, columns < DC4 <
// QS, so < HALF; q_sh rows < BR, columns < DK4 < QRS (d0 + c < DK4: DC4 divides DK4);
// p_sh rows < BR, columns tx < BC/4 < PS and (kc + kk)/4 < BC/4; kc + kk ≤ BC − 4;
// t < VC·DV4 ≤ HALF; `cur` and the
// staging offset are 0, or 0 and HALF with DBUF ≠ 0, whose pool holds 2·HALF; red < WG, and
// with SGR ≠ 0, where `red` is one vec4, `red` is never read or written and `rank` clamps the
// thread number to WG − 1). Split partials: slot < groups·n_q·splits and c < DV4, and the
// host sizes the partial buffers to groups·n_q·splits·(DV4 vec4s, 2 f32s). Every loop runs a
// bounded count. tests/flash_blocked.rs compares the kernel with its checked twin
// (Context::with_runtime_checks) on sizes that fit no tile, by default and with each of DBUF,
// SGR, HMUL, VEC and QRES alone.
//
// The host prepends, from src/kernels/flash_blocked.rs: the constants BR, BC, WG, DK4, DV4
// (head widths in vec4s, rounded up), DC4, VC, OC, MASK, SKIP_ZERO, LSE, SPLIT, DBUF, SGR,
// HMUL, VEC and QRES, the element-type aliases Q_T, KV_T (f32 or f16) and H_T (f16 with HMUL, else
// f32: then all arithmetic is f32); lines marked `// if SGR` only with SGR ≠ 0 (`// if VEC`
// and `// if QRES` likewise, `// if !VEC` with VEC = 0); shaders/prelude.wgsl, the `struct Params` shared
// with flash_tiled.wgsl.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q_buf: array<vec4<Q_T>>; // if VEC
@group(0) @binding(2) var<storage, read> k_buf: array<vec4<KV_T>>; // if VEC
@group(0) @binding(3) var<storage, read> v_buf: array<vec4<KV_T>>; // if VEC
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>; // if VEC
@group(0) @binding(5) var<storage, read> mask: array<f32>;
@group(0) @binding(6) var<storage, read_write> lse: array<f32>;

// Threads per row group (the keys of a tile over 4) and row groups (the rows over 4). The
// host's blocks are multiples of 4; at least 1 keeps every constant valid (naga validates the
// template with odd test constants).
const TX: u32 = max(BC / 4u, 1u);
const TY: u32 = max(BR / 4u, 1u);
// Row stride of the Q and K chunks in vec4s, padded so neighbouring K rows hit other banks.
const QS: u32 = DC4 + 1u;
// Q rows in a chunk: BR, or none with QRES ≠ 0 (Q is in `q_sh`).
const QR: u32 = BR * (1u - min(QRES, 1u));
// QRES ≠ 0: row stride of `q_sh` in vec4s (padded as QS).
const QRS: u32 = DK4 + 1u;
// Row stride of the P tile in vec4s, padded so that the TY neighbouring rows one subgroup
// reads at once sit in other banks.
const PS: u32 = BC / 4u + 1u;
// One chunk buffer: the Q and K chunks (QR + BC rows of QS) or a V chunk (VC rows of DV4).
const HALF: u32 = max((QR + BC) * QS, VC * DV4);
// One chunk buffer, or two (DBUF ≠ 0: the next chunk is staged while this one is used).
var<workgroup> pool: array<vec4<H_T>, (1u + min(DBUF, 1u)) * HALF>;
var<workgroup> p_sh: array<vec4<H_T>, BR * PS>;
// QRES ≠ 0: the block's Q rows, whole (pre-scaled by scale·log2 e, as in the chunks).
// One vec4 (its 4 rows) per thread: partial row maxima, at the end partial row sums
// (one unused vec4 with SGR ≠ 0, where subgroup shuffles reduce them).
var<workgroup> red: array<vec4<f32>, max(WG * (1u - min(SGR, 1u)), 1u)>;
// SGR ≠ 0: threads numbered so far, one subgroup at a time (`rank`).

// Workgroup-memory values as f32 (HMUL ≠ 0: widened from f16; else they are f32 already,
// and no conversion is written).

fn widen(x: vec4<H_T>) -> vec4<f32> { // if !HMUL
    return x;
}

// f32 values as workgroup memory holds them (the inverse of `widen`).

fn narrow(x: vec4<f32>) -> vec4<H_T> { // if !HMUL
    return x;
}

// Values col..col+3 of row `base` of Q (zero past d_k).

// Values col..col+3 of row `base` of K (`is_k`) or V, zero past `width`.

// VEC ≠ 0 (every width, offset and stride a multiple of 4): the same values as one vector
// load each. `base` and `col` are multiples of 4 and col + 3 < d_k (col < 4·DK4 = d_k).
fn load_q(base: u32, col: u32) -> vec4<f32> { // if VEC
    return vec4<f32>(q_buf[(base + col) / 4u]);
}

// As the scalar `load_kv`, for VEC ≠ 0 (col + 3 < width, as for `load_q`).
fn load_kv(is_k: bool, base: u32, col: u32, width: u32) -> vec4<f32> { // if VEC
    if is_k {
        return vec4<f32>(k_buf[(base + col) / 4u]);
    }
    return vec4<f32>(v_buf[(base + col) / 4u]);
}

// Values col..col+3 of the block's Q row `r` (zero past n_q), pre-scaled by scale·log2 e
// (so the scores come out of Q·Kᵀ in the log2 domain, and f16 scores stay small).
fn q_row(r: u32, row0: u32, col: u32, q_base: u32) -> vec4<H_T> {
    var v = vec4<f32>(0.0);
    if row0 + r < p.n_q {
        v = load_q(q_base + (row0 + r) * p.q_row, col) * p.scale_log2;
    }
    return narrow(v);
}

// Stages chunk d0 (in vec4s) of the block's Q rows (QR of them: none with QRES ≠ 0) and of
// the keys j0.. into `pool` at `at`. The K rows are permuted: chunk row QR + x holds key
// 4·(x % TX) + x / TX of the tile, so that thread tx's keys 4tx..4tx+3 sit at rows
// QR + tx + TX·e (neighbouring threads read neighbouring rows, in other banks) and its
// scores of 4 neighbouring keys make one vec4 of P.
fn stage_qk(at: u32, li: u32, row0: u32, j0: u32, d0: u32, q_base: u32, k_base: u32) {
    for (var t = li; t < (QR + BC) * DC4; t += WG) {
        let r = t / DC4;
        let col = (d0 + t % DC4) * 4u;
        let to = at + r * QS + t % DC4;
        if r < QR {
            pool[to] = q_row(r, row0, col, q_base);
        } else {
            let x = r - QR;
            let key = j0 + 4u * (x % TX) + x / TX;
            var v = vec4<f32>(0.0);
            if key < p.n_kv {
                v = load_kv(true, k_base + key * p.k_row, col, p.dk_h);
            }
            pool[to] = narrow(v);
        }
    }
}

// QRES ≠ 0: stages the block's BR rows of Q, whole, into `q_sh`.

// Stages the VC values rows j.. into `pool` at `at`.
fn stage_v(at: u32, li: u32, j: u32, v_base: u32) {
    for (var t = li; t < VC * DV4; t += WG) {
        var v = vec4<f32>(0.0);
        if j + t / DV4 < p.n_kv {
            v = load_kv(false, v_base + (j + t / DV4) * p.v_row, (t % DV4) * 4u, p.dv_h);
        }
        pool[at + t] = narrow(v);
    }
}

// Stores `v` at elements at..at+3 of `out` (`at` a multiple of 4: a split partial).

// Stores the values of `v` that are inside the row, columns col..col+3 of the row at `at`
// of the output.

// As `store_out4` and `store_row`, for VEC ≠ 0: `at` and `col` are multiples of 4 and
// col < d_v means col + 3 < d_v.
fn store_out4(at: u32, v: vec4<f32>) { // if VEC
    out[at / 4u] = v;
}

fn store_row(at: u32, col: u32, v: vec4<f32>) { // if VEC
    if col < p.dv_h {
        out[(at + col) / 4u] = v;
    }
}

// SGR ≠ 0: this thread's number in the workgroup, lane + the sizes of the subgroups ranked
// before its own, so the TX threads of a row group are TX aligned lanes of one subgroup
// (the host picks SGR only when every subgroup size is a multiple of TX dividing WG).

// SGR ≠ 0: the max of `x` over the TX lanes of this thread's row group.

// SGR ≠ 0: the sum of `x` over the TX lanes of this thread's row group.

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) local: u32,
) {
    let id = wg.x + wg.y * nwg.x;
    // Key split (SPLIT ≠ 0, see the header): workgroup id = (g·blocks + block)·splits + part.
    let splits = select(1u, p.splits, SPLIT != 0u);
    if id >= p.groups * p.blocks * splits {
        return;
    }
    let part = id % splits;
    var li = local;
    // The rank counter starts at 0 by this workgroup's own store: WGSL zeroes workgroup
    // memory, but a kernel that relies on it breaks wherever it is not (wgpu's option to
    // skip it, other compilers of this text).
    let ty = li / TX;
    let tx = li % TX;
    let g = id / splits / p.blocks;
    // Causal: each group's query blocks run last rows first, the heaviest (they see the most
    // keys) starting first and the lightest ending the dispatch, so no long block is left to
    // run alone at the end.
    var blk = id / splits % p.blocks;
    if p.causal != 0u {
        blk = p.blocks - 1u - blk;
    }
    let row0 = blk * BR;
    let b = g / p.heads;
    let h = g % p.heads;
    // Grouped-query attention: kv_ratio query heads share one K/V head.
    let hk = h / p.kv_ratio;
    let q_base = p.q_off + b * p.q_batch + h * p.q_head;
    let k_base = p.k_off + b * p.k_batch + hk * p.k_head;
    let v_base = p.v_off + b * p.v_batch + hk * p.v_head;

    var kv_end = p.n_kv;
    if p.causal != 0u {
        kv_end = min(kv_end, min(row0 + BR, p.n_q));
    }
    // This workgroup's keys: [kv_lo, kv_end) (empty for a range wholly above the diagonal).
    var kv_lo = part * p.split_keys;
    if SPLIT != 0u {
        kv_end = min(kv_end, kv_lo + p.split_keys);
    }
    // The mask modifiers' block map (src/kernels/mods.rs): only the keys that hold a visible
    // pair for these rows (the whole range without one).
    let span = wa_span(b, h, row0);
    kv_lo = max(kv_lo, span.x);
    kv_end = min(kv_end, span.y);

    // This thread's rows are i0 + TY·r (r < 4): the TY row groups of a subgroup read
    // neighbouring rows of Q and P. Where its rows, keys and output columns start in
    // workgroup memory (the constant offsets of r, e and k fold into the loads).
    let i0 = row0 + ty;
    let q_at = ty * QS; // if !QRES
    let k_at = (QR + tx) * QS;
    let p_at = ty * PS;
    // The last key each row may see, plus 1: kv_end, or the row itself under causal (0 past
    // n_q: such rows are never written).
    var lim = vec4<u32>(0u);
    {
        const r = 0u;
        let i = i0 + TY * r;
        var end = kv_end;
        if p.causal != 0u {
            end = min(end, i + 1u);
        }
        if i < p.n_q {
            lim[r] = end;
        }
    }
    {
        const r = 1u;
        let i = i0 + TY * r;
        var end = kv_end;
        if p.causal != 0u {
            end = min(end, i + 1u);
        }
        if i < p.n_q {
            lim[r] = end;
        }
    }
    {
        const r = 2u;
        let i = i0 + TY * r;
        var end = kv_end;
        if p.causal != 0u {
            end = min(end, i + 1u);
        }
        if i < p.n_q {
            lim[r] = end;
        }
    }
    {
        const r = 3u;
        let i = i0 + TY * r;
        var end = kv_end;
        if p.causal != 0u {
            end = min(end, i + 1u);
        }
        if i < p.n_q {
            lim[r] = end;
        }
    }

    // Which of its OC output columns tx + TX·k are inside the head (all but at d < 4·BC).
    var cols: array<bool, OC>;
    {
        const k = 0u;
        cols[k] = tx + TX * k < DV4;
    }
    var o: array<vec4<f32>, 4u * OC>;
    var m = vec4<f32>(FLOOR);
    var l = vec4<f32>(0.0);
    // Where in `pool` the chunk in use sits (0, or HALF every other step with DBUF ≠ 0).
    var cur = 0u;
    // QRES ≠ 0: Q once, read after the barrier that follows the first chunk's staging.
    if DBUF != 0u {
        stage_qk(0u, li, row0, kv_lo, 0u, q_base, k_base);
        workgroupBarrier();
    }

    for (var j0 = kv_lo; j0 < kv_end; j0 += BC) {
        // 2 = some pairs of this tile are hidden by a mask modifier; 1 = none (0, none
        // visible, is still computed: the next tile is staged before this one ends).
        let partial = wa_block(b, h, row0, j0) != 1u;
        // 1. S = Q·Kᵀ (in the log2 domain: Q is pre-scaled), chunk by chunk of the head
        //    dimension; s[r][e] is row i0 + TY·r, key j0 + 4tx + e. DBUF ≠ 0: the next chunk
        //    (or the tile's first V chunk) is staged meanwhile, one barrier per chunk.
        var s: array<vec4<f32>, 4>;
        for (var d0 = 0u; d0 < DK4; d0 += DC4) {
            if DBUF == 0u {
                stage_qk(0u, li, row0, j0, d0, q_base, k_base);
                workgroupBarrier();
            } else if d0 + DC4 < DK4 {
                stage_qk(HALF - cur, li, row0, j0, d0 + DC4, q_base, k_base);
            } else {
                stage_v(HALF - cur, li, j0, v_base);
            }
            let qa = cur + q_at; // if !QRES
            let ka = cur + k_at;
            // HMUL ≠ 0: the f16 operands widened to f32, whose products of two f16 values are
            // exact and whose sums keep f32's precision (f16 sums of logits in the thousands
            // would be off by whole units).
            {
                const c = 0u;
                var qv: array<vec4<f32>, 4>;
                {
                    const r = 0u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const r = 1u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const r = 2u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const r = 3u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const e = 0u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
                {
                    const e = 1u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
                {
                    const e = 2u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
                {
                    const e = 3u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
            }
            {
                const c = 1u;
                var qv: array<vec4<f32>, 4>;
                {
                    const r = 0u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const r = 1u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const r = 2u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const r = 3u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const e = 0u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
                {
                    const e = 1u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
                {
                    const e = 2u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
                {
                    const e = 3u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
            }
            {
                const c = 2u;
                var qv: array<vec4<f32>, 4>;
                {
                    const r = 0u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const r = 1u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const r = 2u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const r = 3u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const e = 0u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
                {
                    const e = 1u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
                {
                    const e = 2u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
                {
                    const e = 3u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
            }
            {
                const c = 3u;
                var qv: array<vec4<f32>, 4>;
                {
                    const r = 0u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const r = 1u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const r = 2u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const r = 3u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const e = 0u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
                {
                    const e = 1u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
                {
                    const e = 2u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
                {
                    const e = 3u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
            }
            {
                const c = 4u;
                var qv: array<vec4<f32>, 4>;
                {
                    const r = 0u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const r = 1u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const r = 2u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const r = 3u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const e = 0u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
                {
                    const e = 1u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
                {
                    const e = 2u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
                {
                    const e = 3u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
            }
            {
                const c = 5u;
                var qv: array<vec4<f32>, 4>;
                {
                    const r = 0u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const r = 1u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const r = 2u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const r = 3u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const e = 0u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
                {
                    const e = 1u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
                {
                    const e = 2u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
                {
                    const e = 3u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
            }
            {
                const c = 6u;
                var qv: array<vec4<f32>, 4>;
                {
                    const r = 0u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const r = 1u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const r = 2u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const r = 3u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const e = 0u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
                {
                    const e = 1u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
                {
                    const e = 2u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
                {
                    const e = 3u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
            }
            {
                const c = 7u;
                var qv: array<vec4<f32>, 4>;
                {
                    const r = 0u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const r = 1u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const r = 2u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const r = 3u;
                    qv[r] = widen(pool[qa + (TY * QS * r + c)]); // if !QRES
                }
                {
                    const e = 0u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
                {
                    const e = 1u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
                {
                    const e = 2u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
                {
                    const e = 3u;
                    let kv = widen(pool[ka + (TX * QS * e + c)]);
                    {
                        const r = 0u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 1u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 2u;
                        s[r][e] += dot(qv[r], kv);
                    }
                    {
                        const r = 3u;
                        s[r][e] += dot(qv[r], kv);
                    }
                }
            }
            workgroupBarrier();
            if DBUF != 0u {
                cur = HALF - cur;
            }
        }

        // 2. Causal, the key range, mask and modifiers; the tile's row maxima, reduced
        //    through `red` or subgroups.
        let jt = j0 + 4u * tx;
        var mx = vec4<f32>(NEG);
        {
            const r = 0u;
            let i = i0 + TY * r;
            {
                const e = 0u;
                let j = jt + e;
                var x = NEG;
                if j < lim[r] {
                    // The modifiers (identity stubs without any; see src/kernels/mods.rs).
                    x = wa_score_log2(s[r][e], b, h, i, j);
                    if MASK != 0u {
                        x = add_bias(x, mask[mask_offset(p.mask, b, h, i, j)], LOG2E);
                    }
                    if partial {
                        x = select(NEG, x, wa_keep(b, h, i, j));
                    }
                }
                s[r][e] = x;
            }
            {
                const e = 1u;
                let j = jt + e;
                var x = NEG;
                if j < lim[r] {
                    // The modifiers (identity stubs without any; see src/kernels/mods.rs).
                    x = wa_score_log2(s[r][e], b, h, i, j);
                    if MASK != 0u {
                        x = add_bias(x, mask[mask_offset(p.mask, b, h, i, j)], LOG2E);
                    }
                    if partial {
                        x = select(NEG, x, wa_keep(b, h, i, j));
                    }
                }
                s[r][e] = x;
            }
            {
                const e = 2u;
                let j = jt + e;
                var x = NEG;
                if j < lim[r] {
                    // The modifiers (identity stubs without any; see src/kernels/mods.rs).
                    x = wa_score_log2(s[r][e], b, h, i, j);
                    if MASK != 0u {
                        x = add_bias(x, mask[mask_offset(p.mask, b, h, i, j)], LOG2E);
                    }
                    if partial {
                        x = select(NEG, x, wa_keep(b, h, i, j));
                    }
                }
                s[r][e] = x;
            }
            {
                const e = 3u;
                let j = jt + e;
                var x = NEG;
                if j < lim[r] {
                    // The modifiers (identity stubs without any; see src/kernels/mods.rs).
                    x = wa_score_log2(s[r][e], b, h, i, j);
                    if MASK != 0u {
                        x = add_bias(x, mask[mask_offset(p.mask, b, h, i, j)], LOG2E);
                    }
                    if partial {
                        x = select(NEG, x, wa_keep(b, h, i, j));
                    }
                }
                s[r][e] = x;
            }
            mx[r] = max(max(s[r].x, s[r].y), max(s[r].z, s[r].w));
        }
        {
            const r = 1u;
            let i = i0 + TY * r;
            {
                const e = 0u;
                let j = jt + e;
                var x = NEG;
                if j < lim[r] {
                    // The modifiers (identity stubs without any; see src/kernels/mods.rs).
                    x = wa_score_log2(s[r][e], b, h, i, j);
                    if MASK != 0u {
                        x = add_bias(x, mask[mask_offset(p.mask, b, h, i, j)], LOG2E);
                    }
                    if partial {
                        x = select(NEG, x, wa_keep(b, h, i, j));
                    }
                }
                s[r][e] = x;
            }
            {
                const e = 1u;
                let j = jt + e;
                var x = NEG;
                if j < lim[r] {
                    // The modifiers (identity stubs without any; see src/kernels/mods.rs).
                    x = wa_score_log2(s[r][e], b, h, i, j);
                    if MASK != 0u {
                        x = add_bias(x, mask[mask_offset(p.mask, b, h, i, j)], LOG2E);
                    }
                    if partial {
                        x = select(NEG, x, wa_keep(b, h, i, j));
                    }
                }
                s[r][e] = x;
            }
            {
                const e = 2u;
                let j = jt + e;
                var x = NEG;
                if j < lim[r] {
                    // The modifiers (identity stubs without any; see src/kernels/mods.rs).
                    x = wa_score_log2(s[r][e], b, h, i, j);
                    if MASK != 0u {
                        x = add_bias(x, mask[mask_offset(p.mask, b, h, i, j)], LOG2E);
                    }
                    if partial {
                        x = select(NEG, x, wa_keep(b, h, i, j));
                    }
                }
                s[r][e] = x;
            }
            {
                const e = 3u;
                let j = jt + e;
                var x = NEG;
                if j < lim[r] {
                    // The modifiers (identity stubs without any; see src/kernels/mods.rs).
                    x = wa_score_log2(s[r][e], b, h, i, j);
                    if MASK != 0u {
                        x = add_bias(x, mask[mask_offset(p.mask, b, h, i, j)], LOG2E);
                    }
                    if partial {
                        x = select(NEG, x, wa_keep(b, h, i, j));
                    }
                }
                s[r][e] = x;
            }
            mx[r] = max(max(s[r].x, s[r].y), max(s[r].z, s[r].w));
        }
        {
            const r = 2u;
            let i = i0 + TY * r;
            {
                const e = 0u;
                let j = jt + e;
                var x = NEG;
                if j < lim[r] {
                    // The modifiers (identity stubs without any; see src/kernels/mods.rs).
                    x = wa_score_log2(s[r][e], b, h, i, j);
                    if MASK != 0u {
                        x = add_bias(x, mask[mask_offset(p.mask, b, h, i, j)], LOG2E);
                    }
                    if partial {
                        x = select(NEG, x, wa_keep(b, h, i, j));
                    }
                }
                s[r][e] = x;
            }
            {
                const e = 1u;
                let j = jt + e;
                var x = NEG;
                if j < lim[r] {
                    // The modifiers (identity stubs without any; see src/kernels/mods.rs).
                    x = wa_score_log2(s[r][e], b, h, i, j);
                    if MASK != 0u {
                        x = add_bias(x, mask[mask_offset(p.mask, b, h, i, j)], LOG2E);
                    }
                    if partial {
                        x = select(NEG, x, wa_keep(b, h, i, j));
                    }
                }
                s[r][e] = x;
            }
            {
                const e = 2u;
                let j = jt + e;
                var x = NEG;
                if j < lim[r] {
                    // The modifiers (identity stubs without any; see src/kernels/mods.rs).
                    x = wa_score_log2(s[r][e], b, h, i, j);
                    if MASK != 0u {
                        x = add_bias(x, mask[mask_offset(p.mask, b, h, i, j)], LOG2E);
                    }
                    if partial {
                        x = select(NEG, x, wa_keep(b, h, i, j));
                    }
                }
                s[r][e] = x;
            }
            {
                const e = 3u;
                let j = jt + e;
                var x = NEG;
                if j < lim[r] {
                    // The modifiers (identity stubs without any; see src/kernels/mods.rs).
                    x = wa_score_log2(s[r][e], b, h, i, j);
                    if MASK != 0u {
                        x = add_bias(x, mask[mask_offset(p.mask, b, h, i, j)], LOG2E);
                    }
                    if partial {
                        x = select(NEG, x, wa_keep(b, h, i, j));
                    }
                }
                s[r][e] = x;
            }
            mx[r] = max(max(s[r].x, s[r].y), max(s[r].z, s[r].w));
        }
        {
            const r = 3u;
            let i = i0 + TY * r;
            {
                const e = 0u;
                let j = jt + e;
                var x = NEG;
                if j < lim[r] {
                    // The modifiers (identity stubs without any; see src/kernels/mods.rs).
                    x = wa_score_log2(s[r][e], b, h, i, j);
                    if MASK != 0u {
                        x = add_bias(x, mask[mask_offset(p.mask, b, h, i, j)], LOG2E);
                    }
                    if partial {
                        x = select(NEG, x, wa_keep(b, h, i, j));
                    }
                }
                s[r][e] = x;
            }
            {
                const e = 1u;
                let j = jt + e;
                var x = NEG;
                if j < lim[r] {
                    // The modifiers (identity stubs without any; see src/kernels/mods.rs).
                    x = wa_score_log2(s[r][e], b, h, i, j);
                    if MASK != 0u {
                        x = add_bias(x, mask[mask_offset(p.mask, b, h, i, j)], LOG2E);
                    }
                    if partial {
                        x = select(NEG, x, wa_keep(b, h, i, j));
                    }
                }
                s[r][e] = x;
            }
            {
                const e = 2u;
                let j = jt + e;
                var x = NEG;
                if j < lim[r] {
                    // The modifiers (identity stubs without any; see src/kernels/mods.rs).
                    x = wa_score_log2(s[r][e], b, h, i, j);
                    if MASK != 0u {
                        x = add_bias(x, mask[mask_offset(p.mask, b, h, i, j)], LOG2E);
                    }
                    if partial {
                        x = select(NEG, x, wa_keep(b, h, i, j));
                    }
                }
                s[r][e] = x;
            }
            {
                const e = 3u;
                let j = jt + e;
                var x = NEG;
                if j < lim[r] {
                    // The modifiers (identity stubs without any; see src/kernels/mods.rs).
                    x = wa_score_log2(s[r][e], b, h, i, j);
                    if MASK != 0u {
                        x = add_bias(x, mask[mask_offset(p.mask, b, h, i, j)], LOG2E);
                    }
                    if partial {
                        x = select(NEG, x, wa_keep(b, h, i, j));
                    }
                }
                s[r][e] = x;
            }
            mx[r] = max(max(s[r].x, s[r].y), max(s[r].z, s[r].w));
        }
        var m_new = m;
        if SGR != 0u {
        } else {
            red[li] = mx;
            workgroupBarrier();
            for (var t = 0u; t < TX; t++) {
                m_new = max(m_new, red[ty * TX + t]);
            }
        }
        let corr = exp2(m - m_new);
        m = m_new;
        l *= corr;

        // 3. P = exp2(S − m) into workgroup memory, one vec4 (4 neighbouring keys) per row;
        //    partial row sums in registers.
        {
            const r = 0u;
            let pr = exp2(s[r] - m[r]);
            l[r] += (pr.x + pr.y) + (pr.z + pr.w);
            p_sh[p_at + (TY * PS * r) + tx] = narrow(pr);
            {
                const k = 0u;
                o[r * OC + k] *= corr[r];
            }
        }
        {
            const r = 1u;
            let pr = exp2(s[r] - m[r]);
            l[r] += (pr.x + pr.y) + (pr.z + pr.w);
            p_sh[p_at + (TY * PS * r) + tx] = narrow(pr);
            {
                const k = 0u;
                o[r * OC + k] *= corr[r];
            }
        }
        {
            const r = 2u;
            let pr = exp2(s[r] - m[r]);
            l[r] += (pr.x + pr.y) + (pr.z + pr.w);
            p_sh[p_at + (TY * PS * r) + tx] = narrow(pr);
            {
                const k = 0u;
                o[r * OC + k] *= corr[r];
            }
        }
        {
            const r = 3u;
            let pr = exp2(s[r] - m[r]);
            l[r] += (pr.x + pr.y) + (pr.z + pr.w);
            p_sh[p_at + (TY * PS * r) + tx] = narrow(pr);
            {
                const k = 0u;
                o[r * OC + k] *= corr[r];
            }
        }
        if DBUF != 0u {
            workgroupBarrier();
        }

        // 4. O += P·V, V chunk by chunk of VC keys (only up to the last key in use). DBUF ≠ 0:
        //    the next V chunk (or the next tile's first Q/K chunk) is staged meanwhile. Each
        //    value of V read serves the thread's 4 rows, each weight its OC columns.
        let count = min(BC, kv_end - j0);
        for (var kc = 0u; kc < count; kc += VC) {
            if DBUF == 0u {
                stage_v(0u, li, j0 + kc, v_base);
                workgroupBarrier();
            } else if kc + VC < count {
                stage_v(HALF - cur, li, j0 + kc + VC, v_base);
            } else if j0 + BC < kv_end {
                stage_qk(HALF - cur, li, row0, j0 + BC, 0u, q_base, k_base);
            }
            let va = cur + tx;
            let pa = p_at + kc / 4u;
            for (var kk = 0u; kk < VC; kk += 4u) {
                let pk = pa + kk / 4u;
                var pr: array<vec4<f32>, 4>;
                {
                    const r = 0u;
                    pr[r] = widen(p_sh[pk + TY * PS * r]);
                }
                {
                    const r = 1u;
                    pr[r] = widen(p_sh[pk + TY * PS * r]);
                }
                {
                    const r = 2u;
                    pr[r] = widen(p_sh[pk + TY * PS * r]);
                }
                {
                    const r = 3u;
                    pr[r] = widen(p_sh[pk + TY * PS * r]);
                }
                let vk = va + kk * DV4;
                {
                    const k = 0u;
                    if cols[k] {
                        {
                            const e = 0u;
                            let v = widen(pool[vk + (DV4 * e + TX * k)]);
                            {
                                const r = 0u;
                                let w = pr[r][e];
                                if SKIP_ZERO != 0u {
                                    o[r * OC + k] = select(fma(vec4<f32>(w), v, o[r * OC + k]), o[r * OC + k], w == 0.0);
                                } else {
                                    o[r * OC + k] = fma(vec4<f32>(w), v, o[r * OC + k]);
                                }
                            }
                            {
                                const r = 1u;
                                let w = pr[r][e];
                                if SKIP_ZERO != 0u {
                                    o[r * OC + k] = select(fma(vec4<f32>(w), v, o[r * OC + k]), o[r * OC + k], w == 0.0);
                                } else {
                                    o[r * OC + k] = fma(vec4<f32>(w), v, o[r * OC + k]);
                                }
                            }
                            {
                                const r = 2u;
                                let w = pr[r][e];
                                if SKIP_ZERO != 0u {
                                    o[r * OC + k] = select(fma(vec4<f32>(w), v, o[r * OC + k]), o[r * OC + k], w == 0.0);
                                } else {
                                    o[r * OC + k] = fma(vec4<f32>(w), v, o[r * OC + k]);
                                }
                            }
                            {
                                const r = 3u;
                                let w = pr[r][e];
                                if SKIP_ZERO != 0u {
                                    o[r * OC + k] = select(fma(vec4<f32>(w), v, o[r * OC + k]), o[r * OC + k], w == 0.0);
                                } else {
                                    o[r * OC + k] = fma(vec4<f32>(w), v, o[r * OC + k]);
                                }
                            }
                        }
                        {
                            const e = 1u;
                            let v = widen(pool[vk + (DV4 * e + TX * k)]);
                            {
                                const r = 0u;
                                let w = pr[r][e];
                                if SKIP_ZERO != 0u {
                                    o[r * OC + k] = select(fma(vec4<f32>(w), v, o[r * OC + k]), o[r * OC + k], w == 0.0);
                                } else {
                                    o[r * OC + k] = fma(vec4<f32>(w), v, o[r * OC + k]);
                                }
                            }
                            {
                                const r = 1u;
                                let w = pr[r][e];
                                if SKIP_ZERO != 0u {
                                    o[r * OC + k] = select(fma(vec4<f32>(w), v, o[r * OC + k]), o[r * OC + k], w == 0.0);
                                } else {
                                    o[r * OC + k] = fma(vec4<f32>(w), v, o[r * OC + k]);
                                }
                            }
                            {
                                const r = 2u;
                                let w = pr[r][e];
                                if SKIP_ZERO != 0u {
                                    o[r * OC + k] = select(fma(vec4<f32>(w), v, o[r * OC + k]), o[r * OC + k], w == 0.0);
                                } else {
                                    o[r * OC + k] = fma(vec4<f32>(w), v, o[r * OC + k]);
                                }
                            }
                            {
                                const r = 3u;
                                let w = pr[r][e];
                                if SKIP_ZERO != 0u {
                                    o[r * OC + k] = select(fma(vec4<f32>(w), v, o[r * OC + k]), o[r * OC + k], w == 0.0);
                                } else {
                                    o[r * OC + k] = fma(vec4<f32>(w), v, o[r * OC + k]);
                                }
                            }
                        }
                        {
                            const e = 2u;
                            let v = widen(pool[vk + (DV4 * e + TX * k)]);
                            {
                                const r = 0u;
                                let w = pr[r][e];
                                if SKIP_ZERO != 0u {
                                    o[r * OC + k] = select(fma(vec4<f32>(w), v, o[r * OC + k]), o[r * OC + k], w == 0.0);
                                } else {
                                    o[r * OC + k] = fma(vec4<f32>(w), v, o[r * OC + k]);
                                }
                            }
                            {
                                const r = 1u;
                                let w = pr[r][e];
                                if SKIP_ZERO != 0u {
                                    o[r * OC + k] = select(fma(vec4<f32>(w), v, o[r * OC + k]), o[r * OC + k], w == 0.0);
                                } else {
                                    o[r * OC + k] = fma(vec4<f32>(w), v, o[r * OC + k]);
                                }
                            }
                            {
                                const r = 2u;
                                let w = pr[r][e];
                                if SKIP_ZERO != 0u {
                                    o[r * OC + k] = select(fma(vec4<f32>(w), v, o[r * OC + k]), o[r * OC + k], w == 0.0);
                                } else {
                                    o[r * OC + k] = fma(vec4<f32>(w), v, o[r * OC + k]);
                                }
                            }
                            {
                                const r = 3u;
                                let w = pr[r][e];
                                if SKIP_ZERO != 0u {
                                    o[r * OC + k] = select(fma(vec4<f32>(w), v, o[r * OC + k]), o[r * OC + k], w == 0.0);
                                } else {
                                    o[r * OC + k] = fma(vec4<f32>(w), v, o[r * OC + k]);
                                }
                            }
                        }
                        {
                            const e = 3u;
                            let v = widen(pool[vk + (DV4 * e + TX * k)]);
                            {
                                const r = 0u;
                                let w = pr[r][e];
                                if SKIP_ZERO != 0u {
                                    o[r * OC + k] = select(fma(vec4<f32>(w), v, o[r * OC + k]), o[r * OC + k], w == 0.0);
                                } else {
                                    o[r * OC + k] = fma(vec4<f32>(w), v, o[r * OC + k]);
                                }
                            }
                            {
                                const r = 1u;
                                let w = pr[r][e];
                                if SKIP_ZERO != 0u {
                                    o[r * OC + k] = select(fma(vec4<f32>(w), v, o[r * OC + k]), o[r * OC + k], w == 0.0);
                                } else {
                                    o[r * OC + k] = fma(vec4<f32>(w), v, o[r * OC + k]);
                                }
                            }
                            {
                                const r = 2u;
                                let w = pr[r][e];
                                if SKIP_ZERO != 0u {
                                    o[r * OC + k] = select(fma(vec4<f32>(w), v, o[r * OC + k]), o[r * OC + k], w == 0.0);
                                } else {
                                    o[r * OC + k] = fma(vec4<f32>(w), v, o[r * OC + k]);
                                }
                            }
                            {
                                const r = 3u;
                                let w = pr[r][e];
                                if SKIP_ZERO != 0u {
                                    o[r * OC + k] = select(fma(vec4<f32>(w), v, o[r * OC + k]), o[r * OC + k], w == 0.0);
                                } else {
                                    o[r * OC + k] = fma(vec4<f32>(w), v, o[r * OC + k]);
                                }
                            }
                        }
                    }
                }
            }
            workgroupBarrier();
            if DBUF != 0u {
                cur = HALF - cur;
            }
        }
    }

    // The row sums: each thread's partial sums of its own keys, added up.
    var total = vec4<f32>(0.0);
    if SGR != 0u {
    } else {
        red[li] = l;
        workgroupBarrier();
        for (var t = 0u; t < TX; t++) {
            total += red[ty * TX + t];
        }
    }
    if SPLIT != 0u {
        // A partial result: the unnormalised output and (m, l) of each row over this range, at
        // slot (g·n_q + i)·splits + part; flash_combine.wgsl merges the parts.
        {
            const r = 0u;
            let i = i0 + TY * r;
            if i < p.n_q {
                let slot = (g * p.n_q + i) * splits + part;
                if tx == 0u {
                    lse[2u * slot] = m[r];
                    lse[2u * slot + 1u] = total[r];
                }
                {
                    const k = 0u;
                    let c = tx + TX * k;
                    if c < DV4 {
                        store_out4((slot * DV4 + c) * 4u, o[r * OC + k]);
                    }
                }
            }
        }
        {
            const r = 1u;
            let i = i0 + TY * r;
            if i < p.n_q {
                let slot = (g * p.n_q + i) * splits + part;
                if tx == 0u {
                    lse[2u * slot] = m[r];
                    lse[2u * slot + 1u] = total[r];
                }
                {
                    const k = 0u;
                    let c = tx + TX * k;
                    if c < DV4 {
                        store_out4((slot * DV4 + c) * 4u, o[r * OC + k]);
                    }
                }
            }
        }
        {
            const r = 2u;
            let i = i0 + TY * r;
            if i < p.n_q {
                let slot = (g * p.n_q + i) * splits + part;
                if tx == 0u {
                    lse[2u * slot] = m[r];
                    lse[2u * slot + 1u] = total[r];
                }
                {
                    const k = 0u;
                    let c = tx + TX * k;
                    if c < DV4 {
                        store_out4((slot * DV4 + c) * 4u, o[r * OC + k]);
                    }
                }
            }
        }
        {
            const r = 3u;
            let i = i0 + TY * r;
            if i < p.n_q {
                let slot = (g * p.n_q + i) * splits + part;
                if tx == 0u {
                    lse[2u * slot] = m[r];
                    lse[2u * slot + 1u] = total[r];
                }
                {
                    const k = 0u;
                    let c = tx + TX * k;
                    if c < DV4 {
                        store_out4((slot * DV4 + c) * 4u, o[r * OC + k]);
                    }
                }
            }
        }
        return;
    }
    // Nothing visible (every key masked out, or a row past n_q): zeros, not 0/0.
    let empty = total == vec4<f32>(0.0);
    let inv = select(1.0 / select(total, vec4<f32>(1.0), empty), vec4<f32>(0.0), empty);
    let o_base = p.o_off + b * p.o_batch + h * p.o_head;
    {
        const r = 0u;
        let i = i0 + TY * r;
        if LSE != 0u && tx == 0u && i < p.n_q {
            lse[g * p.n_q + i] = select(m[r] + log2(total[r]), LSE_EMPTY, total[r] == 0.0);
        }
        if i < p.n_q {
            {
                const k = 0u;
                let c = tx + TX * k;
                store_row(o_base + i * p.o_row, c * 4u, o[r * OC + k] * inv[r]);
            }
        }
    }
    {
        const r = 1u;
        let i = i0 + TY * r;
        if LSE != 0u && tx == 0u && i < p.n_q {
            lse[g * p.n_q + i] = select(m[r] + log2(total[r]), LSE_EMPTY, total[r] == 0.0);
        }
        if i < p.n_q {
            {
                const k = 0u;
                let c = tx + TX * k;
                store_row(o_base + i * p.o_row, c * 4u, o[r * OC + k] * inv[r]);
            }
        }
    }
    {
        const r = 2u;
        let i = i0 + TY * r;
        if LSE != 0u && tx == 0u && i < p.n_q {
            lse[g * p.n_q + i] = select(m[r] + log2(total[r]), LSE_EMPTY, total[r] == 0.0);
        }
        if i < p.n_q {
            {
                const k = 0u;
                let c = tx + TX * k;
                store_row(o_base + i * p.o_row, c * 4u, o[r * OC + k] * inv[r]);
            }
        }
    }
    {
        const r = 3u;
        let i = i0 + TY * r;
        if LSE != 0u && tx == 0u && i < p.n_q {
            lse[g * p.n_q + i] = select(m[r] + log2(total[r]), LSE_EMPTY, total[r] == 0.0);
        }
        if i < p.n_q {
            {
                const k = 0u;
                let c = tx + TX * k;
                store_row(o_base + i * p.o_row, c * 4u, o[r * OC + k] * inv[r]);
            }
        }
    }
}

fn wa_keep(b: u32, h: u32, q: u32, kv: u32) -> bool {
    return true;
}
fn wa_score_log2(x: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {
    return x;
}
fn wa_score_ln(x: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {
    return x;
}
fn wa_score_grad(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {
    return 1.0;
}
fn wa_table_grad(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {
    return 1.0;
}
fn wa_block(b: u32, h: u32, row0: u32, j0: u32) -> u32 {
    return 2u;
}
fn wa_span(b: u32, h: u32, row0: u32) -> vec2<u32> {
    return vec2<u32>(0u, 0xffffffffu);
}
