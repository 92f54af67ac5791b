"""The crate's modifier presets for `flex_attention`: score modifiers (`softcap`, `alibi`,
`relative_bias`), which change each scaled score, and mask modifiers (`sliding_window`, `document_mask`,
`prefix_lm`), which decide which keys a query sees.

    >>> import numpy as np, wgpu_attention as wa
    >>> from wgpu_attention import presets
    >>> q = np.random.rand(1, 4, 16, 8).astype(np.float32)
    >>> out = wa.flex_attention(q, q, q, score_mod=presets.softcap(30.0),
    ...                         mask_mod=presets.sliding_window(3), is_causal=True)
    >>> out.shape
    (1, 4, 16, 8)

Positions are the indices in the call, top-left aligned: query `i` is row `i` of the query,
key `j` row `j` of the key, whatever their lengths (as `is_causal`). Each preset is the
crate's `Preset` of the same name, generated as WGSL and applied inside the fused kernel.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Dict

import numpy as np

from ._loader import native as _native

__all__ = [
    "Preset",
    "ScorePreset",
    "MaskPreset",
    "Softcap",
    "Alibi",
    "RelativeBias",
    "SlidingWindow",
    "DocumentMask",
    "PrefixLM",
    "softcap",
    "alibi",
    "alibi_slopes",
    "relative_bias",
    "sliding_window",
    "document_mask",
    "prefix_lm",
]


def _count(name: str, x: Any) -> int:
    """`x` as a non-negative int (a NumPy or Python integer)."""
    try:
        n = operator.index(x)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(x).__name__}") from None
    if n < 0:
        raise ValueError(f"{name} must be non-negative, got {n}")
    return n


def _numpy(x: Any, differentiable: bool = False) -> np.ndarray:
    """An array of `x`: NumPy arrays, sequences, and torch tensors (detached, on the CPU).
    A tensor that requires grad is refused unless `differentiable` (the relative bias
    table, whose gradient the backward returns)."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        if getattr(x, "requires_grad", False) and not differentiable:
            raise NotImplementedError(
                "gradients with respect to a preset's values or a modifier buffer are not implemented "
                "(only a relative bias table's are): pass a detached tensor"
            )
        x = x.detach().cpu().numpy()
    return np.asarray(x)


class Preset:
    """A modifier the crate generates as WGSL. Pass score presets as `score_mod`, mask
    presets as `mask_mod`."""

    #: "score" or "mask": the argument of `flex_attention` it goes to.
    role: str = ""

    def _kwargs(self, plan: Any) -> Dict[str, Any]:
        """The native call's keyword for this preset, shaped for `plan` (functional._Plan)."""
        raise NotImplementedError


class ScorePreset(Preset):
    """A score modifier: changes the scaled score `q·k · scale` before masking."""

    role = "score"


class MaskPreset(Preset):
    """A mask modifier: query `i` sees key `j` only where every mask modifier is true (and
    `is_causal`, and `attn_mask`)."""

    role = "mask"


@dataclass(frozen=True)
class Softcap(ScorePreset):
    """Logit soft-capping (Gemma 2, Grok): `score ← cap · tanh(score / cap)`."""

    cap: float

    def __post_init__(self) -> None:
        c = float(self.cap)
        # The crate's rule (finite, positive), raised as a ValueError.
        _native.check_modifiers(softcap=c)
        object.__setattr__(self, "cap", c)

    def _kwargs(self, plan: Any) -> Dict[str, Any]:
        return {"softcap": self.cap}


@dataclass(frozen=True, eq=False)
class Alibi(ScorePreset):
    """ALiBi (BLOOM, MPT): `score ← score + slopes[h] · (j − i)`, one slope per query head."""

    slopes: np.ndarray

    def __post_init__(self) -> None:
        s = _numpy(self.slopes).astype(np.float32)
        # The crate's rules (1-D, finite, at least one), raised as a ValueError.
        _native.check_modifiers(alibi_slopes=s)
        s.setflags(write=False)
        object.__setattr__(self, "slopes", s)

    def _kwargs(self, plan: Any) -> Dict[str, Any]:
        # One slope per query head: the crate's rule, checked in the call.
        return {"alibi_slopes": self.slopes}

    def __repr__(self) -> str:
        return f"Alibi(slopes={self.slopes.tolist()})"


