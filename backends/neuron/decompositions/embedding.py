"""``embedding_bag`` (``_embedding_bag``, ``_embedding_bag_forward_only`` and the dense
backwards) as decompositions into neuron's native ops. Forward: the bags' rows are gathered (``index_select``), scaled by
the per-sample weights, and reduced per bag (``index_add`` for sum and mean, ``scatter_reduce``
for max); each index's bag is the last offset at or before its position (the sequence search of
``decompositions.arith``).

The auxiliary results are the CPU's, as its backward reads them: ``offset2bag`` (each index's
bag; empty on the CPU's sum fast path: a contiguous floating weight and no padding index),
``bag_size`` (the non-padding indices per bag; zeros for sum), ``max_indices`` (max: the weight
row of each bag's maximum per column, its first occurrence; mean: the bag sizes again; sum:
zeros). ``_embedding_bag_forward_only`` sizes its zeros by the offsets, the other by the bags.
An empty bag gives zeros. Sums are added in index order as on the CPU, but float32 results
may differ in the last bits where the CPU's vectorised sum groups them otherwise. bfloat16 and
float16 rows are scaled and summed in float32 and rounded once, as the CPU does (mean divides the
rounded sums, as there); where a float32 sum lies exactly between two bfloat16 values the CPU's
fast path (fbgemm) rounds away from zero, neuron to even: one step apart at such ties.

Backward (``_embedding_bag_backward`` when not sparse, ``_embedding_bag_dense_backward``,
``_embedding_bag_per_sample_weights_backward``): each non-padding index adds its bag's gradient
row (times its per-sample weight; over the bag size for mean) to its weight row with one
``index_add``; max sends each column's
gradient to the row that was the maximum. An empty ``offset2bag`` (the sum fast path) is made
from the offsets as the CPU makes it. The per-sample weights' gradient is each index's weight
row dotted with its bag's gradient row (in float32 for bfloat16 and float16, rounded once, as
the CPU's dot products). Sums are grouped otherwise than on the CPU (float rounding).
``scale_grad_by_freq`` is left to the CPU: its kernel divides some rows by another index's count
(indices 3, 4, 5 of ``[1, 2, 4, 5, 4, 3, 2, 9]`` get 1/2, 2 and 1/2 rather than 1, 1/2 + 1/2 and
1), which a faithful decomposition would have to copy, not fix.

``embedding_renorm_``: each indexed row whose ``norm_type``-norm exceeds ``max_norm`` is scaled
by ``max_norm / (norm + 1e-7)`` in place (a repeated index scales its row once: every copy of
it writes the same scaled row). The norm and scale are float32 here, double on the CPU: equal
within float rounding.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch._ops import OpOverload

from accelkit_backends.neuron.decompositions import _accumulation_dtype
from accelkit_backends.neuron.decompositions.arith import _search

aten = torch.ops.aten

_SUM, _MEAN, _MAX = 0, 1, 2


def _embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=_SUM, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1, *, forward_only=False):
    if indices.dim() != 1 or offsets.dim() != 1 or mode not in (_SUM, _MEAN, _MAX):
        return NotImplemented
    count, columns, device = indices.numel(), weight.shape[1], weight.device
    bags = offsets.numel() - 1 if include_last_offset else offsets.numel()
    positions = torch.arange(count, dtype=torch.int64, device=device)
    bag = (_search(offsets[:bags].to(torch.int64), positions, True, None) - 1).clamp(min=0)
    kept = indices != padding_idx if padding_idx >= 0 else torch.ones_like(indices, dtype=torch.bool)
    rows = weight.index_select(0, indices)
    if mode != _MAX:  # the CPU scales and sums reduced-precision rows in float32, rounding once
        rows = rows.to(_accumulation_dtype(rows.dtype))
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.to(rows.dtype).unsqueeze(1)
    bag_size = torch.zeros(bags, dtype=torch.int64, device=device).scatter_add(0, bag, kept.to(torch.int64))
    fill = torch.zeros(offsets.numel() if forward_only else bags, dtype=indices.dtype, device=device)
    if mode == _MAX:
        spread = bag.unsqueeze(1).expand(count, columns)
        lowest = torch.finfo(weight.dtype).min if weight.is_floating_point() else torch.iinfo(weight.dtype).min
        candidates = torch.where(kept.unsqueeze(1), rows, lowest)
        largest = torch.full((bags, columns), lowest, dtype=weight.dtype, device=device).scatter_reduce(
            0, spread, candidates, "amax")
        at_max = kept.unsqueeze(1) & (rows == largest.index_select(0, bag))
        first = torch.full((bags, columns), count, dtype=torch.int64, device=device).scatter_reduce(
            0, spread, torch.where(at_max, positions.unsqueeze(1), count), "amin")
        empty = (bag_size == 0).unsqueeze(1)
        output = torch.where(empty, 0, largest)
        safe_indices = torch.cat([indices, indices.new_zeros(1)])  # position ``count``: an empty bag's 0
        max_indices = torch.where(empty, 0, safe_indices[first]).to(indices.dtype)
    else:
        total = torch.zeros((bags, columns), dtype=rows.dtype, device=device).index_add(
            0, bag, torch.where(kept.unsqueeze(1), rows, 0)).to(weight.dtype)
        if mode == _MEAN:  # the CPU divides the rounded sums
            output = torch.where((bag_size == 0).unsqueeze(1), 0,
                                 total / bag_size.clamp(min=1).to(weight.dtype).unsqueeze(1))
        else:
            output = total
        max_indices = bag_size.to(indices.dtype) if mode == _MEAN else fill
    fast_sum = (mode == _SUM and weight.is_contiguous() and weight.is_floating_point() and padding_idx < 0)
    offset2bag = indices.new_zeros(0) if fast_sum else bag.to(indices.dtype)
    bag_size = fill if mode == _SUM else bag_size.to(indices.dtype)
    return output.to(weight.dtype), offset2bag, bag_size, max_indices


def _embedding_bag_forward_only(*args, **kwargs):
    return _embedding_bag(*args, **kwargs, forward_only=True)


def _bags_of(indices, offsets, offset2bag):
    """Each index's bag: ``offset2bag``, or where the sum fast path left it empty, the last
    offset at or before the index's position."""
    if offset2bag.numel() > 0:
        return offset2bag.to(torch.int64)
    positions = torch.arange(indices.numel(), dtype=torch.int64, device=indices.device)
    return (_search(offsets.to(torch.int64), positions, True, None) - 1).clamp(min=0)


