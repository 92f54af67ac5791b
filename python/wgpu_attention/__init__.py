"""wgpu-attention from Python: scaled dot-product attention in WGSL compute shaders on any
Vulkan, Metal, DX12 or GL GPU (or a software Vulkan driver such as lavapipe), with PyTorch's
`scaled_dot_product_attention` signature, on NumPy arrays and torch tensors.

    >>> import numpy as np, wgpu_attention as wa
    >>> q = np.random.rand(1, 8, 16, 64).astype(np.float32)
    >>> wa.scaled_dot_product_attention(q, q, q, is_causal=True).shape
    (1, 8, 16, 64)

Guide: docs/python.md in the repository.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

# Mesa's device-select Vulkan layer prints `XDG_RUNTIME_DIR is invalid` lines where that
# variable is unset (containers, CI); it only reorders adapters, which we choose ourselves.
# Set before the first device opens; a value the caller set wins.
os.environ.setdefault("NODEVICE_SELECT", "1")

from ._loader import native as _native  # noqa: E402
from .decode import KVCache  # noqa: E402
from . import presets  # noqa: E402
from .functional import flex_attention, scaled_dot_product_attention  # noqa: E402
from .nn import MultiheadAttention  # noqa: E402

__all__ = [
    "scaled_dot_product_attention",
    "flex_attention",
    "presets",
    "MultiheadAttention",
    "KVCache",
    "devices",
    "device",
    "use_device",
    "verify",
    "bench",
    "__version__",
]

__version__: str = _native.version()


def devices(backend: Optional[str] = None) -> List[Dict[str, Any]]:
    """Every adapter wgpu finds (best first) as dicts: name, backend, device_type, driver,
    f16, subgroups and the buffer limits. `backend`: "vulkan", "metal", "dx12" or "gl"."""
    return _native.devices(backend)


def device() -> Dict[str, Any]:
    """The adapter calls run on, opening the default one (the best found; `WGPU_BACKEND`
    and `WGPU_ADAPTER_NAME` are honoured) if none is open yet."""
    return _native.device()


def use_device(backend: Optional[str] = None, name: Optional[str] = None) -> Dict[str, Any]:
    """Opens the best adapter of `backend` whose name contains `name` (case-insensitive)
    for every later call, and returns its description. Tensors and layers made on the
    previous device keep using it."""
    return _native.use_device(backend, name)


def verify(cases: int = 8, seed: int = 0, half: bool = False) -> Dict[str, Any]:
    """Checks the kernels on this device against the crate's float64 CPU reference, and
    `scaled_dot_product_attention` against a NumPy float64 evaluation; see
    `wgpu_attention.bench` for speed."""
    from .tools import verify as _verify

    return _verify(cases=cases, seed=seed, half=half)


def bench(**kwargs: Any) -> Dict[str, Any]:
    """Times our call beside PyTorch's CPU SDPA (forward and backward) and the binding's
    per-call overhead; see `python -m wgpu_attention bench --help`."""
    from .tools import bench as _bench

    return _bench(**kwargs)
