"""tpu ``torch.hash_tensor`` against CPU under ``fallback_policy("deny")``: the float64 bit patterns
of float32 specials (signed zeros, infinities, NaN, subnormals, extremes), low-precision floats,
integers and bool, and reductions over some or all dimensions with ``keepdim``."""

from __future__ import annotations

import pytest
import torch

import accelkit
from conftest import assert_native

SPECIALS = [0.0, -0.0, 1.0, -3.5, 7.1, float("inf"), -float("inf"), float("nan"), 1e-40, -1e-45,
            1.1754942e-38, 1.1754944e-38, 3.4028235e38]


def check(dev, x, **kwargs):
    with accelkit.fallback_policy("deny"):
        got = torch.hash_tensor(x.to(dev), **kwargs).cpu()
    want = torch.hash_tensor(x, **kwargs)
    assert got.dtype == torch.uint64 and got.shape == want.shape
    assert torch.equal(got, want)


@pytest.mark.parametrize("value", SPECIALS)
def test_each_float32_value_hashes_to_its_float64_bits(dev, value):
    check(dev, torch.tensor([value]))
    assert_native("aten.hash_tensor.default")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.bool])
def test_other_dtypes(dev, dtype):
    x = (torch.randn(4, 6) * 50).to(dtype)
    check(dev, x)
    check(dev, x, dim=1)


@pytest.mark.parametrize("kwargs", [{}, {"dim": -1}, {"dim": (0, 2), "keepdim": True}, {"dim": 1, "keepdim": True}])
def test_reduction_dims(dev, kwargs):
    check(dev, torch.randn(3, 4, 5), **kwargs)


def test_scalar_and_empty_with_dim(dev):
    check(dev, torch.tensor(2.5))
    check(dev, torch.empty(0, 3), dim=1)  # reducing a non-empty dim of an empty tensor