def _kept(indices, padding_idx):
    return indices != padding_idx if padding_idx >= 0 else torch.ones_like(indices, dtype=torch.bool)


def _embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                  scale_grad_by_freq, mode, per_sample_weights=None, padding_idx=-1):
    if scale_grad_by_freq:
        return NotImplemented  # the CPU's own arithmetic (module docstring): run there
    columns = grad.shape[1]
    grad_weight = torch.zeros((num_weights, columns), dtype=grad.dtype, device=grad.device)
    if mode == _MAX:
        live = (bag_size > 0).unsqueeze(1).expand_as(maximum_indices)
        rows = torch.where(live, maximum_indices, 0).to(torch.int64)
        return grad_weight.scatter_add(0, rows, torch.where(live, grad, 0))
    bag = offset2bag.to(torch.int64)
    scale = torch.ones(indices.shape, dtype=grad.dtype, device=grad.device)
    if per_sample_weights is not None:
        scale = scale * per_sample_weights.to(grad.dtype)
    if mode == _MEAN:
        scale = scale / bag_size.to(grad.dtype).index_select(0, bag).clamp(min=1)
    contributions = grad.index_select(0, bag) * torch.where(_kept(indices, padding_idx), scale, 0).unsqueeze(1)
    return grad_weight.index_add(0, indices.to(torch.int64), contributions)


def _embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                            scale_grad_by_freq, mode, sparse, per_sample_weights=None, padding_idx=-1):
    if sparse or scale_grad_by_freq:
        return NotImplemented  # a sparse gradient (a layout the device's storage cannot hold), or by_freq
    return _embedding_bag_dense_backward(grad, indices, _bags_of(indices, offsets, offset2bag), bag_size,
                                         maximum_indices, num_weights, scale_grad_by_freq, mode,
                                         per_sample_weights, padding_idx)


def _embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    if mode != _SUM:
        return NotImplemented  # the CPU's own error for the other modes comes from there
    bag = _bags_of(indices, offsets, offset2bag)
    wide = _accumulation_dtype(grad.dtype)  # the CPU's dot products are float32, rounded once
    grad_rows = grad.index_select(0, bag).to(wide)
    weight_rows = weight.index_select(0, indices.to(torch.int64)).to(wide)
    products = (grad_rows * weight_rows).sum(1).to(grad.dtype)
    return torch.where(_kept(indices, padding_idx), products, 0)


def _row_norms(rows: torch.Tensor, p: float) -> torch.Tensor:
    if p == 2:
        return torch.sqrt((rows * rows).sum(-1))
    if p == 1:
        return rows.abs().sum(-1)
    if math.isinf(p):
        return rows.abs().amax(-1)
    return rows.abs().pow(p).sum(-1).pow(1.0 / p)


def _embedding_renorm_(self, indices, max_norm, norm_type):
    if self.dim() != 2 or indices.numel() == 0:
        return NotImplemented if self.dim() != 2 else self  # the CPU's error; nothing to renormalise
    flat = indices.reshape(-1).to(torch.int64)
    rows = self.index_select(0, flat)
    math_rows = rows.float() if rows.dtype in (torch.bfloat16, torch.float16) else rows
    norms = _row_norms(math_rows, norm_type)
    scale = torch.where(norms > max_norm, max_norm / (norms + 1e-7), torch.ones_like(norms))
    self.index_copy_(0, flat, (math_rows * scale.unsqueeze(1)).to(self.dtype))
    return self


def decompositions() -> Mapping[OpOverload, Callable]:
    """The decompositions above, keyed by aten overload."""
    return {
        aten.embedding_renorm_.default: _embedding_renorm_,
        aten._embedding_bag.default: _embedding_bag,
        aten._embedding_bag_forward_only.default: _embedding_bag_forward_only,
        aten._embedding_bag_backward.default: _embedding_bag_backward,
        aten._embedding_bag_dense_backward.default: _embedding_bag_dense_backward,
        aten._embedding_bag_per_sample_weights_backward.default: _embedding_bag_per_sample_weights_backward,
    }
