"""Writing results: the environment header, the incremental ``results.jsonl`` and ``results.json``.

One process writes (the pytest controller); every line is flushed as it is written, so killing
the run loses nothing already recorded. See :mod:`accelkit_conformance.schema` for the format.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
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
                expectations: str | None = None) -> dict[str, Any]:
    """The environment header for a run of ``backend``, built without activating it.

    Besides the fields of :data:`~accelkit_conformance.schema.ENVIRONMENT_FIELDS` it carries
    ``expectations``: the backend's expectations file, if it has one.
    """
    import torch

    from accelkit._plugins import registry
    from accelkit._runtime._context import policy_from_env

    reg = registry()
    record = reg.get(backend)
    probe = record.probe() if record is not None else None
    policy = policy_from_env(record.info.default_fallback) if record is not None and record.info else None
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
    }
    validate_environment(env)
    return env


class ResultsWriter:
    """Appends the header, records and events of one run to ``<directory>/results.jsonl``.

    The file is truncated when the writer opens it: a directory holds one run.
    """

    def __init__(self, directory: str | os.PathLike, env: dict[str, Any]):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / JSONL
        self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - lives for the run
        self.written = 0
        self._line({"schema": SCHEMA, "environment": env})

    def _line(self, obj: dict[str, Any]) -> None:
        self._file.write(json.dumps(obj, separators=(",", ":")) + "\n")
        self._file.flush()

    def record(self, record: dict[str, Any]) -> None:
        """Write one result record (validated first: a malformed record is a bug of the suite)."""
        validate_record(record)
        self._line(record)
        self.written += 1

    def event(self, name: str, **fields: Any) -> None:
        """Write an event line (``collected``, ``finished``)."""
        self._line({"event": name, **fields})

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def assemble(directory: str | os.PathLike) -> Path:
    """Write ``<directory>/results.json`` from its ``results.jsonl`` and return its path.

    Works on an interrupted run too: the document then has ``complete`` False.
    """
    directory = Path(directory)
    doc = read_jsonl(directory / JSONL)
    path = directory / JSON
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path
