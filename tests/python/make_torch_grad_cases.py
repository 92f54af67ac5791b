#!/usr/bin/env python3
"""PyTorch-autograd cases for the gradients, saved for `cargo test` (tests/torch_grad_cases.rs).

Run by hand where PyTorch is installed (CI has no torch; the files it writes are committed):

    python3 tests/python/make_torch_grad_cases.py   # writes tests/data/torch_grad/<case>/

Each case holds the inputs as float32 .npy (as the CLI reads them), dO (`grad_output.npy`),
PyTorch's float64 gradients of every input (`want_<flag>.npy`, from autograd on the float64
copies of the same float32 values), and `meta.json` with the CLI flags. The test runs
`wgpu-attention run|sdpa ... --grad-output grad_output.npy` and compares each
`grad_<flag>.npy` it writes with `want_<flag>.npy`.
"""
import json
import os

import numpy as np
import torch
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(__file__), "..", "data", "torch_grad")
g = torch.Generator().manual_seed(13)


def rnd(*shape, s=1.0):
    # float32 values, held as float64 so autograd runs in float64 on exactly those values.
    return (torch.randn(*shape, generator=g) * s).float().double().requires_grad_(True)


def save(case, inputs, grads, d_o, meta):
    d = os.path.join(OUT, case)
    os.makedirs(d, exist_ok=True)
    for name, a in inputs.items():
        a = a.detach().numpy()
        np.save(os.path.join(d, name + ".npy"), a.astype(a.dtype if a.dtype == bool else np.float32) if a.dtype != np.int64 else a)
    np.save(os.path.join(d, "grad_output.npy"), d_o.detach().numpy().astype(np.float32))
    for name, a in grads.items():
        np.save(os.path.join(d, "want_" + name + ".npy"), a.detach().numpy())
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
    print("wrote", case, sorted(grads))


def sdpa_gqa_masked_causal():
    # batch 2, 4 query heads on 2 K/V heads, L = 7, S = 9, E = 5, E_v = 3; a boolean mask
    # (true = attend) broadcast over heads, key lengths, causal, scale 0.6.
    b, h, hkv, l, s, e, ev = 2, 4, 2, 7, 9, 5, 3
    q, k, v = rnd(b, h, l, e), rnd(b, hkv, s, e), rnd(b, hkv, s, ev)
    keep = torch.rand(b, 1, l, s, generator=g) > 0.25
    lengths = torch.tensor([9, 6])
    key_ok = torch.arange(s)[None, :] < lengths[:, None]
    causal = torch.ones(l, s, dtype=torch.bool).tril()
    allowed = keep & key_ok[:, None, None, :] & causal[None, None]
    rep = h // hkv
    kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = (q @ kk.transpose(-1, -2)) * 0.6
    scores = scores.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(scores, -1)
    p = torch.nan_to_num(p, nan=0.0)  # rows with nothing to attend to are zeros, as ours
    out = p @ vv
    d_o = rnd(*out.shape).detach().float().double()
    out.backward(d_o)
    save(
        "sdpa_gqa_masked_causal",
        {"q": q, "k": k, "v": v, "mask": keep, "kv_lengths": lengths},
        {"q": q.grad, "k": k.grad, "v": v.grad},
        d_o,
        {"command": "sdpa", "flags": ["--causal", "--scale", "0.6"],
         "inputs": {"--q": "q", "--k": "k", "--v": "v", "--mask": "mask", "--kv-lengths": "kv_lengths"}},
    )


def run_biases_output_float_mask():
    # batch 2 × 6 tokens, d = 8, 2 heads, d_k = 6, d_v = 4, every bias, W_O (4 → 5) with
    # b_O, a float mask with -inf (broadcast over the batch and heads).
    b, n, d, dk, dv, do_ = 2, 6, 8, 6, 4, 5
    x = rnd(b, n, d)
    wq, wk, wv, wo = rnd(d, dk, s=0.4), rnd(d, dk, s=0.4), rnd(d, dv, s=0.4), rnd(dv, do_, s=0.4)
    bq, bk, bv, bo = rnd(dk, s=0.1), rnd(dk, s=0.1), rnd(dv, s=0.1), rnd(do_, s=0.1)
    fmask = (torch.randn(n, n, generator=g) * 0.5).float().double()
    fmask[1, 3] = float("-inf")
    fmask[4, 0] = float("-inf")
    heads = 2
    qh = (x @ wq + bq).view(b, n, heads, dk // heads).transpose(1, 2)
    kh = (x @ wk + bk).view(b, n, heads, dk // heads).transpose(1, 2)
    vh = (x @ wv + bv).view(b, n, heads, dv // heads).transpose(1, 2)
    ctx = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=fmask)
    out = ctx.transpose(1, 2).reshape(b, n, dv) @ wo + bo
    d_o = rnd(*out.shape).detach().float().double()
    out.backward(d_o)
    save(
        "run_biases_output_float_mask",
        {"x": x, "wq": wq, "wk": wk, "wv": wv, "bq": bq, "bk": bk, "bv": bv, "wo": wo, "bo": bo,
         "mask": fmask},
        {"x": x.grad, "wq": wq.grad, "wk": wk.grad, "wv": wv.grad, "bq": bq.grad, "bk": bk.grad,
         "bv": bv.grad, "wo": wo.grad, "bo": bo.grad},
        d_o,
        {"command": "run", "flags": ["--heads", "2"],
         "inputs": {"--x": "x", "--wq": "wq", "--wk": "wk", "--wv": "wv", "--bq": "bq",
                    "--bk": "bk", "--bv": "bv", "--wo": "wo", "--bo": "bo", "--mask": "mask"}},
    )


if __name__ == "__main__":
    torch.set_default_dtype(torch.float64)
    sdpa_gqa_masked_causal()
    run_biases_output_float_mask()
