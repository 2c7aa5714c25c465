"""Helpers of the FFT and complex-number tests: real and complex inputs, and ``check``, which
runs one call on CPU and on a tpu copy, compares values and dtypes, and asserts the named aten
ops ran natively."""

from __future__ import annotations

import torch

from conftest import assert_native, on_device


TOL = {"atol": 1e-4, "rtol": 1e-4}


def real(shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def cplx(shape, seed=0):
    return torch.complex(real(shape, seed), real(shape, seed + 1))


def check(dev, fn, x, *ops):
    want = fn(x)
    got = fn(on_device(x, dev))
    assert got.device.type == "tpu"
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.cpu(), want, equal_nan=True, **TOL)
    assert_native(*ops)
