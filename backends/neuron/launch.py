"""How an aten op becomes a tile program on the simulated NeuronCore.

``@tile_kernel(aten.add.Tensor)`` registers a *body* ``body(k, out, *args, **kwargs)`` where ``k``
is the :class:`~accelkit_backends.neuron.sim.isa.Kernel` (the instruction set), ``out`` the
result geometry PyTorch's Meta kernel gives for these arguments (a list of :class:`OutSpec`),
and the arguments are numpy views of HBM (device tensors) or Python values. The body allocates
its HBM results with :func:`hbm_empty` and returns them.

Each distinct (op, shapes, dtypes, static arguments) is one compiled kernel instance: counted
per op, and a source of the shape-churn warning (see ``cost.py``).

A body registered ``static=True`` promises that its instructions depend on shapes, dtypes and
static arguments only: it reads no values in Python (a check of values goes through
``Kernel.check``) and writes HBM only through instructions. Its instance is then recorded once
and replayed (:mod:`.sim.replay`): a later run recomputes the numerics only, as a loaded NEFF
does. ``ACCELKIT_NEURON_VERIFY_REPLAY=1`` also runs the body for every replay and raises if the
two differ in a single bit (the tests run with it); ``ACCELKIT_NEURON_REPLAY=0`` runs every
body in full.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
from torch._ops import OpOverload

from accelkit.sdk import KernelDeclined, KernelTable, RandomDraw, meta_call, meta_tensor
from accelkit_backends.neuron import adaptive, cost, runtime
from accelkit_backends.neuron.adaptive import PendingView
from accelkit_backends.neuron.sim import numerics as nx
from accelkit_backends.neuron.sim import replay

kernels = KernelTable("neuron")
#: Each op's tile-program body, as registered (the graph compiler's fusion calls bodies itself).
_BODIES: dict[OpOverload, Callable] = {}


class OutSpec(NamedTuple):
    shape: tuple[int, ...]
    dtype: torch.dtype


def tile_kernel(*ops: OpOverload, derive_variants: bool = True, static: bool = False,
                complex_aware: bool = False) -> Callable[[Callable], Callable]:
    """Register ``body`` as the neuron kernel of each op (see the module docstring).

    ``complex_aware``: the body handles complex64 arguments and results (as float32 pairs, see
    :mod:`.kernels.complex`); without it, a call that involves a complex tensor is declined
    (``KernelDeclined``) and takes the CPU fallback."""

    def register(body: Callable) -> Callable:
        for op in ops:
            kernels.add(op, _launcher(op, body, static, complex_aware), derive_variants=derive_variants)
            if complex_aware:
                _COMPLEX_AWARE.add(op)
            _BODIES[op] = body
        return body

    return register


#: Each op's complex64 body, for ops whose registered body computes real dtypes only.
_COMPLEX_BODIES: dict[OpOverload, Callable] = {}
#: Ops whose registered body handles complex64 itself.
_COMPLEX_AWARE: set[OpOverload] = set()


def computes_complex(op: OpOverload) -> bool:
    """Whether ``op``'s kernel has a program for complex64 operands (otherwise it declines them)."""
    return op in _COMPLEX_AWARE or op in _COMPLEX_BODIES


def complex_form(*ops: OpOverload) -> Callable[[Callable], Callable]:
    """Register ``body`` as the static tile program each op runs when a complex tensor (or
    number) is involved, beside the real body :func:`tile_kernel` registered for it (see
    :mod:`.kernels.complex`)."""

    def register(body: Callable) -> Callable:
        for op in ops:
            _COMPLEX_BODIES[op] = body
        return body

    return register


def body_of(op: OpOverload) -> Callable | None:
    """The tile-program body registered for ``op`` (not its launcher), or None."""
    return _BODIES.get(op)


