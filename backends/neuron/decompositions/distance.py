"""Pairwise distances' remaining ops as decompositions into neuron's native ops:
``_pdist_forward`` (the condensed distances between the rows ``i < j`` of a matrix, pairs from
``triu_indices``), ``_pdist_backward`` and ``_cdist_backward``.

A p-norm distance of the difference ``d``: ``p = 0`` counts its nonzero elements, ``p = 1`` sums
``|d|``, ``p = 2`` is ``sqrt(sum d^2)``, ``p = inf`` the largest ``|d|``, other ``p``
``(sum |d|^p)^(1/p)``. The gradient of a distance ``D`` with respect to ``d`` is the CPU's:
0 for ``p = 0``; ``sign(d)`` for ``p = 1``; ``d / D`` for ``p = 2``; ``sign(d)`` where ``|d| = D``
for ``p = inf``; ``d |d|^(p-2) / D^(p-1)`` otherwise (for ``p < 1`` also 0 where ``d = 0``); each
0 where ``D = 0``. A row's gradient adds its pairs' (``index_add``; ``cdist`` a sum over the
other set's rows). Within float rounding of the CPU (sums in another order).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch._ops import OpOverload

aten = torch.ops.aten


def _norms(diff: torch.Tensor, p: float) -> torch.Tensor:
    """The p-norm of ``diff`` along its last dim."""
    if p == 0:
        return (diff != 0).to(diff.dtype).sum(-1)
    if p == 1:
        return diff.abs().sum(-1)
    if p == 2:
        return torch.sqrt((diff * diff).sum(-1))
    if math.isinf(p):
        return diff.abs().amax(-1)
    return diff.abs().pow(p).sum(-1).pow(1.0 / p)


def _norm_gradient(diff: torch.Tensor, dist: torch.Tensor, p: float) -> torch.Tensor:
    """d(dist)/d(diff), ``dist`` broadcast along ``diff``'s last dim."""
    dist = dist.unsqueeze(-1)
    zero = torch.zeros((), dtype=diff.dtype, device=diff.device)
    if p == 0:
        return torch.zeros_like(diff)
    if p == 1:
        gradient = torch.sign(diff)
    elif p == 2:
        gradient = diff / dist
    elif math.isinf(p):
        gradient = torch.sign(diff) * (diff.abs() == dist).to(diff.dtype)
    else:
        gradient = diff * diff.abs().pow(p - 2) / dist.pow(p - 1)
        if p < 1:
            gradient = torch.where(diff == 0, zero, gradient)
    return torch.where(dist == 0, zero, gradient)


def _pairs(n: int, device: torch.device) -> torch.Tensor:
    return torch.triu_indices(n, n, 1, device=device)


def _pdist_forward(self, p=2.0):
    n = self.shape[0]
    if n <= 1:
        return self.new_zeros((0,))
    pairs = _pairs(n, self.device)
    return _norms(self[pairs[0]] - self[pairs[1]], p)


def _pdist_backward(grad, self, p, pdist):
    n = self.shape[0]
    if n <= 1 or p == 0:
        return torch.zeros_like(self)
    pairs = _pairs(n, self.device)
    diff = self[pairs[0]] - self[pairs[1]]
    pair_grad = grad.unsqueeze(-1) * _norm_gradient(diff, pdist, p)
    return torch.zeros_like(self).index_add(0, pairs[0], pair_grad).index_add(0, pairs[1], -pair_grad)


def _cdist_backward(grad, x1, x2, p, cdist):
    if x1.numel() == 0 or x2.numel() == 0 or p == 0:
        return torch.zeros_like(x1)
    diff = x1.unsqueeze(-2) - x2.unsqueeze(-3)  # [..., P, R, M]
    return (grad.unsqueeze(-1) * _norm_gradient(diff, cdist, p)).sum(-2)


def decompositions() -> Mapping[OpOverload, Callable]:
    """The decompositions above, keyed by aten overload."""
    return {
        aten._pdist_forward.default: _pdist_forward,
        aten._pdist_backward.default: _pdist_backward,
        aten._cdist_backward.default: _cdist_backward,
    }
