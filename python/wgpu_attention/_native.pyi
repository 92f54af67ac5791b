"""Type stubs of the native module (src/lib.rs); the public API is the package's Python."""

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
I32 = npt.NDArray[np.int32]

def version() -> str: ...
def devices(backend: Optional[str] = None) -> List[Dict[str, Any]]: ...
def use_device(backend: Optional[str] = None, name: Optional[str] = None) -> Dict[str, Any]: ...
def device() -> Dict[str, Any]: ...
def sdpa(
    q: F32,
    k: F32,
    v: F32,
    mask: Optional[npt.NDArray[Any]] = None,
    kv_lengths: Optional[Sequence[int]] = None,
    is_causal: bool = False,
    scale: Optional[float] = None,
    return_weights: bool = False,
    save: bool = False,
    half: bool = False,
    *,
    window: Optional[Tuple[int, int]] = None,
    softcap: Optional[float] = None,
    alibi_slopes: Optional[F32] = None,
    relative_bias: Optional[F32] = None,
    relative_bias_max_distance: Optional[int] = None,
    relative_bias_bidirectional: Optional[bool] = None,
    document_ids: Optional[I32] = None,
    prefix_length: Optional[int] = None,
    score_mod: Optional[str] = None,
    mask_mod: Optional[str] = None,
    score_mod_grad: Optional[str] = None,
    mod_buffers: Optional[Dict[str, npt.NDArray[Any]]] = None,
) -> Tuple[F32, Optional[F32], Optional[SavedForward]]: ...
def alibi_slopes(heads: int) -> F32: ...
def check_modifiers(**modifiers: Any) -> None: ...
def verify(random: int = 8, seed: int = 0, half: bool = False) -> List[Dict[str, Any]]: ...
def time_sdpa(
    q: F32, k: F32, v: F32, is_causal: bool = False, repeats: int = 20, warmup: bool = True
) -> List[float]: ...
def _panic_for_tests() -> None: ...

class SavedForward:
    def backward(self, d_o: F32) -> Tuple[F32, F32, F32, Optional[F32]]: ...
    def log_sum_exp(self) -> F32: ...

class ResidentLayer:
    def __init__(
        self,
        w_q: F32,
        w_k: F32,
        w_v: F32,
        b_q: Optional[F32] = None,
        b_k: Optional[F32] = None,
        b_v: Optional[F32] = None,
        w_o: Optional[F32] = None,
        b_o: Optional[F32] = None,
        heads: int = 1,
        is_causal: bool = False,
        scale: Optional[float] = None,
        return_weights: bool = False,
        half: bool = False,
    ) -> None: ...
    def __call__(
        self, x: F32, mask: Optional[npt.NDArray[Any]] = None, kv_lengths: Optional[Sequence[int]] = None
    ) -> Tuple[F32, Optional[F32]]: ...

class KvCacheHandle:
    def __init__(
        self,
        capacity: int,
        batch: int,
        kv_heads: int,
        d_k: int,
        d_v: int,
        scale: Optional[float] = None,
        half: bool = False,
        rolling: bool = False,
        *,
        window: Optional[Tuple[int, int]] = None,
        softcap: Optional[float] = None,
    ) -> None: ...
    def append(self, k: F32, v: F32) -> None: ...
    def attend(self, q: F32) -> F32: ...
    def __len__(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def memory_bytes(self) -> int: ...
    def clear(self) -> None: ...
