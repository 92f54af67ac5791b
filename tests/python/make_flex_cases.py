#!/usr/bin/env python3
"""Golden cases for the score and mask modifier presets, from PyTorch's flex_attention, saved for
`cargo test --test flex_golden` (tests/flex_golden.rs) and python/tests/test_flex.py.

Run by hand where PyTorch is installed (CI has no torch; the files it writes are committed):

    python3 tests/python/make_flex_cases.py    # writes tests/data/flex/<case>/*

Every preset (sliding window, soft-capping, ALiBi, document ids, prefix-LM, T5's relative
position bias) with and without causal, on `L != S` (12 queries, 17 keys, causal top-left aligned as the crate's), plus a
grouped-query case and one with a scale. Each case directory holds `q.npy`, `k.npy`, `v.npy`
(float32), `context.npy` (the expected output, float64), `d_o.npy` (a gradient of the
output, float32) and `grad_q.npy`, `grad_k.npy`, `grad_v.npy` (the gradients for it,
float64), the preset's own array where it has one (`slopes.npy` float32, `ids.npy` int32
`(batch, n)`, `table.npy` float32 `(buckets, heads)` with `grad_table.npy` its gradient,
float64), and `meta.json`: the preset and its numbers, `causal`, `scale` (null:
1/sqrt(E)), and `source`.

The expected output is PyTorch's FlexAttention
(`torch.nn.attention.flex_attention.flex_attention`, run eagerly on the CPU in float64 with the
preset as a `score_mod` or a `create_block_mask` mask) where the installed torch has it, and it
is checked against an explicit float64 evaluation (scores, the modifier, masking, softmax);
without FlexAttention the explicit evaluation is saved (`source` says which). The gradients
are torch autograd's through the explicit float64 evaluation (FlexAttention has no backward on
the CPU: "FlexAttention does not support backward on CPU"), whose output is the one checked
against FlexAttention's.
"""

import json
import os
import shutil
import warnings

import numpy as np
import torch

OUT = os.path.join(os.path.dirname(__file__), "..", "data", "flex")

B, H, L, S, E = 2, 2, 12, 17, 8


