"""What a conformance report says, and in which order, independent of the output format.

:func:`build` turns loaded runs into a list of blocks; the terminal, Markdown and HTML renderers
only lay the blocks out. The order follows the anchors (pytest's terminal reporter, pytest-html):

1. provenance (versions, backend, target, simulated or real, fallback policy, profile, dates);
2. one verdict line per backend;
3. per suite: pass rate with and without CPU fallback and outcome counts, skip reasons grouped,
   the passes that needed the float32 reference, the dynamic-shape table (dynamic suite) or the
   worst op families (other suites);
4. failures and crashes with one-line reasons, worst first; xpasses to remove from the
   expectations files;
5. one closing line per backend (pytest style, greppable).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .render_words import final_line, labels, percent, verdict_line
from .schema import OUTCOMES, SUITES
from .summary import summarize

#: Problems listed per backend before the rest is summed up (the JSON has them all).
MAX_PROBLEMS = 200
#: Dynamic-shape rows shown (per report) before the rest is summed up.
MAX_DYNAMIC = 100

SUITE_TITLES = {
    "ops": "ops — PyTorch OpInfo database",
    "modules": "modules — PyTorch module database",
    "contract": "contract — accelkit's contract checks",
    "dynamic": "dynamic — dynamic shapes under torch.compile",
    "distributed": "distributed — collectives and training across processes, against gloo on CPU",
    "capabilities": "capabilities — a probe of each capability the backend declares",
    "upstream": "upstream — PyTorch's own device-generic test files, instantiated for the backend",
}
OUTCOME_HEADERS = {"skip-declared": "skip decl.", "skip-other": "skip other"}


@dataclass
class Block:
    """One piece of a report.

    ``kind`` is one of: ``title`` (text), ``heading`` (text, level 2 or 3), ``table`` (headers,
    rows; ``numeric`` marks right-aligned columns), ``tables`` (``data["tables"]``: one
    ``(backend label, table block)`` per backend, shown side by side where there is room), ``verdicts`` (rows of ``(label, verdict,
    rest)``), ``text`` (text), ``final`` (rows of ``(verdict, line)``), ``chart`` (``data``:
    read only by the HTML renderer).
    """

    kind: str
    text: str = ""
    level: int = 2
    headers: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    numeric: set[int] = field(default_factory=set)
    data: dict[str, Any] = field(default_factory=dict)


def build(runs: Sequence[Mapping[str, Any]]) -> list[Block]:
    """The blocks of a report on ``runs`` (loaded runs, one column per run, in the given order).

    :raises ValueError: ``runs`` is empty.
    """
    if not runs:
        raise ValueError("no runs to report on: pass at least one loaded results file")
    summaries = [summarize(run) for run in runs]
    names = labels(summaries)
    blocks = [Block("title", "accelkit conformance report")]
    blocks += _provenance(summaries, names)
    blocks.append(Block("heading", "Verdict"))
    blocks.append(Block("verdicts", rows=[[n, s["verdict"], verdict_line(s)[len(s["verdict"]):].strip()]
                                          for n, s in zip(names, summaries)]))
    blocks.append(Block("chart", data={"chart": "coverage", "names": names, "summaries": summaries}))
    blocks += _capabilities(summaries, names)
    for suite in SUITES:
        present = [(n, s["suites"][suite]) for n, s in zip(names, summaries) if suite in s["suites"]]
        if present:
            blocks += _suite(suite, present)
    blocks += _problems(summaries, names)
    blocks.append(Block("heading", "Summary"))
    blocks.append(Block("final", rows=[[s["verdict"], final_line(s, n)] for n, s in zip(names, summaries)]))
    return blocks


def _capabilities(summaries: list[dict[str, Any]], names: list[str]) -> list[Block]:
    """Per capability and backend: declared (with its probe and its tests' passes) or why not."""
    if not any(s.get("capabilities") for s in summaries):
        return []

    def cell(row: dict[str, Any]) -> str:
        if not row["declared"]:
            return f"not declared: {row['reason']}"
        probe = f"probe {row['probe']}" if row["probe"] else "no probe ran"
        verdict = "" if row["ok"] else "FAILING · "
        return f"{verdict}declared · {probe} · {row['passed']}/{row['ran']} tests passed"

    by_name = [{r["capability"]: r for r in s.get("capabilities", [])} for s in summaries]
    capabilities = list(by_name[0])
    rows = [[c, *(cell(b[c]) if c in b else "-" for b in by_name)] for c in capabilities]
    return [Block("heading", "Capabilities"),
            Block("text", "What each backend declares in its conformance.toml [capabilities], the probe of each "
                          "declared one, and the tests that exercise it. A declared capability with failing tests "
                          "fails; an undeclared one's tests are declared skips."),
            Block("table", headers=["capability", *names], rows=rows)]


def _provenance(summaries: list[dict[str, Any]], names: list[str]) -> list[Block]:
    fields = [label for label, _ in summaries[0]["provenance"]]
    values = [dict(s["provenance"]) for s in summaries]
    rows = [[label, *(v[label] for v in values)] for label in fields if label != "backend"]
    return [Block("heading", "Provenance"), Block("table", headers=["", *names], rows=rows)]


def _suite(suite: str, present: list[tuple[str, dict[str, Any]]]) -> list[Block]:
    blocks = [Block("heading", SUITE_TITLES.get(suite, suite))]
    outcomes = [o for o in OUTCOMES if any(s["counts"][o] for _, s in present)] or ["pass"]
    headers = ["backend", "native", "with fallback", "ran", *(OUTCOME_HEADERS.get(o, o) for o in outcomes)]
    rows = [[n, percent(s["native_rate"]), percent(s["pass_rate"]), str(s["ran"]),
             *(str(s["counts"][o]) for o in outcomes)] for n, s in present]
    blocks.append(Block("table", headers=headers, rows=rows, numeric=set(range(1, len(headers)))))
    blocks.append(Block("chart", data={"chart": "outcomes", "suite": suite, "rows": present}))

    skips = [(n, Block("table", headers=["kind", "tests", "reason"], numeric={1},
                       rows=[[row["outcome"], str(row["count"]), row["reason"]] for row in s["skips"]]))
             for n, s in present if s["skips"]]
    if skips:
        blocks.append(Block("heading", "Skip reasons", level=3))
        blocks.append(Block("tables", data={"tables": skips}))

    settled = [(n, Block("table", headers=["op", "dtype", "variant", "comparisons"], numeric={3},
                         rows=[[r["op"] or r["id"], r["dtype"] or "-", r["variant"] or "-", str(r["comparisons"])]
                               for r in s["float_reference"][:MAX_PROBLEMS]]))
               for n, s in present if s["float_reference"]]
    if settled:
        blocks.append(Block("heading", "Passed against the float32 reference, not CPU's kernel", level=3))
        blocks.append(Block("text", "These reduced-precision results differ from CPU's kernel by more than the tolerance "
                                    "and match CPU computing in float32, rounded once: CPU's kernel rounds where the "
                                    "backend does not. Counted per comparison (outputs or gradients of one sample)."))
        blocks.append(Block("tables", data={"tables": settled}))

    if suite == "dynamic":
        # one row per case says more than families would: no family table for this suite
        return blocks + _dynamic(present)

    families = [(n, Block("table", headers=["family", "ran", "native", "with fallback", "bad", "top CPU-fallback ops"],
                          numeric={1, 2, 3, 4},
                          rows=[[f["family"], str(f["ran"]), percent(f["native_rate"]), percent(f["pass_rate"]),
                                 str(f["bad"]), ", ".join(f["fallback_ops"]) or "-"] for f in s["families"]]))
                for n, s in present if s["families"]]
    if families:
        blocks.append(Block("heading", "Worst op families (not fully native; lowest pass rate first)", level=3))
        blocks.append(Block("tables", data={"tables": families}))
    return blocks


def _shapes(shapes: list[list[int]] | None) -> str:
    if shapes is None:
        return "-"
    return " → ".join("×".join(str(d) for d in s) or "()" for s in shapes)


def _dynamic_cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    if row["shapes"] is None:  # the case did not run to a measurement (skipped, crashed)
        return row["outcome"]
    if row["recompiles"] is None:
        recompiles = "not counted"
    else:
        recompiles = f"{row['total_recompiles']} ({', '.join(str(r) for r in row['recompiles']) or '-'})"
    programs = f" · {row['total_programs']} programs" if row.get("programs") is not None else ""
    correct = {True: "correct", False: "WRONG", None: "?"}[row["correct"]]
    return f"{recompiles}{programs} · {correct} · {row['outcome']}"


def _dynamic(present: list[tuple[str, dict[str, Any]]]) -> list[Block]:
    """One row per case and backend, eager and each compile mode side by side."""
    cases: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    modes: list[str] = []
    for name, s in present:
        for row in s["dynamic"]:
            label = row["case"] + (f" [{row['dtype']}]" if row["dtype"] else "")
            cases.setdefault((label, name), {})[row["mode"]] = row
            if row["mode"] not in modes:
                modes.append(row["mode"])
    if not cases:
        return []
    several = len(present) > 1
    rows = []
    for (label, name), by_mode in list(cases.items())[:MAX_DYNAMIC]:
        first = next(iter(by_mode.values()))
        rows.append([label, *([name] if several else []), _shapes(first["shapes"]),
                     *(_dynamic_cell(by_mode.get(m)) for m in modes)])
    headers = ["case", *(["backend"] if several else []), "shapes", *modes]
    blocks = [Block("heading", "Dynamic shapes: recompiles in total (per shape change) · programs built · result",
                    level=3),
              Block("table", headers=headers, rows=rows)]
    if len(cases) > MAX_DYNAMIC:
        blocks.append(Block("text", f"… and {len(cases) - MAX_DYNAMIC} more cases (see the results files)."))
    return blocks


def _problems(summaries: list[dict[str, Any]], names: list[str]) -> list[Block]:
    blocks: list[Block] = []
    rows, cut = [], 0
    for n, s in zip(names, summaries):
        rows += [[n, p["outcome"].upper(), p["id"], p["reason"] or "-", p.get("what_to_do") or "-"]
                 for p in s["problems"][:MAX_PROBLEMS]]
        cut += max(0, len(s["problems"]) - MAX_PROBLEMS)
    if rows:
        blocks.append(Block("heading", "Failures, errors, crashes and timeouts (worst first)"))
        blocks.append(Block("table", headers=["backend", "outcome", "test", "reason", "likely cause · what to do"],
                            rows=rows))
        if cut:
            blocks.append(Block("text", f"… and {cut} more (see the results files)."))
    fixed = [[n, f["expectation"] or "-", f["id"]] for n, s in zip(names, summaries) for f in s["fixed"]]
    if fixed:
        blocks.append(Block("heading", "Unexpected passes — fixed: remove from the expectations file"))
        blocks.append(Block("table", headers=["backend", "expectation entry to remove", "test"], rows=fixed))
    return blocks
