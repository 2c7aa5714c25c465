"""tpu ``F.grid_sample`` (``grid_sampler_2d``/``_3d``) against CPU under ``fallback_policy("deny")``:
every interpolation and padding mode with and without ``align_corners``, grids reaching well
outside ``[-1, 1]`` (where the padding rules differ), exact pixel centres, single-pixel inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import accelkit
from conftest import assert_native


def check(dev, x, grid, **kwargs):
    want = F.grid_sample(x, grid, **kwargs)
    with accelkit.fallback_policy("deny"):
        got = F.grid_sample(x.to(dev), grid.to(dev), **kwargs)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


def inputs(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    grid_shape = (shape[0],) + tuple(s + 1 for s in shape[2:]) + (len(shape) - 2,)
    return torch.randn(shape, generator=g), torch.rand(grid_shape, generator=g) * 3.4 - 1.7


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_2d(dev, mode, padding_mode, align_corners):
    x, grid = inputs(2, 3, 5, 7)
    check(dev, x, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    assert_native("aten.grid_sampler_2d.default")


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_3d(dev, mode, padding_mode, align_corners):
    x, grid = inputs(2, 2, 3, 4, 5, seed=1)
    check(dev, x, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    assert_native("aten.grid_sampler_3d.default")


def test_pixel_centres_reproduce_the_input(dev):
    x = torch.randn(1, 2, 4, 6)
    ys, xs = torch.meshgrid(torch.linspace(-1, 1, 4), torch.linspace(-1, 1, 6), indexing="ij")
    grid = torch.stack([xs, ys], dim=-1)[None]
    for mode in ("bilinear", "nearest", "bicubic"):
        check(dev, x, grid, mode=mode, align_corners=True)


@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_single_pixel_input(dev, padding_mode):
    x, grid = torch.randn(1, 1, 1, 1), torch.rand(1, 3, 3, 2) * 4 - 2
    for align_corners in (False, True):
        check(dev, x, grid, mode="bilinear", padding_mode=padding_mode, align_corners=align_corners)
