"""Execution modes of the tpu backend.

- ``strict`` (default): ops are dispatched asynchronously, as XLA runs them; a failure inside a
  program surfaces at the next synchronisation (``.cpu()``, ``.item()``, ``torch.tpu.synchronize()``)
  and may name a later op.
- ``debug``: every op waits for its program to finish, so an error is raised by the op that
  caused it, with the op's name and its arguments' shapes. Slower; for finding a failing op.

Choose with ``ACCELKIT_TPU_MODE=strict|debug`` or, for a block of code,
``with accelkit_backends.tpu.execution_mode("debug"): ...``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import jax

MODE_ENV = "ACCELKIT_TPU_MODE"
MODES = ("strict", "debug")


class TpuExecutionError(RuntimeError):
    """A program failed on the device; in debug mode the message names the op that ran it."""


def _from_env() -> str:
    value = os.environ.get(MODE_ENV, "strict").strip().lower() or "strict"
    if value not in MODES:
        raise ValueError(f"{MODE_ENV}={value!r} is not a mode; use one of {', '.join(MODES)}")
    return value


_mode = _from_env()


def current() -> str:
    return _mode


@contextlib.contextmanager
def execution_mode(mode: str) -> Iterator[None]:
    """Run the block in ``mode`` (``"strict"`` or ``"debug"``), restoring the previous one."""
    global _mode
    if mode not in MODES:
        raise ValueError(f"execution mode must be one of {MODES}, not {mode!r}")
    previous, _mode = _mode, mode
    try:
        yield
    finally:
        _mode = previous


def _shapes(args: Any) -> str:
    parts = []
    for a in args:
        spec = getattr(a, "spec", None)
        shape = spec.size if spec is not None else getattr(a, "shape", None)
        parts.append(str(tuple(shape)) if shape is not None else repr(a)[:20])
    return ", ".join(parts)


def check(op: str, out: Any, args: Any) -> None:
    """Wait for ``out``; re-raise a device failure as :class:`TpuExecutionError` naming ``op``."""
    try:
        jax.block_until_ready(out)
    except Exception as exc:
        raise TpuExecutionError(f"{op} failed on tpu:0 with arguments ({_shapes(args)}): {exc}") from exc
