"""The CTC loss (``decompositions/ctc.py``) against the CPU's kernel, the fallback denied: the
loss and its gradient for concatenated and padded targets, empty and repeated targets, a blank
other than 0, inputs too short for their targets (an infinite loss, with and without
``zero_infinity``), and the backward fed the CPU's own ``log_alpha``."""

from __future__ import annotations

import pytest
import torch

import accelkit
from conftest import assert_decomposed

aten = torch.ops.aten
pytestmark = pytest.mark.usefixtures("deny_fallback")

STEPS, BATCH, CLASSES = 12, 4, 6


def _case(padded: bool, blank: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    log_probs = torch.randn(STEPS, BATCH, CLASSES, generator=gen).log_softmax(2)
    target_lengths = [3, 0, 5, 4]
    input_lengths = [12, 7, 10, 3]  # the last is too short for its 4 targets: an infinite loss
    labels = [c for c in range(CLASSES) if c != blank]
    rows = [[labels[int(i)] for i in torch.randint(len(labels), (6,), generator=gen)] for _ in range(BATCH)]
    rows[0][:3] = [labels[1], labels[1], labels[2]]  # a repeated label: no skip between the two
    if padded:
        targets = torch.tensor(rows)
    else:
        targets = torch.tensor([c for row, n in zip(rows, target_lengths) for c in row[:n]])
    return log_probs, targets, input_lengths, target_lengths


def _loss_and_gradient(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity):
    log_probs = log_probs.detach().clone().requires_grad_()
    loss = torch.nn.functional.ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=blank,
                                        reduction="none", zero_infinity=zero_infinity)
    weights = torch.linspace(0.5, 2.0, BATCH).to(loss.device)
    (torch.where(torch.isinf(loss), torch.zeros_like(loss), loss) * weights).sum().backward()
    return loss.detach().cpu(), log_probs.grad.cpu()


@pytest.mark.parametrize("padded", [False, True], ids=["concatenated", "padded"])
@pytest.mark.parametrize("blank", [0, CLASSES - 1])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc_loss_and_its_gradient_match_the_cpu(dev, padded, blank, zero_infinity):
    log_probs, targets, input_lengths, target_lengths = _case(padded, blank)
    expected = _loss_and_gradient(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity)
    got = _loss_and_gradient(log_probs.to(dev), targets.to(dev), input_lengths, target_lengths, blank, zero_infinity)
    assert (expected[0][3] == 0) if zero_infinity else torch.isinf(expected[0][3])  # the case has an infinite loss
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g, e, atol=2e-5, rtol=2e-5, equal_nan=True)
    assert_decomposed("aten._ctc_loss.default", "aten._ctc_loss_backward.default")


def test_the_backward_takes_the_cpus_log_alpha(dev):
    """The CPU leaves ``log_alpha``'s unused positions unwritten: the backward must not read them."""
    log_probs, targets, input_lengths, target_lengths = _case(True, 0, seed=3)
    nll, log_alpha = aten._ctc_loss(log_probs, targets, input_lengths, target_lengths, 0, False)
    grad = torch.linspace(0.5, 2.0, BATCH)
    args = (input_lengths, target_lengths)
    expected = aten._ctc_loss_backward(grad, log_probs, targets, *args, nll, log_alpha, 0, True)
    got = aten._ctc_loss_backward(grad.to(dev), log_probs.to(dev), targets.to(dev), *args, nll.to(dev),
                                  log_alpha.to(dev), 0, True)
    torch.testing.assert_close(got.cpu(), expected, atol=2e-5, rtol=2e-5)


def test_a_call_the_cpu_refuses_raises_its_error(dev):
    log_probs, targets, input_lengths, target_lengths = _case(True, 0)
    too_long = [STEPS + 1] + input_lengths[1:]
    with pytest.raises(RuntimeError) as on_cpu:
        aten._ctc_loss(log_probs, targets, too_long, target_lengths)
    with accelkit.fallback_policy("allow"), pytest.raises(RuntimeError) as on_device:
        aten._ctc_loss(log_probs.to(dev), targets.to(dev), too_long, target_lengths)
    assert str(on_device.value).splitlines()[0] == str(on_cpu.value).splitlines()[0]


def test_the_forms_taking_lengths_as_tensors_match_the_cpu(dev):
    log_probs, targets, input_lengths, target_lengths = _case(True, 0, seed=5)
    lengths = torch.tensor(input_lengths), torch.tensor(target_lengths)
    nll, log_alpha = aten._ctc_loss.Tensor(log_probs, targets, *lengths)
    got_nll, got_alpha = aten._ctc_loss.Tensor(log_probs.to(dev), targets.to(dev), *(t.to(dev) for t in lengths))
    torch.testing.assert_close(got_nll.cpu(), nll, atol=2e-5, rtol=2e-5)
    grad = torch.linspace(0.5, 2.0, BATCH)
    expected = aten._ctc_loss_backward.Tensor(grad, log_probs, targets, *lengths, nll, log_alpha, 0)
    got = aten._ctc_loss_backward.Tensor(grad.to(dev), log_probs.to(dev), targets.to(dev), *(t.to(dev) for t in lengths),
                                         got_nll, got_alpha, 0)
    torch.testing.assert_close(got.cpu(), expected, atol=2e-5, rtol=2e-5, equal_nan=True)
    assert_decomposed("aten._ctc_loss.Tensor", "aten._ctc_loss_backward.Tensor")
