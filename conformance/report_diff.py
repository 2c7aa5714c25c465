"""Comparing two runs of the conformance suite: what regressed, what got fixed, what moved.

Tests are matched by ``id``. The categories, each listed with one line per test:

* **regressions** — ``pass``/``xpass`` in the base, ``fail``/``error``/``crash``/``timeout`` now.
  These alone decide the exit code.
* **fixed** — ``fail``/``error``/``crash``/``timeout``/``xfail`` in the base, ``pass``/``xpass`` now.
* **now using the CPU fallback** / **now native** — passes in both whose ``paths.fallback``
  went from 0 to more, or back.
* **other changes** — any other change of outcome (e.g. ``pass`` -> ``skip-declared``, ``fail`` ->
  ``crash``).
* **new** / **removed** tests (a new failing test is listed with its outcome but is not a
  regression: it has no base to regress from).

Plus native coverage and pass rate, overall and per suite, before and after.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from typing import Any

from .render_words import percent
from .schema import BAD_OUTCOMES, PASS, SUITES, XFAIL, XPASS
from .summary import one_line, summarize

#: Entries listed per category (regressions are never cut).
MAX_LISTED = 100


class ExitCode(IntEnum):
    """Exit codes of ``accelkit conformance report`` and ``accelkit conformance diff``."""

    #: The report was written; the diff found no regression.
    OK = 0
    #: The diff found at least one regression.
    REGRESSIONS = 1
    #: Bad command line or unusable input file (the message says which and why).
    USAGE_ERROR = 2


def _describe(run: Mapping[str, Any]) -> str:
    env = run["environment"]
    parts = [env["backend"], f"accelkit {env['accelkit']}", f"torch {env['torch']}", f"profile {env['profile']}",
             f"started {env['started']}"]
    if not run.get("complete"):
        parts.append("INCOMPLETE")
    return " · ".join(parts) + (f" · {run['source']}" if run.get("source") else "")


def _native(record: Mapping[str, Any]) -> bool:
    paths = record.get("paths")
    return record["outcome"] == PASS and paths is not None and paths["fallback"] == 0


def _change(label: str, a: float | None, b: float | None) -> str:
    text = f"{label}: {percent(a)} → {percent(b)}"
    if a is not None and b is not None:
        text += f" ({(b - a) * 100:+.1f} pts)"
    return text


def _section(title: str, lines: list[str], cut: bool = True) -> list[str]:
    if not lines:
        return []
    shown = lines if not cut else lines[:MAX_LISTED]
    out = ["", f"{title} ({len(lines)})", *(f"  {line}" for line in shown)]
    if len(shown) < len(lines):
        out.append(f"  … and {len(lines) - len(shown)} more")
    return out


def diff(base: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[str, ExitCode]:
    """Compare two loaded runs (see :func:`~accelkit_conformance.report_load.load_results`).

    Returns the text of the comparison (ending with one summary line) and
    :attr:`ExitCode.REGRESSIONS` if any test went from passing to a bad outcome, else
    :attr:`ExitCode.OK`. The runs may be of different backends (the text warns).
    """
    old = {r["id"]: r for r in base["results"]}
    cur = {r["id"]: r for r in new["results"]}
    regressions, fixed, to_fallback, to_native, other, added, removed = [], [], [], [], [], [], []
    for test_id, r in cur.items():
        b = old.get(test_id)
        if b is None:
            added.append(f"{test_id}  {r['outcome']}" + (f"  — {one_line(r['reason'])}" if r["outcome"] in BAD_OUTCOMES else ""))
            continue
        was, now = b["outcome"], r["outcome"]
        line = f"{test_id}  {was} → {now}"
        if was in (PASS, XPASS) and now in BAD_OUTCOMES:
            regressions.append(line + (f"  — {one_line(r['reason'])}" if r["reason"] else ""))
        elif was in (*BAD_OUTCOMES, XFAIL) and now in (PASS, XPASS):
            fixed.append(line + ("  (remove its expectation entry)" if now == XPASS else ""))
        elif was != now:
            other.append(line + (f"  — {one_line(r['reason'])}" if r["reason"] else ""))
        elif now == PASS and _native(b) and not _native(r):
            to_fallback.append(f"{test_id}  {', '.join(r['fallback_ops']) or 'fallback used'}")
        elif now == PASS and not _native(b) and _native(r):
            to_native.append(test_id)
    removed = [f"{test_id}  (was {b['outcome']})" for test_id, b in old.items() if test_id not in cur]

    sb, sn = summarize(base), summarize(new)
    out = ["accelkit conformance diff", f"  base: {_describe(base)}", f"  new:  {_describe(new)}"]
    if sb["backend"] != sn["backend"]:
        out.append(f"  note: comparing different backends ({sb['backend']} → {sn['backend']})")
    if base["environment"]["profile"] != new["environment"]["profile"]:
        out.append(f"  note: different profiles ({base['environment']['profile']} → {new['environment']['profile']});"
                   " tests outside both show as new or removed")
    out += ["", _change("native coverage", sb["overall"]["native_rate"], sn["overall"]["native_rate"])
            + " · " + _change("with CPU fallback", sb["overall"]["pass_rate"], sn["overall"]["pass_rate"])]
    for suite in SUITES:
        a, b = sb["suites"].get(suite), sn["suites"].get(suite)
        if a or b:
            out.append(f"  {suite:<9}" + _change("native", a and a["native_rate"], b and b["native_rate"])
                       + " · " + _change("with fallback", a and a["pass_rate"], b and b["pass_rate"]))
    out += _section("REGRESSIONS", regressions, cut=False)
    out += _section("FIXED", fixed)
    out += _section("NOW USING THE CPU FALLBACK", to_fallback)
    out += _section("NOW NATIVE", to_native)
    out += _section("OTHER CHANGES", other)
    out += _section("NEW TESTS", added)
    out += _section("REMOVED TESTS", removed)
    counts = (f"{len(fixed)} fixed, {len(to_fallback)} moved to the CPU fallback, {len(to_native)} now native, "
              f"{len(added)} new, {len(removed)} removed")
    head = f"{len(regressions)} regression{'s' * (len(regressions) != 1)}" if regressions else "no regressions"
    out += ["", f"{head}; {counts}"]
    return "\n".join(out) + "\n", ExitCode.REGRESSIONS if regressions else ExitCode.OK
