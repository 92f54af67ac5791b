"""`scaled_dot_product_attention` with PyTorch's signature and semantics, on NumPy arrays and
torch tensors, run by the crate's WGSL kernels (autograd included for torch tensors), and
`flex_attention`: the same with score and mask modifiers (WGSL or presets)."""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional

import numpy as np

from . import _modifiers
from ._loader import native as _native

__all__ = ["scaled_dot_product_attention", "flex_attention"]


def _torch():
    """The torch module if it is imported already (we never import it for NumPy callers)."""
    import sys

    return sys.modules.get("torch")


def _is_tensor(x: Any) -> bool:
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


class _Plan:
    """How PyTorch's shapes `(..., L, E)`, `(..., S, E)`, `(..., S, Ev)` map onto the
    kernels' `(B, H, L, E)`, `(B, H_kv, S, E)`, `(B, H_kv, S, Ev)`."""

    def __init__(self, qs, ks, vs, enable_gqa: bool):
        for name, s in (("query", qs), ("key", ks), ("value", vs)):
            if len(s) < 2:
                raise ValueError(
                    f"{name} must have at least 2 dimensions (..., length, features), got shape {tuple(s)}"
                )
        if not (len(qs) == len(ks) == len(vs)):
            raise ValueError(
                f"query, key and value must have the same number of dimensions, got shapes {tuple(qs)}, {tuple(ks)}, {tuple(vs)}"
            )
        self.L, self.E = qs[-2], qs[-1]
        self.S, self.Ev = ks[-2], vs[-1]
        if ks[-1] != self.E:
            raise ValueError(
                f"key's last dimension ({ks[-1]}) must equal query's ({self.E}): shapes {tuple(qs)} and {tuple(ks)}"
            )
        if vs[-2] != self.S:
            raise ValueError(
                f"value's length ({vs[-2]}) must equal key's ({self.S}): shapes {tuple(ks)} and {tuple(vs)}"
            )
        for name, n in (
            ("query length", self.L),
            ("key length", self.S),
            ("features", self.E),
            ("value features", self.Ev),
        ):
            if n == 0:
                raise ValueError(f"{name} is 0: attention needs at least one query, one key and one feature")
        if len(qs) == 2:
            self.batch, self.H, self.Hkv = (), 1, 1
        else:
            self.H, self.Hkv = qs[-3], ks[-3]
            if vs[-3] != self.Hkv:
                raise ValueError(f"key and value must have the same number of heads, got {self.Hkv} and {vs[-3]}")
            if self.H != self.Hkv:
                if self.Hkv == 0 or self.H % self.Hkv != 0:
                    raise ValueError(
                        f"query's heads ({self.H}) must be a multiple of key's and value's ({self.Hkv}) for grouped-query attention"
                    )
                if not enable_gqa and self.Hkv != 1:
                    raise ValueError(
                        f"query has {self.H} heads and key/value {self.Hkv}: pass enable_gqa=True for grouped-query attention"
                    )
            try:
                self.batch = tuple(np.broadcast_shapes(tuple(qs[:-3]), tuple(ks[:-3]), tuple(vs[:-3])))
            except ValueError:
                raise ValueError(
                    f"the batch dimensions of query, key and value do not broadcast: shapes {tuple(qs)}, {tuple(ks)}, {tuple(vs)}"
                ) from None
        self.B = int(np.prod(self.batch, dtype=np.int64))
        if self.B == 0 or self.H == 0:
            raise ValueError("a batch or head dimension is 0: nothing to attend")
        self.out_shape = self.batch + ((self.H,) if len(qs) > 2 else ()) + (self.L, self.Ev)
        self.weights_shape = self.batch + ((self.H,) if len(qs) > 2 else ()) + (self.L, self.S)
        self.shapes = (tuple(qs), tuple(ks), tuple(vs))

    def four_d(self, a: np.ndarray, heads: int) -> np.ndarray:
        """`a` as `(B, heads, len, feat)`: a view when its batch needs no broadcast."""
        if a.ndim == 2:
            return a.reshape((1, 1) + a.shape)
        lead = a.shape[:-3]
        if lead != self.batch:
            a = np.broadcast_to(a, self.batch + a.shape[-3:])
        return a.reshape((self.B, heads) + a.shape[-2:])

    def mask4(self, m: np.ndarray) -> np.ndarray:
        """The mask as an array that broadcasts to `(B, H, L, S)` right-aligned, as the crate
        reads it (zero strides, never expanded), after checking it broadcasts to the
        output's `(..., L, S)` as PyTorch requires."""
        target = self.weights_shape
        try:
            if np.broadcast_shapes(m.shape, target) != target:
                raise ValueError
        except ValueError:
            raise ValueError(f"attn_mask of shape {m.shape} does not broadcast to the attention's {target}") from None
        nb = len(self.batch)
        inner = len(target) - nb  # (H, L, S) or (L, S)
        if m.ndim <= inner:
            return m
        lead = m.shape[: m.ndim - inner]
        rest = m.shape[m.ndim - inner :]
        if all(d == 1 for d in lead):
            return m.reshape(rest)
        if nb == 1:
            return m
        # Several batch axes: flatten them as the operands are (a copy only here).
        m = m.reshape((1,) * (nb + inner - m.ndim) + m.shape)
        return np.broadcast_to(m, self.batch + rest).reshape((self.B,) + rest)


