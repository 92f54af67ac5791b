"""`flex_attention` and the presets: PyTorch's FlexAttention golden cases (tests/data/flex,
written by tests/python/make_flex_cases.py) on NumPy arrays and torch tensors, a caller's
WGSL equal to the preset it implements, gradients through the presets and through a WGSL
`score_mod` with its `score_mod_grad` against a float64 torch eager implementation, the
argument checks, the refusal of gradients through a `score_mod` without its derivative, and
the weights (`return_weights=True`) of every preset against their float64 definition."""

import json
import os

import numpy as np
import pytest

import wgpu_attention as wa
from wgpu_attention import presets

CASES = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "flex")


def rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def cases():
    return sorted(d for d in os.listdir(CASES) if os.path.exists(os.path.join(CASES, d, "meta.json")))


def load(name):
    d = os.path.join(CASES, name)
    with open(os.path.join(d, "meta.json")) as f:
        meta = json.load(f)
    arrays = {n[:-4]: np.load(os.path.join(d, n)) for n in os.listdir(d) if n.endswith(".npy")}
    return meta, arrays


def preset_of(meta, arrays):
    """The case's preset as `flex_attention` takes it: `(score_mod, mask_mod)`."""
    kind = meta["preset"]
    if kind == "window":
        return None, presets.sliding_window(meta["left"], meta["right"])
    if kind == "softcap":
        return presets.softcap(meta["cap"]), None
    if kind == "alibi":
        return presets.alibi(arrays["slopes"]), None
    if kind == "documents":
        return None, presets.document_mask(arrays["ids"])
    if kind == "prefix_lm":
        return None, presets.prefix_lm(meta["length"])
    if kind == "relative_bias":
        table = presets.relative_bias(arrays["table"], meta["max_distance"], meta["bidirectional"])
        return table, None
    raise ValueError(kind)


def test_the_golden_cases_are_there():
    assert len(cases()) >= 16


@pytest.mark.parametrize("name", cases())
def test_flex_attention_matches_pytorchs_flex_attention(name):
    meta, a = load(name)
    score_mod, mask_mod = preset_of(meta, a)
    q, k, v = a["q"], a["k"], a["v"]
    out = wa.flex_attention(
        q, k, v, score_mod, mask_mod, is_causal=meta["causal"], scale=meta["scale"], enable_gqa=q.shape[1] != k.shape[1]
    )
    assert out.dtype == np.float32 and out.shape == a["context"].shape
    assert rel(out, a["context"]) < 1e-5


@pytest.mark.parametrize("name", [c for c in cases() if c.startswith("relative_bias")])
def test_t5s_golden_gradients_reach_its_table(name):
    # PyTorch's autograd of T5's bias in float64 (tests/python/make_flex_cases.py): the
    # gradients of Q, K, V and of the (buckets, heads) table itself.
    torch = pytest.importorskip("torch")
    meta, a = load(name)
    q, k, v = (torch.from_numpy(a[n]).requires_grad_(True) for n in "qkv")
    table = torch.from_numpy(a["table"]).requires_grad_(True)
    bias = presets.relative_bias(table, meta["max_distance"], meta["bidirectional"])
    out = wa.flex_attention(
        q, k, v, bias, is_causal=meta["causal"], scale=meta["scale"], enable_gqa=q.shape[1] != k.shape[1]
    )
    out.backward(torch.from_numpy(a["d_o"]))
    assert rel(out.detach(), a["context"]) < 1e-5
    for got, want in [(q.grad, "grad_q"), (k.grad, "grad_k"), (v.grad, "grad_v"), (table.grad, "grad_table")]:
        assert got is not None and got.shape == a[want].shape
        assert rel(got, a[want]) < 1e-4, want


def test_the_standard_alibi_slopes_are_pytorch_sides():
    for name in cases():
        meta, a = load(name)
        if meta["preset"] == "alibi":
            np.testing.assert_array_equal(presets.alibi_slopes(a["q"].shape[1]), a["slopes"])
            assert presets.alibi(a["q"].shape[1]).slopes.tolist() == a["slopes"].tolist()


