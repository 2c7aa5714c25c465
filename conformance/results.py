"""Writing results: the environment header, the incremental ``results.jsonl`` and ``results.json``.

One process writes (the pytest controller). Each line goes to the file in one ``write`` call as
soon as it is complete, so killing the run loses nothing already recorded; a kill that lands in
the middle of that call can cut the last line at most, which :func:`drop_torn_tail` removes once
the writer is dead (and :func:`~accelkit_conformance.schema.read_jsonl` ignores). See
:mod:`accelkit_conformance.schema` for the format.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import threading
from pathlib import Path
from typing import Any

from accelkit_conformance.schema import (
    SCHEMA,
    read_jsonl,
    validate_environment,
    validate_record,
)

JSONL = "results.jsonl"
JSON = "results.json"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(backend: str, *, profile: str, dtypes: list[str], jobs: int, timeout: float | None,
                expectations: str | None = None, capabilities: dict[str, Any] | None = None) -> dict[str, Any]:
    """The environment header for a run of ``backend``, built without activating it.

    Besides the fields of :data:`~accelkit_conformance.schema.ENVIRONMENT_FIELDS` it carries
    ``expectations``: the backend's expectations file, if it has one, ``capabilities``: its
    declared capabilities (name -> ``True`` or the reason it is not supported), and
    ``fast_compile``: whether the run asked the backend to compile quickly rather than well.
    """
    import torch

    from accelkit.sdk import backends, fast_compile

    view = backends().get(backend)
    probe = view.probe() if view is not None else None
    policy = view.fallback_policy() if view is not None and view.info else None
    env = {
        "accelkit": _version("accelkit") or "unknown",
        "torch": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", None),
        "jax": _version("jax"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "backend": backend,
        "target": probe.target if probe is not None else None,
        "simulated": probe.simulated if probe is not None else None,
        "fallback_policy": policy,
        "profile": profile,
        "dtypes": list(dtypes),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "jobs": jobs,
        "timeout": timeout,
        "expectations": expectations,
        "capabilities": dict(capabilities or {}),
        "fast_compile": fast_compile(),
    }
    validate_environment(env)
    return env


class ResultsWriter:
    """Appends the header, records and events of one run to ``<directory>/results.jsonl``.

    The file is truncated when the writer opens it: a directory holds one run. Lines are written
    whole (one ``write`` call each, under a lock), and :meth:`close` may be called from another
    thread to end the writing between two lines.
    """

    def __init__(self, directory: str | os.PathLike, env: dict[str, Any]):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / JSONL
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o666)
        self._lock = threading.Lock()
        self.written = 0
        self._line({"schema": SCHEMA, "environment": env})

    def _line(self, obj: dict[str, Any]) -> bool:
        data = memoryview((json.dumps(obj, separators=(",", ":")) + "\n").encode("utf-8"))
        with self._lock:
            if self._fd < 0:
                return False
            while data:
                data = data[os.write(self._fd, data):]
            return True

    def record(self, record: dict[str, Any]) -> None:
        """Write one result record (validated first: a malformed record is a bug of the suite)."""
        validate_record(record)
        if self._line(record):
            self.written += 1

    def event(self, name: str, **fields: Any) -> None:
        """Write an event line (``collected``, ``finished``)."""
        self._line({"event": name, **fields})

    def close(self) -> None:
        """Close the file once the line being written (if any) is complete; later lines are dropped.

        Safe from any thread: the run's lifeline calls it before killing the run.
        """
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def write_text_atomically(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename,
    so that ``path`` is either its old content or all of the new one, even if the writer is killed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def drop_torn_tail(path: str | os.PathLike) -> bool:
    """Cut an incomplete last line (a writer killed in mid-write) off ``path``; True if it had one.

    Only for a file whose writer is dead: a live writer may be finishing that line.
    """
    with open(path, "rb+") as f:
        end = f.seek(0, os.SEEK_END)
        pos = end
        while pos > 0:
            start = max(0, pos - 65536)
            f.seek(start)
            chunk = f.read(pos - start)
            if pos == end and chunk.endswith(b"\n"):
                return False
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                f.truncate(start + newline + 1)
                return True
            pos = start
        if end:
            f.truncate(0)
        return end > 0


def assemble(directory: str | os.PathLike) -> Path:
    """Write ``<directory>/results.json`` from its ``results.jsonl`` and return its path.

    Works on an interrupted run too: the document then has ``complete`` False.
    """
    directory = Path(directory)
    doc = read_jsonl(directory / JSONL)
    return write_text_atomically(directory / JSON, json.dumps(doc, indent=1) + "\n")