@dataclass(frozen=True, eq=False)
class RelativeBias(ScorePreset):
    """T5's relative position bias: `score ← score + table[bucket(j − i), h]`, with the
    learned `(buckets, heads)` table of Hugging Face's `relative_attention_bias.weight` and
    T5's bucketing of the distance (`T5Attention._relative_position_bucket`: exact buckets
    for small distances, logarithmic ones up to `max_distance`; with `bidirectional`, half
    the buckets for keys after the query, else those share bucket 0). A torch tensor that
    requires grad gets its gradient from the fused backward (the only preset whose values
    do), and is read at each call, so a preset made once follows the table's training."""

    table: np.ndarray
    max_distance: int = 128
    bidirectional: bool = True
    #: The tensor given the table's gradient (the table, when a torch tensor that requires
    #: grad), or None.
    source: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        source = self.table if getattr(self.table, "requires_grad", False) else None
        t = _numpy(self.table, differentiable=True)
        if t.dtype.kind not in "fiu":
            raise ValueError(f"a relative bias table must hold numbers, got {t.dtype}")
        t = t.astype(np.float32)
        t.setflags(write=False)
        md = _count("max_distance", self.max_distance)
        bidirectional = bool(self.bidirectional)
        # The crate's rules (2-D, at least 2 buckets and 1 head, finite values, max_distance
        # past the exact buckets' reach), raised as a ValueError.
        _native.check_modifiers(
            relative_bias=t, relative_bias_max_distance=md, relative_bias_bidirectional=bidirectional
        )
        object.__setattr__(self, "table", t)
        object.__setattr__(self, "max_distance", md)
        object.__setattr__(self, "bidirectional", bidirectional)
        object.__setattr__(self, "source", source)

    @property
    def buckets(self) -> int:
        return int(self.table.shape[0])

    def _kwargs(self, plan: Any) -> Dict[str, Any]:
        table = self.table
        if self.source is not None:
            # A table being trained is read at each call: its values of now, not of when the
            # preset was made.
            table = _numpy(self.source, differentiable=True).astype(np.float32)
            if table.shape != self.table.shape:
                raise ValueError(f"the relative bias table changed shape from {self.table.shape} to {table.shape}")
        # One column per query head: the crate's rule, checked in the call.
        return {
            "relative_bias": table,
            "relative_bias_max_distance": self.max_distance,
            "relative_bias_bidirectional": self.bidirectional,
        }

    def __repr__(self) -> str:
        grad = ", requires_grad" if self.source is not None else ""
        return (
            f"RelativeBias(table of shape {self.table.shape}{grad}, max_distance={self.max_distance}, "
            f"bidirectional={self.bidirectional})"
        )


@dataclass(frozen=True)
class SlidingWindow(MaskPreset):
    """Query `i` sees key `j` when `i − left ≤ j ≤ i + right`. With `is_causal=True`,
    `SlidingWindow(W − 1, 0)` is Mistral's window of `W` keys (the query's own included)."""

    left: int
    right: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "left", _count("the window's left", self.left))
        object.__setattr__(self, "right", _count("the window's right", self.right))

    def _kwargs(self, plan: Any) -> Dict[str, Any]:
        return {"window": (self.left, self.right)}


