"""How many compiled XLA programs tpu keeps loaded, and which it unloads.

A loaded executable costs host memory (about 1.5 MiB for a small program on XLA's CPU client)
and maps three or so memory regions, and Linux refuses a process more than
``vm.max_map_count`` regions (65,530 by default): past that, XLA fails to compile ("Cannot
allocate memory") or the process dies inside it. jax keeps every executable a jitted function
compiled for as long as the function lives, and tpu compiles one per op structure and input
shape, so a process that meets many shapes (a long eager run with changing lengths, a
conformance worker) would grow without bound and end there.

tpu therefore keeps at most ``ACCELKIT_TPU_LIVE_PROGRAMS`` executables loaded (default 2048).
Past that, the jitted functions used least recently unload theirs, down to three quarters of
the limit. An unloaded program is compiled again on its next use (read back from disk when
the persistent compilation cache is on); results do not change.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any, TypeVar

from accelkit.sdk import env_count
from accelkit_backends.tpu import modes

LIVE_PROGRAMS_ENV = "ACCELKIT_TPU_LIVE_PROGRAMS"
DEFAULT_LIVE_PROGRAMS = 2048

_clock = itertools.count(1)
P = TypeVar("P", bound="Program")


class Program:
    """A jitted function whose executables :data:`LOADED` may unload.

    Callers stamp ``last_use = next_use()`` on each call and, after a call, ask
    :meth:`newly_compiled`. ``loaded`` is how many executables it held when last asked;
    ``compiled`` how many it has compiled in all, recompiles after an unload included.
    """

    __slots__ = ("jitted", "loaded", "compiled", "last_use", "__weakref__")

    def __init__(self, jitted: Any):
        self.jitted = jitted
        self.loaded = 0
        self.compiled = 0
        self.last_use = 0

    def newly_compiled(self) -> int:
        """Executables compiled since last asked, counted in :data:`LOADED` (0 when none)."""
        size = self.jitted._cache_size()
        if size == self.loaded:
            return 0
        new = max(size - self.loaded, 0)
        self.loaded = size
        if new:
            self.compiled += new
            LOADED.add(new)
        return new


class TrackedFunction(Program):
    """A jitted function called directly (data movement): each call is stamped and counted."""

    __slots__ = ()

    def __call__(self, *args: Any) -> Any:
        if modes._mode == "fused":
            from accelkit_backends.tpu import fused

            if any(type(a) is fused.Pending for a in args):
                if fused.recording():
                    return fused.record_jit(self, args)
                args = tuple(fused.concrete(a) for a in args)
        self.last_use = next(_clock)
        out = self.jitted(*args)
        if self.jitted._cache_size() != self.loaded:
            self.newly_compiled()
        return out


def tracked(jitted: Any) -> TrackedFunction:
    """``jitted``, called as before, with its executables counted and bounded."""
    return LOADED.track(TrackedFunction(jitted))


#: ``next_use()``: a stamp later than every earlier one (the counter's own C method: every op
#: takes one).
next_use = _clock.__next__


class LoadedPrograms:
    """The executables of every tracked :class:`Program` (held weakly: a program whose owner is
    gone, a discarded compiled graph, takes its executables with it), bounded by ``limit``."""

    def __init__(self, limit: int | None = None):
        self._limit = limit
        self._programs: weakref.WeakSet[Program] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._counted = 0  # loaded executables (an upper bound: see loaded())
        self.unloaded = 0  # executables unloaded so far
        self.unloads = 0  # times the limit was reached

    @property
    def limit(self) -> int:
        """``ACCELKIT_TPU_LIVE_PROGRAMS``, read once (at the first compile).

        :raises ValueError: the variable is not a whole number of at least 16.
        """
        if self._limit is None:
            self._limit = env_count(LIVE_PROGRAMS_ENV, DEFAULT_LIVE_PROGRAMS, "programs", 16)
        return self._limit

    def track(self, program: P) -> P:
        """Count and bound ``program``'s executables from now on (held weakly)."""
        with self._lock:
            self._programs.add(program)
        return program

    def add(self, compiled: int) -> None:
        """``compiled`` more executables are loaded; past the limit, unload."""
        with self._lock:
            self._counted += compiled
            if self._counted > self.limit:
                self._unload_least_recently_used()

    def loaded(self) -> int:
        """Executables loaded: counted as they compile and unload, in constant time (stats read
        it per op call). A discarded compiled graph frees its own, which stay counted until
        the next time the limit is reached, when the count is taken again."""
        return self._counted

    def _unload_least_recently_used(self) -> None:
        programs = sorted(self._programs, key=lambda p: p.last_use)
        loaded = sum(p.jitted._cache_size() for p in programs)
        if loaded > self.limit:
            self.unloads += 1
            target = self.limit * 3 // 4
            for program in programs:
                size = program.jitted._cache_size()
                if size:
                    program.jitted.clear_cache()
                    program.loaded = 0
                    self.unloaded += size
                    loaded -= size
                    if loaded <= target:
                        break
        self._counted = loaded

    def stats(self) -> dict[str, int]:
        return {"loaded": self.loaded(), "limit": self.limit, "unloaded": self.unloaded, "unloads": self.unloads}


#: The process's tracked programs: ops', data movement's and compiled graphs'.
LOADED = LoadedPrograms()
