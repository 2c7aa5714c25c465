"""tpu special-function lowerings (kernels/special.py: gamma family, the modified Bessel functions
I0 and I1 and spherical j0, erfcx/ndtri, zeta, igamma), against CPU. (J0, J1, Y0, Y1, K0, K1 and Ai
are in ``test_tpu_bessel.py``.)

Inputs cover the awkward parts of each domain: poles and negative non-integers of the gamma
family, zeros, large arguments where the scaled Bessel functions matter.
"""

from __future__ import annotations

import pytest
import torch

from conftest import assert_native

TOL = {"atol": 1e-4, "rtol": 1e-4}
GAMMA_POINTS = torch.tensor([-8.4784, -2.5, -1.0, -0.0, 0.0, 0.3, 1.0, 2.5, 7.0, 30.0])
WIDE_POINTS = torch.tensor([-20.0, -3.5, -1.0, -0.25, 0.0, 0.25, 1.0, 3.5, 20.0, 80.0])


def check(dev, fn, *inputs, op, tol=TOL):
    want = fn(*inputs)
    got = fn(*[x.to(dev) for x in inputs])
    assert got.device.type == "tpu" and got.dtype == want.dtype
    torch.testing.assert_close(got.cpu(), want, equal_nan=True, **tol)
    assert_native(op)


@pytest.mark.parametrize("fn, op", [
    (torch.lgamma, "aten.lgamma.default"),
    (torch.digamma, "aten.digamma.default"),
])
def test_gamma_family_at_poles_and_negative_arguments(dev, fn, op):
    check(dev, fn, GAMMA_POINTS, op=op)


@pytest.mark.parametrize("n", [0, 1, 2, 4])
def test_polygamma_including_negative_non_integers(dev, n):
    # Not at negative integers: CPU's values there are float32 rounding artifacts (1e15 for n=1).
    x = torch.tensor([-8.4784, -2.5, -0.5, 0.3, 1.0, 2.5, 7.0])
    check(dev, lambda x: torch.polygamma(n, x), x,
          op="aten.polygamma.default", tol={"atol": 1e-3, "rtol": 1e-3})


@pytest.mark.parametrize("n", [1, 2, 3])
def test_polygamma_at_zero_and_at_non_positive_integers_is_an_infinity_of_the_cpus_sign(dev, n):
    # Poles of zeta(n + 1, x): PyTorch gives +inf there (times polygamma's sign). Only the sign
    # of infinity is compared at negative integers, where CPU float32 sometimes rounds to 1e15.
    x = torch.tensor([0.0, -1.0, -3.0])
    got, want = torch.polygamma(n, x.to(dev)).cpu(), torch.polygamma(n, x)
    assert torch.isinf(got).all() and torch.equal(got[0], want[0])
    assert torch.equal(got.sign(), want.sign())
    check(dev, lambda b: torch.polygamma(n, b), torch.tensor([True, False]), op="aten.polygamma.default")


def test_zeta_at_the_poles_of_q_is_inf_as_on_the_cpu(dev):
    x = torch.tensor([3.0, 2.5, 3.0, 1.0, 0.5])
    q = torch.tensor([0.0, -2.0, -2.5, 0.0, 0.0])
    check(dev, torch.special.zeta, x, q, op="aten.special_zeta.default")


def test_mvlgamma_runs_on_inplace_lgamma(dev):
    check(dev, lambda x: torch.mvlgamma(x, 3), torch.tensor([1.5, 2.0, 4.25, 9.0]), op="aten.lgamma_.default")


@pytest.mark.parametrize("fn, op", [
    (torch.i0, "aten.i0.default"),
    (torch.special.i0e, "aten.special_i0e.default"),
    (torch.special.i1, "aten.special_i1.default"),
    (torch.special.i1e, "aten.special_i1e.default"),
    (torch.special.modified_bessel_i0, "aten.special_modified_bessel_i0.default"),
    (torch.special.modified_bessel_i1, "aten.special_modified_bessel_i1.default"),
    (torch.special.erfcx, "aten.special_erfcx.default"),
    (torch.special.spherical_bessel_j0, "aten.special_spherical_bessel_j0.default"),
])
def test_unary_special_functions(dev, fn, op):
    x = WIDE_POINTS if "i0" not in op and "i1" not in op or op.endswith("e.default") else WIDE_POINTS / 4
    check(dev, fn, x, op=op)


def test_ndtri_and_log_ndtr(dev):
    check(dev, torch.special.ndtri, torch.tensor([0.0, 1e-6, 0.025, 0.5, 0.9, 1.0]), op="aten.special_ndtri.default")
    check(dev, torch.special.log_ndtr, WIDE_POINTS, op="aten.special_erfcx.default")


def test_integer_input_computes_in_float32(dev):
    check(dev, torch.lgamma, torch.arange(1, 8), op="aten.lgamma.default")


def test_zeta_broadcasts(dev):
    check(dev, torch.special.zeta, torch.tensor([[1.5], [2.0], [4.0]]), torch.tensor([0.5, 1.0, 3.0]),
          op="aten.special_zeta.default")


def test_incomplete_gamma(dev):
    a, x = torch.tensor([0.5, 1.0, 3.0, 10.0]), torch.tensor([0.1, 1.0, 2.5, 12.0])
    check(dev, torch.igamma, a, x, op="aten.igamma.default")
    check(dev, torch.igammac, a, x, op="aten.igammac.default")
