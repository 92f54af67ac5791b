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
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from .functional import scaled_dot_product_attention

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

    if kwargs.get("softcap") is not None:
        raise NotImplementedError("the wgpu attention backend does not support `softcap` (logit soft-capping) yet")
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("the wgpu attention backend does not support attention sinks (`s_aux`)")
    q_len, kv_len = query.shape[2], key.shape[2]
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = bool(q_len > 1 and attention_mask is None and is_causal)
    if is_causal and kv_len > q_len:
        # As transformers' sdpa backend: a mask-free causal call only sees its own keys.
        key, value = key[:, :, :q_len], value[:, :, :q_len]
        if position_bias is not None:
            position_bias = position_bias[..., :q_len]
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
    return out.transpose(1, 2).contiguous(), weights


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
