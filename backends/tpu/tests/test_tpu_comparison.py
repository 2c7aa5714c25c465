"""tpu whole-tensor comparison (kernels/comparison.py): ``torch.equal``, one Python bool for two
tensors, against CPU — equal views, NaN (never equal to itself), different values, different
shapes and different dtypes."""

from __future__ import annotations

import torch

from conftest import assert_native


def test_equal(dev):
    a = torch.tensor([1.0, 2.0, float("nan")])
    cases = [(a[:2], a[:2]), (a, a), (a[:2], torch.tensor([1.0, 3.0])), (a[:2], a[:2].reshape(2, 1)),
             (torch.arange(3), torch.arange(3.0))]
    for x, y in cases:
        assert torch.equal(x.to(dev), y.to(dev)) is torch.equal(x, y)
    assert_native("aten.equal.default")
