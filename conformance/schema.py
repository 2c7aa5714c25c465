"""The conformance result format, version ``accelkit-conformance/1``: constants and a validator.

This module is the one definition of the format; the runner writes it and the report reads it.
Field names are stable within a schema version.

Two files per backend, in ``<out>/<backend>/``:

``results.jsonl`` — written while the run goes, one JSON object per line, each line flushed:
    line 1: ``{"schema": SCHEMA, "environment": {...}}`` (the header);
    then one result record per finished test, in completion order.
    A killed run leaves a valid prefix: every line is a complete record. Only a writer killed
    in the middle of writing a line (not by the runner, which stops it between two lines) can
    leave a cut last line; the runner removes it if it outlives the writer, and readers ignore it.

``results.json`` — assembled at the end (or from an interrupted ``results.jsonl``)::

    {"schema": SCHEMA, "complete": bool, "environment": {...}, "results": [record, ...]}

``complete`` is False when the run did not reach its end (killed, or assembled from a partial
``results.jsonl``).

The environment header (:data:`ENVIRONMENT_FIELDS`):
    ``accelkit``, ``torch``, ``torch_git``, ``jax`` (None when jax is absent), ``python``,
    ``platform`` — versions and host; ``backend`` (name), ``target`` (hardware generation or
    None), ``simulated`` (bool or None when unknown), ``fallback_policy`` (the backend's policy
    for the run), ``profile`` (``"quick"`` | ``"full"`` | ``"custom"``), ``dtypes`` (dtype names
    the ops/modules suites ran), ``started`` (ISO-8601 UTC time), ``jobs`` (worker processes),
    ``timeout`` (per-test seconds). Optional: ``expectations`` (the backend's expectations
    file, or None); ``finished`` (ISO-8601 UTC time the run ended; absent when interrupted);
    ``fast_compile`` (the run asked for quick compiles over fast programs).

A result record (:data:`RECORD_FIELDS`):
    ``id``        the pytest node id (unique within a run);
    ``suite``     one of :data:`SUITES`;
    ``op``        what the test is about: an OpInfo name (``"add"``, ``"nn.functional.relu"``), a
                  module class name (``"torch.nn.Linear"``), a contract check or a dynamic case;
                  None when it has none;
    ``variant``   ``"forward"`` | ``"backward"`` for ops/modules, else None;
    ``dtype``     dtype name without ``torch.`` (``"float32"``) or None;
    ``outcome``   one of :data:`OUTCOMES`;
    ``reason``    why it did not pass (failure message, declared reason, crash signal), else None;
    ``expectation`` the key of the backend expectations entry that made the outcome
                  skip-declared / xfail / xpass (for xpass: the entry to remove), else None;
    ``duration``  seconds (float >= 0);
    ``paths``     ``{"native": n, "decomposed": n, "fallback": n}``: aten op executions on the
                  device by dispatch path during the test (deltas of ``accelkit.stats()``
                  totals), or None when the test did not run to a measurement (skips, crashes);
    ``fallback_ops`` sorted aten overload names that used the CPU fallback during the test;
    ``compiles``  backend compilations the test caused (int), or None when not measured;
    ``dynamic``   for suite ``"dynamic"``: ``{"shapes": [[int, ...], ...], "recompiles":
                  [int per shape change] or None when the backend reports no compile count,
                  "correct": bool, "programs": [programs the backend built per shape change]
                  under torch.compile, else None (optional)}``; otherwise None;
    ``float_reference`` (optional, 0 when absent) comparisons in the test that missed CPU's
                  kernel and passed against the float32 reference (a bfloat16 result CPU rounds
                  differently; see ``accelkit_conformance.float_reference``).

Lines of ``results.jsonl`` without an ``id`` are events, not records: ``{"event": "collected",
"total": n}`` (tests selected for the run) and ``{"event": "finished", "complete": bool, "at": time}``
(the run reached its end; ``complete`` says whether every selected test has a record).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

SCHEMA = "accelkit-conformance/1"

PASS = "pass"
FAIL = "fail"
ERROR = "error"
CRASH = "crash"
TIMEOUT = "timeout"
SKIP_DECLARED = "skip-declared"
SKIP_OTHER = "skip-other"
XFAIL = "xfail"
XPASS = "xpass"

#: Every outcome a record may carry.
OUTCOMES = (PASS, FAIL, ERROR, CRASH, TIMEOUT, SKIP_DECLARED, SKIP_OTHER, XFAIL, XPASS)
#: Outcomes that count against the backend (a regression if they appear in a diff).
BAD_OUTCOMES = (FAIL, ERROR, CRASH, TIMEOUT)
#: Outcomes of tests that did not run.
SKIP_OUTCOMES = (SKIP_DECLARED, SKIP_OTHER)

SUITES = ("capabilities", "ops", "modules", "contract", "dynamic", "distributed", "upstream")
VARIANTS = ("forward", "backward")
PATH_KINDS = ("native", "decomposed", "fallback")

ENVIRONMENT_FIELDS = (
    "accelkit", "torch", "torch_git", "jax", "python", "platform", "backend", "target",
    "simulated", "fallback_policy", "profile", "dtypes", "started", "jobs", "timeout",
)
RECORD_FIELDS = (
    "id", "suite", "op", "variant", "dtype", "outcome", "reason", "expectation", "duration",
    "paths", "fallback_ops", "compiles", "dynamic",
)

_STR = {"type": "string"}
_OPT_STR = {"type": ["string", "null"]}
_COUNT = {"type": "integer", "minimum": 0}

#: The same format as a JSON Schema (draft 2020-12), for external tools.
JSON_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": SCHEMA,
    "type": "object",
    "required": ["schema", "complete", "environment", "results"],
    "properties": {
        "schema": {"const": SCHEMA},
        "complete": {"type": "boolean"},
        "environment": {
            "type": "object",
            "required": list(ENVIRONMENT_FIELDS),
            "properties": {
                "accelkit": _STR, "torch": _STR, "torch_git": _OPT_STR, "jax": _OPT_STR,
                "python": _STR, "platform": _STR, "backend": _STR, "target": _OPT_STR,
                "simulated": {"type": ["boolean", "null"]}, "fallback_policy": _OPT_STR,
                "profile": _STR, "dtypes": {"type": "array", "items": _STR}, "started": _STR,
                "jobs": _COUNT, "timeout": {"type": ["number", "null"]},
                "fast_compile": {"type": "boolean"},
            },
        },
        "results": {"type": "array", "items": {"$ref": "#/$defs/record"}},
    },
    "$defs": {
        "record": {
            "type": "object",
            "required": list(RECORD_FIELDS),
            "properties": {
                "id": _STR,
                "suite": {"enum": list(SUITES)},
                "op": _OPT_STR,
                "variant": {"enum": [*VARIANTS, None]},
                "dtype": _OPT_STR,
                "outcome": {"enum": list(OUTCOMES)},
                "reason": _OPT_STR,
                "expectation": _OPT_STR,
                "duration": {"type": "number", "minimum": 0},
                "paths": {
                    "type": ["object", "null"],
                    "required": list(PATH_KINDS),
                    "properties": {k: _COUNT for k in PATH_KINDS},
                },
                "fallback_ops": {"type": "array", "items": _STR},
                "compiles": {"type": ["integer", "null"], "minimum": 0},
                "dynamic": {
                    "type": ["object", "null"],
                    "required": ["shapes", "recompiles", "correct"],
                    "properties": {
                        "shapes": {"type": "array", "items": {"type": "array", "items": _COUNT}},
                        "recompiles": {"type": ["array", "null"], "items": _COUNT},
                        "correct": {"type": "boolean"},
                        "programs": {"type": ["array", "null"], "items": _COUNT},
                    },
                },
                "float_reference": _COUNT,
            },
        }
    },
}


class SchemaError(ValueError):
    """A results document or record does not follow ``accelkit-conformance/1``; says where."""


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check(cond: bool, where: str, msg: str) -> None:
    if not cond:
        raise SchemaError(f"{where}: {msg}")


def validate_record(record: Mapping[str, Any], where: str = "record") -> None:
    """Raise :class:`SchemaError` unless ``record`` is a valid result record.

    Extra keys are allowed (forward compatibility); every field of :data:`RECORD_FIELDS` must
    be present with the type documented in this module.
    """
    _check(isinstance(record, Mapping), where, f"must be an object, not {type(record).__name__}")
    missing = [f for f in RECORD_FIELDS if f not in record]
    _check(not missing, where, f"missing fields {missing}")
    where = f"{where} {record['id']!r}" if isinstance(record["id"], str) else where
    _check(isinstance(record["id"], str) and record["id"], where, "id must be a non-empty string")
    _check(record["suite"] in SUITES, where, f"suite {record['suite']!r} is not one of {SUITES}")
    _check(record["outcome"] in OUTCOMES, where, f"outcome {record['outcome']!r} is not one of {OUTCOMES}")
    _check(record["variant"] in (*VARIANTS, None), where,
           f"variant {record['variant']!r} is not one of {VARIANTS} or null")
    for key in ("op", "dtype", "reason", "expectation"):
        _check(record[key] is None or isinstance(record[key], str), where, f"{key} must be a string or null")
    duration = record["duration"]
    _check(
        isinstance(duration, (int, float)) and not isinstance(duration, bool) and duration >= 0,
        where, f"duration must be a number >= 0, not {duration!r}",
    )
    paths = record["paths"]
    if paths is not None:
        _check(isinstance(paths, Mapping), where, "paths must be an object or null")
        for kind in PATH_KINDS:
            _check(_is_count(paths.get(kind)), where, f"paths.{kind} must be an integer >= 0")
    ops = record["fallback_ops"]
    _check(isinstance(ops, list) and all(isinstance(o, str) for o in ops), where,
           "fallback_ops must be a list of strings")
    _check(record["compiles"] is None or _is_count(record["compiles"]), where,
           "compiles must be an integer >= 0 or null")
    dyn = record["dynamic"]
    if dyn is not None:
        _check(isinstance(dyn, Mapping), where, "dynamic must be an object or null")
        shapes, recompiles = dyn.get("shapes"), dyn.get("recompiles")
        _check(
            isinstance(shapes, list) and all(isinstance(s, list) and all(_is_count(d) for d in s) for s in shapes),
            where, "dynamic.shapes must be a list of shapes (lists of integers >= 0)",
        )
        _check(
            recompiles is None or (isinstance(recompiles, list) and all(_is_count(r) for r in recompiles)),
            where, "dynamic.recompiles must be a list of integers >= 0 or null",
        )
        _check(isinstance(dyn.get("correct"), bool), where, "dynamic.correct must be a boolean")
        programs = dyn.get("programs")
        _check(programs is None or (isinstance(programs, list) and all(_is_count(p) for p in programs)),
               where, "dynamic.programs must be a list of integers >= 0 or null")
    _check(_is_count(record.get("float_reference", 0)), where, "float_reference must be an integer >= 0")


def validate_environment(env: Mapping[str, Any], where: str = "environment") -> None:
    """Raise :class:`SchemaError` unless ``env`` is a valid environment header."""
    _check(isinstance(env, Mapping), where, "must be an object")
    missing = [f for f in ENVIRONMENT_FIELDS if f not in env]
    _check(not missing, where, f"missing fields {missing}")
    for key in ("accelkit", "torch", "python", "platform", "backend", "profile", "started"):
        _check(isinstance(env[key], str), where, f"{key} must be a string")
    _check(isinstance(env["dtypes"], list) and all(isinstance(d, str) for d in env["dtypes"]), where,
           "dtypes must be a list of strings")
    _check(_is_count(env["jobs"]), where, "jobs must be an integer >= 0")


def validate_results(doc: Mapping[str, Any]) -> None:
    """Raise :class:`SchemaError` unless ``doc`` is a valid ``results.json`` document.

    Checks the schema tag, the environment, every record, and that record ids are unique.
    """
    _check(isinstance(doc, Mapping), "results", "must be a JSON object")
    _check(
        doc.get("schema") == SCHEMA, "results",
        f"schema is {doc.get('schema')!r}; this reader understands {SCHEMA!r}",
    )
    _check(isinstance(doc.get("complete"), bool), "results", "complete must be a boolean")
    validate_environment(doc.get("environment"))
    results = doc.get("results")
    _check(isinstance(results, list), "results", "results must be a list")
    seen: set[str] = set()
    for i, record in enumerate(results):
        validate_record(record, where=f"results[{i}]")
        _check(record["id"] not in seen, f"results[{i}]", f"duplicate id {record['id']!r}")
        seen.add(record["id"])


def read_jsonl(path: str | Path) -> dict[str, Any]:
    """Assemble a results document from a (possibly interrupted) ``results.jsonl``.

    A torn last line (the writer was killed mid-write) is ignored; a later record with the
    same id replaces an earlier one. ``complete`` is taken from the ``finished`` event, and is
    False when there is none (the run was killed).
    """
    header: dict[str, Any] | None = None
    records: dict[str, dict[str, Any]] = {}
    complete = False
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines):  # torn final line of a killed writer
                break
            raise SchemaError(f"{path}:{n}: not valid JSON") from None
        if header is None:
            _check("environment" in obj and obj.get("schema") == SCHEMA, f"{path}:1",
                   f"first line must be the {SCHEMA!r} header with an environment")
            header = obj
        elif "id" not in obj:
            if obj.get("event") == "finished":
                complete = obj.get("complete") is True
                if obj.get("at"):
                    header["environment"]["finished"] = obj["at"]
        else:
            records[obj["id"]] = obj
    _check(header is not None, str(path), "empty: no header line")
    return {
        "schema": SCHEMA, "complete": complete, "environment": header["environment"],
        "results": list(records.values()),
    }


def load_results(path: str | Path) -> dict[str, Any]:
    """Read and validate a ``results.json`` or ``results.jsonl``; return the document."""
    path = Path(path)
    if path.suffix == ".jsonl":
        doc = read_jsonl(path)
    else:
        doc = json.loads(path.read_text(encoding="utf-8"))
    validate_results(doc)
    return doc


def counts(results: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Number of records per outcome (every outcome present, zero when absent)."""
    tally = dict.fromkeys(OUTCOMES, 0)
    for record in results:
        tally[record["outcome"]] += 1
    return tally
