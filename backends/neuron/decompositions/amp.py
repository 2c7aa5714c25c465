"""Mixed precision's loss-scaling ops (what ``torch.amp.GradScaler`` calls every step) as
decompositions into neuron's native ops, so a scaled training step stays on the device:

* ``_amp_foreach_non_finite_check_and_unscale_``: each gradient multiplied by ``inv_scale`` in
  float32 (the CPU's math type for reduced floats) and rounded once; ``found_inf`` set to 1 when
  any gradient holds an inf or NaN, never cleared (it gathers over calls, as on the CPU).
* ``_amp_update_scale_``: the CPU's branch as ``where``s: after an overflow the scale is
  multiplied by the backoff factor and the growth tracker reset; otherwise the tracker counts the
  step and, at ``growth_interval``, the scale grows (when the grown scale is finite) and the
  tracker resets.

Nothing is read back: the decisions are device tensors, as on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch._ops import OpOverload

aten = torch.ops.aten


def _math_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def _non_finite_check_and_unscale_(self, found_inf, inv_scale):
    for grad in self:
        if grad.numel() == 0:
            continue
        non_finite = (~torch.isfinite(grad)).any()
        found_inf.copy_(torch.where(non_finite, torch.ones_like(found_inf), found_inf))
        scaled = grad.to(_math_dtype(grad.dtype)) * inv_scale.to(_math_dtype(grad.dtype))
        grad.copy_(scaled.to(grad.dtype))


def _update_scale_(self, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor, growth_interval):
    overflow = found_inf != 0
    successful = growth_tracker + 1
    grow = ~overflow & (successful == growth_interval)
    grown = self * scale_growth_factor
    grow_scale = grow & torch.isfinite(grown)
    new_scale = torch.where(overflow, self * scale_backoff_factor, torch.where(grow_scale, grown, self))
    growth_tracker.copy_(torch.where(overflow | grow, torch.zeros_like(successful), successful))
    return self.copy_(new_scale)


def decompositions() -> Mapping[OpOverload, Callable]:
    """The decompositions above, keyed by aten overload."""
    return {
        aten._amp_foreach_non_finite_check_and_unscale_.default: _non_finite_check_and_unscale_,
        aten._amp_update_scale_.default: _update_scale_,
    }
