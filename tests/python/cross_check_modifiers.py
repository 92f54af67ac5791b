#!/usr/bin/env python3
"""Score and mask modifiers through `wgpu-attention sdpa` and `run`, against NumPy float64.

The modifiers' acceptance check: on shapes the tests never use (not multiples of the tiles,
L != S, grouped-query heads, batches), each preset alone and in combinations, with causal, a
boolean or float mask, and a caller's own `score_mod`/`mask_mod` WGSL files reading
`--mod-buffer` arrays, the CLI's context (and weights) must match an independent float64
implementation written here to 1e-5 relative, and its gradients (`--grad-output`) to 1e-4;
everything must be finite, and what is exact by definition (weights of hidden keys, rows with
nothing to attend to) must be exact.

The semantics, written here from their definitions (docs/semantics.md, `sdpa --help`):
the scaled score s = scale * q.k goes through the score modifiers in one fixed order whatever
the flags' order (the caller's --score-mod, ALiBi, T5's relative bias, the soft-cap last),
then the mask's bias (a float mask adds, a bool mask hides), then the mask modifiers and-ed
with causal (window, documents, prefix-LM, the caller's --mask-mod). Softmax per row; a row
with nothing visible gives weights 0 and output 0. The backward multiplies dS by the chain of
the score modifiers' derivatives; T5's table gets dS taken back through the modifiers after
the bias (the soft-cap), summed per (bucket, head).

`run` cases with `--grad-output` and modifiers are SKIPPED (not failed) where the binary
refuses modifiers on a layer forward saved for the backward (builds before that backward);
that refusal, recognised by its message, is the only error tolerated.

    python3 tests/python/cross_check_modifiers.py [path/to/wgpu-attention [extra flags]]
"""
import math
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(__file__), "..", "..", "target", "debug", "wgpu-attention")
EXTRA = sys.argv[2:]  # appended to every invocation
FWD_TOL, GRAD_TOL = 1e-5, 1e-4
# The one tolerated error: run --grad-output with modifiers, refused by older builds.
UNSUPPORTED_SAVED = re.compile(r"not support\S* score/mask modifiers on a layer forward saved for the backward")


# ---------------------------------------------------------------- the float64 semantics

def t5_bucket(d, num_buckets, max_distance, bidirectional):
    """T5's `_relative_position_bucket` (Hugging Face) of the relative position d = j - i,
    its logarithm in float32 as PyTorch computes it."""
    d = np.asarray(d, np.int64)
    bucket = np.zeros_like(d)
    nb = num_buckets
    if bidirectional:
        nb //= 2
        bucket += (d > 0).astype(np.int64) * nb
        dist = np.abs(d)
    else:
        dist = -np.minimum(d, 0)
    max_exact = nb // 2
    with np.errstate(divide="ignore"):
        large = np.log(dist.astype(np.float32) / np.float32(max_exact))
    large = large / np.float32(math.log(max_distance / max_exact)) * np.float32(nb - max_exact)
    large = max_exact + np.where(np.isfinite(large), large, 0).astype(np.int64)  # trunc like .to(long)
    large = np.minimum(large, nb - 1)
    return bucket + np.where(dist < max_exact, dist, large)


def score_chain(s, m, B, H, L, S):
    """The score modifiers in their fixed order on the scaled score s (B, H, L, S): returns
    the modified score, the derivative of the whole chain by s, the derivative of the
    modifiers after T5's bias (by the bias's output), and the T5 buckets (L, S) or None."""
    i = np.arange(L)[:, None]
    j = np.arange(S)[None, :]
    d_all = np.ones_like(s)
    d_after_bias = np.ones_like(s)
    buckets = None
    if m.get("score_mod") is not None:  # the caller's, first
        f, df = m["score_mod"]
        d_all = d_all * df(s)
        s = f(s)
    if m.get("alibi") is not None:
        s = s + m["alibi"].astype(np.float64)[None, :, None, None] * (j - i)[None, None]
    if m.get("relbias") is not None:
        table, md, bidir = m["relbias"]
        buckets = t5_bucket(j - i, table.shape[0], md, bidir)
        s = s + table.astype(np.float64).T[:, buckets][None]  # (1, H, L, S)
    if m.get("softcap") is not None:  # last
        c = float(np.float32(m["softcap"]))
        t = np.tanh(s / c)
        d_all = d_all * (1 - t * t)
        d_after_bias = d_after_bias * (1 - t * t)
        s = c * t
    return s, d_all, d_after_bias, buckets


