"""tpu ``torch.ormqr`` (apply geqrf's Q, or its conjugate transpose, from either side) against CPU
under ``fallback_policy("deny")``: tall, square and batched factors, real and complex, and empty
matrices."""

from __future__ import annotations

import pytest
import torch

import accelkit
from conftest import assert_native


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("shape, other", [((5, 3), 4), ((2, 6, 6), 2), ((4, 4), 1)])
def test_ormqr_matches_cpu(dev, dtype, left, transpose, shape, other):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(shape, generator=g, dtype=dtype)
    factor, tau = torch.geqrf(a)
    m = shape[-2]
    c = torch.randn(shape[:-2] + ((m, other) if left else (other, m)), generator=g, dtype=dtype)
    want = torch.ormqr(factor, tau, c, left=left, transpose=transpose)
    with accelkit.fallback_policy("deny"):
        got = torch.ormqr(factor.to(dev), tau.to(dev), c.to(dev), left=left, transpose=transpose)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    assert_native("aten.ormqr.default")


def test_ormqr_empty(dev):
    factor, tau, c = torch.empty(0, 0), torch.empty(0), torch.empty(0, 3)
    with accelkit.fallback_policy("deny"):
        got = torch.ormqr(factor.to(dev), tau.to(dev), c.to(dev))
    assert got.shape == (0, 3)
