"""Inputs for which PyTorch's decompositions disagree with its own CPU kernels.

For most of these the runtime declines the decomposition (it returns ``NotImplemented``), and
the pipeline runs the op through the CPU fallback instead, which computes exactly what CPU
torch computes. Where only the result's shape is off, the decomposition's result is reshaped
instead (:data:`CORRECTIONS`), so the op keeps running on the device. Each guard names the
inputs and why; everything else decomposes unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch

aten = torch.ops.aten


def _integral_linspace(*args: Any, dtype: torch.dtype | None = None, out: Any = None, **kwargs: Any) -> bool:
    # The CPU kernel truncates start and end to the integer dtype and steps in float64; the
    # decomposition keeps them fractional and steps in the default float dtype.
    if out is not None:
        dtype = out.dtype
    return dtype is not None and not (dtype.is_floating_point or dtype.is_complex)


def _empty_group_norm_backward(grad_output: torch.Tensor, input: torch.Tensor, *args: Any) -> bool:
    # The decomposition divides by the element count of a group (ZeroDivisionError), and the
    # CPU kernel's statistics of an empty group (NaN weight gradients) are its own.
    return input.numel() == 0


def _multi_margin_loss_shape(result: torch.Tensor, input: torch.Tensor, target: torch.Tensor,
                             p: Any = 1, margin: Any = 1, weight: Any = None,
                             reduction: int = 1) -> torch.Tensor:
    # The CPU kernel gives one loss per target element (reduction='none'), so a 0-dim target
    # has a 0-dim loss; the decomposition makes every input 2-d and keeps the batch dim.
    if reduction == 0 and target.dim() == 0:
        return result.reshape(())
    return result


#: op -> predicate over the op's arguments: True declines the decomposition for that call.
GUARDS: dict[Any, Callable[..., bool]] = {
    aten.linspace.default: _integral_linspace,
    aten.linspace.Tensor_Tensor: _integral_linspace,
    aten.linspace.Tensor_Scalar: _integral_linspace,
    aten.linspace.Scalar_Tensor: _integral_linspace,
    aten.linspace.out: _integral_linspace,
    aten.linspace.Tensor_Tensor_out: _integral_linspace,
    aten.linspace.Tensor_Scalar_out: _integral_linspace,
    aten.linspace.Scalar_Tensor_out: _integral_linspace,
    aten.native_group_norm_backward.default: _empty_group_norm_backward,
}


#: op -> ``correct(result, *args, **kwargs)``: the decomposition's result as the CPU kernel
#: shapes it.
CORRECTIONS: dict[Any, Callable[..., Any]] = {
    aten.multi_margin_loss.default: _multi_margin_loss_shape,
}


def _guarded(decomposition: Callable, declines: Callable[..., bool]) -> Callable:
    @functools.wraps(decomposition)
    def run(*args: Any, **kwargs: Any) -> Any:
        if declines(*args, **kwargs):
            return NotImplemented
        return decomposition(*args, **kwargs)

    return run


def _corrected(decomposition: Callable, correct: Callable[..., Any]) -> Callable:
    @functools.wraps(decomposition)
    def run(*args: Any, **kwargs: Any) -> Any:
        result = decomposition(*args, **kwargs)
        if result is NotImplemented:
            return result
        return correct(result, *args, **kwargs)

    return run


def guard_decompositions(table: Mapping[Any, Callable]) -> dict[Any, Callable]:
    """A copy of ``table`` whose entries for the ops in :data:`GUARDS` decline those inputs,
    and whose entries for the ops in :data:`CORRECTIONS` correct their results."""
    guarded = dict(table)
    for op, declines in GUARDS.items():
        if op in guarded:
            guarded[op] = _guarded(guarded[op], declines)
    for op, correct in CORRECTIONS.items():
        if op in guarded:
            guarded[op] = _corrected(guarded[op], correct)
    return guarded