@dataclass(frozen=True, eq=False)
class DocumentMask(MaskPreset):
    """Packed sequences: query `i` sees key `j` only when `ids[..., i] == ids[..., j]`.
    `ids` is integer, `(n,)` or the batch axes then `(n,)` (broadcast like the inputs'
    batch), with `n` at least the longer of the query's and the key's lengths."""

    ids: np.ndarray

    def __post_init__(self) -> None:
        ids = _numpy(self.ids)
        if ids.dtype.kind not in "iub":
            raise ValueError(f"document ids must be integers, got {ids.dtype}")
        if ids.ndim == 0:
            raise ValueError("document ids must have a positions axis, (n,) or (batch..., n), got a scalar")
        if ids.size and (ids.min() < np.iinfo(np.int32).min or ids.max() > np.iinfo(np.int32).max):
            raise ValueError("document ids must fit in int32")
        ids = ids.astype(np.int32)
        # The crate's rules (at least one position), raised as a ValueError.
        rows = int(np.prod(ids.shape[:-1], dtype=np.int64))
        _native.check_modifiers(document_ids=np.ascontiguousarray(ids.reshape(rows, ids.shape[-1])))
        ids.setflags(write=False)
        object.__setattr__(self, "ids", ids)

    def _kwargs(self, plan: Any) -> Dict[str, Any]:
        ids = self.ids
        n = ids.shape[-1]
        # One id per position: the crate's rule, checked in the call.
        try:
            ids = np.broadcast_to(ids, plan.batch + (n,))
        except ValueError:
            raise ValueError(
                f"document ids of shape {self.ids.shape} do not broadcast to the batch {plan.batch} + ({n},)"
            ) from None
        return {"document_ids": np.ascontiguousarray(ids.reshape(plan.B, n))}

    def __repr__(self) -> str:
        return f"DocumentMask(ids of shape {self.ids.shape})"


@dataclass(frozen=True)
class PrefixLM(MaskPreset):
    """Prefix-LM (T5, PaLI): the first `length` keys are seen by every query, the rest
    causally (`j ≤ i`). It is causal itself: pass it without `is_causal`, which is and-ed
    with it and would hide the prefix's later keys from its earlier queries."""

    length: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "length", _count("the prefix length", self.length))

    def _kwargs(self, plan: Any) -> Dict[str, Any]:
        return {"prefix_length": self.length}


def softcap(cap: float) -> Softcap:
    """`score ← cap · tanh(score / cap)` (Gemma 2 uses `cap = 50`)."""
    return Softcap(cap)


def alibi_slopes(num_heads: int) -> np.ndarray:
    """ALiBi's standard geometric slopes for `num_heads` heads (Press et al.; for a head
    count that is not a power of two, the next power's odd-indexed slopes fill the rest),
    float32: the crate's `Preset::alibi_slopes`."""
    return _native.alibi_slopes(_count("num_heads", num_heads))


def alibi(slopes: Any) -> Alibi:
    """ALiBi with these per-head slopes, or with the standard ones when given an int (the
    number of query heads): `alibi(8)` is `alibi(alibi_slopes(8))`."""
    if isinstance(slopes, (int, np.integer)):
        slopes = alibi_slopes(int(slopes))
    return Alibi(slopes)


def relative_bias(table: Any, max_distance: int = 128, bidirectional: bool = True) -> RelativeBias:
    """T5's relative position bias with this `(buckets, heads)` table (NumPy or torch; T5's
    `relative_attention_bias.weight`, its `heads` the query's): `bidirectional=True` for
    T5's encoder, False for its decoder (keys after the query share bucket 0). A torch
    table that requires grad gets `table.grad` from the fused backward."""
    return RelativeBias(table, max_distance, bidirectional)


def sliding_window(left: int, right: int = 0) -> SlidingWindow:
    """Query `i` sees keys `i − left … i + right`; `sliding_window(W − 1)` with
    `is_causal=True` is a causal window of `W` keys (Mistral's `sliding_window=W`)."""
    return SlidingWindow(left, right)


def document_mask(ids: Any) -> DocumentMask:
    """Attention within documents only: `ids` gives each position's document, `(n,)` or
    `(batch..., n)`."""
    return DocumentMask(ids)


def prefix_lm(length: int) -> PrefixLM:
    """The first `length` positions attend bidirectionally, the rest causally."""
    return PrefixLM(length)
