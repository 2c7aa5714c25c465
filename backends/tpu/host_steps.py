"""Kernels that run host logic between programs: a static value known only at call time (a
count read from the device, a length computed from Python scalars) picks the program.

:class:`Specialised` keeps one :class:`~accelkit_backends.tpu.lowering.Lowering` per distinct
value; :func:`host_step` registers a host-side function as an op's kernel, its programs counted
as the op's. Indexing with masks, the ops with data-dependent result shapes and the shape ops
with computed sizes use them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._ops import OpOverload

from accelkit_backends.tpu.buffers import JaxView, torch_dtype
from accelkit_backends.tpu import fused
from accelkit_backends.tpu.lowering import Lowering, kernels

aten = torch.ops.aten


class Specialised:
    """One op's lowerings specialised on static values known only at call time (a count read
    from the device, a length computed from Python scalars): one :class:`Lowering` — with
    PyTorch's Meta check and its own compile cache — per distinct value."""

    def __init__(self, op: OpOverload, fn: Callable[..., Any]):
        self.op, self.fn = op, fn
        self._by_value: dict[tuple, Lowering] = {}

    def __call__(self, **statics: Any) -> Lowering:
        key = tuple(sorted(statics.items()))
        found = self._by_value.get(key)
        if found is None:
            found = self._by_value[key] = Lowering(self.op, functools.partial(self.fn, **statics))
        return found

    @property
    def compiles(self) -> int:
        return sum(lowered.compiles for lowered in list(self._by_value.values()))


class HostStep:
    """A kernel-table entry that runs host logic, then its programs (``uses``: the lowerings
    and :class:`Specialised` families it calls, whose programs count as this op's).

    In fused mode its programs are recorded like any op's; a value it reads on the host (a
    count that sizes the next program: ``int(array)``, :func:`host_value`) flushes the region
    then, so a step that reads nothing (an integer index, an arange) stays in the region."""

    fusable = True

    def __init__(self, run: Callable[..., Any], uses: Sequence[Any]):
        self.run, self.uses = run, tuple(uses)
        functools.update_wrapper(self, run)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(*args, **kwargs)

    @property
    def compiles(self) -> int:
        return sum(used.compiles for used in self.uses)


def host_step(*ops: OpOverload, uses: Sequence[Any]) -> Callable:
    """Register a host-side function as the tpu kernel of ``ops`` (see :class:`HostStep`)."""

    def register(fn: Callable) -> Callable:
        step = HostStep(fn, uses)
        for op in ops:
            kernels.add(op, step)
        return fn

    return register


def torch_dtype_of(argument: Any) -> torch.dtype | None:
    """The dtype of a kernel argument (a device view or an array, pending or not), else None."""
    if isinstance(argument, JaxView):
        return argument.spec.dtype
    if isinstance(argument, jax.Array) or type(argument) is fused.Pending:
        return torch_dtype(argument.dtype)
    return None


def host_value(array: Any) -> np.ndarray:
    """``array``'s value on the host (a synchronisation; in fused mode, a flush)."""
    return np.asarray(jax.device_get(fused.concrete(array)))


def shape_of(argument: Any) -> tuple[int, ...]:
    if isinstance(argument, JaxView):
        return tuple(argument.spec.size)
    return tuple(argument.shape)


def true_counter() -> Specialised:
    """Programs counting the true elements of a mask broadcast to ``shape`` (one family per op,
    so that each op's compile count holds its own programs)."""
    return Specialised(aten.count_nonzero.default,
                       lambda mask, shape: jnp.count_nonzero(jnp.broadcast_to(mask, shape)))


def count_true(counter: Specialised, mask: Any, shape: tuple[int, ...] | None = None) -> int:
    """The number of true elements of ``mask`` broadcast to ``shape``, read on the host (a sync)."""
    return int(counter(shape=shape if shape is not None else shape_of(mask))(mask))
