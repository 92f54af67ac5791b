"""`flex_attention`'s modifier arguments (WGSL source, presets from `presets`, lists of them,
named buffers) as the keywords of the native call, checked: each preset in its role, score
modifiers in the order the crate applies them, one of each kind."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from .presets import Alibi, MaskPreset, RelativeBias, ScorePreset, Softcap, _numpy


def items(arg: Any) -> Tuple[Any, ...]:
    """A modifier argument (None, one modifier, or a list or tuple of them) as a tuple."""
    if arg is None:
        return ()
    if isinstance(arg, (list, tuple)):
        return tuple(arg)
    return (arg,)


def _buffer(name: Any, a: Any) -> np.ndarray:
    """A modifier buffer as the native call takes it: float32 for floats, int32 for integers
    (and bools)."""
    if not isinstance(name, str):
        raise TypeError(f"buffer names must be strings, got {type(name).__name__}")
    a = _numpy(a)
    if a.dtype.kind == "f":
        return a.astype(np.float32, copy=False)
    if a.dtype.kind in "iub":
        info = np.iinfo(np.int32)
        if a.size and (a.min() < info.min or a.max() > info.max):
            raise ValueError(f"buffer {name!r} has values outside int32")
        return a.astype(np.int32, copy=False)
    raise ValueError(f"buffer {name!r} must hold floats (array<f32>) or integers (array<i32>), got {a.dtype}")


def native_kwargs(
    score_mod: Any, mask_mod: Any, score_mod_grad: Optional[str], buffers: Optional[Mapping[str, Any]], plan: Any
) -> Dict[str, Any]:
    """`flex_attention`'s modifiers as the native call's keywords, checked against `plan`
    (`functional._Plan`: the heads, lengths and batch the presets are shaped for)."""
    kw: Dict[str, Any] = {}
    # The crate applies score modifiers in one order: a caller's WGSL, ALiBi, the relative
    # bias, the soft-cap.
    order = ("WGSL source", "ALiBi", "relative bias", "soft-cap")
    last = -1
    for item in items(score_mod):
        if isinstance(item, str):
            rank, kw["score_mod"] = 0, item
        elif isinstance(item, (Alibi, RelativeBias, Softcap)):
            rank = 1 if isinstance(item, Alibi) else 2 if isinstance(item, RelativeBias) else 3
            kw.update(item._kwargs(plan))
        elif isinstance(item, MaskPreset):
            raise TypeError(f"{item!r} is a mask modifier: pass it as mask_mod")
        else:
            raise TypeError(
                "score_mod takes WGSL source (a str), presets.softcap(...), presets.alibi(...), "
                f"presets.relative_bias(...) or a list of them, got {type(item).__name__}"
            )
        if rank == last:
            raise ValueError(f"score_mod has two of one kind ({order[rank]}): give one")
        if rank < last:
            raise ValueError(
                "score modifiers apply in a fixed order, a caller's WGSL first, then ALiBi, then the relative bias, "
                "then the soft-cap: list them so"
            )
        last = rank
    seen: set = set()
    for item in items(mask_mod):
        if isinstance(item, str):
            kind, new = "WGSL source", {"mask_mod": item}
        elif isinstance(item, MaskPreset):
            kind, new = type(item).__name__, item._kwargs(plan)
        elif isinstance(item, ScorePreset):
            raise TypeError(f"{item!r} is a score modifier: pass it as score_mod")
        else:
            raise TypeError(
                "mask_mod takes WGSL source (a str), presets.sliding_window(...), presets.document_mask(...), "
                f"presets.prefix_lm(...) or a list of them, got {type(item).__name__}"
            )
        if kind in seen:
            raise ValueError(f"mask_mod has two of one kind ({kind}): give one (mask modifiers are and-ed)")
        seen.add(kind)
        kw.update(new)
    if score_mod_grad is not None:
        if not isinstance(score_mod_grad, str):
            raise TypeError(f"score_mod_grad must be WGSL source (a str), got {type(score_mod_grad).__name__}")
        kw["score_mod_grad"] = score_mod_grad
    if buffers:
        if not isinstance(buffers, Mapping):
            raise TypeError(f"buffers must be a dict of name -> array, got {type(buffers).__name__}")
        kw["mod_buffers"] = {name: _buffer(name, a) for name, a in buffers.items()}
    return kw


def grad_table(score_mod: Any) -> Any:
    """The relative bias table among `score_mod`'s presets that requires grad (a torch
    tensor), or None."""
    for item in items(score_mod):
        if isinstance(item, RelativeBias) and item.source is not None:
            return item.source
    return None
