"""`scaled_dot_product_attention` against PyTorch's own, on NumPy and torch, every mask kind
and broadcast, causal, GQA, L != S, scale, float16/32/64; outputs must be written (no
stale memory) and exceptions one line."""

import math

import numpy as np
import pytest

import wgpu_attention as wa

torch = pytest.importorskip("torch")
F = torch.nn.functional


def rel(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def ref(q, k, v, **kw):
    """PyTorch's SDPA in float64 on the CPU (the math backend)."""

    def t(a):
        if a is None:
            return None
        a = torch.from_numpy(np.ascontiguousarray(a))
        return a if a.dtype == torch.bool else a.double()

    m = kw.pop("attn_mask", None)
    if m is not None and np.ndim(m) < 2:  # PyTorch's kernels index the mask's last two axes
        m = np.broadcast_to(m, (np.shape(q)[-2], np.shape(k)[-2]))
    return F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=t(m), **kw).numpy()


def rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


CASES = [
    # (q shape, k shape, v shape, kwargs)
    ((1, 1, 1, 1), (1, 1, 1, 1), (1, 1, 1, 1), {}),
    ((2, 3, 7, 8), (2, 3, 7, 8), (2, 3, 7, 8), {}),
    ((2, 3, 7, 8), (2, 3, 37, 8), (2, 3, 37, 5), {}),
    ((7, 16), (9, 16), (9, 4), {}),
    ((3, 5, 16), (3, 11, 16), (3, 11, 16), {"is_causal": True}),
    ((2, 4, 37, 32), (2, 4, 37, 32), (2, 4, 37, 32), {"is_causal": True}),
    ((1, 2, 13, 8), (1, 2, 29, 8), (1, 2, 29, 8), {"is_causal": True}),
    ((2, 8, 9, 16), (2, 2, 9, 16), (2, 2, 9, 16), {"enable_gqa": True}),
    ((2, 8, 9, 16), (2, 1, 9, 16), (2, 1, 9, 16), {}),
    ((2, 3, 2, 7, 8), (2, 3, 2, 5, 8), (2, 3, 2, 5, 8), {"scale": 0.3}),
    ((1, 2, 10, 64), (1, 2, 10, 64), (1, 2, 10, 64), {"scale": 1.0}),
]


@pytest.mark.parametrize("qs,ks,vs,kw", CASES)
def test_numpy_matches_torch(qs, ks, vs, kw):
    rng = np.random.default_rng(hash((qs, ks, vs)) % 2**32)
    q, k, v = rand(rng, *qs), rand(rng, *ks), rand(rng, *vs)
    got = wa.scaled_dot_product_attention(q, k, v, **kw)
    want = ref(q, k, v, **kw)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == want.shape
    assert rel(got, want) < 1e-5


MASKS = [
    ("bool", (7, 5)),
    ("bool", (5,)),
    ("bool", (2, 1, 1, 5)),
    ("bool", (1, 3, 7, 5)),
    ("bool", (2, 3, 7, 5)),
    ("float", (7, 5)),
    ("float", (3, 1, 5)),
    ("float", (2, 3, 7, 5)),
    ("float", (2, 1, 7, 1)),
]


@pytest.mark.parametrize("kind,shape", MASKS)
@pytest.mark.parametrize("causal", [False, True])
def test_masks_broadcast_as_torch(kind, shape, causal):
    rng = np.random.default_rng(len(shape) * 7 + (kind == "bool"))
    q, k, v = rand(rng, 2, 3, 7, 8), rand(rng, 2, 3, 5, 8), rand(rng, 2, 3, 5, 6)
    if kind == "bool":
        m = rng.random(shape) > 0.3
        m[..., 0] = True  # no fully masked rows: PyTorch's math backend gives NaN there
    else:
        m = rand(rng, *shape)
    if causal:
        # PyTorch refuses a mask together with is_causal: fold causal into its reference.
        c = np.tril(np.ones((7, 5), bool))
        want_mask = (
            (np.broadcast_to(m, np.broadcast_shapes(m.shape, (7, 5))) & c)
            if kind == "bool"
            else np.where(c, m, -np.inf)
        )
        want = ref(q, k, v, attn_mask=want_mask)
    else:
        want = ref(q, k, v, attn_mask=m)
    got = wa.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal)
    assert rel(got, want) < 1e-5


