"""tpu ``torch.segment_reduce`` against CPU under ``fallback_policy("deny")``: every reduction, with
and without ``initial``, lengths and offsets, empty segments, NaN, an inner axis with per-row
segmentations and trailing dimensions."""

from __future__ import annotations

import pytest
import torch

import accelkit
from conftest import assert_native

REDUCTIONS = ["sum", "prod", "max", "min", "mean"]


def check(dev, data, reduce, **kwargs):
    want = torch.segment_reduce(data, reduce, **kwargs)
    on_device = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    with accelkit.fallback_policy("deny"):
        got = torch.segment_reduce(data.to(dev), reduce, **on_device)
    torch.testing.assert_close(got.cpu(), want, equal_nan=True)


@pytest.mark.parametrize("reduce", REDUCTIONS)
@pytest.mark.parametrize("initial", [None, 10.0, -1.0])
def test_lengths_with_empty_segments_and_trailing_dims(dev, reduce, initial):
    data = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    check(dev, data, reduce, lengths=torch.tensor([2, 0, 3, 1]), initial=initial)
    check(dev, data[:, 0], reduce, offsets=torch.tensor([0, 2, 2, 5, 6]), initial=initial)
    assert_native("aten.segment_reduce.default")


@pytest.mark.parametrize("reduce", REDUCTIONS)
def test_inner_axis_with_a_segmentation_per_row(dev, reduce):
    data = torch.arange(24.0).reshape(3, 4, 2) / 7
    check(dev, data, reduce, lengths=torch.tensor([[1, 3], [2, 2], [4, 0]]), axis=1)


def test_nan_propagates_through_max_and_min(dev):
    data = torch.tensor([1.0, float("nan"), 3.0, 4.0])
    for reduce in ("max", "min"):
        check(dev, data, reduce, lengths=torch.tensor([2, 2]))
        check(dev, data, reduce, lengths=torch.tensor([2, 2]), initial=0.0)
