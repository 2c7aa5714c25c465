"""tpu cdist and pdist against CPU under ``fallback_policy("deny")``: every p family (0, fractional,
1, 2, other, inf), both forms of the Euclidean distance (direct, and matrix product for more
than 25 rows or when asked), broadcast batches, repeated points and empty inputs."""

from __future__ import annotations

import pytest
import torch

import accelkit
from conftest import assert_native

TOL = {"rtol": 1e-5, "atol": 1e-5}
PS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf")]


def rows(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def run(fn, *args, **kwargs):
    with accelkit.fallback_policy("deny"):
        return fn(*args, **kwargs).cpu()


@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("mode", ["use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist",
                                  "donot_use_mm_for_euclid_dist"])
def test_cdist_every_p_and_compute_mode(dev, p, mode):
    a, b = rows(2, 1, 7, 5), rows(3, 4, 5, seed=1)
    b[0, 2] = a[1, 0, 3]  # a repeated point: distance 0 on the direct path
    got = run(torch.cdist, a.to(dev), b.to(dev), p=p, compute_mode=mode)
    torch.testing.assert_close(got, torch.cdist(a, b, p=p, compute_mode=mode), **TOL)


def test_cdist_large_inputs_take_the_matrix_product_path(dev):
    a, b = rows(40, 16), rows(30, 16, seed=1)
    torch.testing.assert_close(run(torch.cdist, a.to(dev), b.to(dev)), torch.cdist(a, b), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(run(torch.cdist, a.to(dev), b.to(dev), p=1.0), torch.cdist(a, b, p=1.0), **TOL)
    assert_native("aten._cdist_forward.default")


@pytest.mark.parametrize("shapes", [((0, 5), (4, 5)), ((3, 0), (2, 0)), ((0, 4, 5), (1, 3, 5))])
def test_cdist_empty(dev, shapes):
    a, b = rows(*shapes[0]), rows(*shapes[1], seed=1)
    got = run(torch.cdist, a.to(dev), b.to(dev), p=1.5)
    torch.testing.assert_close(got, torch.cdist(a, b, p=1.5))


@pytest.mark.parametrize("p", PS)
def test_pdist_every_p(dev, p):
    x = rows(6, 4)
    x[4] = x[1]
    torch.testing.assert_close(run(torch.nn.functional.pdist, x.to(dev), p=p), torch.nn.functional.pdist(x, p=p), **TOL)
    assert_native("aten._pdist_forward.default")


@pytest.mark.parametrize("n", [0, 1, 2])
def test_pdist_with_fewer_than_three_rows(dev, n):
    x = rows(n, 3)
    torch.testing.assert_close(run(torch.nn.functional.pdist, x.to(dev)), torch.nn.functional.pdist(x))
