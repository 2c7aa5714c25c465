"""Device-side checks: PyTorch's errors for bad values, from programs that cannot raise.

An XLA program cannot raise, so a lowering that must refuse some input values (an index out of
range, an integer division by zero) states the condition while it is traced::

    checks.require(ok, IndexError, "index {} is out of bounds for dimension 0 with size 3", bad)

and the machinery here turns every such condition of a program into one small extra output,
its *status*: zeros when every condition held, else the check number of the first that failed
and the (up to two) integers its message names, such as the offending index. What the caller sees:

- ``debug`` mode: the status is read after the op and its error raised at once;
- ``strict`` mode (asynchronous): the status stays on the device and is read at the next
  synchronisation (a host read, ``torch.tpu.synchronize()``), which raises the error of the
  first failed check, naming the op that failed — CUDA's device-side assert, but with
  PyTorch's own exception and message, and the process keeps working. A failure known while
  tracing (a Python divisor of 0) raises at the op in either mode.

A lowering that refuses a value must still compute something, and when its result will be
written into an input (the in-place and ``out=`` forms the runtime derives from it) that
something must be the input's old value, so nothing is half-written: see :func:`unchanged_unless`
and :func:`drop_unless` for the two ways to get it.
"""

from __future__ import annotations

import collections
import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

#: Statuses waiting to be read, at most this many; past it the oldest are read at once.
PENDING_LIMIT = 256
#: Statuses folded into one on the device before a read (a read costs about as much as a small
#: op, a fold about as much as one read). XLA's CPU platform reads each status as it is instead
#: (:func:`_read_each`).
FOLD = 64


class Refused(Exception):
    """Carries PyTorch's error for arguments refused while a program was traced (by the op's
    Meta kernel or a condition known at trace time) out of jax, to be raised as it is: in
    debug mode too, it is the caller's error, not a failure of the program."""

    def __init__(self, error: Exception):
        super().__init__(error)
        self.error = error


#: Integers a check's message may name (the status holds this many after the check number).
VALUES = 2


class Check(NamedTuple):
    """What a failed condition raises: ``error(message.format(*values))``."""

    error: type[Exception]
    message: str

    @property
    def number(self) -> int:
        """The check's number in a status: the same in every process, since a program compiled
        in one process may run in another (:mod:`.stored_programs`)."""
        named = f"{self.error.__module__}.{self.error.__qualname__}|{self.message}"
        return int.from_bytes(hashlib.sha256(named.encode()).digest()[:7], "little") + 1


_checks: dict[int, Check] = {}  # by number
_checks_lock = threading.Lock()


def register(check: Check) -> int:
    """Make ``check`` known to this process (a program that states it may have been traced in
    another) and return its number."""
    number = check.number
    with _checks_lock:
        _checks[number] = check
    recording = getattr(_tracing, "recording", None)
    if recording is not None:
        recording.add(check)
    return number


@contextmanager
def recording() -> Iterator[set[Check]]:
    """Collect the checks the programs traced in the block state (to store beside them)."""
    outer = getattr(_tracing, "recording", None)
    _tracing.recording = found = set()
    try:
        yield found
    finally:
        _tracing.recording = outer
        if outer is not None:
            outer.update(found)


# ---------------------------------------------------------------------------------------------
# Inside a lowering (traced)
# ---------------------------------------------------------------------------------------------


class _Conditions:
    """The conditions stated while one program is traced, folded into its status."""

    def __init__(self) -> None:
        self.stated: list[tuple[Any, int, Any]] = []  # (ok, check number, its values)

    def status(self) -> jax.Array | None:
        if not self.stated:
            return None
        status = jnp.zeros((1 + VALUES,), jnp.int64)
        for ok, number, values in reversed(self.stated):  # the first failed condition wins
            status = jnp.where(ok, status, jnp.concatenate([jnp.full((1,), number, jnp.int64), values]))
        return status


_tracing = threading.local()


@contextmanager
def conditions() -> Iterator[_Conditions]:
    """Collect the conditions :func:`require` states while a program is traced."""
    outer = getattr(_tracing, "conditions", None)
    _tracing.conditions = found = _Conditions()
    try:
        yield found
    finally:
        _tracing.conditions = outer


