"""Bad input is one Python exception of one line, of the kind the issue names; nothing
crashes the interpreter."""

import numpy as np
import pytest

import wgpu_attention as wa

torch = pytest.importorskip("torch")


def q(*shape, dtype=np.float32):
    return np.ones(shape, dtype)


def one_line(e):
    msg = str(e.value)
    assert msg and "\n" not in msg, msg
    return msg


@pytest.mark.parametrize(
    "args,kw,exc,words",
    [
        ((q(2, 3, 4, 8), q(2, 3, 5, 7), q(2, 3, 5, 7)), {}, ValueError, "last dimension"),
        ((q(2, 3, 4, 8), q(2, 3, 5, 8), q(2, 3, 6, 8)), {}, ValueError, "length"),
        ((q(2, 4, 4, 8), q(2, 3, 5, 8), q(2, 3, 5, 8)), {"enable_gqa": True}, ValueError, "multiple"),
        ((q(2, 4, 4, 8), q(2, 2, 5, 8), q(2, 2, 5, 8)), {}, ValueError, "enable_gqa"),
        ((q(8), q(8), q(8)), {}, ValueError, "2 dimensions"),
        ((q(2, 0, 8), q(2, 3, 8), q(2, 3, 8)), {}, ValueError, "0"),
        ((q(2, 4, 8, dtype=np.int32),) * 3, {}, ValueError, "float"),
        ((q(2, 4, 8), q(2, 4, 8, dtype=np.float64), q(2, 4, 8)), {}, ValueError, "same dtype"),
        ((q(1, 4, 8), q(1, 4, 8), q(1, 4, 8)), {"attn_mask": np.ones((3, 4), bool)}, ValueError, "broadcast"),
        ((q(1, 4, 8), q(1, 4, 8), q(1, 4, 8)), {"attn_mask": np.ones((4, 4), np.int64)}, ValueError, "bool"),
        ((q(1, 4, 8), q(1, 4, 8), q(1, 4, 8)), {"dropout_p": 0.1}, NotImplementedError, "dropout"),
        ((q(1, 4, 8), q(1, 4, 8), q(1, 4, 8)), {"scale": float("nan")}, ValueError, "scale"),
    ],
)
def test_bad_input_is_a_one_line_exception(args, kw, exc, words):
    with pytest.raises(exc) as e:
        wa.scaled_dot_product_attention(*args, **kw)
    assert words in one_line(e)


def test_nan_input_names_the_array_and_index():
    a = q(1, 1, 4, 8)
    b = a.copy()
    b[0, 0, 2, 3] = np.nan
    with pytest.raises(ValueError) as e:
        wa.scaled_dot_product_attention(a, b, a)
    msg = one_line(e)
    assert "NaN" in msg and "[0, 0, 2, 3]" in msg


def test_nan_in_a_float_mask_is_an_error():
    a = q(1, 1, 4, 8)
    m = np.zeros((4, 4), np.float32)
    m[1, 1] = np.nan
    with pytest.raises(ValueError):
        wa.scaled_dot_product_attention(a, a, a, attn_mask=m)


def test_mixed_kinds_are_an_error():
    t = torch.ones(1, 4, 8)
    with pytest.raises(ValueError) as e:
        wa.scaled_dot_product_attention(t, q(1, 4, 8), t)
    assert "tensor" in one_line(e)


def test_a_mask_that_requires_grad_is_a_clear_error():
    t = torch.ones(1, 4, 8, requires_grad=True)
    m = torch.zeros(4, 4, requires_grad=True)
    with pytest.raises(NotImplementedError) as e:
        wa.scaled_dot_product_attention(t, t, t, attn_mask=m)
    assert "attn_mask" in one_line(e)


def test_unknown_backend_is_a_value_error():
    with pytest.raises(ValueError) as e:
        wa.devices(backend="nonsense")
    assert "backend" in one_line(e)


def test_devices_and_device_describe_the_adapter():
    ds = wa.devices()
    assert ds and all("name" in d and "f16" in d for d in ds)
    d = wa.device()
    assert d["name"] and d["max_storage_buffer_binding_size"] > 0


def test_a_rust_panic_is_a_runtime_error_and_the_package_still_works():
    from wgpu_attention import _native

    with pytest.raises(RuntimeError) as e:
        _native._panic_for_tests()
    assert "panic" in one_line(e)
    a = q(1, 1, 4, 8)
    assert wa.scaled_dot_product_attention(a, a, a).shape == (1, 1, 4, 8)
