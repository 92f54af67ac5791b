"""PyTorch's CPU SDPA, forward and autograd backward, timed for `wgpu-attention bench
--backward` and `wgpu-attention report` as their peer. Prints a first line `# torch VERSION`,
then one line per n: `n forward_ms backward_ms threads` (medians after one warm-up).

    python3 benches/torch_peer.py --n 1024,4096 --heads 1 --e 64 --batch 1 [--causal] [--repeats 3]

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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", required=True)
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--e", type=int, default=64)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--forward-only", action="store_true")
    a = p.parse_args()
    torch.manual_seed(0)
    print("# torch", torch.__version__, flush=True)
    for n in [int(x) for x in a.n.split(",")]:
        shape = (a.batch, a.heads, n, a.e)
        if a.forward_only:
            q, k, v = (torch.randn(shape) for _ in range(3))
            fwd = []
            with torch.inference_mode():
                for i in range(a.repeats + 1):
                    t0 = time.perf_counter()
                    F.scaled_dot_product_attention(q, k, v, is_causal=a.causal)
                    if i > 0:  # the first is a warm-up
                        fwd.append((time.perf_counter() - t0) * 1e3)
            print(n, statistics.median(fwd), "-", torch.get_num_threads(), flush=True)
            continue
        q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
        d_o = torch.randn(shape)
        fwd, bwd = [], []
        for i in range(a.repeats + 1):
            t0 = time.perf_counter()
            out = F.scaled_dot_product_attention(q, k, v, is_causal=a.causal)
            t1 = time.perf_counter()
            out.backward(d_o)
            t2 = time.perf_counter()
            for t in (q, k, v):
                t.grad = None
            if i > 0:  # the first is a warm-up
                fwd.append((t1 - t0) * 1e3)
                bwd.append((t2 - t1) * 1e3)
        print(n, statistics.median(fwd), statistics.median(bwd), torch.get_num_threads(), flush=True)


if __name__ == "__main__":
    main()
