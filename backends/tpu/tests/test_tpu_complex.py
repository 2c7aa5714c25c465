"""tpu complex-number lowerings (kernels/complex.py) against CPU: ``angle`` of real input (signed
zeros, NaN) and of complex input, ``torch.complex`` broadcasting and keeping the imaginary part's
signed zero, and ``torch.polar``.

Each check runs one call on CPU and on a tpu copy of the input, compares the values and dtypes,
and asserts the aten ops ran natively.
"""

from __future__ import annotations

import torch

from conftest import assert_native
from harness_complex import check, cplx, real


def test_angle_of_real_and_complex(dev):
    x = torch.tensor([-2.0, -0.0, 0.0, 3.0, float("nan")])
    check(dev, torch.angle, x, "aten.angle.default")
    check(dev, torch.angle, cplx((7,)), "aten.angle.default")


def test_complex_broadcasts_and_keeps_signed_zero(dev):
    re, im = real((3, 1)), torch.tensor([-0.0, 0.0, 1.5])
    want = torch.complex(re, im)
    got = torch.complex(re.to(dev), im.to(dev)).cpu()
    torch.testing.assert_close(got, want)
    assert torch.equal(torch.signbit(got.imag), torch.signbit(want.imag))
    assert_native("aten.complex.default")


def test_polar(dev):
    check(dev, lambda t: torch.polar(t.abs(), t), real((4, 3)), "aten.polar.default")