def test_torch_tensors_in_and_out():
    torch = pytest.importorskip("torch")
    meta, a = load("documents_causal")
    q, k, v = (torch.from_numpy(a[n]) for n in "qkv")
    ids = torch.from_numpy(a["ids"])
    out = wa.flex_attention(q, k, v, mask_mod=presets.document_mask(ids), is_causal=True)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    assert rel(out.numpy(), a["context"]) < 1e-5
    out64 = wa.flex_attention(q.double(), k.double(), v.double(), mask_mod=presets.document_mask(ids), is_causal=True)
    assert out64.dtype == torch.float64 and rel(out64.numpy(), a["context"]) < 1e-5


def test_batch_axes_and_broadcast_document_ids():
    meta, a = load("documents")
    q, k, v = a["q"], a["k"], a["v"]
    want = a["context"]
    # Two batch axes (1, 2): the ids broadcast over the first.
    out = wa.flex_attention(q[None], k[None], v[None], mask_mod=presets.document_mask(a["ids"][None]))
    assert rel(out[0], want) < 1e-5
    # One id row for every batch entry: batch 0's ids for both.
    out = wa.flex_attention(q, k, v, mask_mod=presets.document_mask(a["ids"][0]))
    assert rel(out[0], want[0]) < 1e-5


ALIBI_WGSL = """
fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {
    return score + slope[h] * (f32(kv) - f32(q));
}
"""

WINDOW_WGSL = """
fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool {
    return kv + 3u >= q && kv <= q + 2u;
}
"""


def test_a_callers_wgsl_equals_the_presets():
    _, a = load("alibi_causal")
    q, k, v = a["q"], a["k"], a["v"]
    own = wa.flex_attention(
        q, k, v, ALIBI_WGSL, WINDOW_WGSL, is_causal=True, buffers={"slope": a["slopes"].astype(np.float64)}
    )
    preset = wa.flex_attention(q, k, v, presets.alibi(a["slopes"]), presets.sliding_window(3, 2), is_causal=True)
    assert rel(own, preset) < 1e-6
    # WGSL and presets together: the caller's score_mod first, then the presets.
    both = wa.flex_attention(
        q, k, v, [ALIBI_WGSL, presets.softcap(2.0)], [WINDOW_WGSL, presets.prefix_lm(4)], buffers={"slope": a["slopes"]}
    )
    assert np.isfinite(both).all()


def test_integer_buffers_reach_the_wgsl():
    _, a = load("documents")
    q, k, v = a["q"], a["k"], a["v"]
    wgsl = """
    fn mask_mod(b: u32, h: u32, q: u32, kv: u32) -> bool {
        return doc[b * 17u + q] == doc[b * 17u + kv];
    }
    """
    out = wa.flex_attention(q, k, v, mask_mod=wgsl, buffers={"doc": a["ids"].astype(np.int64)})
    assert rel(out, a["context"]) < 1e-5


def test_without_modifiers_it_is_sdpa():
    _, a = load("window")
    q, k, v = a["q"], a["k"], a["v"]
    np.testing.assert_array_equal(
        wa.flex_attention(q, k, v, is_causal=True), wa.scaled_dot_product_attention(q, k, v, is_causal=True)
    )


def test_with_a_mask_and_modifiers():
    _, a = load("softcap")
    q, k, v = a["q"], a["k"], a["v"]
    keep = np.ones((12, 17), dtype=bool)
    keep[:, 15:] = False
    got = wa.flex_attention(q, k[:, :, :15], v[:, :, :15], presets.softcap(1.5))
    # The same keys, masked out instead of cut off.
    assert rel(wa.flex_attention(q, k, v, presets.softcap(1.5), attn_mask=keep), got) < 1e-6


def test_a_wgsl_mistake_is_a_located_value_error():
    q = np.random.rand(1, 2, 5, 4).astype(np.float32)
    bad = "fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {\n    return score +;\n}\n"
    with pytest.raises(ValueError, match=r"score_mod:2:"):
        wa.flex_attention(q, q, q, bad)
    wrong = "fn mask_mod(b: u32, h: u32, q: u32) -> bool { return true; }"
    with pytest.raises(ValueError, match="fn mask_mod"):
        wa.flex_attention(q, q, q, mask_mod=wrong)


