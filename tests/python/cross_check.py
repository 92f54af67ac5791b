#!/usr/bin/env python3
"""Independent cases from NumPy, run through `wgpu-attention run`, compared.

NumPy evaluates each case twice, in float64 (the truth) and in float32 (what a float32
implementation is expected to reach). The GPU's relative error against the float64 truth
must stay within a small multiple of float32 NumPy's own, for the context and the weights,
and everything must be finite.

    python3 tests/python/cross_check.py [path/to/wgpu-attention]
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(__file__), "..", "..", "target", "debug", "wgpu-attention")


def attention(x, wq, wk, wv, bq, bk, bv, heads, causal, scale, dtype):
    x = x.astype(dtype)
    if wq is None:
        q = k = v = x
    else:
        q, k, v = x @ wq.astype(dtype), x @ wk.astype(dtype), x @ wv.astype(dtype)
        if bq is not None:
            q, k, v = q + bq.astype(dtype), k + bk.astype(dtype), v + bv.astype(dtype)
    batched = x.ndim == 3
    if not batched:
        q, k, v = q[None], k[None], v[None]
    b, n, dk = q.shape
    dv = v.shape[-1]
    qh = q.reshape(b, n, heads, dk // heads).transpose(0, 2, 1, 3)
    kh = k.reshape(b, n, heads, dk // heads).transpose(0, 2, 1, 3)
    vh = v.reshape(b, n, heads, dv // heads).transpose(0, 2, 1, 3)
    if scale is None:
        scale = 1.0 / np.sqrt(dk // heads)
    s = (qh @ kh.transpose(0, 1, 3, 2)) * dtype(scale)
    if causal:
        s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    a = e / e.sum(axis=-1, keepdims=True)
    ctx = (a @ vh).transpose(0, 2, 1, 3).reshape(b, n, dv)
    if not batched:
        ctx, a = ctx[0], a[0]
    if heads == 1:
        a = a[..., 0, :, :] if batched else a[0]
    return ctx, a


def rel(a, ref):
    return float(np.linalg.norm((a.astype(np.float64) - ref).ravel()) / np.linalg.norm(ref.ravel()))


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
    ]
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, c in enumerate(cases):
            d = c["shape"][-1]
            x = (rng.standard_normal(c["shape"]) * c["mag"]).astype(np.float32)
            args = [BIN, "run", "--x", f"{tmp}/x{i}.npy", "--out", f"{tmp}/out{i}", "--heads", str(c["heads"])]
            np.save(f"{tmp}/x{i}.npy", x)
            wq = wk = wv = bq = bk = bv = None
            if c["dk"] is not None:
                wq, wk = (rng.standard_normal((d, c["dk"])) / np.sqrt(d) for _ in range(2))
                wv = rng.standard_normal((d, c["dv"])) / np.sqrt(d)
                wq, wk, wv = (w.astype(np.float32) for w in (wq, wk, wv))
                for name, w in (("wq", wq), ("wk", wk), ("wv", wv)):
                    np.save(f"{tmp}/{name}{i}.npy", w)
                    args += [f"--{name}", f"{tmp}/{name}{i}.npy"]
                if c["bias"]:
                    bq, bk = (rng.standard_normal(c["dk"]).astype(np.float32) for _ in range(2))
                    bv = rng.standard_normal(c["dv"]).astype(np.float32)
                    for name, b in (("bq", bq), ("bk", bk), ("bv", bv)):
                        np.save(f"{tmp}/{name}{i}.npy", b)
                        args += [f"--{name}", f"{tmp}/{name}{i}.npy"]
            if c["causal"]:
                args.append("--causal")
            if c["scale"] is not None:
                args += ["--scale", str(c["scale"])]
            r = subprocess.run(args, capture_output=True, text=True)
            if r.returncode != 0:
                print(f"case {i}: wgpu-attention failed: {r.stderr.strip()}")
                failed += 1
                continue
            ctx = np.load(f"{tmp}/out{i}/context.npy")
            w = np.load(f"{tmp}/out{i}/weights.npy")
            t_ctx, t_w = attention(x, wq, wk, wv, bq, bk, bv, c["heads"], c["causal"], c["scale"], np.float64)
            f_ctx, f_w = attention(x, wq, wk, wv, bq, bk, bv, c["heads"], c["causal"], c["scale"], np.float32)
            ok = ctx.dtype == np.float32 and ctx.shape == t_ctx.shape and w.shape == t_w.shape
            ok = ok and np.isfinite(ctx).all() and np.isfinite(w).all()
            e = dict(ctx=rel(ctx, t_ctx), w=rel(w, t_w), np_ctx=rel(f_ctx, t_ctx), np_w=rel(f_w, t_w))
            # Within 10x of float32 NumPy's own error (floor: a few ulps of f32).
            ok = ok and e["ctx"] <= 10 * max(e["np_ctx"], 1e-7) and e["w"] <= 10 * max(e["np_w"], 1e-7)
            failed += not ok
            print(f"case {i} {c['shape']}: gpu ctx {e['ctx']:.2e} w {e['w']:.2e} | "
                  f"numpy f32 ctx {e['np_ctx']:.2e} w {e['np_w']:.2e} -> {'pass' if ok else 'FAIL'}")
    print(f"{len(cases) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
