#!/usr/bin/env python3
"""The committed golden cases through the CLI, for an adapter without a Rust toolchain beside
it (tools/gpu-check on a lent GPU; tests/flex_golden.rs and tests/torch_grad_cases.rs check
the same files through the library on the CI machine).

- tests/data/flex/*: PyTorch FlexAttention's forward (float64) and its gradients, run as
  `sdpa` with the preset's flags and `--grad-output d_o.npy`: context within 1e-5, gradients
  (Q, K, V and T5's table) within 1e-4, relative.
- tests/data/torch_grad/*: PyTorch autograd's gradients of `sdpa` and `run`, with the flags
  and inputs their meta.json gives: every `want_<name>.npy` against `grad_<name>.npy`.

Usage: check_goldens.py BINARY [--kernels auto|storage|subgroup] [--dtype f32]
Prints one line per case and a summary; exits 1 on any failure. Needs NumPy.
"""

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data"


def rel(got, want):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return float("inf")
    # A gradient that is exactly zero in theory (b_K's: softmax ignores a per-row shift)
    # is compared absolutely.
    denom = np.linalg.norm(want)
    return float(np.linalg.norm(got - want) / (denom if denom > 1e-6 else 1.0))


def flex_flags(case, meta):
    preset = meta["preset"]
    if preset == "window":
        return ["--window", f"{meta['left']},{meta['right']}"]
    if preset == "softcap":
        return ["--softcap", str(meta["cap"])]
    if preset == "alibi":
        return ["--alibi", str(case / "slopes.npy")]
    if preset == "documents":
        return ["--document-ids", str(case / "ids.npy")]
    if preset == "prefix_lm":
        return ["--prefix-length", str(meta["length"])]
    if preset == "relative_bias":
        flags = [
            "--relative-bias",
            str(case / "table.npy"),
            "--relative-bias-max-distance",
            str(meta["max_distance"]),
        ]
        if not meta["bidirectional"]:
            flags.append("--relative-bias-unidirectional")
        return flags
    raise ValueError(f"unknown preset {preset}")


def run(binary, args):
    out = subprocess.run([binary, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError((out.stderr or out.stdout).strip().splitlines()[-1])


def check_flex(binary, extra, case, out):
    meta = json.loads((case / "meta.json").read_text())
    args = ["sdpa"]
    for name in "qkv":
        args += [f"--{name}", str(case / f"{name}.npy")]
    if meta["causal"]:
        args.append("--causal")
    if meta.get("scale") is not None:
        args += ["--scale", str(meta["scale"])]
    args += flex_flags(case, meta)
    args += ["--grad-output", str(case / "d_o.npy"), "--out", str(out), *extra]
    run(binary, args)
    errors = {"context": (rel(np.load(out / "context.npy"), np.load(case / "context.npy")), 1e-5)}
    for name in "qkv":
        got = np.load(out / f"grad_{name}.npy")
        errors[f"grad_{name}"] = (rel(got, np.load(case / f"grad_{name}.npy")), 1e-4)
    if (case / "grad_table.npy").exists():
        got = np.load(out / "grad_relative_bias.npy")
        errors["grad_table"] = (rel(got, np.load(case / "grad_table.npy")), 1e-4)
    return errors


def check_grad(binary, extra, case, out):
    meta = json.loads((case / "meta.json").read_text())
    args = [meta["command"], *meta["flags"]]
    for flag, name in meta["inputs"].items():
        args += [flag, str(case / f"{name}.npy")]
    args += ["--grad-output", str(case / "grad_output.npy"), "--out", str(out), *extra]
    run(binary, args)
    errors = {}
    for want in sorted(case.glob("want_*.npy")):
        name = want.stem[len("want_") :]
        errors[f"grad_{name}"] = (rel(np.load(out / f"grad_{name}.npy"), np.load(want)), 1e-4)
    return errors


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("--kernels", default=None)
    parser.add_argument("--dtype", default=None)
    opts = parser.parse_args()
    extra = []
    if opts.kernels:
        extra += ["--kernels", opts.kernels]
    if opts.dtype:
        extra += ["--dtype", opts.dtype]
    failed = 0
    total = 0
    cases = [(c, check_flex) for c in sorted((ROOT / "flex").iterdir())]
    cases += [(c, check_grad) for c in sorted((ROOT / "torch_grad").iterdir())]
    for case, check in cases:
        total += 1
        with tempfile.TemporaryDirectory() as tmp:
            try:
                errors = check(opts.binary, extra, case, pathlib.Path(tmp))
            except Exception as e:  # noqa: BLE001 (one line per case, whatever broke)
                failed += 1
                print(f"{case.parent.name}/{case.name:<28} FAIL: {e}")
                continue
        bad = {k: v for k, (v, bound) in errors.items() if not v <= bound}
        worst = max(v for v, _ in errors.values())
        status = "pass" if not bad else "FAIL " + ", ".join(f"{k} {v:.2e}" for k, v in bad.items())
        failed += bool(bad)
        print(f"{case.parent.name}/{case.name:<28} worst rel {worst:.2e}  {status}")
    print(f"goldens: {total - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
