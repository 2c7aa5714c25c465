"""The CTC loss (``_ctc_loss`` and ``_ctc_loss_backward``) as decompositions into neuron's native
ops: the forward-backward algorithm of Graves et al. (2006) in log space, as the CPU's kernel
computes it, with the batch and the extended label sequence ``l'`` (blanks around and between the
targets, ``2 * S + 1`` positions) as tensor dims and one step per time step.

A step of the forward pass adds, at each position ``s``, ``α[t-1]`` at ``s``, ``s - 1`` and, where
``l'[s] != l'[s-2]``, ``s - 2``, with the CPU's guarded log-sum-exp (the maximum taken out, 0 when
every term is -inf), then the step's log-probability of ``l'[s]``; the backward pass does the same
for β from each item's last time step down. The gradient collects ``α + β`` per label (a log-sum
over the positions carrying it) and is ``exp(lp) - exp(collected + nll - lp)`` times the output
gradient, 0 after an item's input length and, under ``zero_infinity``, for an item whose loss is
infinite. The lengths are Python ints (the op's ``int[]`` forms), so no step reads the device;
the forms taking them as tensors read them once.

The positions an item does not use (after ``2 * target_length``, or after its input length) hold
-inf in ``log_alpha`` here; the CPU leaves them unwritten, and its loss reads neither. The
backward reads only the positions the forward defines, so it takes either's ``log_alpha``.
Within float rounding of the CPU (log and exp on the activation engine; the collected sums are
added in another order). Arguments the CPU refuses, float types other than float32/float64 and
empty inputs are left to the CPU, which raises its error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch._ops import OpOverload

aten = torch.ops.aten
_NEG_INF = float("-inf")


class _Labels:
    """The extended label sequences of a batch: ``ids`` (B, L) the label at each position
    (blank at even ones), ``valid`` (B, L) the positions up to ``2 * target_length``, ``skip``
    (B, L) where a step may come from ``s - 2``, and ``lengths`` the targets' lengths."""

    def __init__(self, targets: torch.Tensor, target_lengths: Sequence[int], blank: int, positions: int):
        batch, device = len(target_lengths), targets.device
        longest = (positions - 1) // 2
        if targets.dim() == 1:  # concatenated: item b's targets start after the earlier items'
            starts = [sum(target_lengths[:b]) for b in range(batch)]
            flat = targets
        else:
            starts = [b * targets.shape[1] for b in range(batch)]
            flat = targets.reshape(-1)
        where = torch.tensor([[min(start + k, max(flat.numel() - 1, 0)) for k in range(longest)] for start in starts],
                             dtype=torch.int64).reshape(batch, longest).to(device)
        labels = flat.to(torch.int64).index_select(0, where.reshape(-1)).reshape(batch, longest) if longest else \
            torch.zeros((batch, 0), dtype=torch.int64, device=device)
        ids = torch.full((batch, positions), blank, dtype=torch.int64, device=device)
        if longest:
            ids[:, 1::2] = labels
        position = torch.arange(positions, device=device)
        self.lengths = torch.tensor(list(target_lengths), dtype=torch.int64).to(device)
        self.valid = position.unsqueeze(0) <= 2 * self.lengths.unsqueeze(1)
        ids = torch.where(self.valid, ids, torch.full_like(ids, blank))
        self.ids = ids
        earlier = torch.cat([torch.full((batch, 2), -1, dtype=torch.int64, device=device), ids[:, :-2]], dim=1) \
            if positions > 2 else torch.full_like(ids, -1)
        self.skip = (position.unsqueeze(0) > 1) & (ids != earlier)


