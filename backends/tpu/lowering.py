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
  need not reproduce type promotion; one registered with ``own_dtypes`` returns CPU's where the
  Meta kernel disagrees with it), its shape is checked, and its errors (bad shapes, bad
  dtypes) are raised exactly as on CPU;
- **a compile cache** keyed by op, input geometry, dtypes and static arguments, with per-op
  compile counts; Python floats are runtime inputs (a changing learning rate never recompiles),
  ints, bools, shapes and dtypes are static; with ``ACCELKIT_COMPILE_CACHE`` the executables
  are also kept on disk under the same key and loaded by later processes without tracing
  (:mod:`.stored_programs`);
- **random ops** receive, in their ``generator`` argument, the :class:`~accelkit.sdk.RandomDraw`
  the runtime reserved for them, its seed and offset as the program's inputs (a new draw never
  recompiles): they compute the device stream (:mod:`accelkit.sdk.random_stream`) in the program;
- **device-side checks**: a lowering that refuses some values states its conditions with
  :func:`checks.require`; the program then returns a status beside its result, and the error is
  raised at the op (debug) or at the next synchronisation (strict), see :mod:`.checks`;
- **cost**: XLA's cost analysis of each program (flops, bytes accessed), made once per compiled
  program; a call only counts itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._ops import OpOverload, OpOverloadPacket

from accelkit.sdk import CallLayout, KernelTable, RandomDraw, ShardWindow, ViewSpec, meta_tensor
from accelkit_backends.tpu import checks, fused, modes, stored_programs
from accelkit_backends.tpu.buffers import JaxView, jax_dtype, materialize, sole_allocator, torch_dtype
from accelkit_backends.tpu.cost import COSTS, ProgramCost, Tally
from accelkit_backends.tpu.programs import LOADED, Program, next_use

kernels = KernelTable("tpu")

_VIEW, _ARRAY, _SCALAR, _STATIC, _SEQ, _KEY = "v", "a", "f", "s", "l", "k"

DEVICE = modes.DEVICE  # named in the errors of failed device-side checks


class _Signature(Program):
    """One static structure of arguments: its jitted program, the traceable function behind it
    (which fused regions call), and the cost tally of each program XLA compiled for it (one per
    storage shape and dtype of the array inputs)."""

    __slots__ = ("tallies", "only", "traceable")

    def __init__(self, jitted: Any, traceable: Callable[..., Any]):
        super().__init__(jitted)
        self.traceable = traceable
        self.tallies: dict[Any, Tally] = {}  # input shapes and dtypes -> tally
        self.only: Tally | None = None  # the tally when there is exactly one

    def evaluate(self, arrays: list, scalars: list) -> Any:
        """The program's ``(result, status)`` as shapes and dtypes, computing nothing (arrays
        may be ``jax.ShapeDtypeStruct``); PyTorch's error for refused arguments as
        :class:`checks.Refused`. The trace is jax's, kept for the program's later compile."""
        jitted = self.jitted
        if type(jitted) is stored_programs.StoredProgram:
            jitted = jitted.jitted
        return jitted.eval_shape(arrays, scalars)


#: Argument types encoded without looking further (the common case, checked by exact type).
_PLAIN = frozenset({int, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format})


_DEVICE_SCALARS: dict[tuple[type, Any], jax.Array] = {}
_DEVICE_SCALARS_LIMIT = 1024


def _device_scalar(value: float | complex) -> Any:
    """A Python float or complex as a program input: a weakly typed array kept on the device,
    so that repeated scalars (``x * 0.5``, a learning rate) are not transferred on every call.

    Zeros (whose sign a cache keyed by value would lose) and NaN stay Python numbers; the
    program sees the same weakly typed input either way.
    """
    key = (type(value), value)
    found = _DEVICE_SCALARS.get(key)
    if found is None:
        if not value or value != value:
            return value
        if len(_DEVICE_SCALARS) >= _DEVICE_SCALARS_LIMIT:
            _DEVICE_SCALARS.clear()
        found = _DEVICE_SCALARS[key] = jnp.asarray(value)
    return found


