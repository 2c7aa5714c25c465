"""Lowerings: aten overloads as JAX functions, each run as one compiled XLA program per signature.

A lowering is written against materialised ``jax.numpy`` arrays::

    @lowering(aten.add.Tensor, aten.add.Scalar)
    def add(x, y, alpha=1):
        return x + y * alpha

and the machinery here does the rest, identically for every op:

- **one program per call**: the arguments' views are materialised inside the program
  (:func:`buffers.materialize`), so reading a transposed or sliced input costs no extra dispatch;
- **PyTorch's dtype and shape rules**: when a program is built, the op's Meta kernel runs on
  meta tensors of the same geometry; its result dtype is what the program returns (the lowering
  need not reproduce type promotion), its shape is checked, and its errors (bad shapes, bad
  dtypes) are raised exactly as on CPU;
- **a compile cache** keyed by op, input geometry, dtypes and static arguments, with per-op
  compile counts; Python floats are runtime inputs (a changing learning rate never recompiles),
  ints, bools, shapes and dtypes are static;
- **random ops** receive ``key`` — a JAX PRNG key seeded from the device generator — in place
  of their ``generator`` argument;
- **cost**: XLA's cost analysis of each program (flops, bytes accessed), accumulated per call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import torch
from torch._ops import OpOverload, OpOverloadPacket

from accelkit.sdk import KernelTable
from accelkit_backends.tpu import modes
from accelkit_backends.tpu.buffers import JaxView, jax_dtype, materialize
from accelkit_backends.tpu.cost import COSTS, ProgramCost

kernels = KernelTable("tpu")

_VIEW, _ARRAY, _SCALAR, _STATIC, _SEQ, _KEY = "v", "a", "f", "s", "l", "k"


@dataclass
class _Program:
    run: Callable[..., Any]
    cost: ProgramCost


class Lowering:
    """One aten overload's JAX implementation with its compile cache (see the module docstring)."""

    def __init__(self, op: OpOverload, fn: Callable[..., Any]):
        self.op = op
        self.fn = fn
        self.name = str(op)
        self.programs: dict[Any, _Program] = {}
        self._lock = threading.Lock()

    @property
    def compiles(self) -> int:
        return len(self.programs)

    # -- encoding arguments into (static structure, dynamic inputs) -------------------------

    def _encode(self, value: Any, arrays: list, scalars: list) -> Any:
        if isinstance(value, JaxView):
            arrays.append(value.array)
            return (_VIEW, len(arrays) - 1, value.spec)
        if isinstance(value, jax.Array):
            arrays.append(value)
            return (_ARRAY, len(arrays) - 1)
        if isinstance(value, float | complex):
            scalars.append(value)
            return (_SCALAR, len(scalars) - 1)
        if isinstance(value, torch.Generator):
            scalars.append(int(torch.randint(0, 2**31 - 1, (), generator=value)))
            return (_KEY, len(scalars) - 1)
        if isinstance(value, list | tuple):
            return (_SEQ, tuple(self._encode(v, arrays, scalars) for v in value))
        return (_STATIC, value)

    @staticmethod
    def _decode(code: Any, arrays: Any, scalars: Any) -> Any:
        kind = code[0]
        if kind == _VIEW:
            return materialize(arrays[code[1]], code[2])
        if kind == _ARRAY:
            return arrays[code[1]]
        if kind == _SCALAR:
            return scalars[code[1]]
        if kind == _KEY:
            return jax.random.key(scalars[code[1]])
        if kind == _SEQ:
            return [Lowering._decode(c, arrays, scalars) for c in code[1]]
        return code[1]

    @staticmethod
    def _meta(code: Any, arrays: list, scalars: list) -> Any:
        kind = code[0]
        if kind == _VIEW:
            spec = code[2]
            return torch.empty_strided(spec.size, spec.stride, dtype=spec.dtype, device="meta")
        if kind == _ARRAY:
            from accelkit_backends.tpu.buffers import torch_dtype

            array = arrays[code[1]]
            return torch.empty(array.shape, dtype=torch_dtype(array.dtype), device="meta")
        if kind == _SCALAR:
            return scalars[code[1]]
        if kind == _KEY:
            return None
        if kind == _SEQ:
            return [Lowering._meta(c, arrays, scalars) for c in code[1]]
        return code[1]

    # -- calling -----------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        arrays: list = []
        scalars: list = []
        structure = (
            tuple(self._encode(a, arrays, scalars) for a in args),
            tuple((k, self._encode(v, arrays, scalars)) for k, v in kwargs.items()),
        )
        key = (structure, tuple((a.shape, a.dtype) for a in arrays), tuple(type(s) for s in scalars))
        program = self.programs.get(key)
        if program is None:
            program = self._build(structure, arrays, scalars, key)
        out = program.run(arrays, scalars)
        COSTS.record(self.name, program.cost)
        if modes.current() == "debug":
            modes.check(self.name, out, args)
        return out

    def _expected(self, structure: Any, arrays: list, scalars: list) -> Any:
        """Run the op's Meta kernel: PyTorch's result shapes/dtypes, or its error for bad input."""
        args = [self._meta(c, arrays, scalars) for c in structure[0]]
        kwargs = {k: self._meta(c, arrays, scalars) for k, c in structure[1]}
        try:
            result = self.op(*args, **kwargs)
        except NotImplementedError:
            return None  # no Meta kernel: trust the lowering
        return result

    def _build(self, structure: Any, arrays: list, scalars: list, key: Any) -> _Program:
        expected = self._expected(structure, arrays, scalars)
        fn, name = self.fn, self.name

        def program(arrays: Any, scalars: Any) -> Any:
            args = [Lowering._decode(c, arrays, scalars) for c in structure[0]]
            kwargs = {k: Lowering._decode(c, arrays, scalars) for k, c in structure[1]}
            return _conform(name, fn(*args, **kwargs), expected)

        with self._lock:
            existing = self.programs.get(key)
            if existing is not None:
                return existing
            compiled = jax.jit(program).lower(arrays, scalars).compile()
            built = _Program(compiled, ProgramCost.of(compiled, arrays))
            self.programs[key] = built
            return built


