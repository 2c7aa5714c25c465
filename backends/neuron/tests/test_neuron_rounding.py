"""Reduced-precision results that the NeuronCore computes in fp32 and rounds once.

The engines compute in fp32 and round when they write a bfloat16 tile, so an op that is one
program rounds once; the same op run as several programs (a decomposition) rounds each
intermediate, which cancellation turns into errors of many ulps. Each test compares neuron with
the CPU computing in float32 and rounding once."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_native

#: One bfloat16 ulp (8 significant bits) relative to the value, and the fp32 rounding of a
#: sum of terms near 1 for results that cancel to almost nothing.
ONE_ULP = {"rtol": 2 ** -7, "atol": 1e-6}


@pytest.mark.parametrize("x_shape", [(64, 48), (48,), ()])
def test_addr_in_bfloat16_rounds_once(dev, x_shape):
    g = torch.Generator().manual_seed(0)
    x, a, b = (torch.randn(s, generator=g).bfloat16() for s in (x_shape, (64,), (48,)))
    got = torch.addr(x.to(dev), a.to(dev), b.to(dev), beta=0.6, alpha=0.2).cpu()
    want = torch.addr(x.float(), a.float(), b.float(), beta=0.6, alpha=0.2).bfloat16()
    assert got.dtype == torch.bfloat16
    # A tie in bfloat16 may round either way after fp32 work done in another order.
    torch.testing.assert_close(got.float(), want.float(), **ONE_ULP)
    assert_native("aten.addr.default")


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_addr_matches_cpu_in_other_dtypes(dev, dtype):
    g = torch.Generator().manual_seed(1)
    if dtype == torch.bool:
        x, a, b = (torch.randint(0, 2, s, generator=g).bool() for s in ((5, 7), (5,), (7,)))
        scalars = [(True, True), (False, True), (True, False)]
    elif dtype == torch.int64:
        x, a, b = (torch.randint(-9, 9, s, generator=g) for s in ((5, 7), (5,), (7,)))
        scalars = [(1, 1), (3, -2), (0, 4)]
    else:
        x, a, b = (torch.randn(s, generator=g) for s in ((5, 7), (5,), (7,)))
        scalars = [(1, 1), (0.6, 0.2), (0, 2.0)]
    for beta, alpha in scalars:
        got = torch.addr(x.to(dev), a.to(dev), b.to(dev), beta=beta, alpha=alpha).cpu()
        torch.testing.assert_close(got, torch.addr(x, a, b, beta=beta, alpha=alpha))


def test_addr_with_beta_zero_ignores_nan_input(dev):
    x = torch.full((2, 3), float("nan"))
    got = torch.addr(x.to(dev), torch.ones(2).to(dev), torch.ones(3).to(dev), beta=0).cpu()
    assert torch.equal(got, torch.ones(2, 3))


@pytest.mark.parametrize("head", [True, False])
def test_index_put_accumulate_in_bfloat16_rounds_each_add_in_order(dev, head):
    """The DMA's read-modify-write add rounds each sum back to bfloat16, and adds to one
    address are serialised in the values' order, as the CPU's sequential adds: 256 then 199
    ones stays 256 (256 + 1 rounds to 256), where one fp32 sum gives 456; 199 ones then 256
    is 456 either way."""
    values = torch.ones(200, dtype=torch.bfloat16)
    values[0 if head else -1] = 256
    x, index = torch.zeros(3, dtype=torch.bfloat16), torch.ones(200, dtype=torch.long)
    got = x.to(dev).index_put((index.to(dev),), values.to(dev), accumulate=True).cpu()
    want = x.index_put((index,), values, accumulate=True)
    assert torch.equal(got, want)
    assert got[1].item() == (256 if head else 456)
