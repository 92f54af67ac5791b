"""`presets.relative_bias`, T5's relative position bias, against an explicit float64 torch
computation whose buckets are Hugging Face's (`T5Attention._relative_position_bucket`):
the forward both ways (T5's encoder, bidirectional; its decoder, unidirectional and
causal), the gradients of Q, K, V and the table against torch's autograd of it, a table that
alone requires grad, NumPy inputs, and the argument checks."""

import numpy as np
import pytest

import wgpu_attention as wa
from wgpu_attention import presets

torch = pytest.importorskip("torch")


def rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def explicit(q, k, v, table, *, max_distance, bidirectional, causal, cap=None):
    """Attention with T5's bias added to the scaled scores (then the soft-cap `cap`), in the
    operands' dtype, with transformers' own bucketing."""
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    h, L, S = q.shape[-3], q.shape[-2], k.shape[-2]
    k = k.repeat_interleave(h // k.shape[-3], dim=-3)
    v = v.repeat_interleave(h // v.shape[-3], dim=-3)
    s = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    i = torch.arange(L)[:, None]
    j = torch.arange(S)[None, :]
    bucket = t5.T5Attention._relative_position_bucket(
        j - i, bidirectional=bidirectional, num_buckets=table.shape[0], max_distance=max_distance
    )
    s = s + table[bucket].permute(2, 0, 1)  # (L, S, H) -> (H, L, S)
    if cap is not None:
        s = cap * torch.tanh(s / cap)
    if causal:
        s = s.masked_fill(j > i, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


# (query heads, K/V heads, L, S): L != S, odd lengths, and grouped-query attention.
SHAPES = [(4, 4, 12, 17), (4, 2, 19, 26)]
# (buckets, max_distance): T5's, and few buckets with distances past max_distance.
BUCKETS = [(32, 128), (8, 6)]
# T5's encoder (bidirectional, not causal) and decoder (unidirectional, causal).
MODES = [(True, False), (False, True)]


def operands(seed, hq, hkv, L, S, buckets):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, hq, L, 8, generator=g)
    k = torch.randn(2, hkv, S, 8, generator=g)
    v = torch.randn(2, hkv, S, 8, generator=g)
    table = torch.randn(buckets, hq, generator=g)
    d_o = torch.randn(2, hq, L, 8, generator=g)
    return q, k, v, table, d_o


@pytest.mark.parametrize("bidirectional,causal", MODES)
@pytest.mark.parametrize("buckets,max_distance", BUCKETS)
@pytest.mark.parametrize("hq,hkv,L,S", SHAPES)
def test_forward_is_t5s(hq, hkv, L, S, buckets, max_distance, bidirectional, causal):
    q, k, v, table, _ = operands(1, hq, hkv, L, S, buckets)
    bias = presets.relative_bias(table, max_distance=max_distance, bidirectional=bidirectional)
    got = wa.flex_attention(q, k, v, bias, is_causal=causal, enable_gqa=True)
    want = explicit(
        *(t.double() for t in (q, k, v, table)), max_distance=max_distance, bidirectional=bidirectional, causal=causal
    )
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert rel(got.numpy(), want.numpy()) < 1e-5
    # The other direction's buckets give another answer: the test can tell them apart.
    other = explicit(
        *(t.double() for t in (q, k, v, table)),
        max_distance=max_distance,
        bidirectional=not bidirectional,
        causal=causal,
    )
    assert rel(got.numpy(), other.numpy()) > 1e-3


@pytest.mark.parametrize("bidirectional,causal", MODES)
@pytest.mark.parametrize("hq,hkv,L,S", SHAPES)
def test_gradients_of_q_k_v_and_the_table(hq, hkv, L, S, bidirectional, causal):
    for (buckets, max_distance), cap in zip(BUCKETS, (None, 2.0)):
        q, k, v, table, d_o = operands(2, hq, hkv, L, S, buckets)
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v, table)]
        score_mod = [presets.relative_bias(leaves[3], max_distance, bidirectional)]
        if cap is not None:
            score_mod.append(presets.softcap(cap))
        out = wa.flex_attention(*leaves[:3], score_mod, is_causal=causal, enable_gqa=True)
        got = torch.autograd.grad(out, leaves, d_o)
        ref = [t.double().requires_grad_(True) for t in (q, k, v, table)]
        want_out = explicit(*ref, max_distance=max_distance, bidirectional=bidirectional, causal=causal, cap=cap)
        want = torch.autograd.grad(want_out, ref, d_o.double())
        assert rel(out.detach().numpy(), want_out.detach().numpy()) < 1e-5
        for name, a, b in zip(("q", "k", "v", "table"), got, want):
            assert a.dtype == torch.float32 and a.shape == b.shape, name
            assert rel(a.numpy(), b.numpy()) < 1e-4, (buckets, cap, name)