def test_argument_checks():
    q = np.random.rand(1, 2, 5, 4).astype(np.float32)
    with pytest.raises(TypeError, match="mask modifier: pass it as mask_mod"):
        wa.flex_attention(q, q, q, presets.sliding_window(2))
    with pytest.raises(TypeError, match="score modifier: pass it as score_mod"):
        wa.flex_attention(q, q, q, mask_mod=presets.softcap(2.0))
    with pytest.raises(ValueError, match="fixed order"):
        wa.flex_attention(q, q, q, [presets.softcap(2.0), presets.alibi(2)])
    with pytest.raises(ValueError, match="two of one kind"):
        wa.flex_attention(q, q, q, mask_mod=[presets.prefix_lm(1), presets.prefix_lm(2)])
    with pytest.raises(ValueError, match="3 slopes; the query has 2 heads"):
        wa.flex_attention(q, q, q, presets.alibi(3))
    with pytest.raises(ValueError, match="document ids have 4 positions"):
        wa.flex_attention(q, q, q, mask_mod=presets.document_mask([0, 0, 1, 1]))
    with pytest.raises(ValueError, match="do not broadcast"):
        wa.flex_attention(q, q, q, mask_mod=presets.document_mask(np.zeros((3, 5), dtype=int)))
    with pytest.raises(ValueError, match="non-negative"):
        presets.sliding_window(-1)
    with pytest.raises(ValueError, match="positive"):
        presets.softcap(0.0)
    with pytest.raises(ValueError, match="integers"):
        presets.document_mask([0.5, 1.0])
    with pytest.raises(ValueError, match="buffers were given without"):
        wa.flex_attention(q, q, q, buffers={"x": np.zeros(2)})
    with pytest.raises(ValueError, match="must hold floats"):
        wa.flex_attention(q, q, q, ALIBI_WGSL, buffers={"slope": np.array(["a", "b"])})