def require(ok: Any, error: type[Exception], message: str, *values: Any) -> None:
    """State that the program being traced fails with ``error(message.format(*values))`` unless
    ``ok`` (a boolean scalar) holds; ``values`` are up to two integer scalars naming the
    offending input (an index, its position).

    A condition whose truth is known while tracing costs nothing when it holds and raises at
    once when it does not. Outside a traced program (a lowering called eagerly) every
    condition is known, so it raises at once too.
    """
    if isinstance(ok, bool | np.bool_) or not isinstance(ok, jax.core.Tracer):
        if not bool(ok):
            known = [int(v) if not isinstance(v, jax.core.Tracer) else "?" for v in values]
            raise Refused(error(message.format(*known)))
        return
    if len(values) > VALUES:
        raise ValueError(f"checks.require: at most {VALUES} values, got {len(values)}")
    found = getattr(_tracing, "conditions", None)
    if found is None:
        raise RuntimeError("checks.require: a traced condition outside a tpu program")
    padded = [jnp.asarray(v).astype(jnp.int64) for v in values] + [jnp.zeros((), jnp.int64)] * (VALUES - len(values))
    found.stated.append((ok, register(Check(error, message)), jnp.stack(padded)))


def first_where(bad: Any, values: Any) -> tuple[Any, Any, Any]:
    """``(ok, value, position)``: whether ``bad`` is false everywhere, and the element of
    ``values`` at the first true position of ``bad`` in row-major order, and that position
    (0 when there is none) — a check's arguments."""
    flat = jnp.reshape(bad, -1)
    if flat.shape[0] == 0:
        return True, 0, 0
    position = jnp.argmax(flat)
    return ~flat[position], jnp.reshape(jnp.broadcast_to(values, jnp.shape(bad)), -1)[position], position


def require_in_range(index: Any, size: int, error: type[Exception], message: str,
                     negative: bool = False) -> Any:
    """Require every element of ``index`` to lie in ``[0, size)``, or in ``[-size, size)`` when
    ``negative``; ``message`` is formatted with the first offending index. Returns the
    condition (True when ``index`` is empty)."""
    if jnp.size(index) == 0:
        return True
    low = -size if negative else 0
    ok, bad, _ = first_where((index < low) | (index >= size), index)
    require(ok, error, message, bad)
    return ok


def unchanged_unless(ok: Any, result: Any, old: Any) -> Any:
    """``result`` where ``ok`` holds, else ``old`` (broadcast and cast to ``result``): the value an
    in-place form of the op stores, so a failed check leaves its tensor as it was."""
    if ok is True:
        return result
    return jnp.where(ok, result, jnp.broadcast_to(old, result.shape).astype(result.dtype))


def drop_unless(ok: Any, index: Any, size: int) -> Any:
    """``index`` where ``ok`` holds, else every position out of range (``size``): for a scatter
    with ``mode="drop"``, a failed check then writes nothing, at the cost of the index alone."""
    if ok is True:
        return index
    return jnp.where(ok, index, jnp.asarray(size, index.dtype))


# ---------------------------------------------------------------------------------------------
# After a program ran
# ---------------------------------------------------------------------------------------------


class _Pending(NamedTuple):
    status: jax.Array
    op: str
    results: tuple[int, ...]  # id() of each array the program returned


_pending: collections.deque[_Pending] = collections.deque()
_pending_lock = threading.Lock()


def _error(status: np.ndarray, op: str, device: str, deferred: bool, later: list[str] = ()) -> Exception:
    check = _checks.get(int(status[0]))
    if check is None:  # cannot happen unless a stored program lost its checks
        check = Check(RuntimeError, f"a device-side check of tpu failed (check {int(status[0])}), but this process "
                      "does not know it: clear the program store (ACCELKIT_COMPILE_CACHE/tpu-programs)")
    where = f"{op} on {device}"
    if deferred:
        where += ("; tpu runs ops asynchronously, so this surfaced at the next synchronisation: "
                  "set ACCELKIT_TPU_MODE=debug to raise it at the op")
    if later:
        named = ", ".join(later[:3]) + (", ..." if len(later) > 3 else "")
        where += f"; {len(later)} later op{'s' if len(later) > 1 else ''} failed too: {named}"
    return check.error(f"{check.message.format(*(int(v) for v in status[1:]))} ({where})")


def raise_now(status: jax.Array, op: str, device: str) -> None:
    """Read ``status`` (waiting for the program) and raise its error, if any (debug mode)."""
    found = np.asarray(status)
    if found[0]:
        raise _error(found, op, device, deferred=False)


