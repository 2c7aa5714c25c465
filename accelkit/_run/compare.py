"""``accelkit compare``: the estimates of several ``accelkit run`` reports in one table.

A run estimates its own backend's generations (``--estimate-on``); comparing a TPU with a
Trainium takes a run on each. This puts their reports side by side: one row per report and
target, the same figures the reports print, and each total against the first row's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from accelkit._errors import AccelkitError
from accelkit._run.report import format_seconds


def load_report(path: Path, command: str = "accelkit compare") -> dict[str, Any]:
    """The report at ``path``: a JSON file, or a ``--report`` directory's ``report.json`` (rank
    0's ``report-rank0.json`` for a distributed run); ``command`` names the asker in errors.

    :raises AccelkitError: no report there, or not an ``accelkit run`` report.
    """
    if not path.exists():
        raise AccelkitError(f"{command}: no report at {path} (write one with accelkit run --report DIR)")
    if path.is_dir():
        found = [path / name for name in ("report.json", "report-rank0.json") if (path / name).is_file()]
        if not found:
            raise AccelkitError(f"{command}: {path} holds no report.json (write one with accelkit run --report {path})")
        path = found[0]
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise AccelkitError(f"{command}: {path} cannot be read as a report: {exc}") from exc
    if not isinstance(report, dict) or "estimate" not in report or "device" not in report:
        raise AccelkitError(f"{command}: {path} is not an accelkit run report")
    return report


def rows(reports: Sequence[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per (report, target): ``run``, ``backend``, ``target``, ``seconds``,
    ``launch_seconds``, ``total_seconds``, ``launches``, ``syncs``; the active target first in
    each report, then its other targets. A report without an estimate gives no row."""
    out = []
    for label, report in reports:
        e = report["estimate"]
        if e is None:
            continue
        targets = {e["target"]: e} | {name: row for name, row in (e.get("by_target") or {}).items()
                                       if name != e["target"]}
        for name, row in targets.items():
            out.append({"run": label, "backend": report["device"]["backend"], "target": name,
                        **{k: row[k] for k in ("seconds", "launch_seconds", "total_seconds", "launches", "syncs")}})
    return out


def compare_reports(paths: Sequence[Path]) -> str:
    """The table ``accelkit compare`` prints.

    :raises AccelkitError: a path holds no report, or no report has an estimate.
    """
    reports = [(str(path), load_report(path)) for path in paths]
    table = rows(reports)
    if not table:
        raise AccelkitError("accelkit compare: none of these reports has an estimate")
    base = table[0]["total_seconds"]
    header = ("run", "backend", "target", "device", "launch", "total", "launches", "host waits", f"vs {table[0]['target']}")
    lines = [header] + [
        (r["run"], r["backend"], r["target"], format_seconds(r["seconds"]), format_seconds(r["launch_seconds"]),
         format_seconds(r["total_seconds"]), str(r["launches"]), str(r["syncs"]),
         f"{r['total_seconds'] / base:.2f}×" if base else "-")
        for r in table
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines]
    missing = [f"{label}: {name} not estimated: {why}" for label, report in reports if report["estimate"]
               for name, why in (report["estimate"].get("not_estimated") or {}).items()
               if name not in {r["target"] for r in table}]
    notes = ["Estimated from public specifications, not measured (accelkit run's report says how)."]
    return "\n".join(text + [""] + missing + notes)
