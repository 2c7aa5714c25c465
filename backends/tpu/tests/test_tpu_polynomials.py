"""tpu orthogonal polynomials (torch.special's Chebyshev, shifted Chebyshev, Hermite, Laguerre,
Legendre) against CPU under ``fallback_policy("deny")``.

The grid crosses every branch of PyTorch's definitions: negative and fractional degrees, the
interval's ends (x = +-1, and 0, 1 for the shifted forms), degrees above the trigonometric-form
thresholds inside the interval, and |x| > 1 where the recurrence grows large.
"""

from __future__ import annotations

import pytest
import torch

import accelkit
from conftest import assert_native

TOL = {"rtol": 1e-4, "atol": 1e-4}
KINDS = [f"chebyshev_polynomial_{k}" for k in "tuvw"] + [f"shifted_chebyshev_polynomial_{k}" for k in "tuvw"] + [
    "hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p"]
XS = torch.tensor([-9.0, -3.3, -1.0, -0.999, -0.7, -0.5, -0.1, 0.0, 0.1, 0.25, 0.5, 0.77, 0.999, 1.0, 1.5, 2.2, 8.9])
NS = torch.tensor([-3.0, -1.0, -0.5, 0.0, 0.7, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 13.0, 25.0])


def run(fn, *args):
    with accelkit.fallback_policy("deny"):
        return fn(*args).cpu()


@pytest.mark.parametrize("name", KINDS)
def test_polynomial_on_grid_of_arguments_and_degrees(dev, name):
    fn = getattr(torch.special, name)
    x, n = torch.meshgrid(XS, NS, indexing="ij")
    got = run(fn, x.to(dev), n.to(dev))
    torch.testing.assert_close(got, fn(x, n), equal_nan=True, **TOL)
    assert_native(f"aten.special_{name}.default")


@pytest.mark.parametrize("name", KINDS)
def test_polynomial_scalar_and_integer_degrees(dev, name):
    fn = getattr(torch.special, name)
    x = torch.linspace(-2, 2, 23)
    torch.testing.assert_close(run(fn, x.to(dev), 5), fn(x, 5), **TOL)
    n = torch.arange(-2, 12)
    torch.testing.assert_close(run(fn, 0.375, n.to(dev)), fn(0.375, n), **TOL)
    torch.testing.assert_close(run(fn, x[:, None].to(dev), n.to(dev)), fn(x[:, None], n), **TOL)


def test_polynomial_out_variant_and_empty_input(dev):
    x, n = torch.randn(3, 4), torch.randint(0, 7, (4,)).float()
    out = torch.empty(3, 4, device=dev)
    with accelkit.fallback_policy("deny"):
        torch.special.legendre_polynomial_p(x.to(dev), n.to(dev), out=out)
        empty = torch.special.hermite_polynomial_h(torch.empty(0, 3, device=dev), torch.ones(3, device=dev))
    torch.testing.assert_close(out.cpu(), torch.special.legendre_polynomial_p(x, n), **TOL)
    assert empty.shape == (0, 3)