def _log_add3(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """log(exp(a) + exp(b) + exp(c)), the maximum taken out as the CPU does (0 when all are -inf)."""
    top = torch.maximum(torch.maximum(a, b), c)
    top = torch.where(top == _NEG_INF, torch.zeros_like(top), top)
    return torch.log(torch.exp(a - top) + torch.exp(b - top) + torch.exp(c - top)) + top


def _shifted(x: torch.Tensor, by: int) -> torch.Tensor:
    """``x`` moved ``by`` positions along its last dim (toward higher ``s`` for by > 0), -inf filled."""
    fill = torch.full(x.shape[:-1] + (abs(by),), _NEG_INF, dtype=x.dtype, device=x.device)
    if abs(by) >= x.shape[-1]:
        return torch.full_like(x, _NEG_INF)
    if by > 0:
        return torch.cat([fill, x[..., :-by]], dim=-1)
    return torch.cat([x[..., -by:], fill], dim=-1)


def _refused(log_probs, targets, input_lengths, target_lengths, blank) -> bool:
    """Whether the CPU must take the call (it raises its own error, or the device does not
    compute the dtype)."""
    if log_probs.dim() != 3 or log_probs.dtype not in (torch.float32, torch.float64):
        return True
    steps, batch, classes = log_probs.shape
    if targets.dtype not in (torch.int64, torch.int32) or targets.dim() not in (1, 2):
        return True
    if not 0 <= blank < classes or len(input_lengths) != batch or len(target_lengths) != batch or batch == 0:
        return True
    if any(not 1 <= n <= steps for n in input_lengths) or any(n < 0 for n in target_lengths):
        return True
    if targets.dim() == 1:
        return targets.shape[0] != sum(target_lengths)
    return targets.shape[0] != batch or targets.shape[1] < max(target_lengths)


def _emissions(log_probs: torch.Tensor, labels: _Labels) -> torch.Tensor:
    """(T, B, L): each step's log-probability of the label at each position."""
    steps = log_probs.shape[0]
    return log_probs.gather(2, labels.ids.unsqueeze(0).expand(steps, -1, -1))


def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    input_lengths, target_lengths = list(input_lengths), list(target_lengths)
    if _refused(log_probs, targets, input_lengths, target_lengths, blank):
        return NotImplemented
    steps, batch, _ = log_probs.shape
    positions = 2 * max(target_lengths) + 1
    labels = _Labels(targets, target_lengths, blank, positions)
    emitted = _emissions(log_probs, labels)
    position = torch.arange(positions, device=log_probs.device).unsqueeze(0)
    first = (position == 0) | ((position == 1) & (labels.lengths.unsqueeze(1) > 0))
    alpha = torch.where(first, emitted[0], torch.full_like(emitted[0], _NEG_INF))
    rows = [alpha]
    for t in range(1, max(input_lengths)):
        from_two = torch.where(labels.skip, _shifted(alpha, 2), torch.full_like(alpha, _NEG_INF))
        alpha = _log_add3(alpha, _shifted(alpha, 1), from_two) + emitted[t]
        alpha = torch.where(labels.valid, alpha, torch.full_like(alpha, _NEG_INF))
        rows.append(alpha)
    rows += [torch.full_like(alpha, _NEG_INF)] * (steps - len(rows))
    log_alpha = torch.stack(rows, dim=1)  # (B, T, L)
    last_step = torch.tensor([n - 1 for n in input_lengths], dtype=torch.int64).to(log_probs.device)
    steps_valid = torch.arange(steps, device=log_probs.device).unsqueeze(0) <= last_step.unsqueeze(1)
    log_alpha = torch.where(steps_valid.unsqueeze(2), log_alpha, torch.full_like(log_alpha, _NEG_INF))
    final = log_alpha.gather(1, last_step.reshape(batch, 1, 1).expand(batch, 1, positions)).squeeze(1)
    end = (2 * labels.lengths).unsqueeze(1)
    l1 = final.gather(1, end).squeeze(1)
    l2 = final.gather(1, (end - 1).clamp(min=0)).squeeze(1)
    neg_inf = torch.full_like(l1, _NEG_INF)
    l2 = torch.where(labels.lengths > 0, l2, neg_inf)  # an empty target has one end position
    return -_log_add3(l1, l2, neg_inf), log_alpha


def _ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha, blank,
                       zero_infinity=False):
    input_lengths, target_lengths = list(input_lengths), list(target_lengths)
    if (_refused(log_probs, targets, input_lengths, target_lengths, blank) or log_alpha.dim() != 3
            or log_alpha.shape[2] < 2 * max(target_lengths) + 1):
        return NotImplemented
    steps, batch, classes = log_probs.shape
    positions = log_alpha.shape[2]
    device = log_probs.device
    labels = _Labels(targets, target_lengths, blank, positions)
    emitted = _emissions(log_probs, labels)
    last_step = torch.tensor([n - 1 for n in input_lengths], dtype=torch.int64).to(device)
    position = torch.arange(positions, device=device).unsqueeze(0)
    end = 2 * labels.lengths.unsqueeze(1)
    last_two = (position == end) | ((position == end - 1) & (labels.lengths.unsqueeze(1) > 0))
    # β from each item's last step down; a step after it holds -inf
    later_skip = torch.cat([labels.skip[:, 2:], torch.zeros_like(labels.skip[:, :2])], dim=1)
    next_skip = later_skip & (position < end - 1)  # a step back from s + 2: l'[s + 2] != l'[s]
    beta = torch.full((batch, positions), _NEG_INF, dtype=log_probs.dtype, device=device)
    betas = [beta] * steps
    for t in range(steps - 1, -1, -1):
        started = torch.where(labels.valid, _log_add3(beta, _shifted(beta, -1),
                                                      torch.where(next_skip, _shifted(beta, -2),
                                                                  torch.full_like(beta, _NEG_INF))) + emitted[t],
                              torch.full_like(beta, _NEG_INF))
        at_last = (last_step == t).unsqueeze(1)
        before_last = (last_step > t).unsqueeze(1)
        beta = torch.where(at_last, torch.where(last_two, emitted[t], torch.full_like(beta, _NEG_INF)),
                           torch.where(before_last, started, torch.full_like(beta, _NEG_INF)))
        betas[t] = beta
    log_beta = torch.stack(betas, dim=0)  # (T, B, L)
    steps_valid = (torch.arange(steps, device=device).unsqueeze(1) <= last_step.unsqueeze(0)).unsqueeze(2)
    alpha = log_alpha.transpose(0, 1)  # (T, B, L); positions the forward leaves undefined count as -inf
    alpha = torch.where(steps_valid & labels.valid.unsqueeze(0), alpha, torch.full_like(alpha, _NEG_INF))
    both = alpha + log_beta
    # per label, the log-sum over the positions carrying it
    index = labels.ids.unsqueeze(0).expand(steps, -1, -1)
    top = torch.full((steps, batch, classes), _NEG_INF, dtype=both.dtype, device=device).scatter_reduce(
        2, index, both, "amax", include_self=True)
    finite_top = torch.where(top == _NEG_INF, torch.zeros_like(top), top)
    summed = torch.zeros_like(top).scatter_add(2, index, torch.exp(both - finite_top.gather(2, index)))
    collected = torch.where(top == _NEG_INF, top, torch.log(summed) + finite_top)
    nll = neg_log_likelihood.reshape(1, batch, 1).to(log_probs.dtype)
    result = (torch.exp(log_probs) - torch.exp(collected + nll - log_probs)) * grad.reshape(1, batch, 1)
    keep = steps_valid
    if zero_infinity:
        keep = keep & (neg_log_likelihood != float("inf")).reshape(1, batch, 1)
    return torch.where(keep, result, torch.zeros_like(result))


def _integral(*tensors: torch.Tensor) -> bool:
    return all(not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool for t in tensors)


def _ctc_loss_tensor(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """The form with lengths as tensors: read once (a synchronisation), then the ``int[]`` form."""
    if not _integral(input_lengths, target_lengths):
        return NotImplemented  # the CPU's "must be integral" error
    return _ctc_loss(log_probs, targets, input_lengths.tolist(), target_lengths.tolist(), blank, zero_infinity)


def _ctc_loss_backward_tensor(grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha,
                              blank, zero_infinity=False):
    if not _integral(input_lengths, target_lengths):
        return NotImplemented
    return _ctc_loss_backward(grad, log_probs, targets, input_lengths.tolist(), target_lengths.tolist(),
                              neg_log_likelihood, log_alpha, blank, zero_infinity)


def decompositions() -> Mapping[OpOverload, Callable]:
    """The decompositions above, keyed by aten overload."""
    return {aten._ctc_loss.default: _ctc_loss, aten._ctc_loss_backward.default: _ctc_loss_backward,
            aten._ctc_loss.Tensor: _ctc_loss_tensor, aten._ctc_loss_backward.Tensor: _ctc_loss_backward_tensor}
