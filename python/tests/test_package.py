"""The package as a user meets it: the command line, verify and bench, stubs that type-check a
client, and the GIL released while the device works."""

import importlib.util
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest

import wgpu_attention as wa

PKG = os.path.dirname(wa.__file__)


def test_stubs_and_marker_are_installed():
    assert os.path.exists(os.path.join(PKG, "py.typed"))
    assert os.path.exists(os.path.join(PKG, "_native.pyi"))


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy not installed")
def test_a_client_type_checks_and_a_wrong_call_does_not():
    good = "import numpy as np\nimport wgpu_attention as wa\nq = np.zeros((1, 2, 3, 4), np.float32)\nout = wa.scaled_dot_product_attention(q, q, q, is_causal=True)\nc = wa.KVCache(8, 1, 2, 4)\n"
    bad = good + "wa.scaled_dot_product_attention(q, q, q, is_causal='yes', scale='x', nonsense=1)\n"
    with tempfile.TemporaryDirectory() as d:
        results = []
        for name, text in (("good.py", good), ("bad.py", bad)):
            path = os.path.join(d, name)
            with open(path, "w") as f:
                f.write(text)
            r = subprocess.run(
                [sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", os.path.join(d, "c"), path],
                capture_output=True,
                text=True,
            )
            results.append(r)
    assert results[0].returncode == 0, results[0].stdout
    assert results[1].returncode != 0 and "nonsense" in results[1].stdout


def test_the_module_command_lists_devices():
    r = subprocess.run([sys.executable, "-m", "wgpu_attention", "devices"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and wa.device()["name"] in r.stdout
    assert "XDG_RUNTIME_DIR" not in r.stderr


def test_verify_passes_on_this_device():
    r = wa.verify(cases=2, seed=1)
    assert r["passed"], [c for c in r["kernels"] + r["python"] if not c["passed"]]
    assert len(r["kernels"]) > 10 and len(r["python"]) == 4


def test_bench_reports_both_sides_and_the_overhead():
    r = wa.bench(shapes=[(1, 2, 16, 8)], repeats=2)
    row = r["rows"][0]
    assert row["ours_forward_ms"] > 0 and row["ours_forward_gflops"] > 0
    if importlib.util.find_spec("torch") is not None:
        assert row["torch_forward_ms"] > 0 and row["ours_backward_ms"] > 0
    o = r["overhead"]
    assert o["python_ms"] > 0 and o["rust_ms"] > 0
    from wgpu_attention.tools import format_bench

    assert "binding overhead" in format_bench(r)


def test_the_gil_is_released_while_the_device_works():
    """One long call on a thread while this thread ticks: with the GIL held for the call, no
    tick could happen during it and the longest gap would be the whole call."""
    q = np.random.default_rng(0).standard_normal((1, 8, 1024, 64)).astype(np.float32)
    wa.scaled_dot_product_attention(q, q, q)  # compile first
    ticks = []
    done = threading.Event()

    def work():
        wa.scaled_dot_product_attention(q, q, q)
        done.set()

    t = threading.Thread(target=work)
    start = time.perf_counter()
    t.start()
    while not done.is_set():
        ticks.append(time.perf_counter())
        time.sleep(0.001)
    t.join()
    elapsed = time.perf_counter() - start
    assert elapsed > 0.02, f"the call took {elapsed:.3f} s: too short to tell"
    gaps = np.diff([start] + ticks + [start + elapsed])
    assert gaps.max() < 0.5 * elapsed, (gaps.max(), elapsed, len(ticks))


def test_loading_triton_after_the_device_opened_does_not_crash():
    """lavapipe's LLVM and triton's: the package loads triton's first (see _loader.py)."""
    code = "import wgpu_attention as wa; wa.device()\ntry:\n    import triton._C.libtriton\nexcept ImportError:\n    pass\nprint('ok')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-500:])