_FLOATS = {np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)}


def _check_dtypes(dtypes) -> None:
    if len(set(dtypes)) != 1:
        names = ", ".join(str(d) for d in dtypes)
        raise ValueError(f"query, key and value must have the same dtype, got {names}")


def _np_mask(attn_mask: Any) -> Optional[np.ndarray]:
    if attn_mask is None:
        return None
    if _is_tensor(attn_mask):
        t = attn_mask.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype.is_floating_point and t.dtype != _torch().float32:
            t = t.float()
        attn_mask = t.numpy()
    m = np.asarray(attn_mask)
    if m.dtype == np.bool_:
        return m
    if m.dtype.kind == "f":
        return m if m.dtype == np.float32 else m.astype(np.float32)
    raise ValueError(f"attn_mask must be bool (True = attend) or floating point (added to the scores), got {m.dtype}")


def _forward_np(
    q,
    k,
    v,
    mask,
    is_causal,
    scale,
    plan: _Plan,
    half: bool,
    return_weights: bool,
    save: bool,
    mods: Optional[Dict[str, Any]] = None,
):
    """The native call on f32 arrays in PyTorch's shapes; results in PyTorch's shapes.
    `mods`: the native call's modifier keywords (`_modifiers.native_kwargs`)."""
    m = None if mask is None else plan.mask4(mask)
    out, weights, saved = _native.sdpa(
        plan.four_d(q, plan.H),
        plan.four_d(k, plan.Hkv),
        plan.four_d(v, plan.Hkv),
        mask=m,
        is_causal=bool(is_causal),
        scale=None if scale is None else float(scale),
        return_weights=return_weights,
        save=save,
        half=half,
        **(mods or {}),
    )
    out = out.reshape(plan.out_shape)
    if weights is not None:
        weights = weights.reshape(plan.weights_shape)
    return out, weights, saved


def _as_f32(a: np.ndarray) -> np.ndarray:
    return a if a.dtype == np.float32 else a.astype(np.float32)


def _arrays(query, key, value, enable_gqa: bool):
    """NumPy operands as float32 arrays, their plan, and the dtype to return."""
    arrays = [np.asarray(a) for a in (query, key, value)]
    _check_dtypes([a.dtype for a in arrays])
    dtype = arrays[0].dtype
    if dtype not in _FLOATS:
        raise ValueError(f"query, key and value must be float16, float32 or float64, got {dtype}")
    plan = _Plan(arrays[0].shape, arrays[1].shape, arrays[2].shape, enable_gqa=enable_gqa)
    return [_as_f32(a) for a in arrays], plan, dtype


def _check_common(dropout_p: float, scale) -> None:
    if dropout_p != 0.0:
        raise NotImplementedError(
            f"dropout_p={dropout_p}: attention dropout is not implemented; pass dropout_p=0.0 (as in evaluation)"
        )
    if scale is not None and not math.isfinite(float(scale)):
        raise ValueError(f"scale must be finite, got {scale}")


def scaled_dot_product_attention(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
    *,
    return_weights: bool = False,
):
    """`torch.nn.functional.scaled_dot_product_attention` on the crate's WGSL kernels.

    `query (..., L, E)`, `key (..., S, E)`, `value (..., S, Ev)`; returns `(..., L, Ev)` of the
    kind (NumPy array or torch tensor), dtype and device it was given. `attn_mask` is bool
    (True = attend) or float (added to the scaled scores) and broadcasts to `(..., L, S)`.
    `is_causal` is top-left aligned; it may be combined with a mask. `scale` defaults to
    `1/sqrt(E)`. `enable_gqa` lets key and value have fewer heads than query. With
    `return_weights=True` (not in PyTorch) it returns `(output, weights)`, the weights
    `(..., L, S)` (under autograd they come from a second, unsaved forward and are not
    differentiable: gradients flow through the output only). A query row with nothing to attend to gives zeros (PyTorch's math
    backend gives NaN there). Torch tensors that require grad make the call differentiable:
    its backward is the crate's fused backward on the GPU.
    """
    _check_common(dropout_p, scale)
    if _is_tensor(query) or _is_tensor(key) or _is_tensor(value):
        from . import _autograd

        return _autograd.sdpa_torch(query, key, value, attn_mask, is_causal, scale, enable_gqa, return_weights)
    (q, k, v), plan, dtype = _arrays(query, key, value, enable_gqa)
    out, weights, _ = _forward_np(
        q, k, v, _np_mask(attn_mask), is_causal, scale, plan, dtype == np.float16, return_weights, False
    )
    out = out.astype(dtype, copy=False)
    if return_weights:
        return out, weights.astype(dtype, copy=False)
    return out