def eager(q, k, v, *, slopes=None, cap=None, window=None, ids=None, prefix=None, causal=False, scale=None):
    """The modifiers' definition in torch, eagerly (float64 when given float64): ALiBi, then
    the soft-cap, on the scaled scores; causal, the window, documents and the prefix and-ed."""
    import torch

    h, L, S = q.shape[1], q.shape[2], k.shape[2]
    k = k.repeat_interleave(h // k.shape[1], dim=1)
    v = v.repeat_interleave(h // v.shape[1], dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = (q @ k.transpose(-2, -1)) * scale
    i = torch.arange(L)[:, None]
    j = torch.arange(S)[None, :]
    if slopes is not None:
        s = s + torch.as_tensor(slopes, dtype=s.dtype)[None, :, None, None] * (j - i)
    if cap is not None:
        s = cap * torch.tanh(s / cap)
    keep = torch.ones(L, S, dtype=torch.bool)[None, None]
    if causal:
        keep = keep & (j <= i)
    if window is not None:
        keep = keep & (j >= i - window[0]) & (j <= i + window[1])
    if ids is not None:
        t = torch.as_tensor(ids)
        keep = keep & (t[:, None, :L, None] == t[:, None, None, :S])
    if prefix is not None:
        keep = keep & ((j < prefix) | (j <= i))
    return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v


def grads_of(fn, leaves, d_o):
    """`fn(*leaves)` and autograd's gradients of `Σ d_o ∘ fn(*leaves)`."""
    import torch

    out = fn(*leaves)
    return out, torch.autograd.grad(out, leaves, d_o)


def test_gradients_flow_through_the_presets():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(5)
    # GQA (4 query heads on 2 K/V heads) and L != S.
    q, k, v = (torch.randn(2, h, n, 8, generator=g) for h, n in ((4, 19), (2, 26), (2, 26)))
    d_o = torch.randn(2, 4, 19, 8, generator=g)
    slopes = presets.alibi_slopes(4)
    ids = np.array([[0] * 9 + [1] * 17, [0] * 4 + [1] * 12 + [2] * 10], dtype=np.int32)
    cases = [
        (
            [presets.alibi(slopes), presets.softcap(1.5)],
            presets.sliding_window(6, 2),
            dict(slopes=slopes, cap=1.5, window=(6, 2)),
        ),
        (None, [presets.document_mask(ids), presets.prefix_lm(5)], dict(ids=ids, prefix=5)),
    ]
    for score_mod, mask_mod, definition in cases:
        for causal in (False, True):
            leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
            out, got = grads_of(
                lambda q, k, v: wa.flex_attention(q, k, v, score_mod, mask_mod, is_causal=causal, enable_gqa=True),
                leaves,
                d_o,
            )
            want_out, want = grads_of(
                lambda q, k, v: eager(q, k, v, causal=causal, **definition),
                [t.double().requires_grad_(True) for t in (q, k, v)],
                d_o.double(),
            )
            assert out.requires_grad and rel(out.detach().numpy(), want_out.detach().numpy()) < 1e-5
            for name, a, b in zip("qkv", got, want):
                assert a.dtype == torch.float32 and a.shape == b.shape
                assert rel(a.numpy(), b.numpy()) < 1e-4, (definition, causal, name)


SOFTCAP_WGSL = """
fn score_mod(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {
    return cap[0] * tanh(score / cap[0]);
}
"""

SOFTCAP_GRAD_WGSL = """
fn score_mod_grad(score: f32, b: u32, h: u32, q: u32, kv: u32) -> f32 {
    let t = tanh(score / cap[0]);
    return 1.0 - t * t;
}
"""


def test_gradients_flow_through_a_wgsl_score_mod_with_its_derivative():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g) * 2 for n in (13, 21, 21))
    d_o = torch.randn(1, 2, 13, 8, generator=g)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    _, got = grads_of(
        lambda q, k, v: wa.flex_attention(
            q, k, v, SOFTCAP_WGSL, WINDOW_WGSL, buffers={"cap": np.array([1.5])}, score_mod_grad=SOFTCAP_GRAD_WGSL
        ),
        leaves,
        d_o,
    )
    _, want = grads_of(
        lambda q, k, v: eager(q, k, v, cap=1.5, window=(3, 2)),
        [t.double().requires_grad_(True) for t in (q, k, v)],
        d_o.double(),
    )
    for a, b in zip(got, want):
        assert rel(a.numpy(), b.numpy()) < 1e-4
    # Without the derivative, gradients are refused; the forward alone runs.
    with pytest.raises(NotImplementedError, match="score_mod_grad"):
        wa.flex_attention(*leaves, SOFTCAP_WGSL, buffers={"cap": np.array([1.5])})
    with torch.no_grad():
        out = wa.flex_attention(*leaves, SOFTCAP_WGSL, buffers={"cap": np.array([1.5])})
    assert not out.requires_grad
    with pytest.raises(NotImplementedError, match="preset's values"):
        presets.alibi(torch.ones(2, requires_grad=True))