def test_a_table_alone_that_requires_grad_gets_its_gradient():
    q, k, v, table, d_o = operands(3, 4, 2, 12, 17, 32)
    # float64: the gradient comes back in the table's dtype.
    t = table.double().requires_grad_(True)
    out = wa.flex_attention(q, k, v, presets.relative_bias(t, 20, False), is_causal=True, enable_gqa=True)
    assert out.requires_grad
    (out * d_o).sum().backward()
    assert t.grad is not None and t.grad.dtype == torch.float64 and t.grad.shape == (32, 4)
    ref = table.double().requires_grad_(True)
    want = explicit(q.double(), k.double(), v.double(), ref, max_distance=20, bidirectional=False, causal=True)
    (want * d_o.double()).sum().backward()
    assert rel(t.grad.numpy(), ref.grad.numpy()) < 1e-4
    # Without grad mode nothing is recorded.
    with torch.no_grad():
        assert not wa.flex_attention(q, k, v, presets.relative_bias(t, 20, False), enable_gqa=True).requires_grad


def test_a_table_being_trained_is_read_at_each_call():
    q, k, v, table, _ = operands(4, 4, 4, 12, 17, 32)
    t = table.clone().requires_grad_(True)
    bias = presets.relative_bias(t)
    before = wa.flex_attention(q, k, v, bias).detach()
    with torch.no_grad():
        t.mul_(3.0)
    after = wa.flex_attention(q, k, v, bias).detach()
    want = explicit(q, k, v, table * 3.0, max_distance=128, bidirectional=True, causal=False)
    assert rel(after.numpy(), want.numpy()) < 1e-5 and rel(after.numpy(), before.numpy()) > 1e-3


def test_numpy_inputs():
    q, k, v, table, _ = operands(5, 4, 2, 12, 17, 32)
    qn, kn, vn, tn = (t.numpy() for t in (q, k, v, table))
    want = explicit(*(t.double() for t in (q, k, v, table)), max_distance=128, bidirectional=True, causal=False)
    got = wa.flex_attention(qn, kn, vn, presets.relative_bias(tn), enable_gqa=True)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    assert rel(got, want.numpy()) < 1e-5
    # A float64 NumPy table, and a NumPy table with torch operands.
    assert rel(wa.flex_attention(qn, kn, vn, presets.relative_bias(tn.astype(np.float64)), enable_gqa=True), got) < 1e-7
    assert rel(wa.flex_attention(q, k, v, presets.relative_bias(tn), enable_gqa=True).numpy(), got) < 1e-7
    # A table that requires grad needs tensors to give its gradient to.
    with pytest.raises(TypeError, match="requires grad but query, key and value are NumPy"):
        wa.flex_attention(qn, kn, vn, presets.relative_bias(table.requires_grad_(True)), enable_gqa=True)


def test_argument_checks():
    q = np.random.rand(1, 4, 5, 8).astype(np.float32)
    with pytest.raises(ValueError, match=r"must be 2-D \(buckets, heads\), got shape \(32,\)"):
        presets.relative_bias(np.zeros(32))
    with pytest.raises(ValueError, match=r"at least 2 buckets and 1 head, got \(buckets, heads\) = \(1, 4\)"):
        presets.relative_bias(np.zeros((1, 4)))
    with pytest.raises(ValueError, match="at least 2 buckets and 1 head"):
        presets.relative_bias(np.zeros((32, 0)))
    with pytest.raises(ValueError, match="finite"):
        presets.relative_bias(np.full((32, 4), np.nan))
    with pytest.raises(ValueError, match="must hold numbers"):
        presets.relative_bias(np.array([["a", "b"], ["c", "d"]]))
    with pytest.raises(ValueError, match=r"max_distance 8 must exceed the exact buckets' reach \(8: buckets / 4\)"):
        presets.relative_bias(np.zeros((32, 4)), max_distance=8)
    with pytest.raises(ValueError, match=r"\(16: buckets / 2\)"):
        presets.relative_bias(np.zeros((32, 4)), max_distance=16, bidirectional=False)
    with pytest.raises(ValueError, match="non-negative"):
        presets.relative_bias(np.zeros((32, 4)), max_distance=-1)
    with pytest.raises(ValueError, match="table has 3 heads, .* the query has 4 heads"):
        wa.flex_attention(q, q, q, presets.relative_bias(np.zeros((32, 3))))
    with pytest.raises(ValueError, match="fixed order"):
        wa.flex_attention(q, q, q, [presets.softcap(2.0), presets.relative_bias(np.zeros((32, 4)))])
    with pytest.raises(ValueError, match="two of one kind"):
        wa.flex_attention(q, q, q, [presets.relative_bias(np.zeros((32, 4)))] * 2)
    with pytest.raises(TypeError, match="score modifier: pass it as score_mod"):
        wa.flex_attention(q, q, q, mask_mod=presets.relative_bias(np.zeros((32, 4))))
    # ALiBi before the relative bias is the crate's order.
    wa.flex_attention(q, q, q, [presets.alibi(4), presets.relative_bias(np.zeros((32, 4)))])
    # The other presets' values take no gradient.
    with pytest.raises(NotImplementedError, match="only a relative bias table's"):
        presets.alibi(torch.ones(4, requires_grad=True))
