"""The margin losses' backwards (``decompositions/margin_loss.py``) against the CPU, the fallback
denied: every reduction, p 1 and 2, class weights, repeated and -1-terminated multilabel targets,
in float32 (the CPU's kernels take no bfloat16; within float rounding)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_decomposed

aten = torch.ops.aten


pytestmark = pytest.mark.usefixtures("deny_fallback")


def _gradient(loss_fn, x, *args, dev=None, **kwargs):
    x = x.clone().to(dev or "cpu").requires_grad_()
    def moved(a):
        return a.to(x.device) if isinstance(a, torch.Tensor) else a

    loss = loss_fn(x, *map(moved, args), **{name: moved(a) for name, a in kwargs.items()})
    loss.backward(torch.ones_like(loss) * 1.5)
    return x.grad.cpu()


def _close(got, expected):
    assert got.dtype == expected.dtype and got.shape == expected.shape
    tolerance = dict(atol=2e-2, rtol=2e-2) if expected.dtype == torch.bfloat16 else dict(atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got, expected, **tolerance)


@pytest.mark.parametrize("dtype", [torch.float32])  # the CPU has no bfloat16 kernels
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("p, weighted", [(1, False), (2, False), (1, True), (2, True)])
def test_multi_margin_loss_backward(dev, dtype, reduction, p, weighted):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, generator=generator).to(dtype)
    target = torch.randint(0, 5, (6,), generator=generator)
    weight = (torch.rand(5, generator=generator) + 0.5).to(dtype) if weighted else None
    kwargs = dict(p=p, margin=0.7, weight=weight, reduction=reduction)
    expected = _gradient(F.multi_margin_loss, x, target, **kwargs)
    _close(_gradient(F.multi_margin_loss, x, target, dev=dev, **kwargs), expected)
    assert_decomposed("aten.multi_margin_loss_backward")


@pytest.mark.parametrize("dtype", [torch.float32])  # the CPU has no bfloat16 kernels
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_multilabel_margin_loss_backward(dev, dtype, reduction):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(4, 6, generator=generator).to(dtype)
    target = torch.tensor([[3, 0, -1, 1, 2, 2], [1, 1, 4, -1, -1, -1], [-1, 2, 3, 4, 5, 0], [5, 4, 3, 2, 1, 0]])
    kwargs = dict(reduction=reduction)
    expected = _gradient(F.multilabel_margin_loss, x, target, **kwargs)
    _close(_gradient(F.multilabel_margin_loss, x, target, dev=dev, **kwargs), expected)
    assert_decomposed("aten.multilabel_margin_loss_backward")
