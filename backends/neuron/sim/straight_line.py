"""A compiled program's recording as one straight-line function.

A program recording (:mod:`.replay`) is a list of steps, some of which call its kernels' own
recordings; replaying it walks those lists, resolves each binding and rebuilds each kernel's
result, step by step. All of that is fixed once the program is recorded, so
:func:`straight_line` writes it out once as Python source: one line per instruction, each HBM
operand a local name, the kernels' steps inlined. Running it does the instructions' numerics and
nothing else, as a NEFF runs with nothing of the graph left.

Memory the program allocates that its results never reach (an intermediate written by one
kernel and read by the next) is allocated once, with every view of it, and reused by each run,
as the program's tiles are; up to :data:`SCRATCH_BYTES` of it. Runs of one program are serial
(the caller holds its recording's lock), and the function holds its kernels' locks while it
runs, since their tiles are shared with the kernels' eager replays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from accelkit_backends.neuron.sim import replay as R

#: The most intermediate memory one program keeps between runs (more is allocated per run).
SCRATCH_BYTES = 16 << 20


def straight_line(recording: R.Recording) -> Callable[[list[np.ndarray]], Any] | None:
    """``recording``'s replay as one function of its argument arrays, or None when it has no
    kernels to inline (its plain replay is as short). The function returns ``(result,)``, or
    None without running when a kernel's recording is busy in another thread (the caller then
    replays step by step, waiting for it)."""
    if recording.refused is not None or not any(step[0] is R._CALL for step in recording._steps):
        return None
    return _Writer(recording).function()


class _Writer:
    """Writes the source: each array the program touches becomes a local (``a`` arguments,
    ``v`` everything else) or, for kept scratch memory and its views, a constant (``k``)."""

    def __init__(self, recording: R.Recording):
        self._recording = recording
        self._lines: list[str] = []
        self._constants: dict[str, Any] = {"_view": R._resolve, "_empty": np.empty}
        self._names = 0
        #: Per local or constant name: the root it lies in (a name of an argument, allocation,
        #: or made array), to tell which allocations the results reach.
        self._base: dict[str, str] = {}
        self._views: dict[tuple, str] = {}
        self._locks: dict[int, Any] = {}
        #: Per tile zeroed since the last instruction that could read it: its zeroing's line.
        self._fills: dict[int, int] = {}
        #: Allocations so far (``e<n>`` names them, the same in both passes) and the kept ones.
        self._allocations = 0
        self._kept: set[str] = set()
        self._reached: set[str] = set()
        self._scratch = 0

    def function(self) -> Callable[[list[np.ndarray]], Any]:
        arguments = [f"a{i}" for i in range(self._recording.arguments)]
        for name in arguments:
            self._base[name] = name
        # First pass, to learn which allocations the results reach; the second writes the code.
        result = self._inline(self._recording, arguments, dry=True)
        self._reached = {self._base[name] for name in _names_in(result)}
        self._lines, self._views, self._allocations, self._fills = [], {}, 0, {}
        self._constants = {"_view": R._resolve, "_empty": np.empty}
        self._base = {name: name for name in arguments}
        result = self._inline(self._recording, arguments, dry=False)
        locks = list(self._locks.values())
        body = "\n".join("    " + line for line in self._lines if line is not None)
        source = (f"def replay({', '.join(arguments)}):\n{body}\n    return {_expression(result)}\n")
        namespace = dict(self._constants)
        exec(compile(source, f"<neuron program {id(self._recording):x}>", "exec"), namespace)
        run = namespace["replay"]

        def replay(arrays: list[np.ndarray]) -> Any:
            held = []
            try:
                for lock in locks:
                    if not lock.acquire(blocking=False):
                        return None
                    held.append(lock)
                with np.errstate(all="ignore"):  # as instructions compute (Kernel._run)
                    return (run(*arrays),)
            finally:
                for lock in held:
                    lock.release()

        replay.source = source  # type: ignore[attr-defined]  # for a reader debugging a program
        return replay

    # -- one recording's steps, on roots named by the caller ------------------------------------

    def _inline(self, recording: R.Recording, roots: list[str], dry: bool) -> Any:
        """Write ``recording``'s steps on ``roots`` (names, arguments first); returns its result
        as a structure of names."""
        roots = list(roots)
        for kind, first, second in recording._steps:
            if kind is R._RUN:
                operands = [self._bound(roots, b) for b in second]
                plain = getattr(first, "plain", None)
                if plain is not None:
                    self._copy(plain, operands)
                else:
                    self._line(f"{self._constant('f', first)}({', '.join(operands)})")
            elif kind is R._ZERO:
                for tile in first:
                    self._fills[id(tile)] = len(self._lines)
                    self._lines.append(f"{self._constant('t', tile)}.fill(0)")
            elif kind is R._CALL:
                if first.lock is not recording.lock:
                    self._locks[id(first.lock)] = first.lock
                called = self._inline(first, [self._bound(roots, b) for b in second], dry)
                roots.extend(_names_in(called))
            elif kind is R._EMPTY:
                roots.append(self._allocation(first, second, dry))
            elif kind is R._MADE:
                name = self._local()
                self._line(f"{name} = {self._constant('m', first)}()")
                self._base[name] = name
                roots.append(name)
            else:
                source = self._bound(roots, second)
                name = self._local()
                self._line(f"{name} = {self._constant('d', first)}({source})")
                self._base[name] = name
                roots.append(name)
        return self._structure(recording._result, roots)

    def _copy(self, plain: tuple, operands: list[str]) -> None:
        """A plain DMA, ``target[...] = source`` (``source.T`` if it transposes). A load that fills a whole tile makes the
        tile's zeroing before it void, when nothing between read the tile."""
        hbm = iter(operands)
        source, target = (next(hbm) if array is None else self._constant("t", array) for array in plain[:2])
        line = f"{target}[...] = {source}{'.T' if plain[2] else ''}"
        if plain[0] is None and plain[1] is not None:  # a load: it reads no tile
            zeroing = self._fills.pop(id(plain[1]), None)
            if zeroing is not None:
                self._lines[zeroing] = None
            self._lines.append(line)
        else:
            self._line(line)

    def _allocation(self, shape: tuple, dtype: np.dtype, dry: bool) -> str:
        self._allocations += 1
        name = f"e{self._allocations}"
        self._base[name] = name
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if not dry and name not in self._reached and self._scratch + nbytes <= SCRATCH_BYTES:
            self._scratch += nbytes
            self._constants[name] = np.empty(shape, dtype)
            self._kept.add(name)
            return name
        self._lines.append(f"{name} = _empty({shape!r}, {self._constant('dtype', np.dtype(dtype))})")
        return name

    def _bound(self, roots: list[str], binding: int | tuple) -> str:
        """The name of the array ``binding`` resolves to: a root, or a view of one (made once
        per run, or once for good inside kept scratch memory)."""
        if binding.__class__ is int:
            return roots[binding]
        index, offset, shape, strides, dtype = binding
        root = roots[index]
        key = (root, offset, shape, strides, np.dtype(dtype).str)
        if key in self._views:
            return self._views[key]
        if root in self._kept:  # inside kept memory: the view is a constant too
            name = self._constant("k", R._resolve([self._constants[root]], (0, offset, shape, strides, dtype)))
            self._kept.add(name)
        else:
            name = self._local()
            self._lines.append(f"{name} = _view(({root},), (0, {offset}, {shape!r}, {strides!r}, "
                               f"{self._constant('dtype', np.dtype(dtype))}))")
        self._base[name] = self._base[root]
        self._views[key] = name
        return name

    def _structure(self, structure: Any, roots: list[str]) -> Any:
        kind, content = structure
        if kind == "array":
            return ("array", self._bound(roots, content))
        if kind == "value":
            return structure
        items = [self._structure(s, roots) for s in content]
        if kind is tuple or kind is list:
            return (kind, items)
        return (self._constant("c", kind), items)  # a tuple subclass, rebuilt by calling it

    # -- names --------------------------------------------------------------------------------

    def _local(self) -> str:
        self._names += 1
        return f"v{self._names}"

    def _constant(self, prefix: str, value: Any) -> str:
        self._names += 1
        name = f"{prefix}{self._names}"
        self._constants[name] = value
        return name

    def _line(self, line: str) -> None:
        """An instruction that may read any tile: earlier zeroings stand."""
        self._fills.clear()
        self._lines.append(line)


def _names_in(structure: Any) -> list[str]:
    """The array names of a result structure, in the order :func:`.replay.array_arguments`
    walks the result."""
    kind, content = structure
    if kind == "array":
        return [content]
    if kind == "value":
        return []
    return [name for s in content for name in _names_in(s)]


def _expression(structure: Any) -> str:
    kind, content = structure
    if kind == "array":
        return content
    if kind == "value":
        return repr(content)
    items = ", ".join(_expression(s) for s in content)
    if isinstance(kind, str):
        return f"{kind}([{items}])"
    if kind is tuple:
        return f"({items},)" if len(content) == 1 else f"({items})"
    return f"[{items}]"
