"""A Hugging Face transformers attention backend named `"wgpu"`.

    >>> import wgpu_attention.transformers
    >>> wgpu_attention.transformers.register()
    >>> model.set_attn_implementation("wgpu")   # every attention call runs on our kernels

Registers an attention function with transformers' `AttentionInterface` and, for its masks,
the eager backend's additive float masks (`(batch, 1, q, kv)`, the dtype's lowest value where
masked) with its `AttentionMaskInterface`: a query row with nothing to attend to (left
padding) then gets the eager backend's equal weights, so every logit matches eager, padded
positions included. Grouped-query models run as such (K/V heads are never repeated),
padding and causal masks broadcast in place, and `generate`'s KV cache works as it does for
the `sdpa` backend (transformers keeps the cache; each call attends over it).

Logit soft-capping (`softcap`, Gemma 2) runs as the crate's soft-cap preset inside the fused
kernel. A `sliding_window` (Mistral, Gemma 2) is already in the masks transformers builds (its
`masking_utils` fold it in, and the eager backend relies on that alone), so a call with a mask
takes it from there. A call without a mask gets it as the window preset (query at position `p`
sees positions `p − W + 1 … p`, as transformers' masks and flash-attention read `W`), with the
positions transformers' `sdpa` backend gives such a call: a causal prefill from position 0, or
one decoding step at position `kv − 1`. `output_attentions` returns the weights of these
calls too (`flex_attention(..., return_weights=True)`), over all the call's keys: keys cut off
before a mask-free call weigh 0, as in the eager backend's.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from . import presets
from .functional import _check_common, flex_attention, scaled_dot_product_attention

__all__ = ["register", "attention_forward", "NAME"]

NAME = "wgpu"


def attention_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Optional[Any],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    is_causal: Optional[bool] = None,
    position_bias: Optional[Any] = None,
    **kwargs: Any,
) -> Tuple[Any, Optional[Any]]:
    """transformers' attention signature: `query (batch, heads, q, head_dim)`, `key`/`value`
    `(batch, kv_heads, kv, head_dim)`; returns `(output (batch, q, heads, head_dim),
    weights or None)` — the weights when the model asks for `output_attentions`."""
    import torch

    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("the wgpu attention backend does not support attention sinks (`s_aux`)")
    q_len, kv_len = query.shape[2], key.shape[2]
    first = 0  # the first of the call's keys still attended over (a window's cut)
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = bool(q_len > 1 and attention_mask is None and is_causal)
    if is_causal and kv_len > q_len:
        # As transformers' sdpa backend: a mask-free causal call only sees its own keys.
        key, value = key[:, :, :q_len], value[:, :, :q_len]
        if position_bias is not None:
            position_bias = position_bias[..., :q_len]
    score_mod = [] if kwargs.get("softcap") is None else [presets.softcap(kwargs["softcap"])]
    mask_mod = []
    window = kwargs.get("sliding_window")
    if window is not None and attention_mask is None:
        first = key.shape[2]
        key, value, position_bias, mask_mod = _window(module, query, key, value, position_bias, int(window), is_causal)
        first -= key.shape[2]
    if position_bias is not None:
        # A learned bias (T5): added to the scores, with the mask (or causal) folded in.
        lowest = torch.finfo(position_bias.dtype).min
        if attention_mask is None:
            if is_causal:
                keep = torch.ones(q_len, key.shape[2], dtype=torch.bool, device=query.device).tril()
                attention_mask = torch.where(keep, position_bias, lowest)
            else:
                attention_mask = position_bias
        elif attention_mask.dtype == torch.bool:
            attention_mask = torch.where(attention_mask, position_bias, lowest)
        else:
            attention_mask = position_bias + attention_mask
        is_causal = False
    want_weights = bool(kwargs.get("output_attentions", False))
    if score_mod or mask_mod:
        _check_common(dropout, scaling)  # flex_attention has no dropout_p: refuse it here
        result = flex_attention(
            query,
            key,
            value,
            score_mod,
            mask_mod,
            attn_mask=attention_mask,
            is_causal=is_causal,
            scale=scaling,
            enable_gqa=query.shape[1] != key.shape[1],
            return_weights=want_weights,
        )
    else:
        result = scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attention_mask,
            dropout_p=dropout,
            is_causal=is_causal,
            scale=scaling,
            enable_gqa=query.shape[1] != key.shape[1],
            return_weights=want_weights,
        )
    out, weights = result if want_weights else (result, None)
    if weights is not None and weights.shape[-1] != kv_len:
        # Keys cut off before the call (a window's past, a mask-free causal call's future)
        # have weight 0: the weights over all the call's keys, as the eager backend's.
        after = kv_len - first - weights.shape[-1]
        weights = torch.nn.functional.pad(weights, (first, after))
    return out.transpose(1, 2).contiguous(), weights


def _window(module: Any, query: Any, key: Any, value: Any, position_bias: Any, window: int, is_causal: bool):
    """A causal sliding window of `window` positions on a call without a mask: query `i` is
    position `i + kv − q` (a causal prefill arrives here with its keys already cut to `q`, so
    its queries are positions `0 … q − 1`; a decoding step's one query is position `kv − 1`)
    and sees positions `i + kv − q − window + 1` to its own. The keys no query sees are cut
    off first; the rest is the crate's window preset `(window − 1 − off, off)`, `off = kv − q`."""
    if window < 1:
        raise ValueError(f"sliding_window must be at least 1, got {window}")
    if not is_causal and not getattr(module, "is_causal", True):
        raise NotImplementedError("a sliding window on a bidirectional call without a mask is not supported")
    q_len, kv_len = query.shape[2], key.shape[2]
    if kv_len < q_len:
        raise NotImplementedError(
            f"a sliding window on a call without a mask and fewer keys ({kv_len}) than queries ({q_len})"
        )
    start = max(0, kv_len - q_len - window + 1)
    key, value = key[:, :, start:], value[:, :, start:]
    if position_bias is not None:
        position_bias = position_bias[..., start:]
    off = kv_len - start - q_len
    return key, value, position_bias, [presets.sliding_window(window - 1 - off, off)]


def register(name: str = NAME) -> None:
    """Registers the backend under `name` (default `"wgpu"`) with transformers'
    `AttentionInterface` and `AttentionMaskInterface`; then
    `model.set_attn_implementation(name)` (or `from_pretrained(..., attn_implementation=name)`)
    runs the model's attention on our kernels."""
    from transformers import AttentionInterface

    try:
        from transformers import AttentionMaskInterface
    except ImportError:  # older releases keep it in masking_utils only
        from transformers.masking_utils import AttentionMaskInterface
    from transformers.masking_utils import eager_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, eager_mask)
