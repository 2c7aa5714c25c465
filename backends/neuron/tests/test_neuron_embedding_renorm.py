"""``embedding_renorm_`` (``decompositions/embedding.py``) against the CPU, the fallback denied:
rows over and under ``max_norm``, repeated indices, p 1, 2, 3 and inf, float32 and bfloat16,
and ``F.embedding(max_norm=...)`` that calls it."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import accelkit


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("p", [1.0, 2.0, 3.0, math.inf])
def test_embedding_renorm_matches_the_cpu(dev, dtype, p):
    weight = (torch.randn(10, 4, generator=torch.Generator().manual_seed(0)) * 2).to(dtype)
    indices = torch.tensor([[1, 3], [3, 7], [0, 9]])
    expected = weight.clone()
    torch.embedding_renorm_(expected, indices, 1.5, p)
    got = weight.to(dev)
    with accelkit.fallback_policy("deny"):
        torch.embedding_renorm_(got, indices.to(dev), 1.5, p)
    tolerance = dict(atol=1e-2, rtol=1e-2) if dtype == torch.bfloat16 else dict(atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got.cpu(), expected, **tolerance)
    assert not torch.equal(expected, weight)  # some row was over the bound
    counts = accelkit.stats()["ops"]["aten.embedding_renorm_.default"]
    assert counts["decomposed"] > 0 and not counts["fallback"]


def test_embedding_with_max_norm_stays_on_the_device(dev):
    weight = torch.randn(12, 5, generator=torch.Generator().manual_seed(1)) * 3
    indices = torch.tensor([2, 5, 5, 11])
    expected_weight = weight.clone()
    expected = F.embedding(indices, expected_weight, max_norm=1.0)
    device_weight = weight.to(dev)
    with accelkit.fallback_policy("deny"):
        got = F.embedding(indices.to(dev), device_weight, max_norm=1.0).cpu()
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(device_weight.cpu(), expected_weight, atol=1e-6, rtol=1e-5)
