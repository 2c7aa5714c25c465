"""tpu frexp and nextafter (subnormals, signed zeros, infinities, NaN), and the edge cases of
the normalization lowerings (empty batches for group norm, evaluation-mode batch norm's saved
statistics), against CPU under ``fallback_policy("deny")``."""

from __future__ import annotations

import pytest
import torch

import accelkit
from conftest import assert_native

aten = torch.ops.aten
SPECIAL_FLOATS = [0.0, -0.0, 1.0, -3.5, 7e-3, float("inf"), -float("inf"), float("nan")]


@pytest.mark.parametrize("dtype, subnormals", [
    (torch.float32, [1e-40, -1e-45, 1.1754942e-38]),
    (torch.float16, [1e-6, -6e-8]),
    (torch.bfloat16, [1e-40]),
])
def test_frexp_including_subnormals(dev, dtype, subnormals):
    x = torch.tensor(SPECIAL_FLOATS + subnormals + [3e38 if dtype != torch.float16 else 6e4]).to(dtype)
    want = torch.frexp(x)
    with accelkit.fallback_policy("deny"):
        got = torch.frexp(x.to(dev))
    assert got.mantissa.dtype == dtype and got.exponent.dtype == torch.int32
    torch.testing.assert_close(got.mantissa.cpu(), want.mantissa, equal_nan=True, atol=0, rtol=0)
    torch.testing.assert_close(got.exponent.cpu(), want.exponent)
    assert_native("aten.frexp.Tensor")


def test_frexp_out_variant(dev):
    x = torch.randn(4, 5) * 100
    mantissa, exponent = torch.empty(4, 5, device=dev), torch.empty(4, 5, dtype=torch.int32, device=dev)
    with accelkit.fallback_policy("deny"):
        torch.frexp(x.to(dev), out=(mantissa, exponent))
    want = torch.frexp(x)
    torch.testing.assert_close(mantissa.cpu(), want.mantissa)
    torch.testing.assert_close(exponent.cpu(), want.exponent)


def test_nextafter_towards_every_direction(dev):
    x = torch.tensor([0.0, -0.0, 1.0, 1.0, float("nan"), 1.0, 2.0, 3e38, float("inf"), 1e-45])
    y = torch.tensor([1.0, -1.0, 0.0, float("nan"), 1.0, 2.0, 2.0, float("inf"), 0.0, 0.0])
    want = torch.nextafter(x, y)
    with accelkit.fallback_policy("deny"):
        got = torch.nextafter(x.to(dev), y.to(dev))
    torch.testing.assert_close(got.cpu(), want, equal_nan=True, atol=0, rtol=0)
    assert_native("aten.nextafter.default")


def test_nextafter_broadcasts_bfloat16(dev):
    x, y = torch.randn(3, 1).bfloat16(), torch.randn(4).bfloat16()
    with accelkit.fallback_policy("deny"):
        got = torch.nextafter(x.to(dev), y.to(dev))
    torch.testing.assert_close(got.cpu(), torch.nextafter(x, y), atol=0, rtol=0)


@pytest.mark.parametrize("shape, groups", [((0, 2), 1), ((0, 6, 3), 3), ((2, 6, 0), 2), ((3, 6, 2, 2), 3)])
def test_group_norm_including_empty_inputs(dev, shape, groups):
    x, w, b = torch.randn(shape), torch.randn(shape[1]), torch.randn(shape[1])
    n, c = shape[0], shape[1]
    hxw = x[0, 0].numel() if n else int(torch.tensor(shape[2:]).prod())
    want = aten.native_group_norm(x, w, b, n, c, hxw, groups, 1e-5)
    with accelkit.fallback_policy("deny"):
        got = aten.native_group_norm(x.to(dev), w.to(dev), b.to(dev), n, c, hxw, groups, 1e-5)
        functional = torch.nn.functional.group_norm(x.to(dev), groups, w.to(dev), b.to(dev))
    for g, e in zip(got, want):  # an empty group's rstd is NaN on CPU too
        torch.testing.assert_close(g.cpu(), e, atol=1e-5, rtol=1e-5, equal_nan=True)
    torch.testing.assert_close(functional.cpu(), torch.nn.functional.group_norm(x, groups, w, b),
                               atol=1e-5, rtol=1e-5)
    assert_native("aten.native_group_norm.default")


def test_group_norm_backward_of_empty_batch(dev):
    x = torch.randn(0, 4, 3, requires_grad=True)
    xd = x.detach().to(dev).requires_grad_()
    with accelkit.fallback_policy("deny"):
        torch.nn.functional.group_norm(xd, 2).sum().backward()
    assert xd.grad.shape == (0, 4, 3)


def test_native_batch_norm_eval_saves_no_statistics(dev):
    x, w, b = torch.randn(3, 2, 4), torch.randn(2), torch.randn(2)
    mean, var = torch.randn(2), torch.rand(2) + 0.5
    want = aten.native_batch_norm(x, w, b, mean.clone(), var.clone(), False, 0.1, 1e-5)
    dmean, dvar = mean.to(dev), var.to(dev)
    with accelkit.fallback_policy("deny"):
        got = aten.native_batch_norm(x.to(dev), w.to(dev), b.to(dev), dmean, dvar, False, 0.1, 1e-5)
    for g, e in zip(got, want):
        assert g.shape == e.shape
        torch.testing.assert_close(g.cpu(), e, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dmean.cpu(), mean)  # evaluation leaves the running statistics alone
    torch.testing.assert_close(dvar.cpu(), var)
