"""`ssd.models.linear.linear`: the CPU small-row formulation gives F.linear's values, on the path its rule names."""
import pytest
import torch
import torch.nn.functional as F

from ssd.models.linear import linear, uses_weight_major


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 8, 9, 17])
@pytest.mark.parametrize("shape", [(96, 32), (32, 96), (48, 48)])
def test_matches_f_linear(rows, shape):
    g = torch.Generator().manual_seed(rows * 100 + shape[0])
    w = torch.randn(*shape, generator=g)
    b = torch.randn(shape[0], generator=g)
    x = torch.randn(rows, shape[1], generator=g)
    for bias in (None, b):
        out = linear(x, w, bias)
        assert out.shape == (rows, shape[0]) and out.is_contiguous()
        torch.testing.assert_close(out, F.linear(x, w, bias), rtol=1e-5, atol=1e-5)


def test_leading_dimensions_are_rows():
    w = torch.randn(40, 24)
    x = torch.randn(1, 3, 24)   # a [batch, tokens, hidden] activation: 3 rows
    assert uses_weight_major(3, w)
    out = linear(x, w)
    assert out.shape == (1, 3, 40)
    torch.testing.assert_close(out, F.linear(x, w), rtol=1e-5, atol=1e-5)


def test_rule():
    wide, narrow = torch.randn(64, 16), torch.randn(16, 64)
    assert uses_weight_major(1, narrow) and uses_weight_major(2, narrow)   # 1-2 rows: always
    assert not uses_weight_major(3, narrow)                                # a down projection from 3 rows on
    assert uses_weight_major(8, wide) and not uses_weight_major(9, wide)
    assert not uses_weight_major(0, wide)
    assert not uses_weight_major(1, wide.to(torch.bfloat16))               # fp32 only


def test_other_dtypes_fall_through():
    w = torch.randn(32, 16, dtype=torch.bfloat16)
    x = torch.randn(2, 16, dtype=torch.bfloat16)
    assert torch.equal(linear(x, w), F.linear(x, w))


def test_gradients_match():
    w = torch.randn(30, 10, requires_grad=True)
    x = torch.randn(2, 10, requires_grad=True)
    linear(x, w).square().sum().backward()
    gw, gx = w.grad.clone(), x.grad.clone()
    w.grad = x.grad = None
    F.linear(x, w).square().sum().backward()
    torch.testing.assert_close(gw, w.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gx, x.grad, rtol=1e-5, atol=1e-5)
