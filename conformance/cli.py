"""``accelkit conformance report``, ``diff``, ``coverage`` and ``coverage-diff``.

:mod:`accelkit_conformance.__main__` (``accelkit conformance``) mounts them next to ``run`` with
:func:`add_commands`. Each command returns an :class:`~accelkit_conformance.report_diff.ExitCode`:

* ``report``: 0 once the report is written; 2 for unusable input (the message names the file).
  The verdict is in the report, not the exit code: gate CI with ``diff`` against a baseline.
* ``diff``: 0 without regressions, 1 with regressions, 2 for unusable input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from .report import (
    ExitCode,
    ResultsError,
    diff,
    load_results,
    render_html,
    render_markdown,
    render_terminal,
)

FORMATS = ("terminal", "md", "html")
_SUFFIX_FORMATS = {".html": "html", ".htm": "html", ".md": "md", ".markdown": "md"}
_RESULT_FILES = ("results.json", "results.jsonl")


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``accelkit conformance report``."""
    parser.add_argument(
        "results", nargs="+", metavar="RESULTS",
        help="results.json or results.jsonl of a backend, or a directory: one backend's, or the run's "
             "output directory holding one subdirectory per backend (all are shown side by side)",
    )
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="output format (default: from --out's suffix, .html or .md; else terminal)")
    parser.add_argument("--out", metavar="FILE", default=None, help="write the report to FILE instead of stdout")


def add_diff_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``accelkit conformance diff``."""
    parser.add_argument("base", metavar="BASE", help="the baseline results (file or backend directory)")
    parser.add_argument("new", metavar="NEW", help="the results to compare with the baseline")


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register ``report`` and ``diff`` in a ``conformance`` group's subparsers.

    Each parser gets ``run=<command>`` as its default, the convention of ``accelkit/_cli.py``.
    """
    report = subparsers.add_parser(
        "report", help="render conformance results (terminal, Markdown or self-contained HTML)",
        description="Render one or more backends' conformance results side by side: provenance, one "
                    "verdict per backend, per-suite pass rates with and without CPU fallback, skip "
                    "reasons, dynamic shapes, worst op families, failures.")
    add_report_arguments(report)
    report.set_defaults(run=report_command)
    diff_parser = subparsers.add_parser(
        "diff", help="compare results with a baseline; exit 1 on regressions",
        description="Compare NEW with BASE test by test: regressions (pass -> fail/error/crash/timeout), "
                    "fixes, moves to or from the CPU fallback, new and removed tests, native coverage. "
                    "Exit code 0: no regressions; 1: regressions; 2: unusable input.")
    add_diff_arguments(diff_parser)
    diff_parser.set_defaults(run=diff_command)
    coverage = subparsers.add_parser(
        "coverage", help="audit which path every aten overload takes on a backend (no test runs)",
        description="Classify every aten overload that has a CPU kernel as native, derived (in-place/out= "
                    "from a native kernel), decomposed, fallback (CPU) or refused on each backend, from its "
                    "registrations, and list the op families left. Prints the audit; with --out DIR also "
                    "writes DIR/<backend>.json, DIR/coverage.md and DIR/coverage.html.")
    coverage.add_argument("--backend", action="append", required=True, metavar="NAME",
                          help="a backend to audit (repeat for several, shown side by side)")
    coverage.add_argument("--out", metavar="DIR", default=None, help="write the JSON, Markdown and HTML here")
    coverage.set_defaults(run=coverage_command)
    coverage_diff = subparsers.add_parser(
        "coverage-diff", help="compare two coverage audits; exit 1 when an op moved to a worse path",
        description="List the overloads whose path changed between two audits of a backend. Exit code 0: "
                    "none moved to a worse path (native/derived, decomposed, fallback, refused); 1: some "
                    "did; 2: unusable input.")
    coverage_diff.add_argument("base", metavar="BASE", help="the baseline audit (<backend>.json)")
    coverage_diff.add_argument("new", metavar="NEW", help="the audit to compare with it")
    coverage_diff.set_defaults(run=coverage_diff_command)


def _error(message: str) -> ExitCode:
    print(f"accelkit: error: {message}", file=sys.stderr)
    return ExitCode.USAGE_ERROR


def expand_inputs(paths: Sequence[str]) -> list[Path]:
    """Result paths to load: files as given; a directory with a results file as itself; a run
    directory (one subdirectory per backend) as its backend subdirectories, sorted.

    :raises ResultsError: a directory holds no results at all.
    """
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_dir() or any((path / name).is_file() for name in _RESULT_FILES):
            out.append(path)
            continue
        backends = sorted(d for d in path.iterdir() if d.is_dir() and any((d / n).is_file() for n in _RESULT_FILES))
        if not backends:
            raise ResultsError(f"{path}: no results.json or results.jsonl in it or in its subdirectories; "
                               f"pass the output directory of `accelkit conformance run` or a results file")
        out += backends
    return out


def report_command(args: argparse.Namespace) -> int:
    """Run ``accelkit conformance report`` with parsed ``args`` (see :func:`add_report_arguments`)."""
    fmt = args.format or (_SUFFIX_FORMATS.get(Path(args.out).suffix.lower(), "terminal") if args.out else "terminal")
    try:
        runs = [load_results(p) for p in expand_inputs(args.results)]
    except ResultsError as exc:
        return _error(str(exc))
    if fmt == "html":
        text = render_html(runs)
    elif fmt == "md":
        text = render_markdown(runs)
    else:
        color = args.out is None and sys.stdout.isatty() and "NO_COLOR" not in os.environ
        text = render_terminal(runs, color=color)
    if args.out is None:
        sys.stdout.write(text)
        return ExitCode.OK
    try:
        Path(args.out).write_text(text, encoding="utf-8")
    except OSError as exc:
        return _error(f"cannot write the report to {args.out}: {exc.strerror or exc}")
    print(f"wrote {fmt} report on {len(runs)} run{'s' * (len(runs) != 1)} to {args.out}")
    return ExitCode.OK


def diff_command(args: argparse.Namespace) -> int:
    """Run ``accelkit conformance diff`` with parsed ``args`` (see :func:`add_diff_arguments`)."""
    try:
        base, new = load_results(args.base), load_results(args.new)
    except ResultsError as exc:
        return _error(str(exc))
    text, code = diff(base, new)
    sys.stdout.write(text)
    return code


def coverage_command(args: argparse.Namespace) -> int:
    from .coverage import AuditError, audit, render

    try:
        audits = [audit(name) for name in args.backend]
    except AuditError as exc:
        return _error(str(exc))
    print(render(audits, "terminal"), end="")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for done in audits:
            (out / f"{done['backend']}.json").write_text(json.dumps(done, indent=1) + "\n", encoding="utf-8")
        (out / "coverage.md").write_text(render(audits, "md"), encoding="utf-8")
        (out / "coverage.html").write_text(render(audits, "html"), encoding="utf-8")
        print(f"wrote {', '.join(a['backend'] + '.json' for a in audits)}, coverage.md and coverage.html into {out}")
    return ExitCode.OK


def coverage_diff_command(args: argparse.Namespace) -> int:
    from .coverage import AuditError, diff_audits, load_audit

    try:
        text, code = diff_audits(load_audit(Path(args.base)), load_audit(Path(args.new)))
    except AuditError as exc:
        return _error(str(exc))
    print(text, end="")
    return code
