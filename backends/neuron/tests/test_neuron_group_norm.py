"""neuron's ``native_group_norm`` (a decomposition into native ops, decompositions.py) against the
CPU, with the fallback denied: float32 within the rounding of a differently ordered sum, the
reduced floats (computed in float32, rounded once) and mixed bf16 activations with float32
parameters with the CPU's result dtypes; the backward through autograd; what the CPU refuses or
computes from an empty group stays the CPU's."""

from __future__ import annotations

import pytest
import torch

import accelkit

EPS = 1e-5


def _group_norm(x, weight, bias, groups, dev=None):
    move = (lambda t: t if t is None else t.to(dev)) if dev is not None else (lambda t: t)
    n, c = x.shape[:2]
    out = torch.ops.aten.native_group_norm(move(x), move(weight), move(bias), n, c, x[0, 0].numel(), groups, EPS)
    return [t.cpu() for t in out]


@pytest.mark.parametrize("shape, groups, dtype, parameter_dtype, affine", [
    ((2, 6, 5), 3, torch.float32, torch.float32, True),
    ((3, 8, 4, 4), 2, torch.float32, torch.float32, True),
    ((3, 8, 4, 4), 8, torch.float32, torch.float32, False),
    ((2, 6, 7), 6, torch.bfloat16, torch.bfloat16, True),
    ((2, 6, 7), 1, torch.bfloat16, torch.float32, True),
    ((1, 4, 3, 2, 2), 2, torch.float16, torch.float16, True),
])
def test_group_norm_matches_the_cpu(dev, shape, groups, dtype, parameter_dtype, affine):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * 3 + 1).to(dtype)
    weight = torch.randn(shape[1], generator=g).to(parameter_dtype) if affine else None
    bias = torch.randn(shape[1], generator=g).to(parameter_dtype) if affine else None
    want = _group_norm(x, weight, bias, groups)
    with accelkit.fallback_policy("deny"):
        got = _group_norm(x, weight, bias, groups, dev)
    for name, actual, expected in zip(("output", "mean", "rstd"), got, want):
        assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape), name
        # float32: the moments are summed in another order; reduced floats: one rounding apart
        tolerance = {torch.float32: (1e-5, 1e-6)}.get(actual.dtype, (1e-2, 1e-2))
        torch.testing.assert_close(actual, expected, rtol=tolerance[0], atol=tolerance[1], msg=name)
    assert accelkit.stats()["ops"]["aten.native_group_norm.default"]["decomposed"] >= 1


def test_group_norm_backward_matches_the_cpu(dev):
    g = torch.Generator().manual_seed(1)
    x, weight, bias = torch.randn(2, 6, 5, generator=g), torch.randn(6, generator=g), torch.randn(6, generator=g)
    leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    with accelkit.fallback_policy("deny"):
        moved = [t.detach().to(dev).requires_grad_() for t in (x, weight, bias)]
        (torch.nn.functional.group_norm(moved[0], 3, moved[1], moved[2]) ** 2).sum().backward()
    (torch.nn.functional.group_norm(leaves[0], 3, leaves[1], leaves[2]) ** 2).sum().backward()
    for device_leaf, cpu_leaf in zip(moved, leaves):
        torch.testing.assert_close(device_leaf.grad.cpu(), cpu_leaf.grad, rtol=1e-5, atol=1e-5)


def test_what_the_cpu_refuses_or_does_with_an_empty_group_stays_the_cpus(dev):
    x = torch.randn(2, 6, 5)
    with pytest.raises(RuntimeError) as cpu_error:
        torch.nn.functional.group_norm(x, 4)  # 6 channels in 4 groups
    with pytest.raises(RuntimeError) as device_error:
        torch.nn.functional.group_norm(x.to(dev), 4)
    assert str(device_error.value) == str(cpu_error.value)
    empty = torch.randn(2, 6, 0)
    torch.testing.assert_close(torch.nn.functional.group_norm(empty.to(dev), 3).cpu(),
                               torch.nn.functional.group_norm(empty, 3))
