"""Execution modes of the tpu backend.

- ``strict`` (default): ops are dispatched asynchronously, as XLA runs them; a failure inside a
  program surfaces at the next synchronisation (``.cpu()``, ``.item()``, ``torch.tpu.synchronize()``)
  and may name a later op. (XLA's CPU platform runs host callbacks inline, so there a callback's
  failure is raised at once.)
- ``debug``: every op waits for its program to finish, and any failure of an op is raised as
  :class:`TpuExecutionError` naming the op and its arguments' shapes, with the original error as
  its cause. Slower; for finding a failing op.
- ``fused``: ops are recorded (their errors of shape, dtype and arguments still raised at the
  op) and run as one XLA program per region, flushed at host reads, synchronisations, kernels
  that cannot be recorded and a size limit; regions that repeat (a training step) are compiled
  once and reused (:mod:`.fused`). Device-side check failures surface as in strict mode.

Choose with ``ACCELKIT_TPU_MODE=strict|debug|fused`` or, for a block of code,
``with accelkit_backends.tpu.execution_mode("debug"): ...``.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from typing import Any

import jax

from accelkit.sdk import ViewSpec
from accelkit_backends.tpu import checks

MODE_ENV = "ACCELKIT_TPU_MODE"
MODES = ("strict", "debug", "fused")

DEVICE = "tpu:0"  # named in the errors of failed device-side checks


class TpuExecutionError(RuntimeError):
    """A program failed on the device; in debug mode the message names the op that ran it."""


def _from_env() -> str:
    value = os.environ.get(MODE_ENV, "strict").strip().lower() or "strict"
    if value not in MODES:
        raise ValueError(f"{MODE_ENV}={value!r} is not a mode; use one of {', '.join(MODES)}")
    if value == "fused" and _devices() > 1:
        # A process-wide default, not a request: the process runs, in strict mode, and says so.
        warnings.warn(f"{MODE_ENV}=fused: fused regions run on one tpu device, and "
                      f"ACCELKIT_TPU_DEVICES={_devices()}; ops run in strict mode", stacklevel=2)
        return "strict"
    return value


def _devices() -> int:
    from accelkit.sdk import device_count_from_env

    return device_count_from_env("tpu")


def _check_devices(mode: str) -> None:
    """Fused regions run on one device: refuse a request for fused mode with several."""
    if mode == "fused" and _devices() > 1:
        raise ValueError(f"fused mode runs on one tpu device, and ACCELKIT_TPU_DEVICES={_devices()}: "
                         "use strict mode with several devices, or one device in fused mode")


_mode = _from_env()


def current() -> str:
    return _mode


@contextlib.contextmanager
def execution_mode(mode: str) -> Iterator[None]:
    """Run the block in ``mode`` (``"strict"``, ``"debug"`` or ``"fused"``), restoring the
    previous one; what fused mode left pending runs when it ends."""
    global _mode
    if mode not in MODES:
        raise ValueError(f"execution mode must be one of {MODES}, not {mode!r}")
    _check_devices(mode)
    previous = _mode
    _switch(mode)
    try:
        yield
    finally:
        _switch(previous)


def _switch(mode: str) -> None:
    global _mode
    if _mode == "fused" and mode != "fused":
        from accelkit_backends.tpu import fused

        fused.leave()
    _mode = mode


def _shapes(args: Any) -> str:
    parts = []
    for a in args:
        spec = a if isinstance(a, ViewSpec) else getattr(a, "spec", None)
        shape = spec.size if spec is not None else getattr(a, "shape", None)
        parts.append(str(tuple(shape)) if shape is not None else repr(a)[:20])
    return ", ".join(parts)


def run_checked(op: str, args: Any, program: Any, *inputs: Any) -> Any:
    """Run ``program`` and wait for it; any failure becomes :class:`TpuExecutionError` naming ``op``.

    In debug mode every error of an op — from tracing, compiling or running its program — is
    reported this way, with the original exception as ``__cause__``; arguments the op refuses
    (:class:`checks.Refused`: PyTorch's own error) pass unchanged.
    """
    try:
        out = program(*inputs)
        jax.block_until_ready(out)
    except checks.Refused:
        raise
    except Exception as exc:
        raise TpuExecutionError(f"{op} failed on tpu:0 with arguments ({_shapes(args)}): {exc}") from exc
    return out


def run_program(op: str, args: Any, program: Any, *inputs: Any) -> Any:
    """Run a program returning ``(results, status)`` in the current mode and return its results:
    in debug mode waited for (:func:`run_checked`) and its device-side checks raised at once; in
    strict mode its status left to the next synchronisation. PyTorch's own error for refused
    arguments (:class:`checks.Refused`) is raised as it is."""
    try:
        if _mode == "debug":
            out, status = run_checked(op, args, program, *inputs)
            if status is not None:
                checks.raise_now(status, op, DEVICE)
        else:
            out, status = program(*inputs)
            if status is not None:
                checks.defer(status, op, DEVICE, out)
    except checks.Refused as refused:
        raise refused.error from None
    return out