def _launcher(op: OpOverload, body: Callable, static: bool = False, complex_aware: bool = False) -> Callable:
    name = str(op).removeprefix("aten.")
    recordable = adaptive.recordable(op, static)

    def launch(*args: Any, **kwargs: Any) -> Any:
        if adaptive.engaged():
            # Adaptive eager: a static kernel is recorded (its results' geometry from the Meta
            # kernel now), anything else runs now, after what it needs of the open region. A
            # new instance runs now the first time (its compile, where a kernel may decline
            # its arguments to the CPU fallback or warn of shape churn, at the op).
            instance = None
            if recordable:
                key = _instance_key(args, kwargs)
                out = _output_specs(op, key, args, kwargs)
                if not _complex_involved(args, kwargs, out):
                    instance = (op, key, tuple(out))
                    if instance in _RAN:
                        result = adaptive.record(op, args, kwargs, out)
                        if result is not None:
                            return result
            adaptive.STATS["ops_not_recorded"] += 1
            args, kwargs = adaptive.concrete((args, kwargs))
            result = run(*args, **kwargs)
            if instance is not None:
                if len(_RAN) > 65536:
                    _RAN.clear()
                _RAN.add(instance)
            return result
        return run(*args, **kwargs)

    def run(*args: Any, **kwargs: Any) -> Any:
        key = _instance_key(args, kwargs)
        out = _output_specs(op, key, args, kwargs)
        body_now, static_now = body, static
        if not complex_aware and _complex_involved(args, kwargs, out):
            # The engines have no complex datapath: only programs written for float32 pairs
            # take complex64; any other op goes to the CPU fallback, counted as one.
            body_now, static_now = _COMPLEX_BODIES.get(op), True
            if body_now is None:
                raise KernelDeclined(f"neuron kernel {name} has no complex form")
        cost.LEDGER.note_instance(name, key)
        # The instance (with its result geometry, which a float argument can change) fixes the
        # program: its schedule is computed once (NeuronCore.kernel).
        instance = (op, key, tuple(out))
        if static_now:
            arrays = replay.array_arguments(args, kwargs)

            def program(k: Any, given: list[np.ndarray]) -> Any:
                if given is arrays:
                    return body_now(k, out, *args, **kwargs)
                given_args, given_kwargs = replay.with_arrays(args, kwargs, given)
                return body_now(k, out, *given_args, **given_kwargs)

            # Floats by their bits: a program that fills -0.0 is not the one that fills 0.0.
            return run_static(name, instance, arrays, tuple(v.hex() for v in _float_values(args, kwargs)), program)
        with runtime.core().kernel(name, instance) as k:
            return body_now(k, out, *args, **kwargs)

    launch.__name__ = launch.__qualname__ = f"neuron_{body.__name__}"
    return launch


#: Static kernel instances that ran once (adaptive eager records only these).
_RAN: set[tuple] = set()


def _complex_involved(args: tuple, kwargs: dict, out: list[OutSpec]) -> bool:
    """Whether a call takes or makes a complex tensor (or takes a complex number)."""
    if any(spec is not None and spec.dtype.is_complex for spec in out):
        return True
    for value in (*args, *kwargs.values()):
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, complex) or isinstance(item, (np.ndarray, PendingView)) and item.dtype.kind == "c":
                return True
    return False


# ---------------------------------------------------------------------------------------------
# Static instances: recorded once, then replayed (see the module docstring)
# ---------------------------------------------------------------------------------------------

VERIFY_ENV = "ACCELKIT_NEURON_VERIFY_REPLAY"
REPLAY_ENV = "ACCELKIT_NEURON_REPLAY"
_REFUSED = object()
#: Per static instance (with its float arguments and its arguments' aliasing): its recording,
#: or _REFUSED when it cannot replay.
_RECORDINGS: dict[tuple, Any] = {}
#: Replays, recordings and refusals (with the reason per op), for stats.
REPLAY_COUNTS = {"replayed": 0, "recorded": 0, "refused": {}}


class ReplayMismatch(AssertionError):
    """A replay's results differ from the body's (``ACCELKIT_NEURON_VERIFY_REPLAY=1``): the
    body is not static as declared."""


def run_static(name: str, instance: tuple, arrays: list[np.ndarray], statics: tuple,
               body: Callable[[Any, list[np.ndarray]], Any]) -> Any:
    """Run a static program: ``body(k, arrays)`` on its array arguments ``arrays``, or a replay of
    its recording. ``instance`` fixes its instructions with ``statics`` (values it bakes in, such
    as float arguments) and the arrays' aliasing. The tile-kernel launcher and the graph
    compiler's fused programs run through here."""
    core = runtime.core()
    # Empty operands take shortcuts outside instructions.
    if any(a.size == 0 for a in arrays) or os.environ.get(REPLAY_ENV) == "0":
        with core.kernel(name, instance) as k:
            return body(k, arrays)
    key = (instance, statics, replay.aliasing(arrays))
    recording = _RECORDINGS.get(key)
    if recording is None and not core.record_instructions:
        result = _record(core, name, instance, key, body, arrays)
        recording = _RECORDINGS[key]
    else:
        result = _replay_or_run(core, name, instance, recording, body, arrays)
    program = replay.active_program()
    if program is not None:
        if recording is None or recording is _REFUSED:
            program.refuse(f"kernel {name} cannot replay")
        else:
            program.called(recording, arrays, result)
    return result


def _replay_or_run(core: Any, name: str, instance: tuple, recording: Any, body: Callable,
                   arrays: list[np.ndarray]) -> Any:
    if recording is not _REFUSED and recording is not None and core.can_replay(instance) \
            and recording.lock.acquire(blocking=False):
        verify = os.environ.get(VERIFY_ENV) == "1"
        before = [replay.twin(a) for a in arrays] if verify else None
        try:
            result = recording.replay(arrays)
        finally:
            recording.lock.release()
        core.replayed(name, instance, recording)
        REPLAY_COUNTS["replayed"] += 1
        if verify:
            _verify(core, name, body, arrays, before, result)
        return result
    with core.kernel(name, instance) as k:
        return body(k, arrays)


