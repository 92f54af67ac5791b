"""`verify()` and `bench()`: the checks and measurements a user runs on their own device."""

from __future__ import annotations

import platform
import statistics
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ._loader import native as _native
from .functional import scaled_dot_product_attention

Shape = Tuple[int, int, int, int]

DEFAULT_SHAPES: Tuple[Shape, ...] = ((1, 8, 16, 64), (1, 8, 256, 64), (1, 8, 1024, 64))


def _numpy_sdpa64(q, k, v, mask=None, causal=False):
    s = q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    return p @ v.astype(np.float64)


def verify(cases: int = 8, seed: int = 0, half: bool = False) -> Dict[str, Any]:
    """The crate's kernel check on this device (its standard cases plus `cases` random ones,
    on every kernel path, against the float64 CPU reference), and the Python function's
    own check against a NumPy float64 evaluation (masks, causal, GQA, odd sizes).
    Returns `{"adapter", "passed", "kernels": [per-case dicts], "python": [...]}`."""
    kernels = _native.verify(random=cases, seed=seed, half=half)
    rng = np.random.default_rng(seed)
    py_cases = []
    for B, H, Hkv, L, S, E, causal, masked in [
        (1, 1, 1, 1, 1, 1, False, False),
        (2, 4, 4, 7, 7, 8, True, False),
        (1, 4, 2, 37, 37, 16, False, True),
        (2, 2, 1, 5, 1000, 32, False, True),
    ]:
        q = rng.standard_normal((B, H, L, E)).astype(np.float32)
        k = rng.standard_normal((B, Hkv, S, E)).astype(np.float32)
        v = rng.standard_normal((B, Hkv, S, E)).astype(np.float32)
        mask = rng.random((L, S)) > 0.3 if masked else None
        if mask is not None:
            mask[:, 0] = True
        got = scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
        rep = H // Hkv
        want = _numpy_sdpa64(q, np.repeat(k, rep, 1), np.repeat(v, rep, 1), mask, causal)
        err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        name = f"sdpa B={B} H={H}/{Hkv} L={L} S={S} E={E}" + (" causal" if causal else "") + (" mask" if masked else "")
        py_cases.append({"case": name, "context_rel": err, "tolerance": 1e-5, "passed": err < 1e-5})
    passed = all(c["passed"] for c in kernels) and all(c["passed"] for c in py_cases)
    return {"adapter": _native.device()["name"], "passed": passed, "kernels": kernels, "python": py_cases}


def _median_ms(fn, repeats: int) -> float:
    fn()  # warm-up: pipelines compile on the first call
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def bench(
    shapes: Sequence[Shape] = DEFAULT_SHAPES,
    repeats: int = 10,
    causal: bool = False,
    backward: bool = True,
    overhead_shape: Shape = (1, 8, 16, 64),
) -> Dict[str, Any]:
    """Our call beside PyTorch's CPU SDPA on the same `(batch, heads, n, d)` shapes, forward
    and (with torch tensors that require grad) forward + backward, medians of `repeats`
    calls in milliseconds with GFLOP/s; and the binding's per-call overhead: the Python call
    against the Rust API's own call timed in Rust, at `overhead_shape`. PyTorch's columns
    are None where torch is not installed."""
    torch: Any
    try:
        import torch
    except ImportError:
        torch = None
    rows: List[Dict[str, Any]] = []
    rng = np.random.default_rng(0)
    for B, H, n, d in shapes:
        q, k, v = (rng.standard_normal((B, H, n, d)).astype(np.float32) for _ in range(3))
        flops = 4.0 * B * H * n * n * d * (0.5 if causal else 1.0)
        row: Dict[str, Any] = {"shape": (B, H, n, d), "causal": causal}
        row["ours_forward_ms"] = _median_ms(lambda: scaled_dot_product_attention(q, k, v, is_causal=causal), repeats)
        row["ours_forward_gflops"] = flops / row["ours_forward_ms"] / 1e6
        row["torch_forward_ms"] = row["torch_forward_gflops"] = None
        row["ours_backward_ms"] = row["torch_backward_ms"] = None
        if torch is not None:
            tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
            f = torch.nn.functional.scaled_dot_product_attention
            with torch.no_grad():
                row["torch_forward_ms"] = _median_ms(lambda: f(tq, tk, tv, is_causal=causal), repeats)
            row["torch_forward_gflops"] = flops / row["torch_forward_ms"] / 1e6
            if backward:
                gq, gk, gv = (t.clone().requires_grad_() for t in (tq, tk, tv))

                def ours_fb():
                    scaled_dot_product_attention(gq, gk, gv, is_causal=causal).sum().backward()

                def torch_fb():
                    f(gq, gk, gv, is_causal=causal).sum().backward()

                row["ours_backward_ms"] = _median_ms(ours_fb, repeats)
                row["torch_backward_ms"] = _median_ms(torch_fb, repeats)
        row["ours_vs_torch_forward"] = (
            (row["torch_forward_ms"] / row["ours_forward_ms"]) if row["torch_forward_ms"] else None
        )
        rows.append(row)
    # The overhead: the Rust API's call timed in Rust and ours timed here, interleaved call by
    # call so that both see the same machine (a shared CPU drifts by more than the overhead).
    q, k, v = (rng.standard_normal(overhead_shape).astype(np.float32) for _ in range(3))
    _native.time_sdpa(q, k, v, is_causal=causal, repeats=1)
    rust_s, py_s = [], []
    for _ in range(max(repeats, 50)):
        rust_s += _native.time_sdpa(q, k, v, is_causal=causal, repeats=1, warmup=False)
        t = time.perf_counter()
        scaled_dot_product_attention(q, k, v, is_causal=causal)
        py_s.append(time.perf_counter() - t)
    rust = statistics.median(rust_s) * 1e3
    py = statistics.median(py_s) * 1e3
    return {
        "adapter": _native.device()["name"],
        "cpu": platform.processor() or platform.machine(),
        "torch": None if torch is None else torch.__version__,
        "rows": rows,
        "overhead": {"shape": overhead_shape, "python_ms": py, "rust_ms": rust, "overhead_ms": py - rust},
    }


def format_bench(r: Dict[str, Any]) -> str:
    def f(x: Optional[float], fmt: str = "{:.2f}") -> str:
        return "-" if x is None else fmt.format(x)

    lines = [
        f"adapter: {r['adapter']}; torch: {r['torch'] or 'not installed'} (CPU)",
        "| shape (B, H, n, d) | ours fwd ms | GFLOP/s | torch CPU fwd ms | GFLOP/s | torch/ours | ours fwd+bwd ms | torch fwd+bwd ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        lines.append(
            f"| {row['shape']} | {f(row['ours_forward_ms'])} | {f(row['ours_forward_gflops'])} | "
            f"{f(row['torch_forward_ms'])} | {f(row['torch_forward_gflops'])} | {f(row['ours_vs_torch_forward'], '{:.2f}×')} | "
            f"{f(row['ours_backward_ms'])} | {f(row['torch_backward_ms'])} |"
        )
    o = r["overhead"]
    lines.append(
        f"binding overhead at {o['shape']}: Python call {o['python_ms']:.3f} ms, Rust API call "
        f"{o['rust_ms']:.3f} ms, overhead {o['overhead_ms'] * 1e3:.0f} µs per call"
    )
    return "\n".join(lines)
