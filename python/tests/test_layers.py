"""MultiheadAttention against torch.nn.MultiheadAttention, and the KV cache against one
causal attention over all the tokens."""

import numpy as np
import pytest

import wgpu_attention as wa

torch = pytest.importorskip("torch")
F = torch.nn.functional


def rel(a, b):
    a, b = torch.as_tensor(np.asarray(a)).double(), torch.as_tensor(np.asarray(b)).double()
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("need_weights,average", [(True, True), (True, False), (False, True)])
def test_self_attention_matches_torch(batch_first, need_weights, average):
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(32, 4, batch_first=batch_first).eval()
    with torch.no_grad():
        ref.in_proj_bias.normal_()
        ref.out_proj.bias.normal_()
    ours = wa.MultiheadAttention.from_torch(ref)
    x = torch.randn((3, 7, 32) if batch_first else (7, 3, 32))
    want_out, want_w = ref(x, x, x, need_weights=need_weights, average_attn_weights=average)
    got_out, got_w = ours(x, x, x, need_weights=need_weights, average_attn_weights=average)
    assert isinstance(got_out, torch.Tensor) and got_out.shape == want_out.shape
    assert rel(got_out, want_out.detach()) < 1e-5
    if need_weights:
        assert got_w.shape == want_w.shape and rel(got_w, want_w.detach()) < 1e-5
    else:
        assert got_w is None


def test_masks_and_cross_attention_match_torch():
    torch.manual_seed(1)
    ref = torch.nn.MultiheadAttention(24, 3, kdim=10, vdim=6, batch_first=True).eval()
    ours = wa.MultiheadAttention.from_torch(ref)
    q, k, v = torch.randn(2, 5, 24), torch.randn(2, 9, 10), torch.randn(2, 9, 6)
    kpm = torch.zeros(2, 9, dtype=torch.bool)
    kpm[1, 6:] = True
    am = torch.randn(5, 9)
    want, ww = ref(q, k, v, key_padding_mask=kpm, attn_mask=am)
    got, gw = ours(q, k, v, key_padding_mask=kpm, attn_mask=am)
    assert rel(got, want.detach()) < 1e-5 and rel(gw, ww.detach()) < 1e-5


def test_self_attention_with_a_causal_bool_mask_on_numpy():
    torch.manual_seed(2)
    ref = torch.nn.MultiheadAttention(16, 2, batch_first=True).eval()
    ours = wa.MultiheadAttention.from_torch(ref)
    x = torch.randn(2, 6, 16)
    causal = torch.triu(torch.ones(6, 6, dtype=torch.bool), 1)  # True = masked out
    want, _ = ref(x, x, x, attn_mask=causal)
    xn = x.numpy()
    got, _ = ours(xn, xn, xn, attn_mask=causal.numpy())
    assert isinstance(got, np.ndarray) and rel(got, want.detach()) < 1e-5


def test_state_dict_mismatch_is_a_clear_error():
    ours = wa.MultiheadAttention(16, 2)
    with pytest.raises(ValueError, match="in_proj_weight"):
        ours.load_state_dict({"in_proj_weight": np.zeros((3, 3), np.float32)})


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("float16", 3e-3)])
def test_kv_cache_decode_equals_causal_attention(dtype, tol):
    g = torch.Generator().manual_seed(4)
    B, H, Hkv, D, prompt, new = 2, 4, 2, 16, 5, 4
    n = prompt + new
    q, k, v = (
        torch.randn(B, H, n, D, generator=g),
        torch.randn(B, Hkv, n, D, generator=g),
        torch.randn(B, Hkv, n, D, generator=g),
    )
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    cache = wa.KVCache(capacity=16, batch=B, kv_heads=Hkv, head_dim=D, dtype=dtype)
    rows = [cache.step(q[:, :, :prompt], k[:, :, :prompt], v[:, :, :prompt])]
    for t in range(prompt, n):
        rows.append(cache.step(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1]))
    got = torch.cat(rows, dim=2)
    assert len(cache) == n and cache.memory_bytes > 0
    assert rel(got, want) < tol
    with pytest.raises(ValueError):
        cache.append(torch.randn(B, Hkv, 100, D), torch.randn(B, Hkv, 100, D))  # past capacity
    assert len(cache) == n
    cache.clear()
    assert len(cache) == 0


def test_kv_cache_with_a_window_and_softcap_rolling_or_not():
    # Mistral's window of 6 keys and Gemma 2's soft-cap, a prompt of 5 then one token at a
    # time to 30 tokens; a rolling cache of 8 tokens gives the same rows as one of 30.
    g = torch.Generator().manual_seed(5)
    B, H, Hkv, D, prompt, n, W, cap = 1, 4, 2, 8, 5, 30, 6, 1.5
    q, k, v = (
        torch.randn(B, H, n, D, generator=g, dtype=torch.float64),
        torch.randn(B, Hkv, n, D, generator=g, dtype=torch.float64),
        torch.randn(B, Hkv, n, D, generator=g, dtype=torch.float64),
    )
    i = torch.arange(n)
    keep = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - W)
    s = q @ k.repeat_interleave(H // Hkv, dim=1).transpose(-2, -1) / D**0.5
    s = (cap * torch.tanh(s / cap)).masked_fill(~keep, float("-inf"))
    want = torch.softmax(s, dim=-1) @ v.repeat_interleave(H // Hkv, dim=1)
    q, k, v = q.float(), k.float(), v.float()
    for capacity, rolling in [(n, False), (8, True)]:
        cache = wa.KVCache(capacity, B, Hkv, D, window=W, softcap=cap, rolling=rolling)
        rows = [cache.step(q[:, :, :prompt], k[:, :, :prompt], v[:, :, :prompt])]
        for t in range(prompt, n):
            rows.append(cache.step(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1]))
        assert len(cache) == n
        assert rel(torch.cat(rows, dim=2).double(), want) < 1e-5
    # A rolling cache without a window cannot serve a step once it has wrapped.
    cache = wa.KVCache(8, B, Hkv, D, rolling=True)
    for t in range(10):
        cache.append(k[:, :, t : t + 1], v[:, :, t : t + 1])
    with pytest.raises(ValueError, match="rolling cache"):
        cache.attend(q[:, :, 9:10])
