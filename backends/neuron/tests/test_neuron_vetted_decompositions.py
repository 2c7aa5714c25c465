"""The PyTorch decompositions neuron adds to the core-ATen table (``decompositions.VETTED``) vs
CPU PyTorch, fallback denied: exact for the elementwise forms, the copy and the search (ELU's
exponential branch within an ulp: the CPU's own varies with the host), within a few float32 ulps
(one bfloat16 step) for bicubic upsampling."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import accelkit

EXACT = {
    "leaky_relu": lambda t: F.leaky_relu(t, 0.07),
    "hardtanh": lambda t: F.hardtanh(t, -1.3, 2.1),
    "narrow_copy": lambda t: t.narrow_copy(2, 1, 3),
    "bucketize": lambda t: torch.bucketize(t, torch.tensor([-1.0, 0.0, 0.5, 2.0], dtype=t.dtype, device=t.device)),
    "bucketize_right": lambda t: torch.bucketize(t, torch.tensor([-1.0, 0.0, 0.5], dtype=t.dtype, device=t.device),
                                                 right=True, out_int32=True),
    "bucketize_number": lambda t: torch.bucketize(0.25, torch.linspace(-2, 2, 9, dtype=t.dtype, device=t.device)),
}

#: ELU's negative branch is ``expm1``, which the CPU computes with the vectorised kernel of the
#: host's instruction set: neuron's matches the AVX2 kernel bit for bit, and the AVX-512 one's
#: last bit differs on some inputs (1 of this test's 504). So: the other branch exactly, this one
#: within one ulp.
ELU = {
    "elu": lambda t: F.elu(t, 0.8),
    "elu_near_zero": lambda t: F.elu(t * 1e-3),
}

BICUBIC = {
    "size": lambda t: F.interpolate(t, size=(9, 11), mode="bicubic"),
    "scale_corners": lambda t: F.interpolate(t, scale_factor=1.7, mode="bicubic", align_corners=True),
    "shrink": lambda t: F.interpolate(t, size=(4, 5), mode="bicubic"),
}


def _input(dtype: torch.dtype) -> torch.Tensor:
    x = torch.randn(4, 3, 6, 7, generator=torch.Generator().manual_seed(0)) * 3
    x[0, 0, 0, :4] = torch.tensor([0.0, -0.0, 1e-4, -1e-4])
    return x.to(dtype)


def _on_device(fn, x: torch.Tensor, dev) -> torch.Tensor:
    with accelkit.fallback_policy("deny"):
        return fn(x.to(dev)).cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", EXACT, ids=str)
def test_exact_decompositions_match_cpu(dev, case, dtype):
    x = _input(dtype)
    expected = EXACT[case](x)
    actual = _on_device(EXACT[case], x, dev)
    assert actual.dtype == expected.dtype and torch.equal(actual, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", ELU, ids=str)
def test_elu_matches_cpu_exactly_where_linear_and_within_an_ulp_where_exponential(dev, case, dtype):
    x = _input(dtype)
    expected = ELU[case](x)
    actual = _on_device(ELU[case], x, dev)
    assert actual.dtype == expected.dtype
    linear = x > 0
    assert torch.equal(actual[linear], expected[linear])
    torch.testing.assert_close(actual[~linear], expected[~linear], rtol=torch.finfo(dtype).eps, atol=0)


def test_special_values_pass_through_as_on_cpu(dev):
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    for fn in (EXACT["leaky_relu"], EXACT["hardtanh"], ELU["elu"]):
        torch.testing.assert_close(_on_device(fn, x, dev), fn(x), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", BICUBIC, ids=str)
def test_bicubic_matches_cpu(dev, case, dtype):
    x = _input(dtype)
    expected = BICUBIC[case](x)
    actual = _on_device(BICUBIC[case], x, dev)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if dtype == torch.float32:
        # each output is a 16-tap weighted sum, its taps added in another order than the CPU's:
        # the difference is a few roundings of the largest term, not of the (possibly cancelled) sum
        largest_term = x.abs().max().item() * 1.5  # the cubic weights' absolute sum per dim is below 1.25
        torch.testing.assert_close(actual, expected, rtol=0, atol=8 * torch.finfo(torch.float32).eps * largest_term)
    else:
        step = expected.float().abs().max().item() * 2.0 ** -7
        torch.testing.assert_close(actual.float(), expected.float(), rtol=0, atol=step)
