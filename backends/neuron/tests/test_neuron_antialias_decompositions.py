"""Antialiased resampling (``decompositions/antialias.py``) against the CPU, the fallback
denied: bilinear, bicubic and Lanczos, down and up, align_corners and explicit scales, forward
and backward, float32 and bfloat16 (within float rounding: the taps are summed in another order)."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_decomposed

aten = torch.ops.aten
KINDS = ["bilinear", "bicubic", "lanczos"]
GEOMETRIES = [((11, 9), (5, 13), False, None), ((8, 8), (3, 4), True, None), ((12, 10), (5, 4), False, (0.4, 0.45)),
              ((4, 5), (9, 11), False, None)]


pytestmark = pytest.mark.usefixtures("deny_fallback")


def _close(got, expected):
    got = got.cpu()
    assert got.dtype == expected.dtype and got.shape == expected.shape
    tolerance = dict(atol=3e-2, rtol=3e-2) if expected.dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, expected, **tolerance)


@pytest.mark.parametrize("dtype", [torch.float32])  # the CPU has no bfloat16 kernel
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=["down-up", "corners", "scales", "up"])
@pytest.mark.parametrize("kind", KINDS)
def test_antialiased_resampling_and_its_backward(dev, kind, geometry, dtype):
    (in_h, in_w), output_size, align_corners, scales = geometry
    scales = scales or (None, None)
    x = torch.randn(2, 3, in_h, in_w, generator=torch.Generator().manual_seed(0)).to(dtype)
    forward = getattr(aten, f"_upsample_{kind}2d_aa")
    backward = getattr(aten, f"_upsample_{kind}2d_aa_backward")
    expected = forward(x, output_size, align_corners, *scales)
    _close(forward(x.to(dev), output_size, align_corners, *scales), expected)
    grad = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    expected_grad = backward(grad, output_size, list(x.shape), align_corners, *scales)
    _close(backward(grad.to(dev), output_size, list(x.shape), align_corners, *scales), expected_grad)
    assert_decomposed(f"aten._upsample_{kind}2d_aa")
    assert_decomposed(f"aten._upsample_{kind}2d_aa_backward")


def test_interpolate_with_antialias_stays_on_the_device(dev):
    x = torch.randn(1, 3, 32, 24, generator=torch.Generator().manual_seed(2))
    for mode in ("bilinear", "bicubic"):
        expected = torch.nn.functional.interpolate(x, size=(10, 7), mode=mode, antialias=True)
        _close(torch.nn.functional.interpolate(x.to(dev), size=(10, 7), mode=mode, antialias=True), expected)
