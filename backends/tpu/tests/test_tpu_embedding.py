"""tpu ``F.embedding_bag`` forward (``_embedding_bag_forward_only``) against CPU under
``fallback_policy("deny")``: sum, mean and max bags, empty bags, ``include_last_offset``,
``padding_idx``, per-sample weights, 2-d index batches, and ``max_norm``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import accelkit
from conftest import assert_native


def check(dev, indices, weight, **kwargs):
    want = F.embedding_bag(indices, weight, **kwargs)
    on_device = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    with accelkit.fallback_policy("deny"):
        got = F.embedding_bag(indices.to(dev), weight.to(dev), **on_device)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


WEIGHT = torch.randn(10, 4, generator=torch.Generator().manual_seed(0))
INDICES = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("include_last_offset", [False, True])
@pytest.mark.parametrize("padding_idx", [None, 2])
def test_bags_with_offsets(dev, mode, include_last_offset, padding_idx):
    # The second bag is empty; with include_last_offset the last offset closes the last bag
    # (it must be len(indices): CPU's modes disagree with each other for other values).
    offsets = torch.tensor([0, 4, 4, 6, 8] if include_last_offset else [0, 4, 4, 6])
    check(dev, INDICES, WEIGHT, offsets=offsets, mode=mode, include_last_offset=include_last_offset,
          padding_idx=padding_idx)
    assert_native("aten._embedding_bag_forward_only.default")


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_two_dimensional_indices(dev, mode):
    check(dev, INDICES.reshape(2, 4), WEIGHT, mode=mode)


def test_per_sample_weights_and_ties(dev):
    check(dev, INDICES, WEIGHT, offsets=torch.tensor([0, 3]), mode="sum", per_sample_weights=torch.rand(8))
    tied = torch.ones(6, 3)
    check(dev, torch.tensor([0, 5, 3, 1]), tied, offsets=torch.tensor([0, 2]), mode="max")


def test_max_norm(dev):
    check(dev, INDICES, WEIGHT * 3, offsets=torch.tensor([0, 5]), mode="mean", max_norm=1.0)
