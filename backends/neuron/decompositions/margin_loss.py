"""The margin losses' backwards as decompositions into neuron's native ops (their forwards are
PyTorch's decompositions already):

* ``multi_margin_loss_backward``: for sample ``n`` with target ``y``, each other class ``c`` with
  ``z = margin - x[y] + x[c] > 0`` gets ``h = g`` (``p = 1``) or ``2 g z`` (``p = 2``), times
  ``weight[y]``, and ``x[y]`` gets minus their sum; ``g = 1 / classes`` (also ``/ samples`` for
  the mean), times the output gradient.
* ``multilabel_margin_loss_backward``: each listed target ``j`` (the labels before the first
  -1, a repeated label counted each time, as the CPU's loop counts it) against each class ``i``
  that is not a target, with ``1 - x[j] + x[i] > 0``: ``x[j]`` gets ``-g`` and ``x[i]`` gets
  ``+g``, ``g = 1 / classes`` (also ``/ samples`` for the mean), times the output gradient.

Sums of ``±g`` terms: equal to the CPU's within float rounding (summed in another order).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch._ops import OpOverload

aten = torch.ops.aten

_MEAN, _NONE = 1, 0  # at::Reduction
#: Dtypes the CPU has no margin-loss kernels for: left to it, for its error.
_NO_CPU_KERNEL = (torch.bfloat16, torch.float16)


def _scaled_by_output_gradient(grad: torch.Tensor, grad_output: torch.Tensor, reduction: int) -> torch.Tensor:
    if reduction == _NONE and grad_output.dim() > 0:
        return grad * grad_output.reshape(-1, 1)
    return grad * grad_output.reshape(())


def _multi_margin_loss_backward(grad_output, self, target, p, margin, weight=None, reduction=_MEAN):
    if self.numel() == 0 or p not in (1, 2) or self.dtype in _NO_CPU_KERNEL:
        return NotImplemented  # the CPU's errors (no reduced-float kernel there) and empty shapes
    x = self.reshape(1, -1) if self.dim() <= 1 else self
    samples, classes = x.shape
    y = target.reshape(-1, 1).to(torch.int64)
    g = 1.0 / (classes * (samples if reduction == _MEAN else 1))
    z = margin - x.gather(1, y) + x
    h = torch.full_like(z, g) if p == 1 else 2 * g * z
    if weight is not None:
        h = h * weight.to(x.dtype)[y]
    others = torch.arange(classes, device=x.device).unsqueeze(0) != y
    h = torch.where(others & (z > 0), h, torch.zeros((), dtype=h.dtype, device=h.device))
    grad = h.scatter_add(1, y, -h.sum(dim=1, keepdim=True))
    return _scaled_by_output_gradient(grad, grad_output, reduction).reshape(self.shape)


def _multilabel_margin_loss_backward(grad_output, self, target, reduction, is_target):
    if self.numel() == 0 or self.dtype in _NO_CPU_KERNEL:
        return NotImplemented
    x = self.reshape(1, -1) if self.dim() <= 1 else self
    labels = target.reshape(x.shape).to(torch.int64)
    targets = is_target.reshape(x.shape) != 0
    samples, classes = x.shape
    g = 1.0 / (classes * (samples if reduction == _MEAN else 1))
    listed = torch.cumsum((labels < 0).to(torch.int64), dim=1) == 0  # the labels before the first -1
    times = torch.zeros(x.shape, dtype=x.dtype, device=x.device).scatter_add(
        1, torch.where(listed, labels, 0), listed.to(x.dtype))
    z = 1 - x.unsqueeze(2) + x.unsqueeze(1)  # [n, target j, class i]
    active = (z > 0) & targets.unsqueeze(2) & ~targets.unsqueeze(1)
    pairs = active.to(x.dtype) * times.unsqueeze(2)
    grad = g * (pairs.sum(dim=1) - pairs.sum(dim=2))
    return _scaled_by_output_gradient(grad, grad_output, reduction).reshape(self.shape)


def decompositions() -> Mapping[OpOverload, Callable]:
    """The decompositions above, keyed by aten overload (their ``out=`` forms follow)."""
    return {
        aten.multi_margin_loss_backward.default: _multi_margin_loss_backward,
        aten.multilabel_margin_loss_backward.default: _multilabel_margin_loss_backward,
    }
