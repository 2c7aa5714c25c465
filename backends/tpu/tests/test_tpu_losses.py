"""tpu losses (kernels/losses.py) compared with PyTorch on CPU: negative log-likelihood (1-d and
2-d, class weights, ``ignore_index``, every reduction), cross entropy with label smoothing, MSE,
smooth L1 and Huber, binary cross entropy (clamped logs, weights) and its logits form (large
logits, ``pos_weight``), forward and backward; and the CTC loss forward (``_ctc_loss``) under
``fallback_policy("deny")``: padded and concatenated targets, per-element input and target
lengths, repeated labels (which forbid the blank skip), empty targets, impossible alignments with
and without ``zero_infinity``, and the ``log_alpha`` table it returns for the backward.

The forward-and-backward checks are ``harness_nn.compare``; float32 is compared at 1e-5
(XLA sums in another order than PyTorch's CPU kernels: a few ulps), bfloat16 at its resolution.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import accelkit
from conftest import assert_native
from harness_nn import compare, sample


def ctc_input(steps=12, batch=4, classes=6, seed=0):
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
    check(dev, ctc_input(), targets, [12, 9, 7, 12], [4, 3, 2, 0], reduction=reduction, zero_infinity=zero_infinity)
    assert_native("aten._ctc_loss.default")


@pytest.mark.parametrize("zero_infinity", [False, True])
def test_impossible_alignment(dev, zero_infinity):
    # Three repeated labels need at least five steps (blanks between repeats): four is too few.
    targets = torch.tensor([[3, 3, 3], [1, 2, 3]])
    check(dev, ctc_input(steps=4, batch=2), targets, [4, 4], [3, 3], reduction="none", zero_infinity=zero_infinity)


def test_concatenated_targets_and_blank(dev):
    targets = torch.tensor([1, 2, 3, 2, 2, 4, 1])
    check(dev, ctc_input(10, 3, 5, seed=1), targets, [10, 10, 8], [3, 3, 1], blank=0, reduction="none")
    check(dev, ctc_input(10, 3, 5, seed=2), targets.clamp(max=3), [10, 6, 8], [3, 3, 1], blank=4, reduction="sum")


def test_log_alpha_matches_where_defined(dev):
    log_probs, targets = ctc_input(8, 2, 5), torch.tensor([[1, 2, 1], [3, 3, 0]])
    want_loss, want_alpha = torch.ops.aten._ctc_loss(log_probs, targets, [8, 6], [3, 2])
    with accelkit.fallback_policy("deny"):
        loss, alpha = torch.ops.aten._ctc_loss(log_probs.to(dev), targets.to(dev), [8, 6], [3, 2])
    torch.testing.assert_close(loss.cpu(), want_loss, rtol=1e-5, atol=1e-5)
    # Compare the rows and states each element defines (its input length, its 2 S + 1 states).
    torch.testing.assert_close(alpha.cpu()[0], want_alpha[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(alpha.cpu()[1, :6, :5], want_alpha[1, :6, :5], rtol=1e-5, atol=1e-5)


REDUCTIONS = ["none", "mean", "sum"]


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_loss(dev, reduction):
    x, target, weight = sample((6, 5)), torch.tensor([0, 1, 4, 2, 2, 3]), sample((5,), seed=2).abs()
    native = ["aten.nll_loss_forward.default", "aten.nll_loss_backward.default"]
    compare(dev, lambda x, t: F.nll_loss(x, t, reduction=reduction, ignore_index=2), [x, target], native=native)
    compare(dev, lambda x, t, w: F.nll_loss(x, t, w, reduction=reduction, ignore_index=2), [x, target, weight],
            differentiable=[0], native=native)
    compare(dev, lambda x, t: F.nll_loss(x, t, reduction=reduction), [sample((5,)), torch.tensor(3)])


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_loss2d(dev, reduction):
    compare(dev, lambda x, t: F.nll_loss(x, t, reduction=reduction, ignore_index=1),
            [sample((2, 4, 3, 5)), torch.randint(0, 4, (2, 3, 5), generator=torch.Generator().manual_seed(0))],
            native=["aten.nll_loss2d_forward.default", "aten.nll_loss2d_backward.default"])


def test_cross_entropy_with_label_smoothing(dev):
    compare(dev, lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1),
            [sample((6, 5)), torch.tensor([0, 1, 4, 2, 2, 3])], native=["aten.nll_loss_forward.default"])


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_regression_losses(dev, reduction):
    x, y = sample((4, 5)), sample((4, 5), seed=2)
    compare(dev, lambda a, b: F.mse_loss(a, b, reduction=reduction), [x, y],
            native=["aten.mse_loss.default", "aten.mse_loss_backward.default"])
    for beta in (0.5, 2.0):
        compare(dev, lambda a, b, beta=beta: F.smooth_l1_loss(a, b, reduction=reduction, beta=beta), [x, y],
                native=["aten.smooth_l1_loss.default", "aten.smooth_l1_loss_backward.default"])
        compare(dev, lambda a, b, beta=beta: F.huber_loss(a, b, reduction=reduction, delta=beta), [x, y],
                native=["aten.huber_loss.default", "aten.huber_loss_backward.default"])


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_cross_entropy(dev, reduction):
    g = torch.Generator().manual_seed(0)
    p, target, weight = torch.rand(4, 5, generator=g), torch.rand(4, 5, generator=g), torch.rand(5, generator=g)
    p[0, 0], p[0, 1] = 0.0, 1.0  # log is clamped at -100, as on CPU
    native = ["aten.binary_cross_entropy.default", "aten.binary_cross_entropy_backward.default"]
    compare(dev, lambda a, b: F.binary_cross_entropy(a, b, reduction=reduction), [p, target],
            differentiable=[0], native=native)
    compare(dev, lambda a, b, w: F.binary_cross_entropy(a, b, w, reduction=reduction), [p, target, weight],
            differentiable=[0], native=native)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_cross_entropy_with_logits(dev, reduction):
    g = torch.Generator().manual_seed(0)
    target, weight, pos_weight = torch.rand(4, 5, generator=g), torch.rand(5, generator=g), torch.rand(5, generator=g)
    logits = sample((4, 5)) * 30  # large logits: the overflow-free form is needed
    native = ["aten.binary_cross_entropy_with_logits.default"]
    compare(dev, lambda a, b: F.binary_cross_entropy_with_logits(a, b, reduction=reduction), [logits, target],
            differentiable=[0], native=native)
    compare(dev, lambda a, b, w, pw: F.binary_cross_entropy_with_logits(a, b, w, pos_weight=pw, reduction=reduction),
            [sample((4, 5)), target, weight, pos_weight], differentiable=[0], native=native)