class Lowering:
    """One aten overload's JAX implementation with its compile cache (see the module docstring)."""

    #: :meth:`specialize` takes layouts with lists of device tensors (tuples of view specs).
    specializes_tensor_lists = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass that does more per call than run its program (reads a result on the
        host, adds an argument) runs outside fused regions unless it says ``fusable = True``."""
        super().__init_subclass__(**kwargs)
        if "__call__" in cls.__dict__ and not cls.__dict__.get("fusable", False):
            cls.__call__ = fused.outside_regions(cls.__dict__["__call__"])

    def __init__(self, op: OpOverload, fn: Callable[..., Any], static: tuple[str, ...] = (),
                 own_dtypes: bool = False, ignores_contents: bool = False):
        self.op = op
        self.fn = fn
        self.name = str(op)
        self.own_dtypes = own_dtypes
        self.ignores_contents = ignores_contents
        # Float arguments named here are compile-time constants (a norm's ``ord``): the program
        # may branch on them and the Meta kernel sees their values.
        names = [a.name for a in op._schema.arguments]
        self._static_positions = frozenset(i for i, n in enumerate(names) if n in static)
        self._static_names = frozenset(static)
        self.compiles = 0
        self._signatures: dict[Any, _Signature] = {}  # static structure -> its programs
        self._lock = threading.Lock()

    # -- encoding arguments into (static structure, dynamic inputs) -------------------------

    def _encode(self, value: Any, arrays: list, scalars: list) -> Any:
        kind = type(value)
        if kind is JaxView:
            arrays.append(value.array)
            return (_VIEW, len(arrays) - 1, value.spec)
        if kind in _PLAIN:
            return (_STATIC, value)
        if isinstance(value, jax.Array):
            arrays.append(value)
            return (_ARRAY, len(arrays) - 1)
        if isinstance(value, float | complex):
            scalars.append(_device_scalar(value))
            return (_SCALAR, len(scalars) - 1, type(value))
        if kind is RandomDraw:
            scalars.append(np.asarray(value.seed, dtype=np.uint64))
            scalars.append(np.asarray(value.offset, dtype=np.uint64))
            window = value.window
            return (_KEY, len(scalars) - 2, None if window is None else (window.whole_shape, window.start, window.shape))
        if isinstance(value, list | tuple):
            return (_SEQ, tuple(self._encode(v, arrays, scalars) for v in value))
        return (_STATIC, value)

    def _structure(self, args: tuple, kwargs: dict, arrays: list, scalars: list) -> Any:
        """The hashable static structure of a call; fills ``arrays`` and ``scalars``."""
        encode = self._encode
        if self._static_positions or self._static_names:
            return (
                tuple([(_STATIC, a) if i in self._static_positions else encode(a, arrays, scalars)
                       for i, a in enumerate(args)]),
                tuple([(k, (_STATIC, v) if k in self._static_names else encode(v, arrays, scalars))
                       for k, v in kwargs.items()]),
            )
        return (
            tuple([encode(a, arrays, scalars) for a in args]),
            tuple([(k, encode(v, arrays, scalars)) for k, v in kwargs.items()]) if kwargs else (),
        )

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
            window = None if code[2] is None else ShardWindow(*code[2])
            return RandomDraw(scalars[code[1]], scalars[code[1] + 1], window)
        if kind == _SEQ:
            return [Lowering._decode(c, arrays, scalars) for c in code[1]]
        return code[1]

    @staticmethod
    def _meta(code: Any, arrays: Any) -> Any:
        kind = code[0]
        if kind == _VIEW:
            spec = code[2]
            return meta_tensor(spec.size, spec.dtype, spec.stride)
        if kind == _ARRAY:
            array = arrays[code[1]]
            return meta_tensor(array.shape, torch_dtype(array.dtype))
        if kind == _SCALAR:
            return code[2](1)  # only the Python type matters for PyTorch's dtype rules
        if kind == _KEY:
            return None
        if kind == _SEQ:
            return [Lowering._meta(c, arrays) for c in code[1]]
        return code[1]

    # -- calling -----------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        arrays: list = []
        scalars: list = []
        structure = self._structure(args, kwargs, arrays, scalars)
        return self._run(self._signature(structure), arrays, scalars, args)

    def specialize(self, layout: CallLayout, allocator: Any) -> Callable[[list, list], Any] | None:
        """A plan for every call with this layout (the contract is in
        :class:`accelkit.sdk.KernelEntry`): the arguments are encoded and the signature found
        once, so a call only collects the arrays and runs the program."""
        if type(self).__call__ is not Lowering.__call__:
            return None  # a subclass doing more per call than the program: a plan would skip it
        specs: list[ViewSpec] = []
        numbers = 0

        def code(item: Any, static: bool) -> Any:
            """``item``'s code in the structure :meth:`_structure` would build for its value;
            None for a compile-time float (its value must be in the structure)."""
            nonlocal numbers
            if type(item) is ViewSpec:
                specs.append(item)
                return (_VIEW, len(specs) - 1, item)
            if item is float or item is complex:
                if static:
                    return None
                numbers += 1
                return (_SCALAR, numbers - 1, item)
            if type(item) is tuple and not static:
                if item and type(item[0]) is ViewSpec:  # a list of device tensors
                    codes = []
                    for spec in item:
                        specs.append(spec)
                        codes.append((_VIEW, len(specs) - 1, spec))
                    return (_SEQ, tuple(codes))
                return (_SEQ, tuple((_STATIC, v) for v in item))
            return (_STATIC, item)

        positional = [code(item, i in self._static_positions) for i, item in enumerate(layout.args)]
        keywords = [(name, code(item, name in self._static_names)) for name, item in layout.kwargs]
        if any(c is None for c in positional) or any(c is None for _, c in keywords):
            return None
        signature = self._signature((tuple(positional), tuple(keywords)))
        run, read, to_scalar = self._run, allocator.read, _device_scalar
        # What :meth:`_run` and :func:`modes.run_program` do for a strict-mode call, inline: a
        # small op's Python overhead is mostly calls; a fused-mode record is inlined the same way
        # (debug mode, and fused mode outside recording, take :meth:`_run`).
        jitted, name, tally_of = signature.jitted, self.name, self._tally
        stamp, defer, refused_error = next_use, checks.defer, checks.Refused
        backlog, settle_at, settle = COSTS.backlog()  # COSTS.record, inline
        record_program, recording = fused.record_program, fused.recording

        def plan(blocks: list, values: list) -> Any:
            arrays = []
            for block, spec in zip(blocks, specs):
                array = block.array
                arrays.append(array if array is not None else read(block, spec).array)
            scalars = [to_scalar(v) for v in values] if values else []
            if modes._mode != "strict":
                if not recording():
                    return run(signature, arrays, scalars, specs)
                out, status = record_program(self, signature, arrays, scalars)  # as _run records
                if status is not None:
                    defer(status, name, DEVICE, out)
                return out
            signature.last_use = stamp()
            try:
                out, status = jitted(arrays, scalars)
            except refused_error as refused:
                raise refused.error from None
            if status is not None:
                defer(status, name, DEVICE, out)
            tally = signature.only
            if tally is None or jitted._cache_size() != signature.loaded:
                tally = tally_of(signature, arrays, scalars)
            backlog.append(tally)
            if len(backlog) >= settle_at:
                settle()
            return out

        return _sharing_results(plan, signature, allocator) if self.ignores_contents else plan

    def _signature(self, structure: Any) -> _Signature:
        signature = self._signatures.get(structure)
        if signature is None:
            program = self._program(structure)
            signature = _Signature(self._jitted(_refusing_unholdable_results(program), structure), program)
            signature = self._signatures.setdefault(structure, LOADED.track(signature))
        return signature

    def _jitted(self, program: Callable[..., Any], structure: Any) -> Any:
        """The jitted ``program`` for ``structure``; backed by the program store when one is open
        and the program can be named exactly (:mod:`.stored_programs`)."""
        jitted = jax.jit(program)
        store = stored_programs.STORE
        if store is None:
            return jitted
        try:
            key = stored_programs.canonical(
                (self.name, stored_programs.function_identity(self.fn), self.own_dtypes, structure))
        except stored_programs.Unstable:
            return jitted
        return stored_programs.StoredProgram(jitted, key, store)

    def _run(self, signature: _Signature, arrays: list, scalars: list, args: Any) -> Any:
        """Run the signature's program and count it (``args`` name the inputs in debug mode);
        in fused mode, record it (:mod:`.fused`)."""
        if modes._mode == "fused" and fused.recording():
            out, status = fused.record_program(self, signature, arrays, scalars)
            if status is not None:
                checks.defer(status, self.name, DEVICE, out)
            return out
        jitted = signature.jitted
        signature.last_use = next_use()
        out = modes.run_program(self.name, args, jitted, arrays, scalars)
        tally = signature.only
        if tally is None or jitted._cache_size() != signature.loaded:
            tally = self._tally(signature, arrays, scalars)
        COSTS.record(tally)
        return out

    def execute(self, signature: _Signature, arrays: list, scalars: list) -> tuple[Any, Any]:
        """Run the signature's program on concrete inputs and count it, as strict mode does;
        returns ``(result, status)`` (a fused region run op by op; its statuses were deferred
        when the calls were recorded)."""
        jitted = signature.jitted
        signature.last_use = next_use()
        out = jitted(arrays, scalars)
        tally = signature.only
        if tally is None or jitted._cache_size() != signature.loaded:
            tally = self._tally(signature, arrays, scalars)
        COSTS.record(tally)
        return out

    def _tally(self, signature: _Signature, arrays: list, scalars: list) -> Tally:
        """The cost tally of the program just run; its cost is analysed once, when it is first
        compiled, and the compile counted then."""
        shapes = tuple((a.shape, a.dtype) for a in arrays)
        with self._lock:
            self.compiles += signature.newly_compiled()
            tally = signature.tallies.get(shapes)
            if tally is None:
                jitted = signature.jitted
                if type(jitted) is stored_programs.StoredProgram:
                    executable = jitted.executable(arrays)
                else:  # jax caches both steps: this is the executable the call just ran
                    executable = jitted.lower(arrays, scalars).compile()
                cost = ProgramCost.of(executable, arrays, single_op=True)
                tally = signature.tallies[shapes] = COSTS.tally(self.name, cost)
            signature.only = tally if len(signature.tallies) == 1 else None
        return tally

    def _program(self, structure: Any) -> Callable[..., Any]:
        """The traceable program for one static structure of arguments.

        At trace time (once per input signature) it runs the op's Meta kernel: PyTorch's result
        shapes and dtypes, or PyTorch's own error for bad input. It returns ``(result, status)``,
        the status None when the lowering stated no condition (:mod:`.checks`).
        """
        fn, op, name, own_dtypes = self.fn, self.op, self.name, self.own_dtypes

        def program(arrays: Any, scalars: Any) -> Any:
            meta_args = [Lowering._meta(c, arrays) for c in structure[0]]
            # A key keyword may be one the schema lacks (native_dropout's, see random.py);
            # where the schema has a generator, leaving it out means its default, None.
            meta_kwargs = {k: Lowering._meta(c, arrays) for k, c in structure[1] if c[0] != _KEY}
            try:
                expected = op(*meta_args, **meta_kwargs)
            except NotImplementedError:
                expected = None  # no Meta kernel: trust the lowering
            except Exception as error:  # PyTorch refuses these arguments
                raise checks.Refused(error) from None
            args = [Lowering._decode(c, arrays, scalars) for c in structure[0]]
            kwargs = {k: Lowering._decode(c, arrays, scalars) for k, c in structure[1]}
            with checks.conditions() as stated:
                out = fn(*args, **kwargs)
            return _conform(name, out, expected, own_dtypes), stated.status()

        program.__name__ = name.replace(".", "_")
        return program


def _sharing_results(plan: Callable[[list, list], Any], signature: _Signature, allocator: Any) -> Callable:
    """``plan`` for a lowering whose result ignores its tensors' contents (``fill``, ``zero``):
    in strict mode its small results are made by the program once per call layout and numbers
    and then handed out again by the allocator (:meth:`~.buffers.TpuAllocator.keep_shared`),
    each call still charged the program's cost, as the target would run it. ``torch.zeros``,
    ``full`` and ``ones_like`` (every ``backward``'s seed) are a fresh ``empty`` filled this way.
    """
    shared, keep, record = allocator.shared, allocator.keep_shared, COSTS.record

    def sharing(blocks: list, values: list) -> Any:
        tally = signature.only  # None before the first compile, or with several executables
        if tally is None or modes._mode != "strict":
            return plan(blocks, values)
        # repr tells -0.0 from 0.0, which compare (and hash) equal
        key = (signature, *[(type(v), repr(v)) for v in values]) if values else signature
        out = shared(key)
        if out is None:
            out = plan(blocks, values)
            keep(key, out)
            return out
        record(tally)
        return out

    return sharing


def _refusing_unholdable_results(program: Callable[..., Any]) -> Callable[..., Any]:
    """``program`` as run on its own: when it is traced, that is before it first runs for these
    input shapes (or, in fused mode, when it is recorded), its results' bytes are checked
    against the device's free memory, and a result the device could not hold raises PyTorch's
    ``OutOfMemoryError`` without being computed (XLA's CPU client would otherwise fill the host
    with it before the allocator refused it: the allocator's criterion, applied earlier).

    Not checked: a fused region's flush (its results were accounted when recorded), and later
    runs of a traced program (jax reuses the trace); the allocator refuses those after the run,
    as before. So the check can only refuse what the allocator would refuse.
    """

    def run(arrays: Any, scalars: Any) -> Any:
        out = program(arrays, scalars)
        if not fused.flushing():
            allocator = sole_allocator()
            if allocator is not None:
                nbytes = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(out[0]))
                try:
                    allocator.ensure_room(nbytes)
                except torch.OutOfMemoryError as error:
                    raise checks.Refused(error) from None
        return out

    run.__name__ = program.__name__
    return run


def _conform(name: str, out: Any, expected: Any, own_dtypes: bool = False) -> Any:
    """Cast a lowering's outputs to PyTorch's result dtypes (unless the lowering decides its
    own) and check their shapes (traced)."""
    if expected is None:
        return out
    if isinstance(expected, torch.Tensor):
        if not isinstance(out, jax.Array):
            raise TypeError(f"tpu lowering of {name} returned {type(out).__name__}, expected one array")
        if tuple(out.shape) != tuple(expected.shape):
            raise AssertionError(
                f"tpu lowering of {name} returned shape {tuple(out.shape)}; PyTorch's is {tuple(expected.shape)}"
            )
        if own_dtypes or out.dtype == jax_dtype(expected.dtype):
            return out
        return out.astype(jax_dtype(expected.dtype))
    if isinstance(expected, list | tuple):
        outs = list(out) if isinstance(out, list | tuple) else [out]
        if len(outs) != len(expected):
            raise AssertionError(f"tpu lowering of {name} returned {len(outs)} results; PyTorch returns {len(expected)}")
        fixed = [_conform(name, o, e, own_dtypes) for o, e in zip(outs, expected)]
        return tuple(fixed) if isinstance(expected, tuple) else fixed
    return out


def lowering(
    *ops: OpOverload | OpOverloadPacket, derive_variants: bool = True, static: tuple[str, ...] = (),
    own_dtypes: bool = False, ignores_contents: bool = False,
) -> Callable:
    """Register a JAX function as the tpu kernel of each of ``ops`` (see the module docstring).

    :param static: names of float arguments to treat as compile-time constants (e.g. ``"ord"``).
    :param own_dtypes: the function's result dtypes stand, not the Meta kernel's: for the few
        ops whose CPU kernel and Meta kernel disagree on a result dtype (the lowering then
        implements CPU's rule).
    :param ignores_contents: the result depends on the tensor arguments' geometry and dtypes
        and on the numbers passed, never on the tensors' contents; small results are then made
        once and shared (:func:`_sharing_results`).
    """

    def register(fn: Callable) -> Callable:
        for op in ops:
            if isinstance(op, OpOverloadPacket):
                op = op.default
            lowered = Lowering(op, fn, static, own_dtypes, ignores_contents)
            kernels.add(op, lowered, derive_variants=derive_variants)
        return fn

    return register


def compile_counts() -> dict[str, int]:
    """Programs compiled so far, per op (only ops that compiled at least one)."""
    return {str(entry.op): entry.fn.compiles for entry in kernels if entry.fn.compiles}


def scalar_like(value: Any, array: jax.Array) -> Any:
    """A Python or traced scalar as an array of ``array``'s dtype (for lowerings' arithmetic)."""
    return jnp.asarray(value, dtype=array.dtype)
