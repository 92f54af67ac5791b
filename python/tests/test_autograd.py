"""Gradients through the crate's fused backward against PyTorch's autograd of its own SDPA."""

import pytest

import wgpu_attention as wa

torch = pytest.importorskip("torch")
F = torch.nn.functional


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


CASES = [
    ((2, 3, 7, 8), (2, 3, 7, 8), (2, 3, 7, 8), {}, None),
    ((2, 3, 7, 8), (2, 3, 13, 8), (2, 3, 13, 5), {"is_causal": True}, None),
    ((1, 4, 9, 16), (1, 2, 9, 16), (1, 2, 9, 16), {"enable_gqa": True}, None),
    ((2, 2, 6, 8), (2, 2, 10, 8), (2, 2, 10, 8), {"scale": 0.7}, "bool"),
    ((2, 2, 6, 8), (2, 2, 10, 8), (2, 2, 10, 8), {}, "float"),
    ((5, 16), (37, 16), (37, 16), {}, None),
]


@pytest.mark.parametrize("qs,ks,vs,kw,mask", CASES)
def test_gradients_match_torch_autograd(qs, ks, vs, kw, mask):
    g = torch.Generator().manual_seed(len(qs) * 100 + qs[-2])
    q = torch.randn(*qs, generator=g, requires_grad=True)
    k = torch.randn(*ks, generator=g, requires_grad=True)
    v = torch.randn(*vs, generator=g, requires_grad=True)
    m = None
    if mask == "bool":
        m = torch.rand(qs[-2], ks[-2], generator=g) > 0.3
        m[:, 0] = True
    elif mask == "float":
        m = torch.randn(ks[0], 1, qs[-2], ks[-2], generator=g)
    w = torch.randn(*qs[:-1], vs[-1], generator=g)

    out = wa.scaled_dot_product_attention(q, k, v, attn_mask=m, **kw)
    (out * w).sum().backward()
    got = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    want = F.scaled_dot_product_attention(
        qd, kd, vd, attn_mask=None if m is None else (m if m.dtype == torch.bool else m.double()), **kw
    )
    (want * w.double()).sum().backward()
    assert rel(out.detach(), want.detach()) < 1e-5
    for a, b in zip(got, (qd.grad, kd.grad, vd.grad)):
        assert a.shape == b.shape and a.dtype == torch.float32
        assert rel(a, b) < 1e-4


def test_gradcheck_style_finite_differences():
    """Our backward against central differences of our own forward (float64 in, computed in
    float32 on the device: a loose tolerance, but it fails on a wrong gradient)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 4, 4, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 1, 5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b, c: wa.scaled_dot_product_attention(a, b, c, is_causal=True),
        (q, k, v),
        eps=1e-2,
        atol=2e-3,
        rtol=2e-2,
    )


def test_no_grad_and_detached_inputs_skip_the_save():
    q = torch.randn(1, 2, 5, 8, requires_grad=True)
    with torch.no_grad():
        out = wa.scaled_dot_product_attention(q, q, q)
    assert not out.requires_grad
    out = wa.scaled_dot_product_attention(q, q, q)
    assert out.requires_grad and out.grad_fn is not None


def test_float16_gradients():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g).half().requires_grad_() for _ in range(3))
    out = wa.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.float().sum().backward()
    assert q.grad.dtype == torch.float16
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    F.scaled_dot_product_attention(qd, kd, vd, is_causal=True).sum().backward()
    assert rel(q.grad, qd.grad) < 1e-2 and rel(v.grad, vd.grad) < 1e-2


def test_weights_under_autograd_come_back_not_differentiable():
    # A saved forward returns no weights: they come from a second forward (once they were
    # dropped, and the call returned the output alone).
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 2, 6, 8, generator=g, requires_grad=True)
    k, v = (torch.randn(2, 2, 9, 8, generator=g, requires_grad=True) for _ in range(2))
    result = wa.scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=True)
    assert isinstance(result, tuple) and len(result) == 2
    out, w = result
    assert out.requires_grad and not w.requires_grad and w.shape == (2, 2, 6, 9)
    qd, kd = q.detach().double(), k.detach().double()
    s = (qd @ kd.transpose(-2, -1)) / 8**0.5
    s = s.masked_fill(torch.ones(6, 9, dtype=torch.bool).triu(1), float("-inf"))
    assert rel(w, torch.softmax(s, -1)) < 1e-5
    out.sum().backward()
    want = [t.detach().double().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*want, is_causal=True).sum().backward()
    for a, b in zip((q, k, v), want):
        assert rel(a.grad, b.grad) < 1e-4
