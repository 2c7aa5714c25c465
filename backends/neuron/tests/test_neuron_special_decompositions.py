"""``polygamma`` orders 0 and 1 (``decompositions/special.py``) against the CPU, the fallback
denied: the reflection branch, poles, large arguments, inf and NaN, float32 and bfloat16."""

from __future__ import annotations

import pytest
import torch

import accelkit

POINTS = [0.3, -1.5, 4.0, 0.5, 1e-3, -0.7, 10.0, 100.0, 0.0, -2.0, 2.5e3, float("inf"), float("nan")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [0, 1])
def test_polygamma_low_orders_match_the_cpu(dev, dtype, n):
    x = torch.cat([torch.tensor(POINTS), torch.linspace(-4.9, 6, 101)]).to(dtype)
    expected = torch.polygamma(n, x)
    with accelkit.fallback_policy("deny"):
        got = torch.polygamma(n, x.to(dev)).cpu()
    assert got.dtype == dtype
    finite = torch.isfinite(expected)
    assert torch.equal(finite, torch.isfinite(got)) and torch.equal(expected.isnan(), got.isnan())
    assert torch.equal(expected[~finite & ~expected.isnan()], got[~finite & ~got.isnan()])
    # a few float32 ulps: the sums are the CPU's, the Scalar engine's sin and the CPU's libm differ in the last bit
    torch.testing.assert_close(got[finite], expected[finite], rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=0)
    counts = accelkit.stats()["ops"]
    assert any(name.startswith("aten.polygamma.") and c.get("decomposed") for name, c in counts.items())


def test_polygamma_higher_orders_are_the_cpus(dev):
    """Orders from 2 are zeta multiples: the CPU computes them (the fallback, allowed here)."""
    x = torch.tensor([0.5, 2.0, 7.5])
    torch.testing.assert_close(torch.polygamma(3, x.to(dev)).cpu(), torch.polygamma(3, x))
