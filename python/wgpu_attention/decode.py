"""`KVCache`: token-by-token decoding with keys and values kept on the device."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ._loader import native as _native
from .functional import _is_tensor

__all__ = ["KVCache"]


def _f32(x: Any, name: str) -> np.ndarray:
    if _is_tensor(x):
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        x = t.float().numpy()
    a = np.asarray(x)
    if a.dtype.kind != "f":
        raise ValueError(f"{name} must be floating point, got {a.dtype}")
    return a if a.dtype == np.float32 else a.astype(np.float32)


class KVCache:
    """A KV cache on the device for generation, one token (or a prompt) at a time.

    `capacity` tokens of `batch` sequences, `kv_heads` key/value heads of `head_dim`
    features (`v_head_dim` for values, default the same), stored as float32 or float16
    (`dtype="float16"`: half the memory; arithmetic stays float32). `step(q, k, v)` appends
    the new tokens' `k`, `v` `(batch, kv_heads, m, d)` and attends their queries
    `(batch, heads, m, d)` (heads a multiple of kv_heads) to everything cached, causal
    aligned to the bottom right (PyTorch's `causal_lower_right`): a prompt then one token
    at a time gives the rows of one causal attention over all the tokens. Inputs are NumPy
    arrays or torch tensors; the output is the query's kind and dtype.

    `window=W` (Mistral's sliding window: a token sees itself and the `W - 1` before it) and
    `softcap=C` (Gemma 2's logit soft-capping) apply at each token's position, as the
    crate's presets do. `rolling=True` keeps only the last `capacity` tokens (memory
    O(window)): with a window, each step must fit in it (`m + W - 1 <= capacity`).
    """

    def __init__(
        self,
        capacity: int,
        batch: int,
        kv_heads: int,
        head_dim: int,
        v_head_dim: Optional[int] = None,
        dtype: str = "float32",
        scale: Optional[float] = None,
        window: Optional[int] = None,
        softcap: Optional[float] = None,
        rolling: bool = False,
    ):
        if str(dtype).replace("torch.", "") not in ("float32", "float16"):
            raise ValueError(f"dtype must be 'float32' or 'float16', got {dtype!r}")
        modifiers: dict = {}
        if window is not None:
            if int(window) < 1:
                raise ValueError(f"window must be at least 1 key, got {window}")
            # Mistral's window W: a token sees itself and the W - 1 before it.
            modifiers["window"] = (int(window) - 1, 0)
        if softcap is not None:
            modifiers["softcap"] = float(softcap)
        self._cache = _native.KvCacheHandle(
            capacity,
            batch,
            kv_heads,
            head_dim,
            v_head_dim if v_head_dim is not None else head_dim,
            scale=None if scale is None else float(scale),
            half=str(dtype).endswith("float16"),
            rolling=bool(rolling),
            **modifiers,
        )

    def append(self, key: Any, value: Any) -> None:
        """Writes the new tokens' keys and values; an error leaves the cache as it was."""
        self._cache.append(_f32(key, "key"), _f32(value, "value"))

    def attend(self, query: Any) -> Any:
        """The queries of the cache's last `m` tokens attended to every cached token."""
        out = self._cache.attend(_f32(query, "query"))
        if _is_tensor(query):
            import torch

            return torch.from_numpy(out).to(device=query.device, dtype=query.dtype)
        return out.astype(np.asarray(query).dtype, copy=False)

    def step(self, query: Any, key: Any, value: Any) -> Any:
        """`append(key, value)` then `attend(query)`."""
        self.append(key, value)
        return self.attend(query)

    def __len__(self) -> int:
        return len(self._cache)

    @property
    def capacity(self) -> int:
        return self._cache.capacity

    @property
    def memory_bytes(self) -> int:
        """Device memory the cache holds (allocated up front for its whole capacity)."""
        return self._cache.memory_bytes

    def clear(self) -> None:
        """Empties the cache for the next sequence."""
        self._cache.clear()
