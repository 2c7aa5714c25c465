"""tpu ``torch.linalg.lstsq`` against CPU under ``fallback_policy("deny")``: every driver's result
set (which outputs are empty, their shapes and dtypes), over-, under- and exactly determined
systems, a rank-deficient matrix with ``gelsd``/``gelsy`` (minimum-norm solution, rank), vector
right-hand sides, broadcast batches and complex input."""

from __future__ import annotations

import pytest
import torch

import accelkit
from conftest import assert_native

TOL = {"rtol": 1e-4, "atol": 1e-4}


def check(dev, a, b, **kwargs):
    want = torch.linalg.lstsq(a, b, **kwargs)
    with accelkit.fallback_policy("deny"):
        got = torch.linalg.lstsq(a.to(dev), b.to(dev), **kwargs)
    for name, g, w in zip(("solution", "residuals", "rank", "singular_values"), got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        torch.testing.assert_close(g.cpu(), w, msg=name, **TOL)


@pytest.mark.parametrize("driver", [None, "gelsy", "gelsd", "gelss", "gels"])
@pytest.mark.parametrize("shape", [(6, 3), (3, 3), (2, 4)])
def test_every_driver_and_shape(dev, driver, shape):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, *shape, generator=g), torch.randn(2, shape[0], 2, generator=g)
    check(dev, a, b, driver=driver)
    assert_native("aten.linalg_lstsq.default")


@pytest.mark.parametrize("driver", ["gelsy", "gelsd"])
def test_rank_deficient_minimum_norm_solution(dev, driver):
    a = torch.randn(5, 3)
    a[:, 2] = 2 * a[:, 0]
    b = torch.randn(5, 2)
    want = torch.linalg.lstsq(a, b, driver=driver)
    with accelkit.fallback_policy("deny"):
        got = torch.linalg.lstsq(a.to(dev), b.to(dev), driver=driver)
    torch.testing.assert_close(got.solution.cpu(), want.solution, **TOL)
    assert int(got.rank) == int(want.rank) == 2


def test_vector_rhs_broadcast_batch_and_complex(dev):
    check(dev, torch.randn(5, 3), torch.randn(5), driver="gelsd")
    check(dev, torch.randn(2, 4, 3), torch.randn(1, 4, 2), driver="gelss")
    check(dev, torch.randn(5, 3, dtype=torch.complex64), torch.randn(5, 2, dtype=torch.complex64), driver="gelsd")