def visible_keys(m, causal, B, H, L, S):
    """causal and-ed with the mask modifiers: (B, H, L, S) bool."""
    i = np.arange(L)[:, None]
    j = np.arange(S)[None, :]
    vis = np.ones((B, H, L, S), bool)
    if causal:  # top-left: j <= i
        vis &= (j <= i)[None, None]
    if m.get("window") is not None:
        left, right = m["window"]
        vis &= ((j >= i - left) & (j <= i + right))[None, None]
    if m.get("docs") is not None:
        ids = m["docs"]
        vis &= (ids[:, :L, None] == ids[:, None, :S])[:, None]
    if m.get("prefix") is not None:
        vis &= ((j < m["prefix"]) | (j <= i))[None, None]
    if m.get("mask_mod") is not None:
        vis &= m["mask_mod"](B, H, L, S)
    return vis


def attention64(q, k, v, causal, scale, mask, m):
    """Forward in float64: q (B, H, L, E), k (B, Hkv, S, E), v (B, Hkv, S, Ev). Returns the
    context, the weights and what the backward needs."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    B, H, L, E = q.shape
    S = k.shape[2]
    g = H // k.shape[1]
    kr, vr = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)  # head h reads kv head h // g
    if scale is None:
        scale = 1.0 / math.sqrt(E)
    scale = float(np.float32(scale))
    s = scale * (q @ kr.transpose(0, 1, 3, 2))
    s, d_all, d_after_bias, buckets = score_chain(s, m, B, H, L, S)
    vis = visible_keys(m, causal, B, H, L, S)
    if mask is not None:
        if mask.dtype == bool:
            vis = vis & np.broadcast_to(mask, vis.shape)
        else:
            s = s + mask.astype(np.float64)
            vis = vis & np.broadcast_to(mask != -np.inf, vis.shape)
    s = np.where(vis, s, -np.inf)
    empty = ~vis.any(axis=-1, keepdims=True)
    mx = np.where(empty, 0, s.max(axis=-1, keepdims=True))
    e = np.where(vis, np.exp(s - mx), 0)
    p = e / np.where(empty, 1, e.sum(axis=-1, keepdims=True))
    ctx = p @ vr
    saved = dict(q=q, kr=kr, vr=vr, p=p, scale=scale, g=g, d_all=d_all,
                 d_after_bias=d_after_bias, buckets=buckets, H=H)
    return ctx, p, vis, empty[..., 0], saved


def backward64(do, sv, nb=None):
    """dQ, dK, dV (and T5's table gradient when nb is given) from dO (B, H, L, Ev)."""
    do = do.astype(np.float64)
    p, q, kr, vr, scale, g = sv["p"], sv["q"], sv["kr"], sv["vr"], sv["scale"], sv["g"]
    dv = p.transpose(0, 1, 3, 2) @ do
    dp = do @ vr.transpose(0, 1, 3, 2)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    ds_raw = ds * sv["d_all"]
    dq = scale * ds_raw @ kr
    dk = scale * ds_raw.transpose(0, 1, 3, 2) @ q
    B, H = q.shape[:2]
    fold = lambda a: a.reshape(B, H // g, g, *a.shape[2:]).sum(axis=2)  # kv heads sum their query heads
    out = dict(grad_q=dq, grad_k=fold(dk), grad_v=fold(dv))
    if nb is not None:
        gb = (ds * sv["d_after_bias"]).sum(axis=0)  # (H, L, S)
        table = np.zeros((nb, H))
        for h in range(H):
            table[:, h] = np.bincount(sv["buckets"].ravel(), weights=gb[h].ravel(), minlength=nb)
        out["grad_relative_bias"] = table
    return out


def run64(x, p, heads, causal, scale, mask, m):
    """`run`: X (n, d) or (b, n, d), projections split into heads of contiguous columns,
    attention, heads concatenated, W_O. Returns the output, the weights (the CLI's shape),
    the visibility, the empty rows and a function of dO giving the gradients."""
    x64 = x.astype(np.float64)
    batched = x.ndim == 3
    xb = x64 if batched else x64[None]
    w = {n: a.astype(np.float64) for n, a in p.items()}
    q, k, v = xb @ w["wq"], xb @ w["wk"], xb @ w["wv"]
    if "bq" in w:
        q, k, v = q + w["bq"], k + w["bk"], v + w["bv"]
    b, n, dk = q.shape
    dv = v.shape[-1]
    split = lambda a: a.reshape(b, n, heads, a.shape[-1] // heads).transpose(0, 2, 1, 3)
    ctx, pw, vis, empty, sv = attention64(split(q), split(k), split(v), causal, scale, mask, m)
    c = ctx.transpose(0, 2, 1, 3).reshape(b, n, dv)
    out = c @ w["wo"] + w.get("bo", 0) if "wo" in w else c

    def grads(do, nb=None):
        do = do.astype(np.float64)
        do = do if batched else do[None]
        gr = {}
        if "wo" in w:
            gr["grad_wo"] = np.einsum("bnd,bne->de", c, do)
            if "bo" in w:
                gr["grad_bo"] = do.sum(axis=(0, 1))
            dc = do @ w["wo"].T
        else:
            dc = do
        g = backward64(split(dc), sv, nb)
        if nb is not None:
            gr["grad_relative_bias"] = g["grad_relative_bias"]
        merge = lambda a: a.transpose(0, 2, 1, 3).reshape(b, n, -1)
        dq, dkk, dvv = merge(g["grad_q"]), merge(g["grad_k"]), merge(g["grad_v"])
        for name, dd in (("q", dq), ("k", dkk), ("v", dvv)):
            gr[f"grad_w{name}"] = np.einsum("bnd,bne->de", xb, dd)
            if f"b{name}" in w:
                gr[f"grad_b{name}"] = dd.sum(axis=(0, 1))
        dx = dq @ w["wq"].T + dkk @ w["wk"].T + dvv @ w["wv"].T
        gr["grad_x"] = dx if batched else dx[0]
        return gr

    wshape = ((b,) if batched else ()) + ((heads,) if heads > 1 else ()) + (n, n)
    return (out if batched else out[0]), pw.reshape(wshape), vis.reshape(wshape), empty, grads


# ---------------------------------------------------------------- a caller's WGSL and its twin

def own_score_mod(bias, nh, nb_kv):
    # (The buffer is `hbias`: one named `bias` collides with matmul_subgroup.wgsl's binding
    # of that name on the weights path, a CLI bug reported with this script.)
    """hbias[b * H + h] * kv / S added (an f32 buffer), then a smooth squash: s - 0.04 s^3 / (1 + s^2).
    WGSL text, its derivative's text, and the NumPy pair (f, df) on (B, H, L, S)."""
    wgsl = ("fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n"
            "    let s2 = score * score;\n"
            f"    return score - 0.04 * s2 * score / (1.0 + s2) + hbias[b * {nh}u + h] * f32(kv) / {nb_kv}.0;\n"
            "}\n")
    grad = ("fn score_mod_grad(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n"
            "    let s2 = score * score;\n"
            "    let d = 1.0 + s2;\n"
            "    return 1.0 - 0.04 * (3.0 * s2 + s2 * s2) / (d * d);\n"
            "}\n")
    bb = bias.astype(np.float64)

    def f(s):
        B, H, L, S = s.shape
        add = bb.reshape(-1)[: B * H].reshape(B, H, 1, 1) * np.arange(S)[None, None, None, :] / nb_kv
        return s - 0.04 * s ** 3 / (1 + s * s) + add

    def df(s):
        return 1 - 0.04 * (3 * s * s + s ** 4) / (1 + s * s) ** 2

    return wgsl, grad, (f, df)


def own_mask_mod(group):
    """Keys of the query's own group (group[q] == group[kv], an i32 buffer indexed by
    position) or one of the two sink keys, and a per-(b, h) stripe hiding every 5th key."""
    wgsl = ("fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool {\n"
            "    let same = group[q] == group[kv];\n"
            "    return (same || kv < 2u) && (kv + 2u * h + b) % 5u != 3u;\n"
            "}\n")

    def f(B, H, L, S):
        q = np.arange(L)[None, None, :, None]
        kv = np.arange(S)[None, None, None, :]
        h = np.arange(H)[None, :, None, None]
        b = np.arange(B)[:, None, None, None]
        same = group[:L][None, None, :, None] == group[:S][None, None, None, :]
        return (same | (kv < 2)) & ((kv + 2 * h + b) % 5 != 3)

    return wgsl, f


# ---------------------------------------------------------------- the cases

# sdpa: q (B, H, L, E), k/v (B, Hkv, S, E/Ev). `mods` names the modifiers drawn in make_mods.
SDPA = [
    dict(what="window", B=2, H=4, Hkv=2, L=37, S=53, E=16, Ev=8, mods=["window"], grad=True),
    dict(what="window causal L>S", B=1, H=2, Hkv=2, L=61, S=37, E=8, Ev=12, causal=True,
         mods=["window"], window=(5, 0)),
    dict(what="softcap scale", B=2, H=2, Hkv=2, L=7, S=53, E=8, Ev=8, scale=0.9, mods=["softcap"],
         grad=True),
    dict(what="alibi GQA 4:1", B=1, H=4, Hkv=1, L=37, S=37, E=16, Ev=16, mods=["alibi"], grad=True),
    dict(what="alibi causal", B=2, H=3, Hkv=3, L=61, S=5, E=8, Ev=4, causal=True, mods=["alibi"]),
    dict(what="documents", B=2, H=2, Hkv=1, L=37, S=53, E=8, Ev=8, mods=["docs"], grad=True),
    dict(what="prefix", B=1, H=2, Hkv=2, L=61, S=53, E=12, Ev=8, mods=["prefix"], grad=True),
    dict(what="prefix causal", B=2, H=4, Hkv=2, L=7, S=37, E=8, Ev=8, causal=True, mods=["prefix"]),
    dict(what="t5 bidirectional", B=2, H=2, Hkv=2, L=37, S=53, E=8, Ev=8, mods=["relbias"],
         grad=True),
    dict(what="t5 unidirectional md 20", B=1, H=4, Hkv=2, L=61, S=37, E=8, Ev=8, mods=["relbias"],
         unidirectional=True, max_distance=20, buckets=16, grad=True),
    dict(what="window+alibi+softcap causal", B=2, H=4, Hkv=2, L=61, S=53, E=16, Ev=16, causal=True,
         mods=["window", "alibi", "softcap"], window=(17, 3), grad=True),
    dict(what="documents+prefix", B=2, H=2, Hkv=2, L=37, S=37, E=8, Ev=8,
         mods=["docs", "prefix"], grad=True),
    dict(what="t5 both ways+softcap", B=2, H=2, Hkv=1, L=53, S=37, E=8, Ev=8,
         mods=["relbias", "softcap"], grad=True),
    dict(what="t5 unidir+softcap+alibi causal", B=1, H=4, Hkv=4, L=37, S=53, E=8, Ev=8,
         causal=True, unidirectional=True, mods=["relbias", "softcap", "alibi"], grad=True),
    dict(what="own score+mask mods+window", B=2, H=4, Hkv=2, L=37, S=53, E=16, Ev=8,
         mods=["own_score", "own_mask", "window"], window=(20, 20), grad=True),
    dict(what="own score+softcap+t5 (chain)", B=1, H=2, Hkv=2, L=61, S=61, E=8, Ev=8,
         mods=["own_score", "softcap", "relbias"], scale=0.5, grad=True),
    dict(what="own mask+docs causal", B=2, H=2, Hkv=1, L=53, S=53, E=8, Ev=8, causal=True,
         mods=["own_mask", "docs"]),
    dict(what="bool mask+window+alibi", B=2, H=4, Hkv=2, L=37, S=53, E=8, Ev=8,
         mods=["window", "alibi"], mask="bool", grad=True),
    dict(what="bool mask+softcap+prefix causal", B=1, H=2, Hkv=2, L=61, S=37, E=8, Ev=8,
         causal=True, mods=["softcap", "prefix"], mask="bool"),
    dict(what="float mask+softcap+t5", B=2, H=2, Hkv=2, L=7, S=37, E=8, Ev=8,
         mods=["softcap", "relbias"], mask="float", grad=True),
    dict(what="everything", B=2, H=4, Hkv=2, L=61, S=53, E=16, Ev=8, causal=False,
         mods=["own_score", "alibi", "relbias", "softcap", "window", "docs", "prefix", "own_mask"],
         window=(30, 10), mask="bool", grad=True),
    dict(what="L=1 window+alibi", B=2, H=2, Hkv=1, L=1, S=53, E=8, Ev=8,
         mods=["window", "alibi"], window=(0, 40)),
    dict(what="empty rows window L>S", B=1, H=2, Hkv=2, L=61, S=5, E=8, Ev=8,
         mods=["window", "softcap"], window=(3, 0), grad=True),
]

# run: X (n, d) or (b, n, d); dk/dv projection widths, wo output width (None: no W_O).
RUN = [
    dict(what="window+softcap causal", shape=(2, 37, 16), dk=16, dv=16, heads=2, wo=12,
         causal=True, mods=["window", "softcap"], window=(9, 0)),
    dict(what="alibi+t5", shape=(61, 12), dk=12, dv=8, heads=4, wo=None,
         mods=["alibi", "relbias"]),
    dict(what="documents+prefix biases", shape=(2, 53, 8), dk=8, dv=12, heads=2, wo=8, bias=True,
         mods=["docs", "prefix"]),
    dict(what="own mods+bool mask", shape=(1, 37, 16), dk=16, dv=16, heads=4, wo=16,
         mods=["own_score", "own_mask"], mask="bool", scale=0.3),
    dict(what="grad window+alibi+softcap", shape=(2, 37, 16), dk=16, dv=16, heads=2, wo=12,
         causal=True, mods=["window", "alibi", "softcap"], window=(9, 0), grad=True),
    dict(what="grad t5+docs", shape=(53, 8), dk=8, dv=8, heads=2, wo=None, bias=True,
         mods=["relbias", "docs"], grad=True),
    dict(what="grad t5+softcap causal biases", shape=(2, 61, 8), dk=8, dv=8, heads=2, wo=8,
         bias=True, causal=True, mods=["relbias", "softcap"], unidirectional=True, grad=True),
    dict(what="grad own mods", shape=(2, 37, 8), dk=8, dv=8, heads=2, wo=8,
         mods=["own_score", "own_mask", "prefix"], grad=True),
]


def make_mods(c, rng, B, H, L, S, save, tmp, i):
    """Draws the case's modifiers: (the dict score_chain/visible_keys read, the CLI flags)."""
    m, chunks = {}, []  # one flag (and its value) a chunk
    names = c["mods"]
    if "window" in names:
        m["window"] = c.get("window", (int(rng.integers(3, 12)), int(rng.integers(0, 9))))
        chunks.append(["--window", f"{m['window'][0]},{m['window'][1]}"])
    if "softcap" in names:
        m["softcap"] = float(rng.uniform(0.6, 2.0))
        chunks.append(["--softcap", repr(m["softcap"])])
    if "alibi" in names:
        m["alibi"] = (2.0 ** (-8.0 * np.arange(1, H + 1) / H) * rng.uniform(0.5, 2, H)).astype(np.float32)
        chunks.append(save("alibi", m["alibi"]))
    if "docs" in names:
        n = max(L, S) + int(rng.integers(0, 4))
        ids = np.sort(rng.integers(0, 5, (B, n)), axis=1).astype(np.int32)
        m["docs"] = ids
        chunks.append(save("document_ids", ids))
    if "prefix" in names:
        m["prefix"] = int(rng.integers(1, max(2, min(L, S))))
        chunks.append(["--prefix-length", str(m["prefix"])])
    if "relbias" in names:
        nb = c.get("buckets", 32)
        md = c.get("max_distance", 128 if rng.random() < 0.5 else 40)
        table = rng.standard_normal((nb, H)).astype(np.float32)
        bidir = not c.get("unidirectional", False)
        m["relbias"] = (table, md, bidir)
        chunks += [save("relative_bias", table), ["--relative-bias-max-distance", str(md)]]
        chunks += [] if bidir else [["--relative-bias-unidirectional"]]
    if "own_score" in names:
        bias = rng.standard_normal(B * H).astype(np.float32)
        wgsl, grad, fdf = own_score_mod(bias, H, S)
        m["score_mod"] = fdf
        for name, text in (("score", wgsl), ("score_grad", grad)):
            with open(f"{tmp}/{name}{i}.wgsl", "w") as f:
                f.write(text)
        np.save(f"{tmp}/hbias{i}.npy", bias)
        chunks += [["--score-mod", f"{tmp}/score{i}.wgsl"], ["--score-mod-grad", f"{tmp}/score_grad{i}.wgsl"],
                   ["--mod-buffer", f"hbias={tmp}/hbias{i}.npy"]]
    if "own_mask" in names:
        group = (rng.integers(0, 3, max(L, S))).astype(np.int32)
        wgsl, f = own_mask_mod(group)
        m["mask_mod"] = f
        with open(f"{tmp}/mask{i}.wgsl", "w") as fh:
            fh.write(wgsl)
        np.save(f"{tmp}/group{i}.npy", group)
        chunks += [["--mask-mod", f"{tmp}/mask{i}.wgsl"], ["--mod-buffer", f"group={tmp}/group{i}.npy"]]
    # The flags in a shuffled order: the score modifiers' order must not depend on it.
    order = rng.permutation(len(chunks))
    return m, [a for o in order for a in chunks[o]]


def rel(a, ref, floor=None):
    """||a - ref|| / ||ref|| (or / ||floor|| where that is larger)."""
    den = max(np.linalg.norm(ref.ravel()), 0 if floor is None else np.linalg.norm(floor.ravel()))
    num = np.linalg.norm((a.astype(np.float64) - ref).ravel())
    return float(num / den) if den > 0 else float(num)


# A gradient that may be (near) zero by definition is measured against a companion's norm:
# b_K shifts a row's scores by one constant, which the softmax ignores unless a nonlinear
# score modifier (the soft-cap, a caller's) comes first.
FLOOR = {"grad_bk": "grad_bq"}


def compare(out, expected, tol):
    """Loads out/NAME.npy for each expected array: (rel errors by name, problems)."""
    bad, errs = [], {}
    for name, ref in expected.items():
        path = f"{out}/{name}.npy"
        if not os.path.exists(path):
            bad.append(f"{name}.npy missing")
            continue
        a = np.load(path)
        if a.shape != ref.shape or a.dtype != np.float32 or not np.isfinite(a).all():
            bad.append(f"{name} {a.dtype} {a.shape} (expected float32 {ref.shape}, finite)")
            continue
        e = rel(a, ref, expected.get(FLOOR.get(name)))
        errs[name] = e
        if not e < tol:
            bad.append(f"{name} {e:.2e} >= {tol:.0e}")
    return errs, bad


class Tally:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0
        self.worst = {}

    def note(self, kind, errs):
        for e in errs.values():
            self.worst[kind] = max(self.worst.get(kind, 0.0), e)


def run_cli(args):
    return subprocess.run([BIN] + args + EXTRA, capture_output=True, text=True)


def fmt(errs):
    return " ".join(f"{k.replace('grad_', 'd')} {v:.1e}" for k, v in errs.items())


def main():
    rng = np.random.default_rng(20261124)
    tally = Tally()
    with tempfile.TemporaryDirectory() as tmp:
        for ci, c in enumerate(SDPA + RUN):
            i = ci

            def save(name, a):
                np.save(f"{tmp}/{name}{i}.npy", a)
                return [f"--{name.replace('_', '-')}", f"{tmp}/{name}{i}.npy"]

            is_run = ci >= len(SDPA)
            causal, scale = c.get("causal", False), c.get("scale")
            if is_run:
                shape = c["shape"]
                b = shape[0] if len(shape) == 3 else 1
                n, d = shape[-2], shape[-1]
                B, H, L, S = b, c["heads"], n, n
            else:
                B, H, L, S = c["B"], c["H"], c["L"], c["S"]
            m, margs = make_mods(c, rng, B, H, L, S, save, tmp, i)
            mask = None
            if c.get("mask") == "bool":
                mshape = [(L, S), (B, 1, L, S), (1, H, 1, S)][i % 3]
                mask = rng.random(mshape) >= 0.25
            elif c.get("mask") == "float":
                mask = rng.standard_normal((B, 1, L, S)).astype(np.float32)
                mask[rng.random(mask.shape) < 0.2] = -np.inf
            flags = margs + (save("mask", mask) if mask is not None else [])
            flags += ["--causal"] if causal else []
            flags += ["--scale", repr(scale)] if scale is not None else []

            if is_run:
                x = rng.standard_normal(shape).astype(np.float32)
                p = dict(wq=rng.standard_normal((d, c["dk"])) / math.sqrt(d),
                         wk=rng.standard_normal((d, c["dk"])) / math.sqrt(d),
                         wv=rng.standard_normal((d, c["dv"])) / math.sqrt(d))
                if c.get("bias"):
                    p.update(bq=rng.standard_normal(c["dk"]) * 0.3, bk=rng.standard_normal(c["dk"]) * 0.3,
                             bv=rng.standard_normal(c["dv"]) * 0.3)
                if c["wo"]:
                    p["wo"] = rng.standard_normal((c["dv"], c["wo"])) / math.sqrt(c["dv"])
                p = {k: a.astype(np.float32) for k, a in p.items()}
                inputs = save("x", x)
                for k, a in p.items():
                    inputs += save(k, a)
                inputs += ["--heads", str(H)]
                ref_out, ref_w, vis, empty, grads = run64(x, p, H, causal, scale, mask, m)
                label = f"run  {c['what']} x{shape} heads {H}"
                cmd = "run"
            else:
                q = rng.standard_normal((B, H, L, c["E"])).astype(np.float32)
                k = rng.standard_normal((B, c["Hkv"], S, c["E"])).astype(np.float32)
                v = rng.standard_normal((B, c["Hkv"], S, c["Ev"])).astype(np.float32)
                inputs = save("q", q) + save("k", k) + save("v", v)
                ref_out, ref_w, vis, empty, sv = attention64(q, k, v, causal, scale, mask, m)
                label = f"sdpa {c['what']} q{q.shape} kv{k.shape[1:3]}"
                cmd = "sdpa"
            n_empty = int(empty.sum())

            # The forward, with the weights.
            out = f"{tmp}/out{i}"
            r = run_cli([cmd, "--out", out] + inputs + flags)
            if r.returncode != 0:
                print(f"{label}: FAIL: wgpu-attention failed: {r.stderr.strip()}")
                tally.failed += 1
            else:
                errs, bad = compare(out, dict(context=ref_out, weights=ref_w), FWD_TOL)
                exact = "ok"
                if not bad:
                    w = np.load(f"{out}/weights.npy")
                    ctx = np.load(f"{out}/context.npy")
                    hidden = ~np.broadcast_to(vis, ref_w.shape)
                    if np.any(w[hidden] != 0):
                        bad.append("hidden keys weigh != 0")
                        exact = "NO"
                    if not is_run and np.any(ctx[np.broadcast_to(empty[..., None], ctx.shape)] != 0):
                        bad.append("empty rows' context != 0")
                        exact = "NO"
                tally.note("forward", errs)
                ok = not bad
                tally.passed += ok
                tally.failed += not ok
                print(f"{label}: {fmt(errs)} | empty rows {n_empty} exact {exact} -> "
                      f"{'pass' if ok else 'FAIL: ' + '; '.join(bad)}")

            if not c.get("grad"):
                continue
            # The gradients (context only).
            do = rng.standard_normal(ref_out.shape).astype(np.float32)
            gflags = save("grad_output", do) + ["--context-only"]
            out = f"{tmp}/grad{i}"
            nb = m["relbias"][0].shape[0] if "relbias" in m else None
            expected = grads(do, nb) if is_run else backward64(do, sv, nb)
            expected["context"] = ref_out
            glabel = f"{label} grad"
            r = run_cli([cmd, "--out", out] + inputs + flags + gflags)
            if r.returncode != 0:
                msg = r.stderr.strip()
                if is_run and UNSUPPORTED_SAVED.search(msg):
                    print(f"{glabel}: SKIPPED ({msg.splitlines()[-1][:160]})")
                    tally.skipped += 1
                else:
                    print(f"{glabel}: FAIL: wgpu-attention failed: {msg}")
                    tally.failed += 1
                continue
            ctx_ref = expected.pop("context")
            errs, bad = compare(out, expected, GRAD_TOL)
            written = {f[:-4] for f in os.listdir(out) if f.startswith("grad_") and f.endswith(".npy")}
            if written != set(expected):
                bad.append(f"gradients written {sorted(written)}, expected {sorted(expected)}")
            cerrs, cbad = compare(out, dict(context=ctx_ref), FWD_TOL)
            tally.note("gradient", errs)
            tally.note("forward", cerrs)
            if os.path.exists(f"{out}/weights.npy"):
                cbad.append("weights.npy written with --context-only")
            ok = not bad and not cbad
            tally.passed += ok
            tally.failed += not ok
            print(f"{glabel}: {fmt(cerrs)} {fmt(errs)} -> {'pass' if ok else 'FAIL: ' + '; '.join(bad + cbad)}")

    worst = ", ".join(f"{k} {v:.2e}" for k, v in tally.worst.items())
    print(f"{tally.passed} passed, {tally.failed} failed, {tally.skipped} skipped (worst rel: {worst})")
    sys.exit(1 if tally.failed else 0)


if __name__ == "__main__":
    main()
