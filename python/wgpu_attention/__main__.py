"""`python -m wgpu_attention devices | verify | bench`."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    import wgpu_attention as wa
    from .tools import DEFAULT_SHAPES, format_bench

    p = argparse.ArgumentParser(prog="python -m wgpu_attention", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("devices", help="list the adapters wgpu finds, best first")
    v = sub.add_parser("verify", help="check the kernels on this device against the float64 reference")
    v.add_argument("--cases", type=int, default=8, help="random cases besides the standard ones (default 8)")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--half", action="store_true", help="store operands as float16")
    b = sub.add_parser("bench", help="our call beside PyTorch's CPU SDPA, and the binding's overhead")
    b.add_argument(
        "--shapes",
        default=";".join(",".join(map(str, s)) for s in DEFAULT_SHAPES),
        help="B,H,n,d shapes separated by ';' (default %(default)s)",
    )
    b.add_argument("--repeats", type=int, default=10, help="calls per median (default 10)")
    b.add_argument("--causal", action="store_true")
    b.add_argument("--no-backward", action="store_true", help="forward only")
    for s in (v, b):
        s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    a = p.parse_args(argv)
    if a.cmd == "devices":
        for d in wa.devices():
            print(
                f"{d['name']} ({d['backend']}, {d['device_type']}, driver {d['driver']} {d['driver_info']}); f16: {d['f16']}"
            )
        return 0
    if a.cmd == "verify":
        r = wa.verify(cases=a.cases, seed=a.seed, half=a.half)
        if a.json:
            print(json.dumps(r, indent=1))
        else:
            print(f"adapter: {r['adapter']}")
            for c in r["kernels"] + r["python"]:
                status = "pass" if c["passed"] else ("error: " + c["error"] if c.get("error") else "FAIL")
                err = c.get("context_rel")
                print(f"{c['case']:<60} {'' if err is None else f'{err:.2e}':>9}  {status}")
            print("all passed" if r["passed"] else "FAILED")
        return 0 if r["passed"] else 1
    shapes = [tuple(int(x) for x in s.split(",")) for s in a.shapes.split(";") if s.strip()]
    if any(len(s) != 4 for s in shapes):
        p.error("--shapes wants B,H,n,d groups separated by ';'")
    r = wa.bench(shapes=shapes, repeats=a.repeats, causal=a.causal, backward=not a.no_backward)
    print(json.dumps(r, indent=1) if a.json else format_bench(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
