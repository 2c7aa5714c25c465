"""tpu ``torch.multinomial`` under ``fallback_policy("deny")``: its values are JAX's stream, so the
checks are distributional (frequencies against the weights), structural (distinct indices
without replacement, zero weights drawn last, shapes and dtype) and reproducibility under
``torch.manual_seed``."""

from __future__ import annotations

import torch

import accelkit
from conftest import assert_native


def draw(dev, weights, n, replacement=False):
    with accelkit.fallback_policy("deny"):
        return torch.multinomial(weights.to(dev), n, replacement=replacement).cpu()


def test_frequencies_follow_the_weights_with_replacement(dev):
    weights = torch.tensor([[1.0, 0.0, 6.0, 3.0], [2.0, 2.0, 2.0, 2.0]])
    samples = draw(dev, weights, 40000, replacement=True)
    assert samples.shape == (2, 40000) and samples.dtype == torch.int64
    for row, w in zip(samples, weights):
        frequency = torch.bincount(row, minlength=4) / row.numel()
        torch.testing.assert_close(frequency, w / w.sum(), atol=0.01, rtol=0)
    assert_native("aten.multinomial.default")


def test_without_replacement_indices_are_distinct_and_zero_weights_come_last(dev):
    weights = torch.tensor([[0.0, 5.0, 0.0, 1.0, 2.0]] * 50)
    samples = draw(dev, weights, 5)
    for row in samples:
        assert sorted(row.tolist()) == [0, 1, 2, 3, 4]
        assert set(row[:3].tolist()) == {1, 3, 4}
    first = torch.bincount(samples[:, 0], minlength=5)
    assert first[1] > first[3]  # the heaviest category leads most often


def test_one_dimensional_and_empty_inputs(dev):
    assert draw(dev, torch.tensor([0.2, 0.8]), 1).shape == (1,)
    assert draw(dev, torch.ones(0, 3), 2).shape == (0, 2)


def test_reproducible_under_manual_seed(dev):
    weights = torch.rand(3, 10)
    torch.manual_seed(7)
    first = draw(dev, weights, 6)
    torch.manual_seed(7)
    assert torch.equal(draw(dev, weights, 6), first)