def defer(status: jax.Array, op: str, device: str, results: Any) -> None:
    """Keep ``status`` to be read at the next synchronisation (strict mode); ``results`` are the
    arrays its program returned (see :func:`settle`). Past :data:`PENDING_LIMIT` waiting
    statuses, the oldest are read at once (this waits for their programs)."""
    returned = tuple(map(id, results)) if type(results) is tuple or type(results) is list else (id(results),)
    _pending.append(_Pending(status, op, returned))
    if len(_pending) > PENDING_LIMIT:
        _settle(device, count=PENDING_LIMIT // 2)


def raise_pending(device: str) -> None:
    """Read every status still waiting and raise the error of the first failed one. Later
    failures — often the same bad value met again, as ``x[bad] += 1`` reads and then writes
    through it — are named in that error, not raised again: as with CUDA's device-side
    asserts, what ran after a failure is suspect, and the first failure is the one to fix."""
    if _pending:
        _settle(device)


def settle(results: Any, device: str) -> None:
    """Raise now the pending error of the program that returned ``results`` (arrays, or device
    views of them), if its status is still waiting; this reads every waiting status. Nothing is
    read for the results of a program with no waiting status."""
    wanted = {id(r.array if hasattr(r, "spec") else r) for r in results}
    if any(not wanted.isdisjoint(p.results) for p in _pending):
        _settle(device)


@jax.jit
def _fold(statuses: tuple[jax.Array, ...]) -> jax.Array:
    """One array for many statuses: which of them failed (1/0 each), then the first failed one
    (all zeros when none did)."""
    stacked = jnp.stack(statuses)
    failed = stacked[:, 0] != 0
    return jnp.concatenate([failed.astype(jnp.int64), stacked[jnp.argmax(failed)] * jnp.any(failed)])


def _padded(statuses: list[jax.Array]) -> tuple[jax.Array, ...]:
    """``statuses`` padded with passing ones to a power of two, so that few folds compile."""
    size = 1 << (len(statuses) - 1).bit_length()
    return tuple(statuses) + (_PASSED,) * (size - len(statuses))


_PASSED = np.zeros((1 + VALUES,), np.int64)


def _read_each(status: Any) -> bool:
    """Whether statuses like ``status`` are read one by one: on XLA's CPU platform an array's
    host view is its own memory, so a read costs about a microsecond (64 of them less than one
    fold program and its transfer); on an accelerator each read is a transfer, and statuses are
    folded first."""
    return all(device.platform == "cpu" for device in status.devices())


def _settle(device: str, count: int | None = None) -> None:
    """Read the oldest ``count`` waiting statuses (all by default), :data:`FOLD` at a time
    folded into one read (each as it is where reads are cheap: :func:`_read_each`), and raise
    the first failure among them."""
    with _pending_lock:
        taken = [_pending.popleft() for _ in range(min(len(_pending), count or len(_pending)))]
        if not taken:
            return
        from accelkit_backends.tpu.fused import concrete

        statuses = [concrete(p.status) for p in taken]
        if _read_each(statuses[0]):
            failed = [(found, p.op) for p, status in zip(taken, statuses) if (found := np.asarray(status))[0]]
        else:
            failed = _folded_failures(taken, statuses)
        if failed:
            (status, op), later = failed[0], [name for _, name in failed[1:]]
            raise _error(status, op, device, deferred=True, later=later)


def _folded_failures(taken: list[_Pending], statuses: list[jax.Array]) -> list[tuple[np.ndarray | None, str]]:
    """The failed ones of ``taken`` (whose ``statuses`` are these arrays), in order, :data:`FOLD`
    statuses a read: the first with its status, the others (its chunk's later failures; other
    chunks' firsts) by name at least."""
    starts = range(0, len(taken), FOLD)
    folds = jax.device_get([_fold(_padded(statuses[i:i + FOLD])) for i in starts])
    failed: list[tuple[np.ndarray | None, str]] = []
    for i, folded in zip(starts, folds):
        marks, first = folded[:-(1 + VALUES)], folded[-(1 + VALUES):]
        names = [p.op for p, mark in zip(taken[i:i + FOLD], marks) if mark]
        if names:
            failed.append((first, names[0]))
            failed.extend((None, name) for name in names[1:])
    return failed


def pending() -> int:
    """Statuses not yet read (for tests and stats)."""
    return len(_pending)
