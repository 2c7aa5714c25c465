"""neuron's decomposed backwards of upsampling and replication padding vs CPU PyTorch.

``decompositions.py`` folds the output gradient back along each spatial dim with ``index_add``;
these run every form (nearest, nearest-exact, linear 1-3d, bicubic, replication pad 1-3d) forward and
backward with the CPU fallback denied, and compare the input gradient with the CPU's: float32
within a few ulps (the additions' order differs), bfloat16 within one bfloat16 step of the sum.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import accelkit

SHAPES = {1: (2, 3, 7), 2: (2, 3, 5, 6), 3: (1, 2, 3, 4, 5)}

CASES = {
    "nearest1d_size": (1, lambda t: F.interpolate(t, size=17, mode="nearest"), "upsample_nearest1d_backward"),
    "nearest1d_shrink": (1, lambda t: F.interpolate(t, size=4, mode="nearest"), "upsample_nearest1d_backward"),
    "nearest2d_scale": (2, lambda t: F.interpolate(t, scale_factor=(1.7, 2.3), mode="nearest"),
                        "upsample_nearest2d_backward"),
    "nearest3d_size": (3, lambda t: F.interpolate(t, size=(5, 7, 9), mode="nearest"), "upsample_nearest3d_backward"),
    "nearest_exact1d": (1, lambda t: F.interpolate(t, size=10, mode="nearest-exact"),
                        "_upsample_nearest_exact1d_backward"),
    "nearest_exact2d": (2, lambda t: F.interpolate(t, scale_factor=2.5, mode="nearest-exact"),
                        "_upsample_nearest_exact2d_backward"),
    "nearest_exact3d": (3, lambda t: F.interpolate(t, size=(5, 3, 9), mode="nearest-exact"),
                        "_upsample_nearest_exact3d_backward"),
    "linear1d_corners": (1, lambda t: F.interpolate(t, size=11, mode="linear", align_corners=True),
                         "upsample_linear1d_backward"),
    "linear1d_shrink": (1, lambda t: F.interpolate(t, size=5, mode="linear"), "upsample_linear1d_backward"),
    "bilinear_scale": (2, lambda t: F.interpolate(t, scale_factor=1.6, mode="bilinear"),
                       "upsample_bilinear2d_backward"),
    "bilinear_corners": (2, lambda t: F.interpolate(t, size=(9, 4), mode="bilinear", align_corners=True),
                         "upsample_bilinear2d_backward"),
    "trilinear_size": (3, lambda t: F.interpolate(t, size=(4, 7, 3), mode="trilinear"),
                       "upsample_trilinear3d_backward"),
    "trilinear_scale_corners": (3, lambda t: F.interpolate(t, scale_factor=1.5, mode="trilinear",
                                                           align_corners=True), "upsample_trilinear3d_backward"),
    "bicubic_size": (2, lambda t: F.interpolate(t, size=(9, 11), mode="bicubic"), "upsample_bicubic2d_backward"),
    "bicubic_corners_shrink": (2, lambda t: F.interpolate(t, size=(3, 4), mode="bicubic", align_corners=True),
                               "upsample_bicubic2d_backward"),
    "bicubic_scale": (2, lambda t: F.interpolate(t, scale_factor=1.7, mode="bicubic"), "upsample_bicubic2d_backward"),
    "replicate1d": (1, lambda t: F.pad(t, (2, 3), mode="replicate"), "replication_pad1d_backward"),
    "replicate2d": (2, lambda t: F.pad(t, (2, 3, 1, 4), mode="replicate"), "replication_pad2d_backward"),
    "replicate2d_unbatched": (2, lambda t: F.pad(t[0], (0, 2, 3, 0), mode="replicate"),
                              "replication_pad2d_backward"),
    "replicate3d": (3, lambda t: F.pad(t, (2, 3, 1, 0, 2, 2), mode="replicate"), "replication_pad3d_backward"),
}


def _gradients(fn, x: torch.Tensor, grad_seed: int, device) -> torch.Tensor:
    x = x.detach().to(device).requires_grad_()
    y = fn(x)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(grad_seed)).to(y.dtype)
    y.backward(g.to(device))
    return x.grad.cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_backward_matches_cpu(dev, case, dtype):
    rank, fn, op = CASES[case]
    x = torch.randn(SHAPES[rank], generator=torch.Generator().manual_seed(rank)).to(dtype)
    expected = _gradients(fn, x, 1, "cpu")
    with accelkit.fallback_policy("deny"):
        actual = _gradients(fn, x, 1, dev)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-5)
    else:
        # one bfloat16 step of the largest sum (the CPU's pad backward rounds per addition)
        step = expected.float().abs().max().item() * 2.0 ** -7
        torch.testing.assert_close(actual.float(), expected.float(), rtol=0, atol=step)
    # the functional op runs as its out= form (a structured op): either overload counts
    runs = [counts for name, counts in accelkit.stats()["ops"].items() if name.startswith(f"aten.{op}.")]
    assert runs and all(counts.get("fallback", 0) == 0 for counts in runs), runs
    assert sum(counts.get("decomposed", 0) for counts in runs) > 0, runs


def test_nearest_backward_sums_each_input_s_copies(dev):
    """Doubling a length-3 signal: each input's gradient is the sum of its two copies', exactly."""
    x = torch.zeros(1, 1, 3, device=dev, requires_grad=True)
    y = F.interpolate(x, scale_factor=2, mode="nearest")
    with accelkit.fallback_policy("deny"):
        y.backward(torch.tensor([[[1.0, 2.0, 4.0, 8.0, 16.0, 32.0]]]).to(dev))
    assert x.grad.cpu().tolist() == [[[3.0, 12.0, 48.0]]]
