"""Figures and outcomes in words, as every view of the report and the diff write them."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from .schema import CRASH, ERROR, FAIL, PASS, SKIP_OUTCOMES, TIMEOUT, XFAIL, XPASS
from .summary import format_seconds

#: How each outcome is counted in words, in the order the words appear (worst first, then the rest).
OUTCOME_WORDS = {
    CRASH: "crashed", TIMEOUT: "timed out", ERROR: "errors", FAIL: "failed", XPASS: "xpassed",
    PASS: "passed", XFAIL: "xfailed", "skip-declared": "skipped (declared)", "skip-other": "skipped (other)",
}


def percent(value: float | None) -> str:
    """``97.3%``; never rounds up to ``100.0%`` or down to ``0.0%`` a value that is not; ``-`` for None."""
    if value is None:
        return "-"
    if value <= 0 or value >= 1:
        return f"{value * 100:.1f}%"
    if value < 0.001:
        return "<0.1%"
    return f"{math.floor(value * 1000) / 10:.1f}%"


def counts_words(counts: Mapping[str, int], outcomes: Iterable[str]) -> str:
    """``3 failed, 2 crashed`` for the given outcomes that occurred."""
    def word(o: str) -> str:
        return "error" if o == ERROR and counts[o] == 1 else OUTCOME_WORDS[o]

    return ", ".join(f"{counts[o]} {word(o)}" for o in outcomes if counts.get(o))


#: Appended to the verdict line of a run that did not reach its end.
INCOMPLETE_MARK = " [incomplete run]"


def verdict_line(summary: Mapping[str, Any]) -> str:
    """The one-line verdict of a backend, e.g.
    ``FAIL  native 71.2% (97.3% with CPU fallback) of 1204 run, 85 skipped — 3 failed, 2 crashed``
    (without the backend name, which the renderer aligns)."""
    o = summary["overall"]
    skipped = o["total"] - o["ran"]
    if not o["ran"]:
        line = f"{summary['verdict']}  no tests ran, {skipped} skipped"
        return line + (INCOMPLETE_MARK if not summary["complete"] else "")
    line = (f"{summary['verdict']}  native {percent(o['native_rate'])} "
            f"({percent(o['pass_rate'])} with CPU fallback) of {o['ran']} run, {skipped} skipped")
    bad = counts_words(o["counts"], (CRASH, TIMEOUT, ERROR, FAIL, XPASS))
    if bad:
        line += f" — {bad}"
    if not summary["complete"]:
        line += INCOMPLETE_MARK
    return line


def final_line(summary: Mapping[str, Any], label: str | None = None) -> str:
    """The greppable closing line, pytest style: ``ref: 1170 passed, 3 failed, ... in 12.3s``
    (``label`` replaces the backend name)."""
    counts = dict(summary["overall"]["counts"])
    words = counts_words(counts, (PASS, FAIL, ERROR, CRASH, TIMEOUT, XFAIL, XPASS, *SKIP_OUTCOMES)) or "no tests"
    wall = summary["wall_seconds"]
    return f"{label or summary['backend']}: {words}" + (f" in {format_seconds(wall)}" if wall is not None else "")


def labels(summaries: list[Mapping[str, Any]]) -> list[str]:
    """Column labels: the backend names, numbered when one backend appears more than once."""
    names = [s["backend"] for s in summaries]
    seen: Counter[str] = Counter()
    out = []
    for name in names:
        seen[name] += 1
        out.append(name if names.count(name) == 1 else f"{name} #{seen[name]}")
    return out


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_LINE_BREAKS = re.compile(r"[\x00-\x09\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_CONTROL_NAMES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def visible_controls(text: str, *, but_line_breaks: bool = False) -> str:
    """``text`` with its control characters written as Python escapes (``\\n``, ``\\x1b``), so
    that text from a test can neither move a terminal's cursor nor hide in a page; with
    ``but_line_breaks``, ``\\n`` and ``\\r`` are left for the view to lay out."""
    pattern = _CONTROL_BUT_LINE_BREAKS if but_line_breaks else _CONTROL
    return pattern.sub(lambda m: _CONTROL_NAMES.get(m[0], f"\\x{ord(m[0]):02x}"), text)
