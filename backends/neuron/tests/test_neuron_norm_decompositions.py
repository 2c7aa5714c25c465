"""``batch_norm_update_stats`` and ``_weight_norm_interface_backward`` (``decompositions/norm.py``)
against the CPU, the fallback denied, float32 and bfloat16 (within float rounding)."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_decomposed

aten = torch.ops.aten


pytestmark = pytest.mark.usefixtures("deny_fallback")


def _close(got, expected):
    got = got.cpu()
    assert got.dtype == expected.dtype and got.shape == expected.shape
    tolerance = dict(atol=2e-2, rtol=2e-2) if expected.dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, expected, **tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("running", [True, False])
def test_batch_norm_update_stats(dev, dtype, running):
    x = (torch.randn(4, 3, 5, 2, generator=torch.Generator().manual_seed(0)) * 3 + 1).to(dtype)
    stats = [torch.randn(3).abs(), torch.rand(3) + 0.5] if running else [None, None]
    device_stats = [None if s is None else s.to(dev) for s in stats]
    expected = aten.batch_norm_update_stats(x, *stats, 0.1)
    got = aten.batch_norm_update_stats(x.to(dev), *device_stats, 0.1)
    for e, g in zip(expected, got):
        _close(g, e)
    for e, g in zip(stats, device_stats):
        if e is not None:
            _close(g, e)
    assert_decomposed("aten.batch_norm_update_stats.default")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim", [0, 2])
def test_weight_norm_interface_backward(dev, dtype, dim):
    generator = torch.Generator().manual_seed(1)
    v = torch.randn(6, 3, 4, generator=generator).to(dtype)
    g_shape = [1, 1, 1]
    g_shape[dim] = v.shape[dim]
    g = torch.randn(g_shape, generator=generator).to(dtype)
    grad_w = torch.randn(6, 3, 4, generator=generator).to(dtype)
    norms = torch._weight_norm_interface(v, g, dim)[1]
    expected = aten._weight_norm_interface_backward(grad_w, v, g, norms, dim)
    got = aten._weight_norm_interface_backward(grad_w.to(dev), v.to(dev), g.to(dev), norms.to(dev), dim)
    for e, o in zip(expected, got):
        _close(o, e)
    assert_decomposed("aten._weight_norm_interface_backward.default")
