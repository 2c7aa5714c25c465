"""Loss lowerings: nll (1-d and 2-d targets), mse, smooth L1, Huber, binary cross-entropy, CTC.

Each loss and its backward is one program. ``reduction`` follows ``torch.nn._reduction``:
0 none, 1 mean, 2 sum. Low-precision inputs are computed in float32 (PyTorch's CPU kernels
accumulate in float32 too); the machinery casts results to PyTorch's dtypes.

An nll target outside ``[0, C)`` that is not ``ignore_index`` fails the forward with CPU's
IndexError, as a device-side check (:mod:`accelkit_backends.tpu.checks`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from accelkit_backends.tpu import checks
from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten

NONE, MEAN, SUM = 0, 1, 2


def _f32(x):
    if x is None:
        return None
    return x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) and jnp.dtype(x.dtype).itemsize < 4 else x


def _reduce(loss, reduction: int):
    if reduction == MEAN:
        return jnp.mean(loss)
    if reduction == SUM:
        return jnp.sum(loss)
    return loss


def _reduced_grad(grad, shape, reduction: int):
    """``grad_output`` broadcast to the loss's elementwise shape, with the mean's 1/N."""
    g = _f32(grad)
    if reduction == MEAN:
        size = 1
        for n in shape:
            size *= n
        g = g / size
    return jnp.broadcast_to(g, shape)


# -- negative log likelihood ------------------------------------------------------------------


def _nll_parts(x, target, weight, ignore_index):
    """Class axis moved last; per-element picked log-probability, weight and keep mask."""
    logp = jnp.moveaxis(_f32(x), 1, -1) if x.ndim > 1 else _f32(x)[None]
    t = target if x.ndim > 1 else target[None]
    keep = t != ignore_index
    safe = jnp.where(keep, t, 0)
    picked = jnp.take_along_axis(logp, safe[..., None], axis=-1, mode="clip")[..., 0]
    w = jnp.ones(t.shape, logp.dtype) if weight is None else jnp.take(_f32(weight), safe, mode="clip")
    w = jnp.where(keep, w, jnp.zeros((), logp.dtype))
    return picked, w, safe


def _nll_forward(x, target, weight, reduction, ignore_index):
    classes = x.shape[1] if x.ndim > 1 else x.shape[0]
    ok, bad, _ = checks.first_where((target != ignore_index) & ((target < 0) | (target >= classes)), target)
    checks.require(ok, IndexError, "Target {} is out of bounds.", bad)
    picked, w, _ = _nll_parts(x, target, weight, ignore_index)
    loss = -picked * w
    total_weight = jnp.sum(w)
    if reduction == NONE:
        return (loss if x.ndim > 1 else loss[0]), total_weight
    if reduction == SUM:
        return jnp.sum(loss), total_weight
    return jnp.sum(loss) / total_weight, total_weight


def _nll_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    _, w, safe = _nll_parts(x, target, weight, ignore_index)
    g = _f32(grad)
    if reduction == NONE:
        g = g if x.ndim > 1 else g[None]
    elif reduction == MEAN:
        g = g / _f32(total_weight)
    contribution = -w * g
    classes = x.shape[1] if x.ndim > 1 else x.shape[0]
    onehot = jax.nn.one_hot(safe, classes, dtype=contribution.dtype)
    grad_input = onehot * contribution[..., None]
    return jnp.moveaxis(grad_input, -1, 1) if x.ndim > 1 else grad_input[0]


@lowering(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def nll_loss_forward(x, target, weight, reduction, ignore_index):
    """(output, total_weight)."""
    return _nll_forward(x, target, weight, reduction, ignore_index)


@lowering(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def nll_loss_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    return _nll_backward(grad, x, target, weight, reduction, ignore_index, total_weight)


# -- regression losses ------------------------------------------------------------------------


@lowering(aten.mse_loss.default)
def mse_loss(x, target, reduction=MEAN):
    return _reduce(jnp.square(_f32(x) - _f32(target)), reduction)


@lowering(aten.mse_loss_backward.default)
def mse_loss_backward(grad, x, target, reduction):
    diff = _f32(x) - _f32(target)
    return 2 * diff * _reduced_grad(grad, diff.shape, reduction)


@lowering(aten.smooth_l1_loss.default)
def smooth_l1_loss(x, target, reduction=MEAN, beta=1.0):
    diff = jnp.abs(_f32(x) - _f32(target))
    beta = jnp.asarray(beta, diff.dtype)
    quadratic = 0.5 * jnp.square(diff) / jnp.where(beta > 0, beta, 1)
    return _reduce(jnp.where(diff < beta, quadratic, diff - 0.5 * beta), reduction)


@lowering(aten.smooth_l1_loss_backward.default)
def smooth_l1_loss_backward(grad, x, target, reduction, beta):
    diff = _f32(x) - _f32(target)
    beta = jnp.asarray(beta, diff.dtype)
    slope = jnp.where(jnp.abs(diff) < beta, diff / jnp.where(beta > 0, beta, 1), jnp.sign(diff))
    return slope * _reduced_grad(grad, diff.shape, reduction)


@lowering(aten.huber_loss.default)
def huber_loss(x, target, reduction=MEAN, delta=1.0):
    diff = jnp.abs(_f32(x) - _f32(target))
    delta = jnp.asarray(delta, diff.dtype)
    return _reduce(jnp.where(diff < delta, 0.5 * jnp.square(diff), delta * (diff - 0.5 * delta)), reduction)


@lowering(aten.huber_loss_backward.default)
def huber_loss_backward(grad, x, target, reduction, delta):
    diff = _f32(x) - _f32(target)
    delta = jnp.asarray(delta, diff.dtype)
    return jnp.clip(diff, -delta, delta) * _reduced_grad(grad, diff.shape, reduction)


# -- binary cross-entropy ---------------------------------------------------------------------

_LOG_FLOOR = -100.0  # PyTorch clamps log(p) and log(1 - p) here, so p = 0 or 1 stays finite
_EPSILON = 1e-12  # and bounds the backward's denominator p (1 - p) from below


@lowering(aten.binary_cross_entropy.default)
def binary_cross_entropy(x, target, weight=None, reduction=MEAN):
    p, t = _f32(x), _f32(target)
    loss = -(t * jnp.maximum(jnp.log(p), _LOG_FLOOR) + (1 - t) * jnp.maximum(jnp.log1p(-p), _LOG_FLOOR))
    if weight is not None:
        loss = loss * _f32(weight)
    return _reduce(loss, reduction)


@lowering(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(grad, x, target, weight=None, reduction=MEAN):
    p, t = _f32(x), _f32(target)
    slope = (p - t) / jnp.maximum((1 - p) * p, _EPSILON)
    if weight is not None:
        slope = slope * _f32(weight)
    return slope * _reduced_grad(grad, p.shape, reduction)


@lowering(aten.binary_cross_entropy_with_logits.default)
def binary_cross_entropy_with_logits(x, target, weight=None, pos_weight=None, reduction=MEAN):
    """``(1 - t) x + w_pos log(1 + exp(-x))`` with ``w_pos = 1 + (pos_weight - 1) t``, in the
    overflow-free form ``log(1 + exp(-x)) = log1p(exp(-|x|)) + max(-x, 0)``."""
    z, t = _f32(x), _f32(target)
    softplus_neg = jnp.log1p(jnp.exp(-jnp.abs(z))) + jnp.maximum(-z, 0)
    if pos_weight is not None:
        loss = (1 - t) * z + (1 + (_f32(pos_weight) - 1) * t) * softplus_neg
    else:
        loss = (1 - t) * z + softplus_neg
    if weight is not None:
        loss = loss * _f32(weight)
    return _reduce(loss, reduction)


# -- CTC --------------------------------------------------------------------------------------


@lowering(aten._ctc_loss.default)
def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """(negative log-likelihood per batch element, log_alpha (N, T, 2 * max target length + 1)).

    The forward (alpha) recursion of CTC in log space over the extended label sequence
    ``blank, l_1, blank, ..., l_S, blank``: a state is reached from itself, from the previous
    state, and from two back when that skips a blank between two different labels. Each batch
    element stops at its own input length (its later ``log_alpha`` rows are -inf, as are states
    past its own sequence). ``targets`` is padded (N, S) or concatenated 1-d; lengths are
    static lists. ``zero_infinity`` turns an impossible alignment's infinite loss into 0.
    """
    lp = _f32(log_probs)
    if lp.ndim == 2:  # unbatched (T, C)
        lp = lp[:, None]
    steps, batch = lp.shape[0], lp.shape[1]
    longest = max(target_lengths, default=0)
    states = 2 * longest + 1
    labels = []
    start = 0
    for n, length in enumerate(target_lengths):
        row = targets[n, :length] if targets.ndim == 2 else targets[start:start + length]
        start += length
        labels.append(jnp.pad(row.astype(jnp.int32), (0, longest - length)))
    labels = jnp.stack(labels) if labels else jnp.zeros((batch, 0), jnp.int32)
    extended = jnp.full((batch, states), blank, jnp.int32).at[:, 1::2].set(labels)
    lengths = jnp.asarray(target_lengths, jnp.int32)
    valid = jnp.arange(states)[None, :] < (2 * lengths + 1)[:, None]
    # A two-state skip is allowed into a label different from the one two states back.
    skip = jnp.zeros((batch, states), bool).at[:, 2:].set(
        (extended[:, 2:] != blank) & (extended[:, 2:] != extended[:, :-2]))
    neg = jnp.asarray(-jnp.inf, lp.dtype)
    emit = jnp.take_along_axis(lp, jnp.broadcast_to(extended[None], (steps, batch, states)), axis=2)
    first = jnp.where(jnp.arange(states)[None, :] < 2, emit[0], neg)
    first = jnp.where(valid, first, neg)
    time_limit = jnp.asarray(input_lengths, jnp.int32)

    def step(alpha, inputs):
        t, emitted = inputs
        one = jnp.concatenate([jnp.full((batch, 1), neg), alpha[:, :-1]], axis=1)
        two = jnp.concatenate([jnp.full((batch, 2), neg), alpha[:, :-2]], axis=1)
        two = jnp.where(skip, two, neg)
        new = jnp.logaddexp(jnp.logaddexp(alpha, one), two) + emitted
        new = jnp.where(valid, new, neg)
        running = (t < time_limit)[:, None]
        return jnp.where(running, new, alpha), jnp.where(running, new, neg)

    if steps > 1:
        last, rest = jax.lax.scan(step, first, (jnp.arange(1, steps), emit[1:]))
        log_alpha = jnp.concatenate([first[None], rest], axis=0)
    else:
        last, log_alpha = first, first[None]
    log_alpha = jnp.where((time_limit > 0)[None, :, None], log_alpha, neg)
    end = 2 * lengths
    final = jnp.take_along_axis(last, end[:, None], axis=1)[:, 0]
    before = jnp.take_along_axis(last, jnp.maximum(end - 1, 0)[:, None], axis=1)[:, 0]
    total = jnp.where(lengths > 0, jnp.logaddexp(final, before), final)
    # No input steps: only the empty target is reachable, with probability 1.
    total = jnp.where(time_limit > 0, total, jnp.where(lengths > 0, neg, 0))
    loss = -total
    if zero_infinity:
        loss = jnp.where(jnp.isinf(loss), 0, loss)
    loss = loss.astype(lp.dtype)
    log_alpha = jnp.transpose(log_alpha, (1, 0, 2))
    if log_probs.ndim == 2:
        return loss[0], log_alpha[0]
    return loss, log_alpha
