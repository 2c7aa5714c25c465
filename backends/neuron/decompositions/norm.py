"""Normalisation's remaining ops as decompositions into neuron's native ops:

* ``batch_norm_update_stats``: each channel's mean and population variance over the batch and
  spatial dims (float32 for reduced floats), returned as ``(mean, var)`` in the running stats'
  dtype (the input's without them); the running stats move by ``momentum`` towards the mean and
  the unbiased variance, as the CPU's kernel updates them.
* ``_weight_norm_interface_backward``: with ``w = g * v / |v|`` (norms over every dim but
  ``dim``), ``grad_g = sum(grad_w * v) / |v|`` and ``grad_v = g / |v| * (grad_w - v * grad_g /
  |v|)``, in float32, each result in its argument's dtype.

Within float rounding of the CPU (the same formulas; sums in another order).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch._ops import OpOverload

aten = torch.ops.aten


def _math(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def _batch_norm_update_stats(input, running_mean, running_var, momentum):
    if input.dim() < 2 or input.numel() == 0:
        return NotImplemented  # the CPU's errors and empty-input rules
    reduced = [d for d in range(input.dim()) if d != 1]
    x = _math(input)
    count = input.numel() // input.shape[1]
    mean = x.mean(dim=reduced)
    centred = x - mean.reshape([1, -1] + [1] * (input.dim() - 2))
    square_sum = (centred * centred).sum(dim=reduced)
    var = square_sum / count
    if running_mean is not None:
        running_mean.copy_((running_mean * (1 - momentum) + mean * momentum).to(running_mean.dtype))
    if running_var is not None:
        unbiased = square_sum / max(count - 1, 1) if count > 1 else torch.full_like(square_sum, float("nan"))
        running_var.copy_((running_var * (1 - momentum) + unbiased * momentum).to(running_var.dtype))
    stats_dtype = running_mean.dtype if running_mean is not None else input.dtype
    return mean.to(stats_dtype), var.to(stats_dtype)


def _weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    dim = dim % saved_v.dim()
    reduced = [d for d in range(saved_v.dim()) if d != dim]
    grad, v, g, norms = (_math(t) for t in (grad_w, saved_v, saved_g, saved_norms))
    grad_g = (grad * v).sum(dim=reduced, keepdim=True) / norms
    grad_v = (g / norms) * (grad - v * (grad_g / norms))
    return grad_v.to(saved_v.dtype), grad_g.to(saved_g.dtype)


def decompositions() -> Mapping[OpOverload, Callable]:
    """The decompositions above, keyed by aten overload."""
    return {
        aten.batch_norm_update_stats.default: _batch_norm_update_stats,
        aten._weight_norm_interface_backward.default: _weight_norm_interface_backward,
    }
