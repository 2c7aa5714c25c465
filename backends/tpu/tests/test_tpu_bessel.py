"""tpu Bessel functions J0, J1, Y0, Y1, K0, K1 (plain and scaled) and Airy Ai against CPU,
under ``fallback_policy("deny")``.

The points cross every switch between the lowerings' methods (series to asymptotic expansion at
|x| = 8, series to quadrature and to asymptotics for Ai at 1.5 and -4), the domain edges (0 of
either sign, negative arguments of Y and K, infinities, NaN) and large arguments where K
underflows and the scaled K decays like 1/sqrt(x).
"""

from __future__ import annotations

import pytest
import torch

import accelkit
from conftest import assert_native

EDGES = torch.tensor([-float("inf"), -30.0, -8.01, -8.0, -7.99, -4.01, -4.0, -3.99, -1.0, -0.0, 0.0, 1e-30,
                      1e-3, 0.5, 1.49, 1.5, 1.51, 3.0, 7.99, 8.0, 8.01, 25.0, 80.0, 1e3, 1e30, float("inf"),
                      float("nan")])
SWEEP = torch.linspace(-30, 30, 1201)
NAMES = ["bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "modified_bessel_k0", "modified_bessel_k1",
         "scaled_modified_bessel_k0", "scaled_modified_bessel_k1", "airy_ai"]
# Absolute tolerance matters near the zeros of the oscillating functions, where both sides
# carry float32 rounding of order 1e-6 of the function's amplitude.
TOL = {"rtol": 1e-4, "atol": 2e-5}


@pytest.mark.parametrize("name", NAMES)
def test_bessel_function_at_domain_edges_and_method_switches(dev, name):
    fn = getattr(torch.special, name)
    with accelkit.fallback_policy("deny"):
        got = fn(EDGES.to(dev)).cpu()
    torch.testing.assert_close(got, fn(EDGES), equal_nan=True, **TOL)
    assert_native(f"aten.special_{name}.default")


@pytest.mark.parametrize("name", NAMES)
def test_bessel_function_over_a_sweep(dev, name):
    fn = getattr(torch.special, name)
    with accelkit.fallback_policy("deny"):
        got = fn(SWEEP.to(dev)).cpu()
    torch.testing.assert_close(got, fn(SWEEP), equal_nan=True, **TOL)


def test_small_arguments_where_y_and_k_diverge(dev):
    x = torch.logspace(-20, 0, 41)
    for name in ("bessel_y0", "bessel_y1", "modified_bessel_k0", "modified_bessel_k1", "scaled_modified_bessel_k1"):
        fn = getattr(torch.special, name)
        with accelkit.fallback_policy("deny"):
            got = fn(x.to(dev)).cpu()
        torch.testing.assert_close(got, fn(x), rtol=1e-4, atol=0, msg=name)


def test_integer_input_and_out_variant(dev):
    x = torch.arange(-3, 10)
    with accelkit.fallback_policy("deny"):
        got = torch.special.bessel_j1(x.to(dev))
        out = torch.empty(13, device=dev)
        torch.special.modified_bessel_k0(x.float().to(dev), out=out)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.cpu(), torch.special.bessel_j1(x), **TOL)
    torch.testing.assert_close(out.cpu(), torch.special.modified_bessel_k0(x.float()), equal_nan=True, **TOL)
