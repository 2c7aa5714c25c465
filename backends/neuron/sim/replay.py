"""Numerics-only replay of a static kernel instance.

A kernel instance whose instructions depend on shapes, dtypes and static arguments only (never
on values) issues the same instructions every run, as a compiled NEFF does. Its first run is
recorded: each instruction's numerics as a step, with every HBM operand bound to where it lies
in one of the kernel's *roots* (its array arguments, the results it allocates, and host copies
it stages). A later run of the instance replays the steps on the new roots: no kernel Python,
no tile allocation, no scheduling (the instance's timing is already known). The numerics are
the recorded instructions' own, so results are bit-for-bit those of running the body.

A compiled program is recorded the same way, as the calls of its kernels' recordings
(:meth:`Recording.called`), with the arrays it makes on the host between them (a graph's
constants, dtype conversions) made again at each replay.

A recording refuses to replay (and the kernel then always runs in full) when an instruction
touches HBM memory that is none of its roots, or when the tiles it would keep exceed
:data:`TILE_BYTES`; :attr:`Recording.refused` says why.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from numpy.lib.array_utils import byte_bounds


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


class _At:
    """An ``__array_interface__`` at an address, keeping the memory's owner alive."""

    __slots__ = ("__array_interface__", "owner")

    def __init__(self, interface: dict, owner: Any):
        self.__array_interface__ = interface
        self.owner = owner