def _record(core: Any, name: str, instance: tuple, key: tuple, body: Callable, arrays: list[np.ndarray]) -> Any:
    recording = replay.Recording(arrays)
    with core.kernel(name, instance) as k, replay.recording_into(recording):
        k.recording = recording
        result = body(k, arrays)
        recording.finish(result)
    if len(_RECORDINGS) > 4096:
        _RECORDINGS.clear()
    if recording.refused is None:
        _RECORDINGS[key] = recording
        REPLAY_COUNTS["recorded"] += 1
    else:
        _RECORDINGS[key] = _REFUSED
        REPLAY_COUNTS["refused"][name] = recording.refused
    return result


def _verify(core: Any, name: str, body: Callable, arrays: list[np.ndarray], before: list[np.ndarray],
            result: Any) -> None:
    """Run the body on copies of the arguments as they were, on a scratch core; its results and
    the arguments it writes must equal the replay's bit for bit."""
    if any(a is not None for a in replay.aliasing(arrays)) or nx.stochastic_rounding_enabled():
        return  # copies would not alias as the arguments do; stochastic rounding draws anew
    from accelkit_backends.neuron.sim.core import NeuronCore

    with NeuronCore(core.spec).kernel(name) as k:
        expected = body(k, before)
    if not replay.same_bits(result, expected) or not all(replay.same_bits(a, b) for a, b in zip(arrays, before)):
        raise ReplayMismatch(f"neuron kernel {name}: a replay of its recorded instructions differs from "
                             "running its body; it is registered static but is not")


# ---------------------------------------------------------------------------------------------
# Instance keys and output geometry (from PyTorch's Meta kernels, cached per instance)
# ---------------------------------------------------------------------------------------------


def _key_of(value: Any) -> Any:
    if isinstance(value, (np.ndarray, PendingView)):
        return ("array", value.shape, value.dtype.str, value.strides)
    if isinstance(value, (list, tuple)):
        return tuple(_key_of(v) for v in value)
    if isinstance(value, float):
        return ("float",)  # a runtime input: a new value is not a new kernel
    if isinstance(value, RandomDraw):  # a runtime input: the window shapes the program
        return ("draw", value.window)
    if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return str(value)
    return value


def _instance_key(args: tuple, kwargs: dict) -> tuple:
    return (tuple(_key_of(a) for a in args), tuple(sorted((k, _key_of(v)) for k, v in kwargs.items())))


def _to_meta(value: Any) -> Any:
    if isinstance(value, (np.ndarray, PendingView)):
        itemsize = value.dtype.itemsize
        strides = tuple(s // itemsize for s in value.strides)
        return meta_tensor(value.shape, nx.torch_dtype(value.dtype), strides)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_meta(v) for v in value)
    if isinstance(value, RandomDraw):
        return None
    return value


_SPECS: dict[tuple, list[OutSpec]] = {}
#: Ops PyTorch gives no Meta kernel, each with an op of the same arguments and result geometry
#: whose Meta kernel stands in (see :func:`meta_twin`).
_META_TWINS: dict[OpOverload, OpOverload] = {}


def meta_twin(op: OpOverload, twin: OpOverload) -> None:
    """Take ``op``'s result geometry from ``twin``'s Meta kernel (``op`` has none of its own);
    ``twin`` takes the same arguments and gives results of the same shapes and dtypes."""
    _META_TWINS[op] = twin


def _output_specs(op: OpOverload, key: tuple, args: tuple, kwargs: dict) -> list[OutSpec]:
    cache_key = (op, key, _float_values(args, kwargs))
    specs = _SPECS.get(cache_key)
    if specs is None and not op._schema.returns:
        return []  # an op that only writes its arguments (some have no Meta kernel to ask)
    if specs is None:
        # A draw given to an op whose schema has no generator (native_dropout in a program).
        names = {a.name for a in op._schema.arguments}
        result = meta_call(_META_TWINS.get(op, op), *_to_meta(args),
                           **{k: _to_meta(v) for k, v in kwargs.items() if k in names})
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
    array = np.empty(shape, dtype=nx.numpy_dtype(dtype))
    recording = replay.active()
    if recording is not None:
        recording.allocated(array)
    return array


@functools.lru_cache(maxsize=None)
def chip_dtype(dtype: np.dtype) -> np.dtype:
    """The tile dtype to request for an HBM dtype: float64 (downcast policy only) computes as
    float32; int64 stays int64, which ``Kernel.sbuf`` holds as a range-checked int32 tile."""
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        return np.dtype(np.float32)
    return dtype