def test_the_native_calls_modifier_keywords():
    from wgpu_attention._loader import native

    q = np.random.rand(1, 2, 5, 4).astype(np.float32)
    with pytest.raises(TypeError, match='unexpected keyword argument "windw"'):
        native.sdpa(q, q, q, windw=(1, 1))
    with pytest.raises(TypeError, match="window must be"):
        native.sdpa(q, q, q, window=(1,))
    with pytest.raises(ValueError, match="document_ids must be 2-D"):
        native.sdpa(q, q, q, document_ids=np.zeros(5, dtype=np.int32))
    np.testing.assert_array_equal(native.sdpa(q, q, q, window=None)[0], native.sdpa(q, q, q)[0])
    # The weights apply them too (here soft-capped scores), and so does the saved forward.
    weights = native.sdpa(q, q, q, return_weights=True, softcap=2.0)[1]
    s = (q.astype(np.float64) @ q.astype(np.float64).transpose(0, 1, 3, 2)) / 2.0
    s = 2.0 * np.tanh(s / 2.0)
    want = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(weights, want / want.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    _, _, saved = native.sdpa(q, q, q, save=True, window=(1, 1))
    assert saved.backward(np.ones_like(q))[0].shape == q.shape


def t5_bucket(d, buckets, max_distance, bidirectional):
    """T5's bucket of the distance `d = kv − q` (transformers'
    `T5Attention._relative_position_bucket`, its log in float32 as there), in NumPy."""
    ret = np.zeros_like(d)
    n = buckets
    if bidirectional:
        n //= 2
        ret = ret + (d > 0) * n
        d = np.abs(d)
    else:
        d = -np.minimum(d, 0)
    exact = n // 2
    # (the small distances take the exact branch; 1 keeps the log of 0 out of the others)
    log = np.log(np.maximum(d, 1).astype(np.float32) / np.float32(exact)) / np.float32(np.log(max_distance / exact))
    large = exact + (log * np.float32(n - exact)).astype(np.int64)
    large = np.minimum(large, n - 1)
    return ret + np.where(d < exact, d, large)


def weights64(q, k, *, causal, scale=None, slopes=None, table=None, cap=None, window=None, ids=None, prefix=None):
    """The attention weights by their definition, in float64 NumPy: the scaled scores, then
    ALiBi, T5's bias (`table`: `(table, max_distance, bidirectional)`) and the soft-cap, then
    the softmax over the keys kept (causal, the window, the documents and the prefix and-ed);
    a masked entry is 0. Also returns the mask kept, `(B or 1, H or 1, L, S)`."""
    q, k = q.astype(np.float64), k.astype(np.float64)
    h, L, S = q.shape[1], q.shape[2], k.shape[2]
    k = np.repeat(k, h // k.shape[1], axis=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = q @ k.transpose(0, 1, 3, 2) * scale
    i, j = np.arange(L)[:, None], np.arange(S)[None, :]
    if slopes is not None:
        s = s + np.asarray(slopes, dtype=np.float64)[None, :, None, None] * (j - i)
    if table is not None:
        t, max_distance, bidirectional = table
        bucket = t5_bucket(j - i, t.shape[0], max_distance, bidirectional)
        s = s + t.astype(np.float64)[bucket].transpose(2, 0, 1)[None]
    if cap is not None:
        s = cap * np.tanh(s / cap)
    keep = np.ones((1, 1, L, S), dtype=bool)
    if causal:
        keep = keep & (j <= i)
    if window is not None:
        keep = keep & (j >= i - window[0]) & (j <= i + window[1])
    if ids is not None:
        keep = keep & (ids[:, None, :L, None] == ids[:, None, None, :S])
    if prefix is not None:
        keep = keep & ((j < prefix) | (j <= i))
    s = np.where(keep, s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return w / w.sum(-1, keepdims=True), keep


def weight_cases():
    """`(name, score_mod, mask_mod, definition)`: each preset alone and two together, for a
    query of 4 heads on 2 K/V heads, L = 12, S = 17."""
    rng = np.random.default_rng(24)
    slopes = presets.alibi_slopes(4)
    table = (rng.standard_normal((8, 4)) * 0.5).astype(np.float32)
    ids = np.array([[0] * 5 + [1] * 7 + [2] * 5, [0] * 2 + [1] * 9 + [2] * 6], dtype=np.int32)
    return [
        ("window", None, presets.sliding_window(3, 2), dict(window=(3, 2))),
        ("softcap", presets.softcap(0.7), None, dict(cap=0.7)),
        ("alibi", presets.alibi(slopes), None, dict(slopes=slopes)),
        ("documents", None, presets.document_mask(ids), dict(ids=ids)),
        ("prefix_lm", None, presets.prefix_lm(5), dict(prefix=5)),
        ("relative_bias", presets.relative_bias(table, 20, True), None, dict(table=(table, 20, True))),
        ("relative_bias_unidirectional", presets.relative_bias(table, 20, False), None, dict(table=(table, 20, False))),
        (
            "alibi_softcap_window_documents",
            [presets.alibi(slopes), presets.softcap(0.7)],
            [presets.sliding_window(4, 1), presets.document_mask(ids)],
            dict(slopes=slopes, cap=0.7, window=(4, 1), ids=ids),
        ),
    ]


def qkv(seed, L=12, S=17):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(s) * 1.5).astype(np.float32) for s in ((2, 4, L, 8), (2, 2, S, 8), (2, 2, S, 8))]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", weight_cases(), ids=lambda c: c[0])
def test_flex_attention_returns_the_weights_of_its_modifiers(case, causal):
    _, score_mod, mask_mod, definition = case
    q, k, v = qkv(7)
    out, w = wa.flex_attention(
        q, k, v, score_mod, mask_mod, is_causal=causal, scale=0.4, enable_gqa=True, return_weights=True
    )
    want, keep = weights64(q, k, causal=causal, scale=0.4, **definition)
    assert w.dtype == np.float32 and w.shape == (2, 4, 12, 17)
    assert rel(w, want) < 1e-5
    # Masked entries are exactly 0, and the output is made of these weights.
    keep = np.broadcast_to(keep, w.shape)
    assert keep.all() == (mask_mod is None and not causal)
    assert (w[~keep] == 0).all()
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)
    v64 = np.repeat(v.astype(np.float64), 2, axis=1)
    assert rel(out, w.astype(np.float64) @ v64) < 1e-5
    # The output is the one without the weights.
    alone = wa.flex_attention(q, k, v, score_mod, mask_mod, is_causal=causal, scale=0.4, enable_gqa=True)
    assert rel(out, alone) < 1e-6


