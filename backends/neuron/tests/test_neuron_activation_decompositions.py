"""GLU's forward-mode derivatives and the masked softmax (``decompositions/activation.py``)
against the CPU, the fallback denied, float32 and bfloat16 (within float rounding)."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_decomposed

aten = torch.ops.aten
DTYPES = [torch.float32, torch.bfloat16]


pytestmark = pytest.mark.usefixtures("deny_fallback")


def _random(*shape, dtype, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _close(got, expected):
    got = got.cpu()
    assert torch.equal(got.isnan(), expected.isnan())
    got, expected = got.nan_to_num(nan=0.0), expected.nan_to_num(nan=0.0)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    tolerance = dict(atol=2e-2, rtol=2e-2) if expected.dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, expected, **tolerance)


@pytest.mark.parametrize("dtype", [torch.float32])  # the CPU has no bfloat16 glu_jvp
@pytest.mark.parametrize("dim", [1, -1])
def test_glu_jvp(dev, dtype, dim):
    x, dx = _random(3, 8, 6, dtype=dtype), _random(3, 8, 6, dtype=dtype, seed=1)
    glu = torch.nn.functional.glu(x, dim)
    expected = aten.glu_jvp(glu, x, dx, dim)
    _close(aten.glu_jvp(glu.to(dev), x.to(dev), dx.to(dev), dim), expected)
    assert_decomposed("aten.glu_jvp.default")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [1, -1])
def test_glu_backward_jvp(dev, dtype, dim):
    x, dx = _random(3, 8, 6, dtype=dtype), _random(3, 8, 6, dtype=dtype, seed=1)
    half = list(x.shape)
    half[dim] //= 2
    grad_glu, dgrad_glu = _random(*half, dtype=dtype, seed=2), _random(*half, dtype=dtype, seed=3)
    grad_x = aten.glu_backward(grad_glu, x, dim)
    tensors = (grad_x, grad_glu, x, dgrad_glu, dx)
    expected = aten.glu_backward_jvp(*tensors, dim)
    _close(aten.glu_backward_jvp(*(t.to(dev) for t in tensors), dim), expected)
    assert_decomposed("aten.glu_backward_jvp.default")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_type", [None, 1, 2])
def test_masked_softmax_and_its_backward(dev, dtype, mask_type):
    x = _random(2, 3, 5, 5, dtype=dtype)  # [batch, heads, queries, keys]: mask_type 1 wants queries == keys
    generator = torch.Generator().manual_seed(5)
    if mask_type == 1:
        mask = torch.rand(2, 5, generator=generator) < 0.4
        mask[1] = True  # a batch whose every key is masked (NaN, as the CPU's)
    else:
        mask = torch.rand(2, 3, 5, 5, generator=generator) < 0.4
        mask[0, 1, 2] = True
    expected = aten._masked_softmax(x, mask, 3, mask_type)
    got = aten._masked_softmax(x.to(dev), mask.to(dev), 3, mask_type)
    _close(got, expected)
    assert_decomposed("aten._masked_softmax.default")
    if mask_type != 1:  # the backward takes a mask of the output's shape
        grad = _random(2, 3, 5, 5, dtype=dtype, seed=6)
        expected_grad = aten._masked_softmax_backward(grad, expected, mask, 3)
        _close(aten._masked_softmax_backward(grad.to(dev), expected.to(dev), mask.to(dev), 3), expected_grad)
        assert_decomposed("aten._masked_softmax_backward.default")
