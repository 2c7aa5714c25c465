"""``polygamma`` (``decompositions/special.py``) against the CPU, the fallback denied: orders 0
and 1 (the reflection branch) and the zeta multiples from 2 on; poles, large arguments, inf and
NaN, float32 and bfloat16."""

from __future__ import annotations

import pytest
import torch

import accelkit
from conftest import assert_decomposed

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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [2, 3, 4, 7, 10])
def test_polygamma_higher_orders_match_the_cpu(dev, dtype, n):
    """Orders from 2 are ``(-1)^(n+1) n! zeta(n + 1, x)`` on neuron's zeta program: the poles at
    0 and the negative integers, the sums for a negative x, large arguments, inf and NaN."""
    x = torch.cat([torch.tensor(POINTS), torch.linspace(-4.9, 6, 101), torch.linspace(6, 80, 40)]).to(dtype)
    expected = torch.polygamma(n, x)
    reference = torch.polygamma(n, x.double())
    with accelkit.fallback_policy("deny"):
        got = torch.polygamma(n, x.to(dev)).cpu()
    assert got.dtype == dtype
    assert torch.equal(expected.isnan(), got.isnan())
    assert torch.equal(expected[expected.isinf()], got[expected.isinf()])
    finite = torch.isfinite(expected)
    if dtype == torch.float32:
        # a few float32 ulps beside the CPU's own float32 error, and beside what four ulps of x
        # move the result by: near a pole the sum's large terms cancel, and a last-bit
        # difference in each (the Vector engine's pow, the CPU's libm) is amplified as much
        eps = torch.finfo(dtype).eps
        step = x.double() * 4 * eps
        sensitivity = ((torch.polygamma(n, x.double() + step) - torch.polygamma(n, x.double() - step)).abs() / 2)
        allowed = (8 * eps * expected.double().abs() + 4 * (expected.double() - reference).abs()
                   + sensitivity.nan_to_num(0.0, posinf=0.0))
        assert bool(((got.double() - expected.double()).abs() <= allowed)[finite].all())
    else:
        # float32 rounded once, against the CPU's float32 (its bfloat16 kernel rounds its sum's
        # terms to bfloat16 first, and near -1.5 and -2.5 they cancel: 416 where the value is -4.03)
        in_float = torch.polygamma(n, x.float()).to(dtype)
        torch.testing.assert_close(got[finite], in_float[finite], rtol=torch.finfo(dtype).eps, atol=0)
    assert_decomposed("aten.polygamma")
    assert accelkit.stats()["neuron"]["estimate"]["per_op"]["special_zeta.self_scalar"]["seconds"] > 0


def test_polygamma_out_form_runs_on_the_device(dev):
    """The conformance suite calls ``aten.polygamma.out``: it runs as the decomposition too."""
    x = torch.linspace(-3.7, 9, 50)
    out = torch.empty(50).to(dev)
    with accelkit.fallback_policy("deny"):
        torch.polygamma(3, x.to(dev), out=out)
    torch.testing.assert_close(out.cpu(), torch.polygamma(3, x), rtol=1e-6, atol=0)
    assert_decomposed("aten.polygamma")


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
@pytest.mark.parametrize("n", [0, 1, 3])
def test_polygamma_of_integers_is_the_cpus_float(dev, dtype, n):
    """An integer or bool argument is promoted to the default float type, as on the CPU."""
    x = torch.tensor([-3, -1, 0, 1, 2, 5, 40]).to(dtype)
    expected = torch.polygamma(n, x)
    with accelkit.fallback_policy("deny"):
        got = torch.polygamma(n, x.to(dev)).cpu()
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=0, equal_nan=True)
    assert_decomposed("aten.polygamma")