def _view(root: np.ndarray, offset: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The array of ``shape``/``strides`` starting ``offset`` bytes from ``root``'s first element."""
    interface = {"data": (_address(root) + offset, False), "shape": shape, "strides": strides,
                 "typestr": dtype.str, "descr": dtype.descr, "version": 3}
    view = np.asarray(_At(interface, root))
    return view if view.dtype == dtype else view.view(dtype)  # descr round trips lose ml_dtypes


#: The most tile memory one recording keeps (its tiles are reused by every replay).
TILE_BYTES = 16 << 20

_active = threading.local()


def active() -> Recording | None:
    """The recording the current thread's kernel body fills, if any."""
    return getattr(_active, "recording", None)


def active_program() -> Recording | None:
    """The recording of the compiled program the current thread runs, if any: each kernel the
    program runs is a call of its own recording (:meth:`Recording.called`)."""
    return getattr(_active, "program", None)


def program_into(recording: Recording) -> contextlib.AbstractContextManager[None]:
    """Within the block, the kernels the thread runs are calls of ``recording``'s program."""
    return _bound("program", recording)


def recording_into(recording: Recording) -> contextlib.AbstractContextManager[None]:
    """Within the block, results the body allocates (``hbm_empty``) become the recording's roots."""
    return _bound("recording", recording)


@contextlib.contextmanager
def _bound(slot: str, recording: Recording) -> Iterator[None]:
    previous = getattr(_active, slot, None)
    setattr(_active, slot, recording)
    try:
        yield
    finally:
        setattr(_active, slot, previous)


class Recording:
    """The steps of one static kernel instance's run (see the module docstring)."""

    def __init__(self, arguments: Sequence[np.ndarray]):
        self.arguments = len(arguments)
        self._roots: list[np.ndarray] = list(arguments)
        #: In order: (_RUN, compute, bindings) for an instruction's numerics, (_ZERO, tiles, None)
        #: for fresh tiles, (_CALL, recording, bindings) for a program's kernel, and for each root
        #: after the arguments (_EMPTY, shape, dtype), (_MADE, fn, None) or (_DERIVED, fn, binding).
        #: A binding is a root's index, or ``(index, offset, shape, strides, dtype)`` for memory
        #: inside it.
        self._steps: list[tuple] = []
        self._result: Any = None
        #: Why the instance cannot replay (None: it can).
        self.refused: str | None = None
        #: The instance's flops and timing (relative to its start), as recorded.
        self.flops = 0
        self.timing: Any = None
        self._tile_bytes = 0
        #: Kernels a program recording saw called (see :meth:`called`).
        self.calls = 0
        #: Replays reuse the recorded tiles' memory: one at a time.
        self.lock = threading.Lock()

    # -- recording ------------------------------------------------------------------------

    def allocated(self, array: np.ndarray) -> None:
        """``array`` is a fresh HBM result of the kernel."""
        self._roots.append(array)
        self._steps.append((_EMPTY, array.shape, array.dtype))

    def tile(self, data: np.ndarray) -> None:
        """A new tile, zeroed now and at each replay (a fresh tile reads as zeros)."""
        self._tile_bytes += data.nbytes
        if self._tile_bytes > TILE_BYTES:
            self.refuse(f"its tiles take more than {TILE_BYTES >> 20} MiB to keep")
        if self.refused is not None:
            return
        if self._steps and self._steps[-1][0] is _ZERO:  # tiles taken one after another: one step
            self._steps[-1][1].append(data)
        else:
            self._steps.append((_ZERO, [data], None))

    def finished(self, flops: int, timing: Any) -> None:
        """What the recorded run cost, once it is timed."""
        self.flops, self.timing = flops, timing

    def derived(self, fn: Callable[[np.ndarray], np.ndarray], source: np.ndarray) -> np.ndarray:
        """``fn(source)``: a host array the simulator derives from HBM memory (a dense staging
        copy of a strided input), made again from the new memory at replay."""
        made = fn(source)
        binding = self.bind(source)
        if binding is not None:
            self._roots.append(made)
            self._steps.append((_DERIVED, fn, binding))
        return made

    def made(self, fn: Callable[[], np.ndarray]) -> np.ndarray:
        """``fn()``: a host array made from static values only (a graph's constant), made anew
        at replay."""
        made = fn()
        self._roots.append(made)
        self._steps.append((_MADE, fn, None))
        return made

    def step(self, compute: Callable[..., None], hbm: tuple[np.ndarray, ...] = ()) -> None:
        """An instruction's numerics, ``compute(*hbm)``, already run once by the caller."""
        if self.refused is not None:
            return
        bindings = tuple(self.bind(a) for a in hbm)
        if self.refused is None:
            self._steps.append((_RUN, compute, bindings))

    def called(self, kernel: Recording, arguments: Sequence[np.ndarray], result: Any) -> None:
        """A program's kernel ran as ``kernel`` records it, on ``arguments``, and gave ``result``
        (whose arrays become roots): at replay, ``kernel`` replays on the same memory."""
        if self.refused is not None:
            return
        if kernel.refused is not None:
            self.refuse(f"its kernel cannot replay: {kernel.refused}")
            return
        bindings = tuple(self.bind(a) for a in arguments)
        self.calls += 1
        if self.refused is None:
            self._steps.append((_CALL, kernel, bindings))
            self._roots.extend(array_arguments((result,), {}))

    def finish(self, result: Any) -> None:
        """The body's return value: arrays among the roots (or views of them), or plain data."""
        if self.refused is None:
            self._result = self._structure(result)
        self._roots = []  # bindings are made: the first run's memory is not kept

    def bind(self, array: np.ndarray) -> int | tuple | None:
        """Where ``array`` lies: a root's index for the root itself, else ``(root, offset,
        shape, strides, dtype)``; None (and the recording refuses) when it lies in no root."""
        for index, root in enumerate(self._roots):
            if array is root:
                return index
        # By address: roots are alive while recording, so memory inside one belongs to it (a
        # view made through torch has another owner object, but the same bytes).
        low, high = byte_bounds(array)
        for index, root in enumerate(self._roots):
            root_low, root_high = byte_bounds(root)
            if root_low <= low and high <= root_high:
                if array.shape == root.shape and array.strides == root.strides and _address(array) == _address(root) \
                        and array.dtype == root.dtype:
                    return index
                return (index, _address(array) - _address(root), array.shape, array.strides, array.dtype)
        self.refuse(f"an instruction touched HBM memory of shape {array.shape} that is no argument or result")
        return None

    def _structure(self, value: Any) -> Any:
        if isinstance(value, np.ndarray):
            binding = self.bind(value)
            return ("array", binding)
        if isinstance(value, (list, tuple)):
            return (type(value), [self._structure(v) for v in value])
        if value is None or isinstance(value, (bool, int, str)):
            return ("value", value)
        self.refuse(f"the body returned a {type(value).__name__}")
        return None

    def refuse(self, reason: str) -> None:
        if self.refused is None:
            self.refused = reason
        self._steps.clear()  # nor keep the tiles alive

    # -- replay ---------------------------------------------------------------------------

    def replay(self, arguments: Sequence[np.ndarray]) -> Any:
        """Run the recorded steps on new argument arrays (laid out as the recorded ones);
        returns the body's result on the new memory."""
        with np.errstate(all="ignore"):  # as instructions compute (Kernel._run)
            return self._replay(list(arguments))

    def _replay(self, roots: list[np.ndarray]) -> Any:
        for kind, first, second in self._steps:
            if kind is _RUN:
                first(*[roots[b] if b.__class__ is int else _resolve(roots, b) for b in second])
            elif kind is _ZERO:
                for tile in first:
                    tile.fill(0)
            elif kind is _CALL:
                with first.lock:
                    result = first._replay([roots[b] if b.__class__ is int else _resolve(roots, b) for b in second])
                roots.extend(array_arguments((result,), {}))
            elif kind is _EMPTY:
                roots.append(np.empty(first, dtype=second))
            elif kind is _MADE:
                roots.append(first())
            else:
                roots.append(first(_resolve(roots, second)))
        return _rebuild(roots, self._result)


# Step kinds (see Recording._steps).
_RUN, _ZERO, _CALL, _EMPTY, _MADE, _DERIVED = "run", "zero", "call", "empty", "made", "derived"


def _resolve(roots: list[np.ndarray], binding: int | tuple) -> np.ndarray:
    if binding.__class__ is int:
        return roots[binding]
    index, offset, shape, strides, dtype = binding
    root = roots[index]
    if offset >= 0 and root.flags.c_contiguous:
        try:  # the fast way, where the root lends its memory as a buffer
            return np.ndarray(shape, dtype, root, offset, strides)
        except (TypeError, ValueError):
            pass
    return _view(root, offset, shape, strides, dtype)


def _rebuild(roots: list[np.ndarray], structure: Any) -> Any:
    kind, content = structure
    if kind == "array":
        return _resolve(roots, content)
    if kind == "value":
        return content
    return kind(_rebuild(roots, s) for s in content)


def array_arguments(args: tuple, kwargs: dict) -> list[np.ndarray]:
    """The arrays among a call's arguments, in order (lists and tuples walked)."""
    found: list[np.ndarray] = []
    for value in (*args, *kwargs.values()):
        _collect_arrays(value, found)
    return found


def _collect_arrays(value: Any, found: list[np.ndarray]) -> None:
    # A function of the module, not a closure calling itself: that closure and its cell are a
    # cycle, and ``found`` (the call's arrays) would wait for the cyclic collector.
    if isinstance(value, np.ndarray):
        found.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _collect_arrays(v, found)


def _swap_arrays(value: Any, replacements: Iterator[np.ndarray]) -> Any:
    if isinstance(value, np.ndarray):
        return next(replacements)
    if isinstance(value, (list, tuple)):
        return type(value)(_swap_arrays(v, replacements) for v in value)
    return value


def with_arrays(args: tuple, kwargs: dict, arrays: Sequence[np.ndarray]) -> tuple[tuple, dict]:
    """``args`` and ``kwargs`` with their arrays replaced by ``arrays``, in the order
    :func:`array_arguments` lists them."""
    replacements = iter(arrays)
    return (tuple(_swap_arrays(a, replacements) for a in args),
            {k: _swap_arrays(v, replacements) for k, v in kwargs.items()})


def aliasing(arrays: Sequence[np.ndarray]) -> tuple:
    """Which arguments overlap in memory, and at what distance: part of what fixes a recording
    (``mul(x, x)`` reads both operands from one root, ``mul(x, y)`` from two). By address, as
    arrays read through ``as_strided`` share no owner object."""
    if len(arrays) < 2:
        return ()
    if _apart(arrays):
        return (None,) * len(arrays)
    bounds = [byte_bounds(a) for a in arrays]
    pattern = []
    for i, (low, high) in enumerate(bounds):
        first = next((j for j in range(i) if low < bounds[j][1] and bounds[j][0] < high), None)
        pattern.append(None if first is None else (first, _address(arrays[i]) - _address(arrays[first])))
    return tuple(pattern)


def _apart(arrays: Sequence[np.ndarray]) -> bool:
    """Whether the arrays lie in distinct numpy allocations, so none can overlap another: a
    cheap test (no addresses) that holds for most calls. False says nothing."""
    owners = set()
    for array in arrays:
        owner = array
        while owner.base is not None:
            owner = owner.base
            if owner.__class__ is not np.ndarray:
                return False  # memory lent by another object: only addresses can tell
        if not owner.flags.owndata or id(owner) in owners:
            return False
        owners.add(id(owner))
    return True


def twin(array: np.ndarray) -> np.ndarray:
    """A copy of ``array`` in new memory laid out as it is (same strides and gaps): a kernel
    takes the same path over it, which a compacted copy need not."""
    low, high = byte_bounds(array)
    memory = np.empty(max(high - low, 1), np.uint8)
    copy = _view(memory, _address(array) - low, array.shape, array.strides, array.dtype)
    copy[...] = array
    return copy


def same_bits(a: Any, b: Any) -> bool:
    """Bitwise equality of two results (arrays compared byte for byte)."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.shape == b.shape and a.dtype == b.dtype and \
            np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_bits(x, y) for x, y in zip(a, b))
    return a == b
