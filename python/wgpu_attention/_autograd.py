"""The torch side of `scaled_dot_product_attention`: tensors in and out (any device: moved
to the CPU for the upload and the result moved back), and a `torch.autograd.Function` whose
backward is the crate's fused backward on the GPU."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import numpy as np
import torch

from .functional import _Plan, _check_dtypes, _forward_np, _np_mask

_TORCH_FLOATS = (torch.float16, torch.float32, torch.float64, torch.bfloat16)


def _to_np(t: torch.Tensor) -> np.ndarray:
    """A CPU float32 (or float16) NumPy array of `t`; no copy when `t` is a CPU float32
    tensor (strided views are read in place)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.float16:
        return t.numpy().astype(np.float32)
    if t.dtype != torch.float32:
        t = t.float()
    return t.numpy()


def _back(a: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).to(device=like.device, dtype=like.dtype)


def _unbroadcast(g: np.ndarray, shape) -> np.ndarray:
    """Sums `g` over the batch axes that were broadcast to give `shape`'s tensor."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    extra = g.ndim - len(shape)
    if extra > 0:
        g = g.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, (a, b) in enumerate(zip(g.shape, shape)) if b == 1 and a != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


class _SDPA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, mask, is_causal, scale, plan, half, return_weights, mods=None, table=None):
        # `table`: a relative bias table that requires grad, an input so that it gets its
        # gradient (its values are in `mods` already).
        q, k, v = (_to_np(t) for t in (query, key, value))
        out, _, saved = _forward_np(q, k, v, mask, is_causal, scale, plan, half, False, True, mods)
        weights = None
        if return_weights:
            # A saved forward returns no weights: a second forward, unsaved, gives them (they
            # are not differentiable; the gradients flow through the output).
            _, weights, _ = _forward_np(q, k, v, mask, is_causal, scale, plan, half, True, False, mods)
        ctx.saved = saved
        ctx.plan = plan
        ctx.likes = (query, key, value, table)
        result = _back(out, query)
        if weights is None:
            return result
        w = _back(weights, query)
        ctx.mark_non_differentiable(w)
        return result, w

    @staticmethod
    def backward(ctx, grad_out, *_grad_weights):
        plan = ctx.plan
        d_o = _to_np(grad_out).reshape((plan.B, plan.H) + (plan.L, plan.Ev))
        dq, dk, dv, d_table = ctx.saved.backward(np.ascontiguousarray(d_o))
        grads = []
        for g, like, heads in zip((dq, dk, dv), ctx.likes, (plan.H, plan.Hkv, plan.Hkv)):
            shape = like.shape
            full = plan.batch + ((heads,) if len(shape) > 2 else ()) + tuple(shape[-2:])
            grads.append(_back(_unbroadcast(g.reshape(full), shape), like))
        table = ctx.likes[3]
        g_table = None
        if table is not None and d_table is not None:
            g_table = _back(d_table.reshape(table.shape), table)
        return grads[0], grads[1], grads[2], None, None, None, None, None, None, None, g_table


def _plan(query, key, value, enable_gqa) -> _Plan:
    """The plan of three tensors of one float dtype."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(
                f"{name} is a {type(t).__name__} while another operand is a torch tensor: pass all three as tensors or all as arrays"
            )
    _check_dtypes([query.dtype, key.dtype, value.dtype])
    dtype = query.dtype
    if dtype not in _TORCH_FLOATS:
        raise ValueError(f"query, key and value must be float16, bfloat16, float32 or float64, got {dtype}")
    return _Plan(query.shape, key.shape, value.shape, enable_gqa=enable_gqa)


def flex_torch(
    query,
    key,
    value,
    attn_mask,
    is_causal,
    scale,
    enable_gqa,
    mods: Callable[[_Plan], Dict[str, Any]],
    table: Optional[torch.Tensor] = None,
    return_weights: bool = False,
):
    """`flex_attention` on tensors: with inputs that require grad, through `_SDPA` (the saved
    forward keeps the modifiers, the fused backward takes them back through their
    derivatives). `table`: the relative bias table that requires grad, or None. With
    `return_weights`, `(output, weights)`, the weights not differentiable."""
    plan = _plan(query, key, value, enable_gqa)
    if isinstance(attn_mask, torch.Tensor) and attn_mask.requires_grad and torch.is_grad_enabled():
        raise NotImplementedError(
            "the gradient with respect to attn_mask is not implemented: pass attn_mask.detach(), "
            "or a bias as a learned parameter outside the mask"
        )
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value, table) if t is not None)
    half = query.dtype == torch.float16
    mask = _np_mask(attn_mask)
    if needs_grad:
        return _SDPA.apply(query, key, value, mask, is_causal, scale, plan, half, return_weights, mods(plan), table)
    q, k, v = (_to_np(t) for t in (query, key, value))
    out, weights, _ = _forward_np(q, k, v, mask, is_causal, scale, plan, half, return_weights, False, mods(plan))
    result = _back(out, query)
    if return_weights:
        return result, _back(weights, query)
    return result


def sdpa_torch(query, key, value, attn_mask, is_causal, scale, enable_gqa, return_weights):
    plan = _plan(query, key, value, enable_gqa)
    dtype = query.dtype
    mask = _np_mask(attn_mask)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if isinstance(attn_mask, torch.Tensor) and attn_mask.requires_grad and torch.is_grad_enabled():
        raise NotImplementedError(
            "the gradient with respect to attn_mask is not implemented: pass attn_mask.detach(), "
            "or a bias as a learned parameter outside the mask"
        )
    half = dtype == torch.float16
    if needs_grad:
        return _SDPA.apply(query, key, value, mask, is_causal, scale, plan, half, return_weights)
    q, k, v = (_to_np(t) for t in (query, key, value))
    out, weights, _ = _forward_np(q, k, v, mask, is_causal, scale, plan, half, return_weights, False)
    result = _back(out, query)
    if return_weights:
        return result, _back(weights, query)
    return result
