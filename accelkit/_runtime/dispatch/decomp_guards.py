"""Inputs for which PyTorch's decompositions disagree with its own CPU kernels.

- **Guards**: for these inputs the runtime declines the decomposition (it returns
  ``NotImplemented``), and the pipeline runs the op through the CPU fallback instead, which
  computes exactly what CPU torch computes. Each guard names the inputs and why; everything
  else still decomposes.
- **Replacements**: where PyTorch's decomposition computes other values for ordinary inputs
  (``multilabel_margin_loss``: labels after the first -1), accelkit's own replaces it
  (:data:`REPLACEMENTS`).
- **Corrections**: where only the result's shape is off, the decomposition's result is
  reshaped instead (:data:`CORRECTIONS`), so the op keeps running on the device.
- **Index checks**: the decompositions of ``index_add``, ``index_copy``, ``index_fill``, ``take``
  and ``nll_loss`` meet an out-of-range index only in the op they decompose into, which raises
  another exception type or message (``index_put``'s ``IndexError`` for index_add's
  ``RuntimeError``, ``gather``'s wording for ``Target 5 is out of bounds.``). The runtime reads
  the index first; when one is out of range it runs the op on host copies, so CPU torch raises
  its own error for the call. Reading the index synchronises; a backend that wants none gives
  the op a kernel.
- **Layouts**: ``native_group_norm`` and its backward decompose through views that a
  channels_last input refuses; they get contiguous copies, and the results the input's memory
  format, as the CPU kernel gives them (:data:`LAYOUTS`).
- **Broadcast writes**: the decompositions of ``fill_`` and ``zero_`` store through ``copy_``,
  which refuses a ``self`` whose elements share memory (an expanded view); CPU's ``fill_`` and
  ``zero_`` accept one, as every element gets the same value. The runtime applies them to the
  view of ``self`` with each broadcast dimension taken at index 0, which covers the same memory
  once (:data:`BROADCAST_WRITES`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch._C import DispatchKey
from torch._decomp import decomposition_table
from torch._prims_common import suggest_memory_format

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


def _group_norm_in_input_layout(decomposition: Callable) -> Callable:
    # The decomposition views the input as (N, groups, -1), which a channels_last input refuses
    # ("view size is not compatible"); the CPU kernel reads any layout and gives the output
    # the input's memory format.
    @functools.wraps(decomposition)
    def run(input: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if input.is_contiguous():
            return decomposition(input, *args, **kwargs)
        out, mean, rstd = decomposition(input.contiguous(), *args, **kwargs)
        return out.contiguous(memory_format=suggest_memory_format(input)), mean, rstd

    return run


def _group_norm_backward_in_input_layout(decomposition: Callable) -> Callable:
    @functools.wraps(decomposition)
    def run(grad_output: torch.Tensor, input: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if input.is_contiguous() and grad_output.is_contiguous():
            return decomposition(grad_output, input, *args, **kwargs)
        layout = suggest_memory_format(input)
        grad_input, *rest = decomposition(grad_output.contiguous(), input.contiguous(), *args, **kwargs)
        if grad_input is not None:
            grad_input = grad_input.contiguous(memory_format=layout)
        return (grad_input, *rest)

    return run


#: op -> wrapper of its decomposition that gives it the inputs it can take.
LAYOUTS: dict[Any, Callable[[Callable], Callable]] = {
    aten.native_group_norm.default: _group_norm_in_input_layout,
    aten.native_group_norm_backward.default: _group_norm_backward_in_input_layout,
}


#: op -> ``correct(result, *args, **kwargs)``: the decomposition's result as the CPU kernel
#: shapes it.
CORRECTIONS: dict[Any, Callable[..., Any]] = {
    aten.multi_margin_loss.default: _multi_margin_loss_shape,
}


# -- replacements ----------------------------------------------------------------------------


def _multilabel_margin_loss_forward(input: torch.Tensor, target: torch.Tensor, reduction: int) -> tuple:
    """The CPU kernel's loss: for each sample, over the labels before the first -1 (``j``) and
    the classes that are not labels (``i``), ``max(0, 1 - x[j] + x[i]) / classes``.

    PyTorch's decomposition also counts the slots after the first -1 as labels of class 0
    (other values whenever a sample has fewer labels than classes), and gives a 1-d input's
    unreduced loss shape (1,) where CPU gives ().
    """
    torch._check(input.dim() <= 2 and input.shape[-1:] != (0,),
                 lambda: f"Expected non-empty vector or matrix with optional 0-dim batch size, but got: {input.shape}")
    torch._check(target.shape == input.shape,
                 lambda: f"inconsistent target size: {target.shape} for input of size: {input.shape}")
    x, labels = torch.atleast_2d(input), torch.atleast_2d(target)
    classes = x.shape[1]
    slot = torch.arange(classes, device=labels.device)
    first_end = torch.where(labels == -1, slot, classes).amin(dim=-1, keepdim=True)
    is_label_slot = slot < first_end  # (N, C) over j
    label = torch.where(is_label_slot, labels, 0)
    is_target = (slot == torch.where(is_label_slot, labels, -1).unsqueeze(-1)).any(dim=1)  # (N, C) over i
    margins = (1 - x.gather(-1, label).unsqueeze(-1) + x.unsqueeze(1)).clamp_min(0) / classes  # (N, j, i)
    counted = is_label_slot.unsqueeze(-1) & ~is_target.unsqueeze(1)
    per_sample = torch.where(counted, margins, 0).sum(dim=(1, 2))
    if reduction == 1:
        loss = per_sample.mean()
    elif reduction == 2:
        loss = per_sample.sum()
    else:
        loss = per_sample.reshape(input.shape[:-1])
    return loss, is_target.to(input.dtype).reshape(target.shape)


#: op -> accelkit's decomposition, used in place of PyTorch's, which computes other values than
#: the CPU kernel for ordinary inputs. A backend's own decomposition of the op is kept.
REPLACEMENTS: dict[Any, Callable[..., Any]] = {
    aten.multilabel_margin_loss_forward.default: _multilabel_margin_loss_forward,
}


def _same_function(kernel: Any, decomposition: Any) -> bool:
    # PyTorch registers one function as both, wrapped differently (an out= wrapper, a
    # registration wrapper): the same definition, not the same object.
    return (kernel is not None and decomposition is not None
            and (kernel.__module__, kernel.__qualname__) == (decomposition.__module__, decomposition.__qualname__))


@contextlib.contextmanager
def replacements_while_tracing() -> Iterator[None]:
    """While a graph is traced for compiling: PyTorch also registers some of the decompositions
    :data:`REPLACEMENTS` replaces as the op's Python autograd kernel, which the tracer runs before
    any decomposition table (so even PyTorch's own compilers get other values than CPU). Inside,
    those kernels are accelkit's; outside, PyTorch's are back."""
    swapped = {op: op.py_kernels[DispatchKey.Autograd] for op in REPLACEMENTS
               if _same_function(op.py_kernels.get(DispatchKey.Autograd), decomposition_table.get(op))}
    for op in swapped:
        op.py_kernels[DispatchKey.Autograd] = REPLACEMENTS[op]
        op._dispatch_cache.clear()
    try:
        yield
    finally:
        for op, kernel in swapped.items():
            op.py_kernels[DispatchKey.Autograd] = kernel
            op._dispatch_cache.clear()


def _guarded(decomposition: Callable, declines: Callable[..., bool]) -> Callable:
    @functools.wraps(decomposition)
    def run(*args: Any, **kwargs: Any) -> Any:
        if declines(*args, **kwargs):
            return NotImplemented
        return decomposition(*args, **kwargs)

    return run


# -- index checks ----------------------------------------------------------------------------


def _outside(index: torch.Tensor, low: int, high: int, dtypes: tuple[torch.dtype, ...] = (torch.int64,)) -> bool:
    """Whether any element of (device) ``index`` lies outside ``[low, high)``; an index of
    a dtype the op refuses counts as outside (CPU torch words that error too)."""
    if index.dtype not in dtypes:
        return True
    if index.numel() == 0:
        return False
    values = index.detach().to("cpu")
    return bool(((values < low) | (values >= high)).any())


def _bad_index_along(negative_wraps: bool, dtypes: tuple[torch.dtype, ...] = (torch.int64,)) -> Callable[..., bool]:
    def bad(x: torch.Tensor, dim: int, index: torch.Tensor, *args: Any, **kwargs: Any) -> bool:
        if not -max(x.dim(), 1) <= dim < max(x.dim(), 1):
            return True
        size = x.shape[dim] if x.dim() else 1
        return _outside(index, -size if negative_wraps else 0, size, dtypes)

    return bad


def _bad_take(x: torch.Tensor, index: torch.Tensor) -> bool:
    return _outside(index, -x.numel(), x.numel())


def _bad_target(x: torch.Tensor, target: torch.Tensor, weight: Any, reduction: int, ignore_index: int) -> bool:
    if x.dim() == 0 or target.dtype != torch.int64:
        return True
    if target.numel() == 0:
        return False
    classes = x.shape[1] if x.dim() >= 2 else x.shape[0]
    values = target.detach().to("cpu")
    return bool(((values != ignore_index) & ((values < 0) | (values >= classes))).any())


#: op -> predicate over the op's arguments: True when an index is out of range (or the call is
#: otherwise malformed), so that CPU torch, given the same call, raises its own error.
#: (The ``out=`` overloads run their functional op's decomposition, the in-place ones their own.)
INDEX_CHECKS: dict[Any, Callable[..., bool]] = {
    aten.index_add.default: _bad_index_along(False, (torch.int32, torch.int64)),
    aten.index_add_.default: _bad_index_along(False, (torch.int32, torch.int64)),
    aten.index_copy.default: _bad_index_along(False),
    aten.index_copy_.default: _bad_index_along(False),
    aten.index_fill.int_Scalar: _bad_index_along(True),
    aten.index_fill.int_Tensor: _bad_index_along(True),
    aten.index_fill_.int_Scalar: _bad_index_along(True),
    aten.index_fill_.int_Tensor: _bad_index_along(True),
    aten.take.default: _bad_take,
    aten.nll_loss_forward.default: _bad_target,
    aten.nll_loss2d_forward.default: _bad_target,
}


def _on_host(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu")
    if isinstance(value, (list, tuple)):
        return type(value)(_on_host(v) for v in value)
    return value


def _checked(op: Any, decomposition: Callable, out_of_range: Callable[..., bool]) -> Callable:
    @functools.wraps(decomposition)
    def run(*args: Any, **kwargs: Any) -> Any:
        if out_of_range(*args, **kwargs):
            # CPU torch raises its error for this call; if it does not, the index was valid
            # after all (and the decomposition computes the result).
            op(*_on_host(args), **_on_host(kwargs))
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


#: In-place ops that write one value to every element of ``self``, so a ``self`` with broadcast
#: (stride-0) dimensions is valid for them.
BROADCAST_WRITES = (aten.fill_.Scalar, aten.fill_.Tensor, aten.zero_.default)


def _without_broadcast_dims(t: torch.Tensor) -> torch.Tensor:
    """The view of ``t`` that takes each broadcast dimension (stride 0, size > 1) at index 0."""
    return t[tuple(0 if stride == 0 and size > 1 else slice(None) for size, stride in zip(t.shape, t.stride()))]


def _broadcast_write(decomposition: Callable) -> Callable:
    @functools.wraps(decomposition)
    def run(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not any(stride == 0 and size > 1 for size, stride in zip(self.shape, self.stride())):
            return decomposition(self, *args, **kwargs)
        result = decomposition(_without_broadcast_dims(self), *args, **kwargs)
        return self if result is not NotImplemented else result

    return run


def guard_decompositions(table: Mapping[Any, Callable]) -> dict[Any, Callable]:
    """A copy of ``table`` whose entries for the ops in :data:`REPLACEMENTS` are accelkit's
    when they were PyTorch's, those for the ops in :data:`LAYOUTS` take any memory layout,
    those for the ops in :data:`GUARDS` decline those inputs,
    and whose entries for the ops in :data:`CORRECTIONS` correct their results, those in
    :data:`INDEX_CHECKS` raise CPU's error for a bad index and those in
    :data:`BROADCAST_WRITES` accept a broadcast ``self``."""
    guarded = dict(table)
    for op, replacement in REPLACEMENTS.items():
        if op in guarded and guarded[op] is decomposition_table.get(op):
            guarded[op] = replacement
    for op, in_layout in LAYOUTS.items():
        if op in guarded:
            guarded[op] = in_layout(guarded[op])
    for op in BROADCAST_WRITES:
        if op in guarded:
            guarded[op] = _broadcast_write(guarded[op])
    for op, declines in GUARDS.items():
        if op in guarded:
            guarded[op] = _guarded(guarded[op], declines)
    for op, correct in CORRECTIONS.items():
        if op in guarded:
            guarded[op] = _corrected(guarded[op], correct)
    for op, out_of_range in INDEX_CHECKS.items():
        if op in guarded:
            guarded[op] = _checked(op, guarded[op], out_of_range)
    return guarded