def flex_attention(
    query,
    key,
    value,
    score_mod=None,
    mask_mod=None,
    *,
    scale: Optional[float] = None,
    is_causal: bool = False,
    enable_gqa: bool = False,
    attn_mask=None,
    buffers: Optional[Mapping[str, Any]] = None,
    score_mod_grad: Optional[str] = None,
    return_weights: bool = False,
):
    """Attention with score and mask modifiers, after PyTorch's
    `torch.nn.attention.flex_attention.flex_attention`, but the modifiers are WGSL or presets
    (`wgpu_attention.presets`) run inside the fused kernel rather than Python callables.

    `score_mod`: WGSL source defining
    `fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32` (the new scaled score),
    `presets.softcap(c)`, `presets.alibi(slopes)`, `presets.relative_bias(table)` (T5), or a
    list of them, applied in one order, which a list must follow: a caller's WGSL, then ALiBi,
    then the relative bias, then the soft-cap. `mask_mod`: WGSL source defining
    `fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool` (True = attend),
    `presets.sliding_window(left, right)`, `presets.document_mask(ids)`,
    `presets.prefix_lm(p)`, or a list of them (and-ed). `buffers` names read-only arrays the
    WGSL indexes (`slope[h]`): floats become `array<f32>`, integers `array<i32>`, flattened
    row-major. `b` is the flattened batch index, `h` the query head, `q` and `kv` the
    positions (top-left aligned).

    Shapes, `scale`, `is_causal`, `enable_gqa` and `attn_mask` are as in
    `scaled_dot_product_attention` (causal and `attn_mask` apply with the modifiers: the score
    modifiers first, then the mask's bias, then the mask modifiers). Returns `(..., L, Ev)` of
    the kind, dtype and device it was given. With `return_weights=True` (not in PyTorch's
    FlexAttention) it returns `(output, weights)`: the weights `(..., L, S)` of the same
    kind, dtype and device, the softmax of the modified scores the output is made of (a
    masked entry is exactly 0), not differentiable (under autograd they come from a second,
    unsaved forward; gradients flow through the output only).

    Gradients flow to torch tensors that require grad (the crate's fused backward, on the
    device): to a relative bias table that requires grad (`table.grad`, `(buckets, heads)`;
    the other presets' values and `buffers` take none), through the presets, and through a
    caller's WGSL `score_mod` when
    `score_mod_grad` gives its derivative by the score, WGSL defining
    `fn score_mod_grad(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32`; without it,
    asking for gradients through a `score_mod` raises `NotImplementedError`. Mask modifiers
    need no derivative. Without modifiers it is `scaled_dot_product_attention`.
    """
    _check_common(0.0, scale)
    if not _modifiers.items(score_mod) and not _modifiers.items(mask_mod):
        if buffers:
            raise ValueError("buffers were given without a score_mod or mask_mod to read them")
        return scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attn_mask,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
            return_weights=return_weights,
        )

    def mods(plan: _Plan) -> Dict[str, Any]:
        return _modifiers.native_kwargs(score_mod, mask_mod, score_mod_grad, buffers, plan)

    table = _modifiers.grad_table(score_mod)
    if _is_tensor(query) or _is_tensor(key) or _is_tensor(value):
        from . import _autograd

        return _autograd.flex_torch(
            query, key, value, attn_mask, is_causal, scale, enable_gqa, mods, table, return_weights
        )
    if table is not None and _torch().is_grad_enabled():
        raise TypeError(
            "the relative bias table requires grad but query, key and value are NumPy arrays: "
            "pass them as torch tensors for its gradient, or the table detached"
        )
    (q, k, v), plan, dtype = _arrays(query, key, value, enable_gqa)
    out, weights, _ = _forward_np(
        q, k, v, _np_mask(attn_mask), is_causal, scale, plan, dtype == np.float16, return_weights, False, mods(plan)
    )
    out = out.astype(dtype, copy=False)
    if return_weights:
        return out, weights.astype(dtype, copy=False)
    return out
