"""How an aten op becomes a tile program on the simulated NeuronCore.

``@tile_kernel(aten.add.Tensor)`` registers a *body* ``body(k, out, *args, **kwargs)`` where ``k``
is the :class:`~accelkit_backends.neuron.sim.core.Kernel` (the instruction set), ``out`` the
result geometry PyTorch's Meta kernel gives for these arguments (a list of :class:`OutSpec`),
and the arguments are numpy views of HBM (device tensors) or Python values. The body allocates
its HBM results with :func:`hbm_empty` and returns them.

Each distinct (op, shapes, dtypes, static arguments) is one compiled kernel instance: counted
per op, and a source of the shape-churn warning (see ``cost.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
from torch._ops import OpOverload

from accelkit.sdk import KernelTable, meta_call, meta_tensor
from accelkit_backends.neuron import cost, runtime
from accelkit_backends.neuron.sim import numerics as nx

kernels = KernelTable("neuron")
#: Each op's tile-program body, as registered (the graph compiler's fusion calls bodies itself).
_BODIES: dict[OpOverload, Callable] = {}


class OutSpec(NamedTuple):
    shape: tuple[int, ...]
    dtype: torch.dtype


def tile_kernel(*ops: OpOverload, derive_variants: bool = True) -> Callable[[Callable], Callable]:
    """Register ``body`` as the neuron kernel of each op (see the module docstring)."""

    def register(body: Callable) -> Callable:
        for op in ops:
            kernels.add(op, _launcher(op, body), derive_variants=derive_variants)
            _BODIES[op] = body
        return body

    return register


def body_of(op: OpOverload) -> Callable | None:
    """The tile-program body registered for ``op`` (not its launcher), or None."""
    return _BODIES.get(op)


def _launcher(op: OpOverload, body: Callable) -> Callable:
    name = str(op).removeprefix("aten.")

    def run(*args: Any, **kwargs: Any) -> Any:
        key = _instance_key(args, kwargs)
        out = _output_specs(op, key, args, kwargs)
        cost.LEDGER.note_instance(name, key)
        # The instance (with its result geometry, which a float argument can change) fixes the
        # program: its schedule is computed once (NeuronCore.kernel).
        with runtime.core().kernel(name, (op, key, tuple(out))) as k:
            return body(k, out, *args, **kwargs)

    run.__name__ = run.__qualname__ = f"neuron_{body.__name__}"
    return run


# ---------------------------------------------------------------------------------------------
# Instance keys and output geometry (from PyTorch's Meta kernels, cached per instance)
# ---------------------------------------------------------------------------------------------


def _key_of(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return ("array", value.shape, value.dtype.str, value.strides)
    if isinstance(value, (list, tuple)):
        return tuple(_key_of(v) for v in value)
    if isinstance(value, float):
        return ("float",)  # a runtime input: a new value is not a new kernel
    if isinstance(value, torch.Generator):
        return ("generator",)
    if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return str(value)
    return value


def _instance_key(args: tuple, kwargs: dict) -> tuple:
    return (tuple(_key_of(a) for a in args), tuple(sorted((k, _key_of(v)) for k, v in kwargs.items())))


def _to_meta(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        itemsize = value.dtype.itemsize
        strides = tuple(s // itemsize for s in value.strides)
        return meta_tensor(value.shape, nx.torch_dtype(value.dtype), strides)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_meta(v) for v in value)
    if isinstance(value, torch.Generator):
        return None
    return value


_SPECS: dict[tuple, list[OutSpec]] = {}


def _output_specs(op: OpOverload, key: tuple, args: tuple, kwargs: dict) -> list[OutSpec]:
    cache_key = (op, key, _float_values(args, kwargs))
    specs = _SPECS.get(cache_key)
    if specs is None:
        result = meta_call(op, *_to_meta(args), **{k: _to_meta(v) for k, v in kwargs.items()})
        results = result if isinstance(result, (tuple, list)) else (result,)
        specs = [OutSpec(tuple(r.shape), r.dtype) if isinstance(r, torch.Tensor) else None for r in results]
        if len(_SPECS) > 65536:
            _SPECS.clear()
        _SPECS[cache_key] = specs
    return specs


def _float_values(args: tuple, kwargs: dict) -> tuple:
    # A float can change a result's shape (arange's step) but never a kernel's program.
    return tuple(a for a in (*args, *kwargs.values()) if isinstance(a, float))


# ---------------------------------------------------------------------------------------------
# Helpers for bodies
# ---------------------------------------------------------------------------------------------


def hbm_empty(spec: OutSpec | tuple, dtype: torch.dtype | None = None) -> np.ndarray:
    """A fresh HBM array for a result (adopted by the allocator without a copy)."""
    shape, dtype = (spec.shape, spec.dtype) if isinstance(spec, OutSpec) else (tuple(spec), dtype)
    return np.empty(shape, dtype=nx.numpy_dtype(dtype))


@functools.lru_cache(maxsize=None)
def chip_dtype(dtype: np.dtype) -> np.dtype:
    """The tile dtype to request for an HBM dtype: float64 (downcast policy only) computes as
    float32; int64 stays int64, which ``Kernel.sbuf`` holds as a range-checked int32 tile."""
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        return np.dtype(np.float32)
    return dtype
