"""Reading one backend's conformance results, with errors that name the file and the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .schema import SCHEMA, SchemaError, read_jsonl, validate_results

_FIX = "pass the results.json (or results.jsonl) that `accelkit conformance run` wrote"


class ResultsError(ValueError):
    """A results file cannot be used: the message names the file, what is wrong and the fix."""


def load_results(path: str | Path) -> dict[str, Any]:
    """Read one backend's results and return the validated document.

    ``path`` is a ``results.json``, a ``results.jsonl`` (also the partial one a killed run
    leaves: a torn last line is ignored and ``complete`` is False), or a directory holding
    either (``results.json`` preferred).

    The returned dict is the ``accelkit-conformance/1`` document (``schema``, ``complete``,
    ``environment``, ``results``) plus ``"source"``: the path it was read from (str).

    :raises ResultsError: the file is missing, is not JSON, has another schema version, or
        does not follow the schema; the message names the file and the fix.
    """
    path = Path(path)
    if path.is_dir():
        candidates = [path / "results.json", path / "results.jsonl"]
        found = next((p for p in candidates if p.is_file()), None)
        if found is None:
            raise ResultsError(f"{path}: directory holds no results.json or results.jsonl; {_FIX}")
        path = found
    if not path.is_file():
        raise ResultsError(f"{path}: no such file; {_FIX}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{path}: cannot be read ({exc}); {_FIX}") from None
    jsonl = path.suffix == ".jsonl"
    try:
        first = json.loads(text.split("\n", 1)[0] if jsonl else text)
    except json.JSONDecodeError as exc:
        kind = "its first line is not JSON" if jsonl else f"not valid JSON ({exc.msg}, line {exc.lineno})"
        hint = " (a results.json cut short? report the results.jsonl next to it)" if not jsonl else ""
        raise ResultsError(f"{path}: {kind}{hint}; {_FIX}") from None
    _check_version(path, first)
    try:
        doc = read_jsonl(path) if jsonl else first
        validate_results(doc)
    except (SchemaError, KeyError, TypeError, AttributeError) as exc:
        detail = str(exc) if isinstance(exc, SchemaError) else f"{type(exc).__name__}: {exc}"
        detail = detail.removeprefix(f"{path}:").strip()
        raise ResultsError(
            f"{path}: does not follow {SCHEMA}: {detail}. The file was edited or written by a "
            f"broken runner; re-run `accelkit conformance run`"
        ) from None
    return {**doc, "source": str(path)}


def _check_version(path: Path, doc: Any) -> None:
    version = doc.get("schema") if isinstance(doc, dict) else None
    if version == SCHEMA:
        return
    if version is None:
        raise ResultsError(f"{path}: not an accelkit conformance result (no 'schema' field); {_FIX}")
    raise ResultsError(
        f"{path}: schema is {version!r} but this accelkit reads {SCHEMA!r}. Re-run "
        f"`accelkit conformance run` with this accelkit, or report it with the accelkit that wrote it"
    )
