#!/usr/bin/env python3
"""Independent cases from NumPy, run through `wgpu-attention run` and `sdpa`, compared.

NumPy evaluates each case twice, in float64 (the truth) and in float32 (what a float32
implementation is expected to reach). The GPU's relative error against the float64 truth
must stay within a small multiple of float32 NumPy's own, for the context and the weights,
and everything must be finite. Where the truth is exact by definition (weights of masked
keys, rows with nothing to attend to, and the output rows those give through W_O), the
GPU must match it exactly.

The `sdpa` cases follow the reference semantics PyTorch documents for
`torch.nn.functional.scaled_dot_product_attention` (L != S, grouped-query heads, boolean
and float masks of several broadcast shapes, top-left causal, masks combined with causal
and key lengths), written here in NumPy.

    python3 tests/python/cross_check.py [path/to/wgpu-attention [extra flags, e.g. --kernels storage]]
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(__file__), "..", "..", "target", "debug", "wgpu-attention")
EXTRA = sys.argv[2:]  # appended to every invocation
F32_MIN = np.finfo(np.float32).min


def sdpa(q, k, v, causal, scale, mask, lengths, dtype):
    """PyTorch's scaled_dot_product_attention (its documented reference), with enable_gqa.

    q (B, H_q, L, E), k (B, H_kv, S, E), v (B, H_kv, S, E_v); mask broadcastable to
    (B, H_q, L, S), bool (True = attend) or float (added to the scaled scores); lengths (B,):
    sequence b attends to keys j < lengths[b]. Returns the context (B, H_q, L, E_v), the
    weights (B, H_q, L, S), which weights are masked out (-inf bias) and which rows have
    nothing to attend to (B, H_q, L).
    """
    q, k, v = (a.astype(dtype) for a in (q, k, v))
    n_q, n_kv = q.shape[-2], k.shape[-2]
    # enable_gqa: key.repeat_interleave(H_q // H_kv, dim=1), and the same for value.
    k = np.repeat(k, q.shape[1] // k.shape[1], axis=1)
    v = np.repeat(v, q.shape[1] // v.shape[1], axis=1)
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[-1])
    bias = np.zeros((n_q, n_kv), dtype)
    if causal:  # top-left aligned: tril(ones(L, S))
        bias = np.where(np.tril(np.ones((n_q, n_kv), bool)), bias, -np.inf)
    if mask is not None:  # combined with causal, as this tool allows (PyTorch asserts one)
        bias = np.where(mask, bias, -np.inf) if mask.dtype == bool else mask.astype(dtype) + bias
    if lengths is not None:  # the boolean mask arange(S) < L[b], of shape (B, 1, 1, S)
        bias = np.where(np.arange(n_kv) < lengths.reshape(-1, 1, 1, 1), bias, -np.inf)
    s = (q @ k.transpose(0, 1, 3, 2)) * dtype(scale) + bias
    m = s.max(axis=-1, keepdims=True)
    # This tool's documented rule, not PyTorch's math backend (which gives NaN there): a row
    # where every key is masked out (all scores -inf) gives weights 0 and a context of 0.
    empty = m == -np.inf
    e = np.exp(s - np.where(empty, 0, m))  # exp(-inf) = 0 across an empty row
    a = e / np.where(empty, 1, e.sum(axis=-1, keepdims=True))
    return a @ v, a, np.broadcast_to(bias == -np.inf, a.shape), empty[..., 0]


def attention(x, p, heads, causal, scale, mask, lengths, dtype):
    """`run`: projections, heads split as nn.MultiheadAttention splits them, sdpa, W_O.

    Returns the output and the weights in the CLI's shapes, and masks of the entries that
    are exact by definition (0 for masked weights and empty rows, b_O for output rows empty
    in every head).
    """
    x = x.astype(dtype)
    p = {name: w.astype(dtype) for name, w in p.items()}
    if "wq" in p:
        q, k, v = x @ p["wq"], x @ p["wk"], x @ p["wv"]
        if "bq" in p:
            q, k, v = q + p["bq"], k + p["bk"], v + p["bv"]
    else:
        q = k = v = x
    batched = x.ndim == 3
    if not batched:
        q, k, v = q[None], k[None], v[None]
    b, n, dk = q.shape
    dv = v.shape[-1]
    qh = q.reshape(b, n, heads, dk // heads).transpose(0, 2, 1, 3)
    kh = k.reshape(b, n, heads, dk // heads).transpose(0, 2, 1, 3)
    vh = v.reshape(b, n, heads, dv // heads).transpose(0, 2, 1, 3)
    ctx, a, hidden, empty = sdpa(qh, kh, vh, causal, scale, mask, lengths, dtype)
    ctx = ctx.transpose(0, 2, 1, 3).reshape(b, n, dv)
    if "wo" in p:
        ctx = ctx @ p["wo"] + p.get("bo", dtype(0))
        exact_ctx = np.broadcast_to(empty.all(axis=1)[..., None], ctx.shape)
    else:
        exact_ctx = np.repeat(empty.transpose(0, 2, 1), dv // heads, axis=-1)
    if not batched:
        ctx, a, hidden, exact_ctx = ctx[0], a[0], hidden[0], exact_ctx[0]
    if heads == 1:
        a, hidden = a[..., 0, :, :], hidden[..., 0, :, :]
    return ctx, a, exact_ctx, hidden, int(empty.sum())


def sdpa_reference(q, k, v, causal, scale, mask, lengths, dtype):
    """`sdpa`: the context, the weights, and the entries exact by definition (0 for masked
    weights, and for an empty row's weights and context)."""
    ctx, a, hidden, empty = sdpa(q, k, v, causal, scale, mask, lengths, dtype)
    return ctx, a, np.broadcast_to(empty[..., None], ctx.shape), hidden, int(empty.sum())


def rel(a, ref):
    return float(np.linalg.norm((a.astype(np.float64) - ref).ravel()) / np.linalg.norm(ref.ravel()))


def check(label, args, out, reference):
    """Runs the CLI, compares with reference(dtype) -> (ctx, weights, exact ctx, exact
    weights, empty rows); prints the case's line and returns whether it passed."""
    r = subprocess.run(args + EXTRA, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"{label}: wgpu-attention failed: {r.stderr.strip()}")
        return False
    t_ctx, t_w, x_ctx, x_w, n_empty = reference(np.float64)
    f_ctx, f_w = reference(np.float32)[:2]
    ctx = np.load(f"{out}/context.npy")
    no_weights = "--context-only" in args
    if no_weights:
        w, t_w, f_w, x_w = np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0, bool)
        w_ok = not os.path.exists(f"{out}/weights.npy")
    else:
        w = np.load(f"{out}/weights.npy")
        w_ok = w.dtype == np.float32 and w.shape == t_w.shape and np.isfinite(w).all()
    ok = w_ok and ctx.dtype == np.float32 and ctx.shape == t_ctx.shape and np.isfinite(ctx).all()
    if not ok:
        print(f"{label}: bad outputs: context {ctx.dtype} {ctx.shape} (expected {t_ctx.shape})"
              + ("" if no_weights else f", weights {w.dtype} {w.shape} (expected {t_w.shape})"))
        return False
    e = dict(ctx=rel(ctx, t_ctx), np_ctx=rel(f_ctx, t_ctx))
    e.update(dict(w=0.0, np_w=0.0) if no_weights else dict(w=rel(w, t_w), np_w=rel(f_w, t_w)))
    # Within 10x of float32 NumPy's own error (floor: a few ulps of f32).
    ok = e["ctx"] <= 10 * max(e["np_ctx"], 1e-7) and e["w"] <= 10 * max(e["np_w"], 1e-7)
    # Exact by definition: masked weights 0; an empty row's weights and context 0 (b_O through W_O).
    exact = np.array_equal(ctx[x_ctx], t_ctx[x_ctx]) and np.array_equal(w[x_w], t_w[x_w])
    print(f"{label}: gpu ctx {e['ctx']:.2e} w {e['w']:.2e} | numpy f32 ctx {e['np_ctx']:.2e} "
          f"w {e['np_w']:.2e} | empty rows {n_empty:3d} exact {'ok' if exact else 'NO'}"
          f"{' (no weights)' if no_weights else ''} -> {'pass' if ok and exact else 'FAIL'}")
    return ok and exact