def test_flex_weights_with_torch_tensors_and_autograd():
    torch = pytest.importorskip("torch")
    q, k, v = (torch.from_numpy(a) for a in qkv(8))
    score_mod, mask_mod = [presets.alibi(4), presets.softcap(0.7)], presets.sliding_window(4, 1)
    definition = dict(slopes=presets.alibi_slopes(4), cap=0.7, window=(4, 1))
    want, _ = weights64(q.numpy(), k.numpy(), causal=True, **definition)
    # float64 tensors in, float64 tensors out.
    out, w = wa.flex_attention(
        q.double(), k.double(), v.double(), score_mod, mask_mod, is_causal=True, enable_gqa=True, return_weights=True
    )
    assert isinstance(w, torch.Tensor) and w.dtype == torch.float64 and out.dtype == torch.float64
    assert rel(w.numpy(), want) < 1e-5
    # Under autograd: the weights come back, not differentiable; the gradients are those
    # without the weights.
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, w = wa.flex_attention(*leaves, score_mod, mask_mod, is_causal=True, enable_gqa=True, return_weights=True)
    assert out.requires_grad and not w.requires_grad
    assert rel(w.numpy(), want) < 1e-5
    d_o = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    got = torch.autograd.grad(out, leaves, d_o)
    plain = [t.clone().requires_grad_(True) for t in (q, k, v)]
    base = wa.flex_attention(*plain, score_mod, mask_mod, is_causal=True, enable_gqa=True)
    assert rel(out.detach().numpy(), base.detach().numpy()) < 1e-6
    for a, b in zip(got, torch.autograd.grad(base, plain, d_o)):
        assert rel(a.numpy(), b.numpy()) < 1e-6
    # A relative bias table that requires grad: still the weights, and the table's gradient.
    table = torch.randn(8, 4, generator=torch.Generator().manual_seed(10), dtype=torch.float64).requires_grad_(True)
    out, w = wa.flex_attention(q, k, v, presets.relative_bias(table, 20), enable_gqa=True, return_weights=True)
    want, _ = weights64(q.numpy(), k.numpy(), causal=False, table=(table.detach().numpy(), 20, True))
    assert not w.requires_grad and w.dtype == torch.float32 and rel(w.numpy(), want) < 1e-5
    out.sum().backward()
    assert table.grad is not None and table.grad.shape == (8, 4)


def test_flex_weights_float16_and_without_modifiers():
    q, k, v = qkv(11)
    out, w = wa.flex_attention(
        *(a.astype(np.float16) for a in (q, k, v)), presets.softcap(0.7), enable_gqa=True, return_weights=True
    )
    assert out.dtype == np.float16 and w.dtype == np.float16
    want, _ = weights64(q.astype(np.float16), k.astype(np.float16), causal=False, cap=0.7)
    assert rel(w, want) < 2e-3
    # Without modifiers it is scaled_dot_product_attention's weights.
    got = wa.flex_attention(q, k, v, is_causal=True, enable_gqa=True, return_weights=True)
    sdpa = wa.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, return_weights=True)
    for a, b in zip(got, sdpa):
        np.testing.assert_array_equal(a, b)
    want, _ = weights64(q, k, causal=True)
    assert rel(got[1], want) < 1e-5
