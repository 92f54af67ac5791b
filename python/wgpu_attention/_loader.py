"""The native module, behind one guard that runs before the first call that may open a device.

Mesa's lavapipe (the software Vulkan driver) links LLVM, and triton (installed with torch on
Linux, loaded lazily by `torch._dynamo`, which transformers imports) bundles its own LLVM:
loading triton's library after a lavapipe device opened crashes the process (a segmentation
fault), while the other order works. So the first call that may open a device loads triton's
library first, where triton is installed (about 0.3 s, once).
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
from typing import Any

from . import _native as _real

_lock = threading.Lock()
_prepared = False


def _prepare() -> None:
    global _prepared
    with _lock:
        if _prepared:
            return
        _prepared = True
        try:
            if importlib.util.find_spec("triton") is not None:
                importlib.import_module("triton._C.libtriton")
        except Exception:  # a broken triton install is not our concern here
            pass


class _Native:
    """`_native`'s functions and classes; any of them but `version` prepares first."""

    def __getattr__(self, name: str) -> Any:
        if name != "version":
            _prepare()
        return getattr(_real, name)


native: Any = _Native()