def test_several_batch_axes_with_a_mask():
    rng = np.random.default_rng(3)
    q, k, v = rand(rng, 2, 3, 2, 6, 8), rand(rng, 2, 3, 2, 4, 8), rand(rng, 2, 3, 2, 4, 8)
    m = rng.random((3, 1, 6, 4)) > 0.2
    m[..., 0] = True
    assert rel(wa.scaled_dot_product_attention(q, k, v, attn_mask=m), ref(q, k, v, attn_mask=m)) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_torch_in_torch_out(dtype):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 9, 16, generator=g).to(dtype)
    k = torch.randn(2, 2, 11, 16, generator=g).to(dtype)
    v = torch.randn(2, 2, 11, 8, generator=g).to(dtype)
    m = torch.rand(9, 11, generator=g) > 0.3
    m[:, 0] = True
    got = wa.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)
    assert isinstance(got, torch.Tensor) and got.dtype == dtype and got.shape == (2, 4, 9, 8)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=m, enable_gqa=True)
    tol = {torch.float32: 1e-5, torch.float64: 1e-5, torch.float16: 3e-3, torch.bfloat16: 1e-2}[dtype]
    assert rel(got.double(), want) < tol


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_numpy_dtypes_come_back(dtype):
    rng = np.random.default_rng(5)
    q = rand(rng, 1, 2, 6, 8).astype(dtype)
    got = wa.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert got.dtype == dtype
    assert rel(got, ref(q.astype(np.float32), q.astype(np.float32), q.astype(np.float32), is_causal=True)) < (
        3e-3 if dtype == np.float16 else 1e-5
    )


def test_weights_are_the_softmax():
    rng = np.random.default_rng(9)
    q, k, v = rand(rng, 2, 3, 7, 8), rand(rng, 2, 3, 5, 8), rand(rng, 2, 3, 5, 6)
    out, w = wa.scaled_dot_product_attention(q, k, v, return_weights=True, scale=0.5)
    s = torch.from_numpy(q).double() @ torch.from_numpy(k).double().transpose(-1, -2) * 0.5
    p = torch.softmax(s, -1).numpy()
    assert w.shape == (2, 3, 7, 5) and rel(w, p) < 1e-5
    assert rel(out, p @ v) < 1e-5


def test_large_logits_subtract_the_row_max():
    rng = np.random.default_rng(11)
    q, k, v = rand(rng, 1, 1, 8, 4, scale=30.0), rand(rng, 1, 1, 8, 4, scale=30.0), rand(rng, 1, 1, 8, 4)
    got = wa.scaled_dot_product_attention(q, k, v)
    assert np.isfinite(got).all() and rel(got, ref(q, k, v)) < 1e-5


def test_fully_masked_rows_are_zero():
    q = np.ones((1, 1, 3, 4), np.float32)
    m = np.array([[True, True], [False, False], [True, False]])
    got = wa.scaled_dot_product_attention(q, q[:, :, :2], q[:, :, :2], attn_mask=m)
    assert np.all(got[0, 0, 1] == 0) and np.all(got[0, 0, 0] == 1)


def test_a_torch_tensor_on_another_device_comes_back_there():
    q = torch.randn(1, 2, 5, 8, device="meta")
    with pytest.raises(Exception):  # meta tensors have no data: a clear error, not a crash
        wa.scaled_dot_product_attention(q, q, q)


def test_strided_input_is_read_in_place():
    rng = np.random.default_rng(2)
    big = rand(rng, 2, 9, 4, 16)
    q = big.transpose(0, 2, 1, 3)  # (2, 4, 9, 16), not contiguous
    assert not q.flags.c_contiguous
    assert rel(wa.scaled_dot_product_attention(q, q, q), ref(q, q, q)) < 1e-5


def test_default_scale_is_one_over_sqrt_e():
    rng = np.random.default_rng(4)
    q = rand(rng, 1, 1, 5, 9)
    a = wa.scaled_dot_product_attention(q, q, q)
    b = wa.scaled_dot_product_attention(q, q, q, scale=1 / math.sqrt(9))
    assert np.array_equal(a, b)