def bool_mask(rng, shape, p_masked, dead=()):
    """True = attend, each entry masked with probability p_masked; index tuples in dead are
    set to False (whole rows when they name every axis but the last)."""
    m = rng.random(shape) >= p_masked
    for i in dead:
        m[i] = False
    return m


def float_mask(rng, shape, p_masked, fill=-np.inf, dead=()):
    """Normal values added to the scores, each entry replaced by fill with probability p_masked."""
    m = rng.standard_normal(shape).astype(np.float32)
    m[rng.random(shape) < p_masked] = fill
    for i in dead:
        m[i] = fill
    return m


def f32_min_mask(rng, shape):
    """finfo(float32).min entries (weight 0 beside anything else), a row of nothing but
    finfo.min (PyTorch: equal weights), a row of -inf and finfo.min (the finfo.min keys share
    the row), and a row of -inf (empty)."""
    m = float_mask(rng, shape, 0.3, F32_MIN)
    m[0, 0, 2] = F32_MIN
    m[1, 0, 5, : shape[-1] // 2] = -np.inf
    m[1, 0, 5, shape[-1] // 2:] = F32_MIN
    m[1, 0, 6] = -np.inf
    return m


# run cases beyond the first seven: mask, lengths and W_O (shape, projections as before).
RUN_MASKED = [
    # heads 2, W_O/b_O, bool mask (B, 1, n, n); row 4 of sequence 0 empty in both heads -> out = b_O
    dict(shape=(2, 30, 12), dk=16, dv=16, heads=2, causal=False, bias=True, scale=None, mag=1.0,
         wo=10, bo=True, mask=lambda r: bool_mask(r, (2, 1, 30, 30), 0.3, dead=[(0, 0, 4)])),
    # heads 2, per-head float mask (H, n, n) with -inf, causal, key lengths; row 3 empty in head 1
    dict(shape=(3, 25, 8), dk=None, dv=None, heads=2, causal=True, bias=False, scale=None, mag=1.0,
         mask=lambda r: float_mask(r, (2, 25, 25), 0.2, dead=[(1, 3)]), lengths=[25, 9, 3]),
    # unbatched, heads 4, W_O without b_O, causal + bool mask (n,) (key 0 masked: row 0 empty)
    dict(shape=(40, 16), dk=16, dv=24, heads=4, causal=True, bias=False, scale=None, mag=1.0,
         wo=16, bo=False, mask=lambda r: bool_mask(r, (40,), 0.3, dead=[0])),
]

# sdpa cases: q (B, H_q, L, E), k (B, H_kv, S, E), v (B, H_kv, S, E_v).
SDPA = [
    dict(what="L<S causal", B=2, Hq=3, Hkv=3, L=5, S=37, E=16, Ev=8, causal=True),
    dict(what="L>S causal", B=1, Hq=2, Hkv=2, L=70, S=23, E=8, Ev=12, causal=True),
    dict(what="L!=S scale", B=2, Hq=2, Hkv=2, L=19, S=50, E=8, Ev=8, scale=0.2),
    dict(what="GQA 2 causal", B=2, Hq=4, Hkv=2, L=33, S=33, E=16, Ev=16, causal=True),
    dict(what="GQA 4 bool (L,S)", B=1, Hq=8, Hkv=2, L=17, S=40, E=8, Ev=4,
         mask=lambda r: bool_mask(r, (17, 40), 0.3, dead=[3])),
    dict(what="bool (S,)", B=2, Hq=2, Hkv=2, L=24, S=31, E=12, Ev=12,
         mask=lambda r: bool_mask(r, (31,), 0.4)),
    dict(what="bool (B,1,1,S)", B=3, Hq=2, Hkv=2, L=10, S=45, E=8, Ev=8,
         mask=lambda r: bool_mask(r, (3, 1, 1, 45), 0.3, dead=[(1, 0, 0)])),
    dict(what="bool (B,H,L,S)", B=2, Hq=3, Hkv=3, L=21, S=21, E=8, Ev=8,
         mask=lambda r: bool_mask(r, (2, 3, 21, 21), 0.5, dead=[(0, 1, 4), (1, 2, 0), (1, 2, 20)])),
    dict(what="float -inf (L,S)", B=1, Hq=2, Hkv=2, L=30, S=26, E=8, Ev=8,
         mask=lambda r: float_mask(r, (30, 26), 0.25, dead=[0, 7])),
    dict(what="float f32 min (B,1,L,S)", B=2, Hq=2, Hkv=2, L=12, S=20, E=8, Ev=8,
         mask=lambda r: f32_min_mask(r, (2, 1, 12, 20))),
    dict(what="key lengths", B=3, Hq=2, Hkv=2, L=16, S=40, E=8, Ev=8, lengths=[40, 7, 1]),
    dict(what="lengths 0 GQA 2 causal", B=2, Hq=4, Hkv=2, L=18, S=25, E=8, Ev=8, causal=True,
         lengths=[0, 11]),
    dict(what="bool (B,H,L,S) causal L>S", B=2, Hq=2, Hkv=2, L=40, S=28, E=8, Ev=8, causal=True,
         mask=lambda r: bool_mask(r, (2, 2, 40, 28), 0.4, dead=[(0, 0, 30)])),
    dict(what="float (L,S) causal lengths", B=2, Hq=1, Hkv=1, L=32, S=32, E=16, Ev=8, causal=True,
         mask=lambda r: float_mask(r, (32, 32), 0.2), lengths=[32, 20]),
    dict(what="large logits x20 float", B=2, Hq=2, Hkv=2, L=40, S=40, E=16, Ev=16, mag=20.0,
         mask=lambda r: float_mask(r, (40, 40), 0.2, dead=[5])),
    dict(what="no weights GQA 2 bool", B=2, Hq=4, Hkv=2, L=50, S=64, E=32, Ev=16, no_weights=True,
         mask=lambda r: bool_mask(r, (2, 4, 50, 64), 0.3, dead=[(0, 3, 7), (1, 0, 49)])),
]


def main():
    rng = np.random.default_rng(20261122)
    cases = [
        dict(shape=(6, 16), dk=24, dv=28, heads=1, causal=False, bias=False, scale=None, mag=1.0),
        dict(shape=(37, 13), dk=10, dv=6, heads=2, causal=True, bias=True, scale=None, mag=1.0),
        dict(shape=(3, 129, 17), dk=12, dv=20, heads=4, causal=True, bias=True, scale=None, mag=1.0),
        dict(shape=(2, 64, 32), dk=32, dv=32, heads=8, causal=False, bias=False, scale=0.3, mag=1.0),
        dict(shape=(1000, 16), dk=16, dv=16, heads=1, causal=True, bias=False, scale=None, mag=1.0),
        dict(shape=(50, 8), dk=None, dv=None, heads=2, causal=False, bias=False, scale=None, mag=8.0),
        dict(shape=(1, 7), dk=3, dv=5, heads=1, causal=False, bias=True, scale=-0.5, mag=1.0),
    ] + RUN_MASKED
    total = len(cases) + len(SDPA)
    passed = 0
    with tempfile.TemporaryDirectory() as tmp:

        def save(name, a, i):
            np.save(f"{tmp}/{name}{i}.npy", a)
            return [f"--{name.replace('_', '-')}", f"{tmp}/{name}{i}.npy"]

        def options(c, i):
            """The case's mask and key lengths (drawn here, saved) and its flags."""
            mask = c["mask"](rng) if "mask" in c else None
            lengths = np.array(c["lengths"], np.int64) if "lengths" in c else None
            args = (save("mask", mask, i) if mask is not None else []) + (
                save("kv_lengths", lengths, i) if lengths is not None else [])
            args += ["--causal"] if c.get("causal") else []
            args += ["--scale", str(c["scale"])] if c.get("scale") is not None else []
            return mask, lengths, args

        for i, c in enumerate(cases):
            d = c["shape"][-1]
            x = (rng.standard_normal(c["shape"]) * c["mag"]).astype(np.float32)
            args = [BIN, "run", "--out", f"{tmp}/out{i}", "--heads", str(c["heads"])] + save("x", x, i)
            p = {}
            if c["dk"] is not None:
                p["wq"], p["wk"] = (rng.standard_normal((d, c["dk"])) / np.sqrt(d) for _ in range(2))
                p["wv"] = rng.standard_normal((d, c["dv"])) / np.sqrt(d)
                if c["bias"]:
                    p["bq"], p["bk"] = (rng.standard_normal(c["dk"]) for _ in range(2))
                    p["bv"] = rng.standard_normal(c["dv"])
            if "wo" in c:
                dv = c["dv"] or d
                p["wo"] = rng.standard_normal((dv, c["wo"])) / np.sqrt(dv)
                if c["bo"]:
                    p["bo"] = rng.standard_normal(c["wo"])
            for name in p:
                p[name] = p[name].astype(np.float32)
                args += save(name, p[name], i)
            mask, lengths, more = options(c, i)
            args += more
            label = f"case {i} run {c['shape']}" + "".join(
                f" {k}" for k in ("mask", "lengths", "wo") if k in c)
            passed += check(label, args, f"{tmp}/out{i}", lambda dt: attention(
                x, p, c["heads"], c["causal"], c["scale"], mask, lengths, dt))

        for j, c in enumerate(SDPA):
            i = len(cases) + j
            mag = c.get("mag", 1.0)
            q = (rng.standard_normal((c["B"], c["Hq"], c["L"], c["E"])) * mag).astype(np.float32)
            k = (rng.standard_normal((c["B"], c["Hkv"], c["S"], c["E"])) * mag).astype(np.float32)
            v = rng.standard_normal((c["B"], c["Hkv"], c["S"], c["Ev"])).astype(np.float32)
            args = [BIN, "sdpa", "--out", f"{tmp}/out{i}"] + save("q", q, i) + save("k", k, i) + save("v", v, i)
            causal, scale = c.get("causal", False), c.get("scale")
            mask, lengths, more = options(c, i)
            args += more + (["--context-only"] if c.get("no_weights") else [])
            label = f"case {i} sdpa {c['what']} q{q.shape} kv{k.shape[1:3]}"
            passed += check(label, args, f"{tmp}/out{i}", lambda dt: sdpa_reference(
                q, k, v, causal, scale, mask, lengths, dt))
    print(f"{passed} passed, {total - passed} failed")
    sys.exit(0 if passed == total else 1)


if __name__ == "__main__":
    main()