def slopes_for(heads):
    """ALiBi's standard slopes (Press et al.), as the crate's `Preset::alibi_slopes`."""

    def powers(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    p = 1 << (heads - 1).bit_length()
    if p == heads:
        return np.array(powers(heads), dtype=np.float32)
    lower = p // 2
    return np.array(powers(lower) + powers(2 * lower)[::2][: heads - lower], dtype=np.float32)


IDS = np.array([[0] * 5 + [1] * 7 + [2] * 5, [0] * 9 + [1] * 8], dtype=np.int32)


def t5_bucket(relative_position, meta):
    """T5's bucket of `kv - q`: transformers' own `_relative_position_bucket`."""
    from transformers.models.t5.modeling_t5 import T5Attention

    return T5Attention._relative_position_bucket(
        relative_position,
        bidirectional=meta["bidirectional"],
        num_buckets=meta["buckets"],
        max_distance=meta["max_distance"],
    )


def modifier(meta, slopes, ids, table=None):
    """The preset as FlexAttention's `(score_mod, mask_mod)` (either may be None)."""
    kind = meta["preset"]
    if kind == "relative_bias":
        return lambda s, b, h, q, kv: s + table[t5_bucket(kv - q, meta), h], None
    if kind == "window":
        left, right = meta["left"], meta["right"]
        return None, lambda b, h, q, kv: (kv >= q - left) & (kv <= q + right)
    if kind == "softcap":
        cap = meta["cap"]
        return lambda s, b, h, q, kv: cap * torch.tanh(s / cap), None
    if kind == "alibi":
        t = torch.from_numpy(slopes).double()
        return lambda s, b, h, q, kv: s + t[h] * (kv - q), None
    if kind == "documents":
        t = torch.from_numpy(ids).long()
        return None, lambda b, h, q, kv: t[b, q] == t[b, kv]
    if kind == "prefix_lm":
        p = meta["length"]
        return None, lambda b, h, q, kv: (kv < p) | (kv <= q)
    raise ValueError(kind)


def with_causal(mask_mod, causal):
    if not causal:
        return mask_mod
    if mask_mod is None:
        return lambda b, h, q, kv: kv <= q
    return lambda b, h, q, kv: (kv <= q) & mask_mod(b, h, q, kv)


def explicit(q, k, v, score_mod, mask_mod, scale):
    """The definition in float64: scaled scores, the score modifier, the mask, softmax."""
    b, h, q_len, _ = q.shape
    kv_len = k.shape[2]
    k = k.repeat_interleave(h // k.shape[1], dim=1)
    v = v.repeat_interleave(h // v.shape[1], dim=1)
    s = (q @ k.transpose(-2, -1)) * scale
    bi, hi, qi, ki = torch.meshgrid(
        torch.arange(b), torch.arange(h), torch.arange(q_len), torch.arange(kv_len), indexing="ij"
    )
    if score_mod is not None:
        s = score_mod(s, bi, hi, qi, ki)
    if mask_mod is not None:
        keep = mask_mod(bi, hi, qi, ki)
        assert keep.any(-1).all(), "every query row must see a key"
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def flex(q, k, v, score_mod, mask_mod, scale):
    """PyTorch's FlexAttention on the CPU, eagerly; None where this torch lacks it."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    # Eager FlexAttention still traces through dynamo; a fresh start per case keeps it from
    # making the scale a symbolic float (which its operator then refuses) after a recompile.
    torch._dynamo.reset()
    block_mask = None
    if mask_mod is not None:
        block_mask = create_block_mask(mask_mod, q.shape[0], q.shape[1], q.shape[2], k.shape[2], device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile"
        return flex_attention(
            q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
        )


def case(name, meta, heads=H, kv_heads=H, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, heads, L, E, generator=g).float()
    k = torch.randn(B, kv_heads, S, E, generator=g).float()
    v = torch.randn(B, kv_heads, S, E, generator=g).float()
    # Drawn after Q, K and V, so theirs stay what they were before gradients were saved.
    d_o = torch.randn(B, heads, L, E, generator=g).float()
    slopes = slopes_for(heads)
    # T5's learned table, (buckets, heads), drawn last so the other cases' draws stay as they were.
    table = None
    if meta["preset"] == "relative_bias":
        table = torch.randn(meta["buckets"], heads, generator=g).float()
    table64 = table.double().requires_grad_(True) if table is not None else None
    score_mod, mask_mod = modifier(meta, slopes, IDS, table64)
    mask_mod = with_causal(mask_mod, meta["causal"])
    scale = meta["scale"] if meta["scale"] is not None else 1.0 / E**0.5
    leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    want = explicit(*leaves, score_mod, mask_mod, scale)
    grads = torch.autograd.grad(want, leaves + ([table64] if table is not None else []), d_o.double())
    grad_q, grad_k, grad_v = grads[:3]
    want = want.detach()
    q64, k64, v64 = (t.double() for t in (q, k, v))
    if table is not None:
        score_mod, _ = modifier(meta, slopes, IDS, table.double())
    got = flex(q64, k64, v64, score_mod, mask_mod, scale)
    if got is not None:
        err = ((got - want).norm() / want.norm()).item()
        assert err < 1e-12, f"{name}: FlexAttention and the explicit evaluation differ by {err:.2e}"
        want = got
    meta = dict(meta, source="flex_attention" if got is not None else "explicit float64")
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    arrays = {
        "q": q.numpy(),
        "k": k.numpy(),
        "v": v.numpy(),
        "context": want.numpy(),
        "d_o": d_o.numpy(),
        "grad_q": grad_q.numpy(),
        "grad_k": grad_k.numpy(),
        "grad_v": grad_v.numpy(),
    }
    if meta["preset"] == "alibi":
        arrays["slopes"] = slopes
    if meta["preset"] == "documents":
        arrays["ids"] = IDS
    if table is not None:
        arrays["table"] = table.numpy()
        arrays["grad_table"] = grads[3].numpy()
    for key, a in arrays.items():
        np.save(os.path.join(d, key + ".npy"), a)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
        f.write("\n")
    print("wrote", name, meta["source"])


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    presets = {
        "window": {"preset": "window", "left": 3, "right": 2},
        "softcap": {"preset": "softcap", "cap": 1.5},
        "alibi": {"preset": "alibi"},
        "documents": {"preset": "documents"},
        "prefix_lm": {"preset": "prefix_lm", "length": 5},
    }
    # prefix_lm_causal is plain causal attention: mask modifiers are and-ed with causal, so the
    # prefix's later keys stay hidden from its earlier queries. The case pins that reading.
    for i, (name, meta) in enumerate(presets.items()):
        for causal in (False, True):
            full = dict(meta, causal=causal, scale=None)
            case(name + ("_causal" if causal else ""), full, seed=10 * i + causal)
    # Grouped-query heads (4 query heads, 2 K/V heads): Mistral's window of 4 keys.
    case("window_gqa_causal", {"preset": "window", "left": 3, "right": 0, "causal": True, "scale": None}, 4, 2, 90)
    # ALiBi with 3 heads (not a power of two) and GQA 3:1, and a scale.
    case("alibi_gqa3_scale", {"preset": "alibi", "causal": False, "scale": 0.6}, 3, 1, 91)
    # T5's relative position bias (a learned (buckets, heads) table, buckets as transformers'
    # T5 computes them; saturating within the 17 keys): its encoder's two-way buckets, and its
    # decoder's one-way ones with causal, and with GQA; the table's own gradient too.
    t5 = {"preset": "relative_bias", "buckets": 8, "max_distance": 10, "scale": None}
    case("relative_bias", dict(t5, bidirectional=True, causal=False), seed=93)
    case("relative_bias_causal", dict(t5, bidirectional=False, causal=True), seed=94)
    case("relative_bias_gqa_scale", dict(t5, bidirectional=True, causal=True, scale=0.8), 4, 2, 95)
    # Soft-capping with a scale that makes the cap bite.
    case("softcap_scale_causal", {"preset": "softcap", "cap": 2.0, "causal": True, "scale": 1.3}, seed=92)


if __name__ == "__main__":
    main()
