"""tpu bicubic and antialiased bilinear resizing (``F.interpolate``) against CPU under
``fallback_policy("deny")``: up- and downscaling, given sizes and given scale factors (which
change the source positions), ``align_corners``, single-pixel outputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import accelkit
from conftest import assert_native

TOL = {"rtol": 1e-5, "atol": 1e-5}
SIZES = [{"size": (3, 4)}, {"size": (9, 13)}, {"size": (1, 1)}, {"scale_factor": 1.7}, {"scale_factor": 0.6},
         {"scale_factor": (0.8, 2.3)}]


def check(dev, x, **kwargs):
    want = F.interpolate(x, **kwargs)
    with accelkit.fallback_policy("deny"):
        got = F.interpolate(x.to(dev), **kwargs)
    torch.testing.assert_close(got.cpu(), want, **TOL)


@pytest.mark.parametrize("resize", SIZES)
@pytest.mark.parametrize("align_corners", [False, True])
def test_bicubic(dev, resize, align_corners):
    check(dev, torch.randn(2, 3, 6, 7), mode="bicubic", align_corners=align_corners, **resize)
    assert_native("aten.upsample_bicubic2d.default")


@pytest.mark.parametrize("resize", SIZES)
@pytest.mark.parametrize("align_corners", [False, True])
def test_antialiased_bilinear(dev, resize, align_corners):
    check(dev, torch.randn(2, 3, 10, 20), mode="bilinear", antialias=True, align_corners=align_corners, **resize)
    assert_native("aten._upsample_bilinear2d_aa.default")


def test_recomputed_scale_factor(dev):
    x = torch.randn(1, 2, 5, 5)
    check(dev, x, mode="bicubic", scale_factor=1.7, recompute_scale_factor=True)
    check(dev, x, mode="bilinear", antialias=True, scale_factor=0.45, recompute_scale_factor=False)
