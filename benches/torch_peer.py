"""PyTorch's SDPA, forward and autograd backward, timed for `wgpu-attention bench` and
`wgpu-attention report` as their peer. Prints a first line `# torch VERSION`, a second
`# device TYPE NAME` (cpu, or cuda / mps and the card), then one line per n:
`n forward_ms backward_ms threads` (medians after one warm-up; on a GPU each timed call is
synchronised, so the time is the device's work).

    python3 benches/torch_peer.py --n 1024,4096 --heads 1 --e 64 --batch 1 [--causal] [--repeats 3]
        [--device cpu|auto] [--cpu-flop-max F] [--dtype float32|float16]

`--device auto` takes the GPU torch has (CUDA, ROCm through the same API, or Apple's MPS) and
the CPU without one: the callers pass it when their own adapter is a GPU, so that both sides
of a ratio ran on the same kind of device in the same run.

With `--forward-only` the forward runs without autograd (`torch.inference_mode()`), nothing
is recorded for a backward, and backward_ms is `-`.

Exits 3 without PyTorch (the bench then leaves the peer out).
"""

import argparse
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.exit(3)


def pick_device(wanted: str) -> "tuple[torch.device, str]":
    """The device to time on, and its name: the CPU, or with `auto` torch's GPU if any."""
    if wanted == "auto" and torch.cuda.is_available():
        return torch.device("cuda"), torch.cuda.get_device_name(0).replace(" ", "_")
    mps = getattr(torch.backends, "mps", None)
    if wanted == "auto" and mps is not None and mps.is_available():
        return torch.device("mps"), "Apple_GPU"
    return torch.device("cpu"), "cpu"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", required=True)
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--e", type=int, default=64)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--forward-only", action="store_true")
    p.add_argument("--device", choices=["cpu", "auto"], default="cpu")
    p.add_argument("--cpu-flop-max", type=float, default=None)
    p.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    a = p.parse_args()
    dtype = getattr(torch, a.dtype)
    torch.manual_seed(0)
    dev, name = pick_device(a.device)
    print("# torch", torch.__version__, flush=True)
    print("# device", dev.type, name, flush=True)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        elif dev.type == "mps":
            torch.mps.synchronize()

    for n in [int(x) for x in a.n.split(",")]:
        shape = (a.batch, a.heads, n, a.e)
        # On the CPU, sizes past --cpu-flop-max (GPU-sized problems) are left out: minutes each.
        flop = 4.0 * n * n * a.e * a.heads * a.batch
        if dev.type == "cpu" and a.cpu_flop_max is not None and flop > a.cpu_flop_max:
            continue
        if a.forward_only:
            q, k, v = (torch.randn(shape, device=dev, dtype=dtype) for _ in range(3))
            fwd = []
            with torch.inference_mode():
                for i in range(a.repeats + 1):
                    sync()
                    t0 = time.perf_counter()
                    F.scaled_dot_product_attention(q, k, v, is_causal=a.causal)
                    sync()
                    if i > 0:  # the first is a warm-up
                        fwd.append((time.perf_counter() - t0) * 1e3)
            print(n, statistics.median(fwd), "-", torch.get_num_threads(), flush=True)
            continue
        q, k, v = (
            torch.randn(shape, device=dev, dtype=dtype, requires_grad=True)
            for _ in range(3)
        )
        d_o = torch.randn(shape, device=dev, dtype=dtype)
        fwd, bwd = [], []
        for i in range(a.repeats + 1):
            sync()
            t0 = time.perf_counter()
            out = F.scaled_dot_product_attention(q, k, v, is_causal=a.causal)
            sync()
            t1 = time.perf_counter()
            out.backward(d_o)
            sync()
            t2 = time.perf_counter()
            for t in (q, k, v):
                t.grad = None
            if i > 0:  # the first is a warm-up
                fwd.append((t1 - t0) * 1e3)
                bwd.append((t2 - t1) * 1e3)
        print(
            n,
            statistics.median(fwd),
            statistics.median(bwd),
            torch.get_num_threads(),
            flush=True,
        )


if __name__ == "__main__":
    main()
