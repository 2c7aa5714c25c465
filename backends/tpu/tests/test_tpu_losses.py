"""tpu CTC loss forward (``_ctc_loss``) against CPU under ``fallback_policy("deny")``: padded and
concatenated targets, per-element input and target lengths, repeated labels (which forbid the
blank skip), empty targets, impossible alignments with and without ``zero_infinity``, and the
``log_alpha`` table it returns for the backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import accelkit
from conftest import assert_native


def sample(steps=12, batch=4, classes=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(steps, batch, classes, generator=g).log_softmax(-1)


def check(dev, log_probs, targets, input_lengths, target_lengths, **kwargs):
    want = F.ctc_loss(log_probs, targets, input_lengths, target_lengths, **kwargs)
    with accelkit.fallback_policy("deny"):
        got = F.ctc_loss(log_probs.to(dev), targets.to(dev), input_lengths, target_lengths, **kwargs)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_padded_targets_with_varied_lengths(dev, reduction, zero_infinity):
    targets = torch.tensor([[1, 2, 2, 3], [4, 4, 4, 0], [5, 1, 0, 0], [0, 0, 0, 0]]).clamp(min=1)
    check(dev, sample(), targets, [12, 9, 7, 12], [4, 3, 2, 0], reduction=reduction, zero_infinity=zero_infinity)
    assert_native("aten._ctc_loss.default")


@pytest.mark.parametrize("zero_infinity", [False, True])
def test_impossible_alignment(dev, zero_infinity):
    # Three repeated labels need at least five steps (blanks between repeats): four is too few.
    targets = torch.tensor([[3, 3, 3], [1, 2, 3]])
    check(dev, sample(steps=4, batch=2), targets, [4, 4], [3, 3], reduction="none", zero_infinity=zero_infinity)


def test_concatenated_targets_and_blank(dev):
    targets = torch.tensor([1, 2, 3, 2, 2, 4, 1])
    check(dev, sample(10, 3, 5, seed=1), targets, [10, 10, 8], [3, 3, 1], blank=0, reduction="none")
    check(dev, sample(10, 3, 5, seed=2), targets.clamp(max=3), [10, 6, 8], [3, 3, 1], blank=4, reduction="sum")


def test_log_alpha_matches_where_defined(dev):
    log_probs, targets = sample(8, 2, 5), torch.tensor([[1, 2, 1], [3, 3, 0]])
    want_loss, want_alpha = torch.ops.aten._ctc_loss(log_probs, targets, [8, 6], [3, 2])
    with accelkit.fallback_policy("deny"):
        loss, alpha = torch.ops.aten._ctc_loss(log_probs.to(dev), targets.to(dev), [8, 6], [3, 2])
    torch.testing.assert_close(loss.cpu(), want_loss, rtol=1e-5, atol=1e-5)
    # Compare the rows and states each element defines (its input length, its 2 S + 1 states).
    torch.testing.assert_close(alpha.cpu()[0], want_alpha[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(alpha.cpu()[1, :6, :5], want_alpha[1, :6, :5], rtol=1e-5, atol=1e-5)
