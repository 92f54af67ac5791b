"""`MultiheadAttention`, mirroring `torch.nn.MultiheadAttention`'s constructor and forward,
with its projections uploaded once and kept on the device (inference: no autograd)."""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import numpy as np

from ._loader import native as _native
from .functional import _is_tensor, _np_mask, scaled_dot_product_attention

__all__ = ["MultiheadAttention"]


def _np(x: Any) -> np.ndarray:
    if _is_tensor(x):
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        return t.float().numpy()
    return np.asarray(x, dtype=np.float32)


class MultiheadAttention:
    """`torch.nn.MultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True,
    add_bias_kv=False, add_zero_attn=False, kdim=None, vdim=None, batch_first=False)` on the
    crate's kernels. Parameters are NumPy float32 arrays in PyTorch's layout
    (`in_proj_weight (3E, E)` or `q/k/v_proj_weight`, `in_proj_bias (3E,)`,
    `out_proj.weight (E, E)`, `out_proj.bias`), initialised as PyTorch does, or loaded from a
    torch module's `state_dict` (`load_state_dict`, `from_torch`). Self-attention
    (`query is key is value`) runs a resident layer: the projections stay on the device and a
    call uploads only the input. Inputs and outputs are NumPy arrays or torch tensors (CPU or
    any device, moved back); gradients do not flow through this module.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: Optional[int] = None,
        vdim: Optional[int] = None,
        batch_first: bool = False,
        device: Any = None,
        dtype: Any = None,
    ):
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be positive, got {embed_dim} and {num_heads}")
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        if add_bias_kv or add_zero_attn:
            raise NotImplementedError("add_bias_kv and add_zero_attn are not implemented")
        if dropout != 0.0:
            raise NotImplementedError(f"dropout={dropout}: attention dropout is not implemented; use dropout=0.0")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.batch_first = batch_first
        self.bias = bias
        self.dropout = dropout
        rng = np.random.default_rng()
        E = embed_dim

        def xavier(rows, cols):
            a = math.sqrt(6.0 / (rows + cols))
            return rng.uniform(-a, a, size=(rows, cols)).astype(np.float32)

        self.params: Dict[str, np.ndarray] = {}
        if self._qkv_same_embed_dim:
            self.params["in_proj_weight"] = xavier(3 * E, E)
        else:
            self.params["q_proj_weight"] = xavier(E, E)
            self.params["k_proj_weight"] = xavier(E, self.kdim)
            self.params["v_proj_weight"] = xavier(E, self.vdim)
        bound = 1.0 / math.sqrt(E)
        self.params["out_proj.weight"] = rng.uniform(-bound, bound, size=(E, E)).astype(np.float32)
        if bias:
            self.params["in_proj_bias"] = np.zeros(3 * E, np.float32)
            self.params["out_proj.bias"] = np.zeros(E, np.float32)
        self._layers: Dict[Tuple[bool, bool], Any] = {}

    # --- parameters -------------------------------------------------------------------

    def state_dict(self) -> Dict[str, np.ndarray]:
        return dict(self.params)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Loads `torch.nn.MultiheadAttention.state_dict()` (tensors or arrays); shapes must
        match this module's."""
        new = {}
        for name, old in self.params.items():
            if name not in state:
                raise ValueError(f"state_dict has no {name!r} (it has {sorted(state)})")
            a = _np(state[name])
            if a.shape != old.shape:
                raise ValueError(f"{name}: expected shape {old.shape}, got {a.shape}")
            new[name] = np.ascontiguousarray(a)
        extra = set(state) - set(self.params)
        if extra:
            raise ValueError(f"state_dict has entries this module does not: {sorted(extra)}")
        self.params = new
        self._layers.clear()

    @classmethod
    def from_torch(cls, module: Any) -> "MultiheadAttention":
        """A copy of a `torch.nn.MultiheadAttention` (its configuration and weights)."""
        m = cls(
            module.embed_dim,
            module.num_heads,
            dropout=0.0,
            bias=module.in_proj_bias is not None,
            kdim=module.kdim,
            vdim=module.vdim,
            batch_first=module.batch_first,
        )
        if module.bias_k is not None or module.add_zero_attn:
            raise NotImplementedError("add_bias_kv and add_zero_attn are not implemented")
        m.load_state_dict(module.state_dict())
        return m

    def _weights(self):
        E = self.embed_dim
        p = self.params
        if self._qkv_same_embed_dim:
            w = p["in_proj_weight"]
            wq, wk, wv = w[:E], w[E : 2 * E], w[2 * E :]
        else:
            wq, wk, wv = p["q_proj_weight"], p["k_proj_weight"], p["v_proj_weight"]
        b = p.get("in_proj_bias")
        bq, bk, bv = (None, None, None) if b is None else (b[:E], b[E : 2 * E], b[2 * E :])
        return wq, wk, wv, bq, bk, bv, p["out_proj.weight"], p.get("out_proj.bias")

    def _layer(self, need_weights: bool, causal: bool):
        key = (need_weights, causal)
        if key not in self._layers:
            wq, wk, wv, bq, bk, bv, wo, bo = self._weights()

            def t(a: Any) -> Any:  # X·W orientation
                return None if a is None else np.ascontiguousarray(a.T)

            def c(a: Any) -> Any:
                return None if a is None else np.ascontiguousarray(a)

            self._layers[key] = _native.ResidentLayer(
                t(wq),
                t(wk),
                t(wv),
                c(bq),
                c(bk),
                c(bv),
                t(wo),
                c(bo),
                heads=self.num_heads,
                is_causal=causal,
                return_weights=need_weights,
            )
        return self._layers[key]

    # --- forward -----------------------------------------------------------------------

    def _mask(self, attn_mask, key_padding_mask, B: int, L: int, S: int):
        """PyTorch's MHA masks (bool True = masked out; float added; attn_mask `(L, S)` or
        `(B·H, L, S)`, key_padding_mask `(B, S)`) as one SDPA mask broadcasting to
        `(B, H, L, S)`: bool True = attend, or float."""
        H = self.num_heads
        parts = []
        for m, shape_of in ((attn_mask, "attn"), (key_padding_mask, "kpm")):
            if m is None:
                continue
            a: Any = _np_mask(m)
            if shape_of == "attn":
                if a.shape == (L, S):
                    a = a.reshape(1, 1, L, S)
                elif a.shape == (B * H, L, S):
                    a = a.reshape(B, H, L, S)
                else:
                    raise ValueError(f"attn_mask must be ({L}, {S}) or ({B * H}, {L}, {S}), got {a.shape}")
            else:
                if a.shape != (B, S):
                    raise ValueError(f"key_padding_mask must be ({B}, {S}), got {a.shape}")
                a = a.reshape(B, 1, 1, S)
            parts.append(a)
        if not parts:
            return None
        if all(p.dtype == np.bool_ for p in parts):
            keep = ~parts[0]
            for p in parts[1:]:
                keep = keep & ~p
            return keep
        total = np.zeros((1, 1, 1, 1), np.float32)
        for p in parts:
            total = total + (np.where(p, np.float32(-np.inf), np.float32(0)) if p.dtype == np.bool_ else p)
        return total.astype(np.float32)

    def forward(
        self,
        query,
        key,
        value,
        key_padding_mask=None,
        need_weights: bool = True,
        attn_mask=None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ):
        """As `torch.nn.MultiheadAttention.forward`: `(attn_output, attn_weights or None)`;
        the weights averaged over heads unless `average_attn_weights=False`."""
        like = query if _is_tensor(query) else None
        self_attn = query is key and key is value
        q: Any = _np(query)
        k: Any = None if self_attn else _np(key)
        v: Any = None if self_attn else _np(value)
        batched = q.ndim == 3
        if q.ndim not in (2, 3):
            raise ValueError(f"query must be (L, E) or batched, got shape {q.shape}")

        def bf(a: Any) -> Any:  # to (B, L, E)
            if a is None:
                return None
            if not batched:
                return a[None]
            return a if self.batch_first else a.transpose(1, 0, 2)

        qb, kb, vb = bf(q), bf(k), bf(v)
        B, L = qb.shape[0], qb.shape[1]
        S = L if self_attn else kb.shape[1]
        if key_padding_mask is not None and not batched:
            kpm: Any = _np_mask(key_padding_mask)
            key_padding_mask = kpm.reshape(1, -1)
        mask = self._mask(attn_mask, key_padding_mask, B, L, S)
        causal = bool(is_causal) and attn_mask is None
        if self_attn and qb.shape[-1] == self.embed_dim:
            out, w = self._layer(need_weights, causal)(np.ascontiguousarray(qb), mask=mask)
            if w is not None and w.ndim == 3:  # one head: no heads axis
                w = w[:, None]
        else:
            out, w = self._cross(
                qb, kb if kb is not None else qb, vb if vb is not None else qb, mask, causal, need_weights
            )
        if not batched:
            out = out[0]
        elif not self.batch_first:
            out = out.transpose(1, 0, 2)
        if w is not None:
            if average_attn_weights:
                w = w.mean(axis=1)
            if not batched:
                w = w[0]
        if like is not None:
            import torch

            out = torch.from_numpy(np.ascontiguousarray(out)).to(device=like.device, dtype=like.dtype)
            if w is not None:
                w = torch.from_numpy(np.ascontiguousarray(w)).to(device=like.device, dtype=like.dtype)
        return out, (w if need_weights else None)

    __call__ = forward

    def _cross(self, q, k, v, mask, causal, need_weights):
        """Attention with distinct query and key/value inputs: projected on the host, the
        attention on the device."""
        wq, wk, wv, bq, bk, bv, wo, bo = self._weights()
        H, D = self.num_heads, self.head_dim

        def proj(x, w, b):
            y = x @ w.T
            return y if b is None else y + b

        def heads(x):
            return x.reshape(x.shape[0], x.shape[1], H, -1).transpose(0, 2, 1, 3)

        qh, kh, vh = heads(proj(q, wq, bq)), heads(proj(k, wk, bk)), heads(proj(v, wv, bv))
        r = scaled_dot_product_attention(
            np.ascontiguousarray(qh, np.float32),
            np.ascontiguousarray(kh, np.float32),
            np.ascontiguousarray(vh, np.float32),
            attn_mask=mask,
            is_causal=causal,
            return_weights=need_weights,
        )
        o, w = r if need_weights else (r, None)
        o = o.transpose(0, 2, 1, 3).reshape(q.shape[0], q.shape[1], H * D)
        out = proj(o, wo, bo).astype(np.float32)
        return out, w