def _conform(name: str, out: Any, expected: Any) -> Any:
    """Cast a lowering's outputs to PyTorch's result dtypes and check their shapes (traced)."""
    if expected is None:
        return out
    if isinstance(expected, torch.Tensor):
        if not isinstance(out, jax.Array):
            raise TypeError(f"tpu lowering of {name} returned {type(out).__name__}, expected one array")
        if tuple(out.shape) != tuple(expected.shape):
            raise AssertionError(
                f"tpu lowering of {name} returned shape {tuple(out.shape)}; PyTorch's is {tuple(expected.shape)}"
            )
        return out.astype(jax_dtype(expected.dtype)) if out.dtype != jax_dtype(expected.dtype) else out
    if isinstance(expected, list | tuple):
        outs = list(out) if isinstance(out, list | tuple) else [out]
        if len(outs) != len(expected):
            raise AssertionError(f"tpu lowering of {name} returned {len(outs)} results; PyTorch returns {len(expected)}")
        fixed = [_conform(name, o, e) for o, e in zip(outs, expected)]
        return tuple(fixed) if isinstance(expected, tuple) else fixed
    return out


def lowering(*ops: OpOverload | OpOverloadPacket, derive_variants: bool = True) -> Callable:
    """Register a JAX function as the tpu kernel of each of ``ops`` (see the module docstring)."""

    def register(fn: Callable) -> Callable:
        for op in ops:
            if isinstance(op, OpOverloadPacket):
                op = op.default
            kernels.add(op, Lowering(op, fn), derive_variants=derive_variants)
        return fn

    return register


def compile_counts() -> dict[str, int]:
    """Programs compiled so far, per op (only ops that compiled at least one)."""
    return {entry.op.__str__(): entry.fn.compiles for entry in kernels if entry.fn.compiles}


def scalar_like(value: Any, array: jax.Array) -> Any:
    """A Python or traced scalar as an array of ``array``'s dtype (for lowerings' arithmetic)."""
    return jnp.asarray(value, dtype=array.dtype)
