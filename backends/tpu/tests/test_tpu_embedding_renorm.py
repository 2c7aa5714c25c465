"""tpu ``embedding`` with ``max_norm`` (``embedding_renorm_`` rescales the named rows of the weight
in place) against CPU under ``fallback_policy("deny")``: repeated indices, rows under the limit,
several norm types, a 2-d index batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import accelkit
from conftest import assert_native


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf")])
def test_embedding_max_norm_renormalises_named_rows_in_place(dev, norm_type):
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(10, 4, generator=g) * 3
    weight[7] = 0.01  # named, but already under the limit
    indices = torch.tensor([[1, 7, 1], [3, 9, 1]])
    cpu_weight = weight.clone()
    want = F.embedding(indices, cpu_weight, max_norm=1.5, norm_type=norm_type)
    device_weight = weight.to(dev)
    with accelkit.fallback_policy("deny"):
        got = F.embedding(indices.to(dev), device_weight, max_norm=1.5, norm_type=norm_type)
    torch.testing.assert_close(got.cpu(), want)
    torch.testing.assert_close(device_weight.cpu(), cpu_weight)  # rows 0, 2, 4-6, 8 untouched
    assert_native("aten.embedding_renorm_.default")


def test_embedding_renorm_functional_op(dev):
    weight, indices = torch.randn(5, 3) * 4, torch.tensor([0, 4, 4])
    want = torch.ops.aten.embedding_renorm(weight, indices, 2.0, 2.0)
    with accelkit.fallback_policy("deny"):
        got = torch.ops.aten.embedding_renorm(weight.to(dev), indices.to(dev), 2.0, 2.0)
    torch.testing.assert_close(got.cpu(), want)
