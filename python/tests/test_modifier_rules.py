"""Every modifier rule the crate checks gives the crate's message from Python too, as from the
CLI and the browser: the cases of tests/data/modifier_rules.json (read by the Rust tests and
web/crate's too) through the native call's keywords and through `presets` and
`flex_attention`. NumPy only."""

import json
import pathlib

import numpy as np
import pytest

import wgpu_attention as wa
from wgpu_attention import presets
from wgpu_attention._loader import native

RULES = json.loads((pathlib.Path(__file__).parents[2] / "tests" / "data" / "modifier_rules.json").read_text())
CASES = [c for c in RULES["cases"] if not c.get("json_only")]


def operands():
    b, h, n_q, n_kv, e = RULES["problem"]
    rng = np.random.default_rng(0)
    q = rng.standard_normal((b, h, n_q, e)).astype(np.float32)
    k = rng.standard_normal((b, h, n_kv, e)).astype(np.float32)
    return q, k, k.copy()


def keywords(preset):
    """One preset of the JSON as the native call's keywords."""
    ((kind, value),) = preset.items()
    if kind == "softcap":
        return {"softcap": value}
    if kind == "alibi":
        return {"alibi_slopes": np.array(value, dtype=np.float32)}
    if kind == "documents":
        return {"document_ids": np.array(value, dtype=np.int32).reshape(len(value), -1)}
    if kind == "relative_bias":
        buckets = value["buckets"]
        table = np.array(value["table"], dtype=np.float32).reshape(buckets, len(value["table"]) // buckets)
        kw = {"relative_bias": table}
        if "max_distance" in value:
            kw["relative_bias_max_distance"] = value["max_distance"]
        if "bidirectional" in value:
            kw["relative_bias_bidirectional"] = value["bidirectional"]
        return kw
    raise AssertionError(f"no keyword for {kind}")


def public(preset):
    """One preset of the JSON as `presets` makes it, and the argument it goes to."""
    ((kind, value),) = preset.items()
    if kind == "softcap":
        return "score_mod", lambda: presets.softcap(value)
    if kind == "alibi":
        return "score_mod", lambda: presets.alibi(np.array(value, dtype=np.float32))
    if kind == "documents":
        return "mask_mod", lambda: presets.document_mask(np.array(value, dtype=np.int32).reshape(len(value), -1))
    if kind == "relative_bias":
        buckets = value["buckets"]
        table = np.array(value["table"], dtype=np.float32).reshape(buckets, len(value["table"]) // buckets)
        return "score_mod", lambda: presets.relative_bias(
            table, value.get("max_distance", 128), value.get("bidirectional", True)
        )
    raise AssertionError(f"no preset for {kind}")


def test_the_cases_are_there():
    assert len(RULES["cases"]) >= 13 and len(CASES) >= 11


@pytest.mark.parametrize("case", CASES, ids=[c["rule"] for c in CASES])
def test_the_native_call_gives_the_crates_message(case):
    q, k, v = operands()
    kw = {}
    for p in case["presets"]:
        kw.update(keywords(p))
    with pytest.raises(ValueError) as e:
        native.sdpa(q, k, v, **kw)
    assert str(e.value) == case["message"]


@pytest.mark.parametrize("case", CASES, ids=[c["rule"] for c in CASES])
def test_presets_and_flex_attention_give_the_crates_message(case):
    q, k, v = operands()
    args = {"score_mod": [], "mask_mod": []}
    with pytest.raises(ValueError) as e:
        for p in case["presets"]:
            role, make = public(p)
            args[role].append(make())
        wa.flex_attention(q, k, v, args["score_mod"] or None, mask_mod=args["mask_mod"] or None)
    assert str(e.value) == case["message"]
