"""The conformance report: loading results, the summary arithmetic, the three views, and diff.

Every result file here is synthetic, written by the helpers below in the schema's format, so the
expected figures can be counted by hand. Nothing here needs a device.
"""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from accelkit_conformance import report
from accelkit_conformance.schema import OUTCOMES, SCHEMA, validate_results

# -- synthetic results ---------------------------------------------------------------------------


def environment(backend: str, **overrides) -> dict:
    env = {
        "accelkit": "0.1.0", "torch": "2.13.0+cpu", "torch_git": "4f2a1c9e0b7d", "jax": None,
        "python": "3.12.3", "platform": "Linux-6.8-x86_64", "backend": backend, "target": None,
        "simulated": True, "fallback_policy": "allow", "profile": "quick", "dtypes": ["float32", "bfloat16"],
        "started": "2026-12-01T10:00:00+00:00", "finished": "2026-12-01T10:04:05+00:00", "jobs": 4, "timeout": 60.0,
    }
    env.update(overrides)
    return env


def record(op: str, outcome: str = "pass", *, suite: str = "ops", dtype: str | None = "float32",
           fallback: int = 0, reason: str | None = None, expectation: str | None = None,
           dynamic: dict | None = None, compiles: int | None = None, test_id: str | None = None) -> dict:
    measured = outcome not in ("skip-declared", "skip-other", "crash", "timeout")
    return {
        "id": test_id or f"conformance/test_{suite}.py::test_{suite}[{op}-{dtype}]",
        "suite": suite, "op": op, "variant": "forward" if suite in ("ops", "modules") else None,
        "dtype": dtype, "outcome": outcome, "reason": reason, "expectation": expectation,
        "duration": 0.25, "paths": {"native": 5, "decomposed": 1, "fallback": fallback} if measured else None,
        "fallback_ops": ["aten.cumsum.default"] * bool(fallback and measured), "compiles": compiles,
        "dynamic": dynamic,
    }


def document(backend: str, records: list[dict], *, complete: bool = True, **env) -> dict:
    doc = {"schema": SCHEMA, "complete": complete, "environment": environment(backend, **env), "results": records}
    validate_results(doc)  # the fixtures themselves follow the schema
    return doc


def ref_records() -> list[dict]:
    """ops: 10 records — 6 pass (4 native), 1 fail, 1 error, 1 xfail, 1 skip-declared;
    modules: 2 pass (1 native), 1 skip-other; contract: 2 pass, 1 crash;
    dynamic: 2 cases (one recompiling, one wrong)."""
    return [
        record("add"), record("mul"), record("linalg.svd"), record("linalg.qr"),
        record("cumsum", fallback=2), record("linalg.eigh", fallback=1),
        record("linalg.inv", "fail", reason="AssertionError: Tensor-likes are not close!\nMismatched elements: 3 / 9"),
        record("nn.functional.max_pool2d", "error", reason="RuntimeError: no kernel for aten.max_pool2d_with_indices"),
        record("nn.functional.conv2d", "xfail", reason="known: grouped conv", expectation="ops.nn.functional.conv2d"),
        record("fft.fft", "skip-declared", reason="complex dtypes are not supported", expectation="ops.fft"),
        record("torch.nn.Linear", suite="modules"), record("torch.nn.Conv2d", suite="modules", fallback=3),
        record("torch.nn.LSTM", "skip-other", suite="modules", reason="needs cuDNN"),
        record("aliasing.views", suite="contract", dtype=None), record("rng.fork", suite="contract", dtype=None),
        record("serialization.save_load", "crash", suite="contract", dtype=None, reason="worker died: SIGSEGV"),
        record("mm", suite="dynamic", compiles=2,
               dynamic={"shapes": [[1, 3], [1, 4], [1, 6]], "recompiles": [1, 0], "correct": True}),
        record("cat", "fail", suite="dynamic", compiles=3, reason="wrong result at shape 2x5",
               dynamic={"shapes": [[2, 3], [2, 5]], "recompiles": [2], "correct": False}),
    ]


def tpu_records() -> list[dict]:
    """Everything a second backend can add: timeout, xpass, more declared skips."""
    return [
        record("add"), record("mul", fallback=1), record("linalg.svd", "timeout", reason="timed out after 60 s"),
        record("linalg.qr", "xpass", reason="expected to fail", expectation="ops.linalg.qr"),
        record("cumsum", "skip-declared", reason="float64 is not supported on TPU", expectation="dtype.float64"),
        record("cummax", "skip-declared", reason="float64 is not supported on TPU", expectation="dtype.float64"),
        record("mm", suite="dynamic", compiles=1,
               dynamic={"shapes": [[1, 3], [1, 4], [1, 6]], "recompiles": [0, 0], "correct": True}),
    ]


def write_json(path: Path, doc: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def write_jsonl(path: Path, doc: dict, *, torn: bool = False) -> Path:
    """The runner's streaming file. A finished run ends with the ``finished`` event; ``torn``
    instead cuts the last record mid-line, as a kill does."""
    env = {k: v for k, v in doc["environment"].items() if k != "finished"}  # known only at the end
    lines = [json.dumps({"schema": doc["schema"], "environment": env}),
             json.dumps({"event": "collected", "total": len(doc["results"])})]
    lines += [json.dumps(r) for r in doc["results"]]
    if not torn:
        lines.append(json.dumps({"event": "finished", "complete": True, "at": doc["environment"]["finished"]}))
    text = "\n".join(lines) + "\n"
    if torn:
        text = text[: len(text) - len(lines[-1]) // 2 - 1]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def runs(tmp_path) -> list[dict]:
    ref = write_json(tmp_path / "ref" / "results.json", document("ref", ref_records(), target="host"))
    tpu = write_json(tmp_path / "tpu" / "results.json",
                     document("tpu", tpu_records(), target="v5e", jax="0.10.1", fallback_policy="warn",
                              expectations="backends/tpu/conformance.toml"))
    return [report.load_results(ref), report.load_results(tpu)]


# -- loading -------------------------------------------------------------------------------------


def test_load_results_reads_json_and_remembers_the_source(tmp_path):
    path = write_json(tmp_path / "results.json", document("ref", ref_records()))
    run = report.load_results(path)
    assert run["schema"] == SCHEMA and run["complete"] is True and run["source"] == str(path)
    assert len(run["results"]) == len(ref_records())
    assert report.load_results(tmp_path)["source"] == str(path)  # a directory: its results.json


def test_a_finished_jsonl_loads_as_complete(tmp_path):
    path = write_jsonl(tmp_path / "results.jsonl", document("ref", ref_records()))
    run = report.load_results(path)
    assert run["complete"] is True and len(run["results"]) == len(ref_records())
    assert report.summarize(run)["wall_seconds"] == 245.0  # "finished" comes from the event


def test_a_killed_run_loads_from_its_truncated_jsonl_as_incomplete(tmp_path):
    records = ref_records()
    path = write_jsonl(tmp_path / "results.jsonl", document("ref", records), torn=True)
    run = report.load_results(path)
    assert run["complete"] is False
    assert [r["id"] for r in run["results"]] == [r["id"] for r in records[:-1]]  # the torn record is gone
    summary = report.summarize(run)
    assert summary["verdict"] == "FAIL"  # it had failures before it was killed
    assert "INCOMPLETE" in dict(summary["provenance"])["run"]
    assert dict(summary["provenance"])["finished"] == "-" and summary["wall_seconds"] is None
    assert report.verdict_line(summary).endswith("[incomplete run]")


def test_a_killed_run_without_failures_is_incomplete_not_pass(tmp_path):
    path = write_jsonl(tmp_path / "results.jsonl", document("ref", [record("add"), record("mul")]), torn=True)
    assert report.summarize(report.load_results(path))["verdict"] == "INCOMPLETE"


def test_wrong_schema_version_names_the_file_and_the_fix(tmp_path):
    doc = document("ref", ref_records())
    doc["schema"] = "accelkit-conformance/2"
    path = write_json(tmp_path / "old.json", doc)
    with pytest.raises(report.ResultsError) as info:
        report.load_results(path)
    message = str(info.value)
    assert str(path) in message
    assert "'accelkit-conformance/2'" in message and f"'{SCHEMA}'" in message
    assert "accelkit conformance run" in message


@pytest.mark.parametrize(("content", "expected"), [
    ('{"results": []}', "no 'schema' field"),
    ('{"schema": "accelkit-conformance/1", "complete": true', "not valid JSON"),
    ('{"schema": "accelkit-conformance/1", "complete": true, "environment": {}, "results": []}', "missing fields"),
])
def test_unusable_files_are_named_with_the_problem(tmp_path, content, expected):
    path = tmp_path / "results.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(report.ResultsError, match=re.escape(expected)) as info:
        report.load_results(path)
    assert str(path) in str(info.value)


def test_missing_file_is_a_results_error(tmp_path):
    with pytest.raises(report.ResultsError, match="no such file"):
        report.load_results(tmp_path / "nope.json")


# -- summary arithmetic ----------------------------------------------------------------------------


def test_summary_counts_and_native_coverage_arithmetic(runs):
    s = report.summarize(runs[0])
    ops = s["suites"]["ops"]
    assert ops["total"] == 10 and ops["ran"] == 9  # the declared skip did not run
    assert ops["counts"]["pass"] == 6 and ops["native"] == 4
    assert ops["pass_rate"] == pytest.approx(6 / 9) and ops["native_rate"] == pytest.approx(4 / 9)
    assert ops["bad"] == 2  # fail + error; the xfail is expected, not bad
    modules = s["suites"]["modules"]
    assert (modules["ran"], modules["passed"], modules["native"]) == (2, 2, 1)
    overall = s["overall"]
    assert overall["total"] == 18 and overall["ran"] == 16
    assert overall["native"] == 4 + 1 + 2 + 1  # ops, modules, contract, dynamic
    assert overall["native_rate"] == pytest.approx(8 / 16)
    assert sum(overall["counts"].values()) == overall["total"]
    assert set(overall["counts"]) == set(OUTCOMES)
    assert s["verdict"] == "FAIL"
    assert [p["outcome"] for p in s["problems"]] == ["crash", "error", "fail", "fail"]  # worst first
    assert s["problems"][-1]["reason"] == "AssertionError: Tensor-likes are not close!"  # one line
    assert s["wall_seconds"] == 245.0


def test_a_clean_run_passes_and_xpass_is_listed_as_fixed(tmp_path, runs):
    clean = report.load_results(write_json(tmp_path / "c.json", document("ref", [record("add"), record("mul")])))
    assert report.summarize(clean)["verdict"] == "PASS"
    tpu = report.summarize(runs[1])
    assert tpu["verdict"] == "FAIL"  # a timeout, and a strict xfail that passed
    assert tpu["fixed"] == [{"id": "conformance/test_ops.py::test_ops[linalg.qr-float32]", "suite": "ops",
                             "expectation": "ops.linalg.qr"}]
    assert tpu["suites"]["ops"]["skips"] == [
        {"outcome": "skip-declared", "reason": "float64 is not supported on TPU", "count": 2}]


@pytest.mark.parametrize(("op", "family"), [
    ("linalg.svd", "linalg"), ("fft.fft2", "fft"), ("special.bessel_j0", "special"),
    ("signal.windows.hann", "signal.windows"), ("nn.functional.max_pool2d", "pool"),
    ("nn.functional.conv_transpose2d", "conv"), ("torch.nn.AdaptiveAvgPool1d", "pool"),
    ("nn.CrossEntropyLoss", "loss"), ("nn.functional.nll_loss", "loss"), ("torch.nn.PReLU", "prelu"),
    ("torch.nn.GRUCell", "rnn"), ("index_put", "index"), ("index_add", "index"), ("bitwise_and", "bitwise"),
    ("max.reduction_with_dim", "max"), ("addmm", "addmm"), ("as_strided", "strided"),
    ("aten.mm.default", "mm"), ("aliasing.views", "aliasing"), (None, "(none)"),
])
def test_op_family_rule(op, family):
    assert report.op_family(op) == family


def test_worst_families_rank_by_pass_rate_then_native_rate(runs):
    fams = report.summarize(runs[0])["suites"]["ops"]["families"]
    # conv (an xfail) and pool (an error) pass nothing: tied, by name; fully native add/mul are left out
    assert [f["family"] for f in fams] == ["conv", "pool", "linalg", "cumsum"]
    conv, pool, linalg, cumsum = fams
    assert (conv["ran"], conv["passed"], conv["bad"]) == (1, 0, 0)  # expected to fail: not bad
    assert (pool["ran"], pool["passed"], pool["bad"]) == (1, 0, 1)
    assert (linalg["ran"], linalg["passed"], linalg["native"], linalg["bad"]) == (4, 3, 2, 1)
    assert cumsum["fallback_ops"] == ["aten.cumsum.default"]


def test_dynamic_table_rows(runs):
    rows = report.summarize(runs[0])["suites"]["dynamic"]["dynamic"]
    assert [(r["op"], r["total_recompiles"], r["correct"], r["outcome"]) for r in rows] == [
        ("mm", 1, True, "pass"), ("cat", 2, False, "fail")]


def test_dynamic_case_without_a_compile_count_still_shows_its_result(tmp_path):
    case = record("mm", suite="dynamic", dynamic={"shapes": [[1, 3], [1, 5]], "recompiles": None, "correct": True})
    run = report.load_results(write_json(tmp_path / "d.json", document("ref", [case])))
    assert report.summarize(run)["suites"]["dynamic"]["dynamic"][0]["total_recompiles"] is None
    assert r"| mm \[float32\] | 1×3 → 1×5 | not counted · correct · pass |" in report.render_markdown([run])


def test_dynamic_table_puts_eager_and_compiled_side_by_side_with_programs_built(tmp_path):
    eager = record("mlp.eager", suite="dynamic", dynamic={"shapes": [[4, 8], [8, 8]], "recompiles": [3], "correct": True})
    static = record("mlp.compile_static", suite="dynamic",
                    dynamic={"shapes": [[4, 8], [8, 8]], "recompiles": [1], "correct": True, "programs": [2]})
    dynamic = record("mlp.compile_dynamic", suite="dynamic", outcome="fail",
                     dynamic={"shapes": [[4, 8], [8, 8]], "recompiles": [0], "correct": False, "programs": [1]})
    run = report.load_results(write_json(tmp_path / "d.json", document("tpu", [eager, static, dynamic])))
    md = report.render_markdown([run])
    assert r"| case | shapes | eager | compile\_static | compile\_dynamic |" in md
    assert (r"| mlp \[float32\] | 4×8 → 8×8 | 3 (3) · correct · pass | 1 (1) · 2 programs · correct · pass "
            r"| 0 (0) · 1 programs · WRONG · fail |") in md


def test_percent_never_rounds_to_a_misleading_figure():
    assert report.percent(0.9996) == "99.9%" and report.percent(1.0) == "100.0%"
    assert report.percent(0.0004) == "<0.1%" and report.percent(0.0) == "0.0%" and report.percent(None) == "-"


# -- views ---------------------------------------------------------------------------------------


def positions(text: str, *needles: str) -> list[int]:
    found = [text.find(n) for n in needles]
    assert -1 not in found, [n for n, i in zip(needles, found) if i == -1]
    return found


def test_markdown_puts_provenance_then_verdicts_then_suites_then_failures(runs):
    md = report.render_markdown(runs)
    order = positions(md, "## Provenance", "2.13.0+cpu", "0.10.1", "| mode | simulated | simulated |",
                      "## Verdict", "- `ref` **FAIL** native 50.0% (68.7% with CPU fallback) of 16 run, 2 skipped",
                      "- `tpu` **FAIL**", "## ops", "### Skip reasons", "### Worst op families",
                      "## dynamic", "### Dynamic shapes", "1×3 → 1×4 → 1×6", "## Failures", "CRASH",
                      "## Unexpected passes", "ops.linalg.qr", "## Summary")
    assert order == sorted(order)
    assert "| fallback policy | allow | warn |" in md and "| expectations | - | backends/tpu/conformance.toml |" in md
    assert "ref: 11 passed, 2 failed, 1 error, 1 crashed, 1 xfailed, 1 skipped (declared), 1 skipped (other) in 4m 05s" in md


def test_terminal_view_is_plain_without_color_and_coloured_with_it(runs):
    plain = report.render_terminal(runs)
    assert "\033[" not in plain
    order = positions(plain, "Provenance", "Verdict", "ref  FAIL  native 50.0%", "tpu  FAIL", "-- ops",
                      "Failures", "Summary", "ref: 11 passed")
    assert order == sorted(order)
    assert "\033[31m" in report.render_terminal(runs, color=True)  # FAIL in red


def test_html_is_self_contained_and_ordered(runs):
    html = report.render_html(runs)
    assert html.startswith("<!DOCTYPE html>")
    assert not re.search(r"https?:", html) and "url(" not in html
    assert "<script" not in html and "<link" not in html and "@import" not in html
    assert html.count("<svg") >= 1 + 4  # coverage chart + one outcome chart per suite
    order = positions(html, "Provenance", "Verdict", "native 50.0%", "ops — PyTorch OpInfo", "Failures", "Summary")
    assert order == sorted(order)


# -- text from tests is shown as it is ------------------------------------------------------------

HOSTILE_ID = "conformance/test_ops.py::test_ops[a|b-<script>alert('id')</script>-x&amp;y\nz]"
HOSTILE_REASON = ("AssertionError: <script>alert(1)</script> | 2 * 3_000 & [x](http://e.com) `c` $x$ \\| \x1b[2J\n"
                  "second line")
HOSTILE_SKIP = "needs <b>bold</b> | x & y"
HOSTILE_PLATFORM = "Linux <u>|</u> & co\nline 2"
#: The report gives the first line of a reason (the JSON has all of it), its control characters
#: written as escapes.
SHOWN_REASON = HOSTILE_REASON.splitlines()[0].replace("\x1b", r"\x1b")
#: The failure's likely cause and remedy, next to it.
HOSTILE_REMEDY = "the test's check failed (see the reason): compare the kernel with the CPU kernel on this case"


def hostile_run(tmp_path) -> dict:
    records = [record("add", "fail", reason=HOSTILE_REASON, test_id=HOSTILE_ID),
               record("mul", "skip-other", reason=HOSTILE_SKIP)]
    return report.load_results(write_json(tmp_path / "h.json", document("ref", records, platform=HOSTILE_PLATFORM)))


_MD_TOKEN = re.compile(r"\\([!-/:-@\[-`{-~])|&(?:amp|lt|gt);|<br>|(.)", re.S)


def md_shown(markdown: str) -> str:
    """What a CommonMark renderer shows for inline Markdown made of plain text and escapes only
    (backslash escapes, the entities &amp; &lt; &gt;, <br>); fails on any character it would act on."""
    shown = []
    for m in _MD_TOKEN.finditer(markdown):
        if m[1] is not None:
            shown.append(m[1])
        elif m[2] is None:
            shown.append("\n" if m[0] == "<br>" else html.unescape(m[0]))
        else:
            assert m[2] not in "\\`*_[]|<>&~$\n", f"unescaped {m[2]!r} in {markdown!r}"
            shown.append(m[2])
    return "".join(shown)


def md_tables(markdown: str) -> list[list[list[str]]]:
    """The GFM tables of ``markdown``: rows of raw cells, split at the pipes that are not escaped."""
    tables, rows = [], []
    for line in [*markdown.splitlines(), ""]:
        if line.startswith("|"):
            cells = "".join("\0" if t == "|" else t for t in re.findall(r"\\.|[^|\\]+|\|", line)).split("\0")
            rows.append([c.strip() for c in cells[1:-1]])
        elif rows:
            tables.append(rows)
            rows = []
    return tables


def test_markdown_shows_ids_and_reasons_as_they_are_without_html_or_broken_tables(tmp_path):
    md = report.render_markdown([hostile_run(tmp_path)])
    assert set(re.findall(r"<[^>]*>", md)) == {"<br>"}  # the only tag: line breaks inside cells
    assert "\x1b" not in md
    tables = md_tables(md)
    for rows in tables:  # every row has its header's cells: no pipe or newline split one
        assert {len(row) for row in rows} == {len(rows[0])}, rows
    shown = [[md_shown(c) for c in row] for rows in tables for row in rows[2:]]
    assert ["ref", "FAIL", HOSTILE_ID, SHOWN_REASON, HOSTILE_REMEDY] in shown
    assert ["skip-other", "1", HOSTILE_SKIP] in shown
    assert ["platform", HOSTILE_PLATFORM] in shown


def test_markdown_code_spans_and_blocks_hold_any_backend_name(tmp_path):
    name = "x`` |<b>\n# y"
    run = report.load_results(write_json(tmp_path / "n.json", document(name, [record("add")])))
    md = report.render_markdown([run])
    verdict = next(line for line in md.splitlines() if line.startswith("- "))
    assert verdict.startswith(r"- ```x`` |<b>\n# y``` **PASS**")  # a fence longer than any backtick run
    fence, *lines = md[md.index("## Summary"):].split("\n\n")[1].splitlines()
    assert fence == "```" and lines[0].startswith(r"x`` |<b>\n# y: 1 passed") and lines[-1] == fence


class _Cells(HTMLParser):
    """The text of every table row (``<br>`` read as a newline) and every tag name of a page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.rows: list[list[str]] = []
        self.tags: set[str] = set()
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "br" and self._cell is not None:
            self._cell.append("\n")

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def test_html_shows_ids_and_reasons_as_they_are(tmp_path):
    page = report.render_html([hostile_run(tmp_path)])
    cells = _Cells()
    cells.feed(page)
    assert "script" not in cells.tags and "u" not in cells.tags
    assert ["ref", "FAIL", HOSTILE_ID, SHOWN_REASON, HOSTILE_REMEDY] in cells.rows
    assert ["skip-other", "1", HOSTILE_SKIP] in cells.rows
    assert ["platform", HOSTILE_PLATFORM] in cells.rows


def test_terminal_view_keeps_each_row_on_one_line_and_sends_no_control_characters(tmp_path):
    text = report.render_terminal([hostile_run(tmp_path)])
    assert "\x1b" not in text
    row = next(line for line in text.splitlines() if "alert(1)" in line)
    assert row.endswith(r"$x$ \| \x1b[2J  " + HOSTILE_REMEDY) and "FAIL" in row
    assert r"\nz]" in row  # the id's newline, written as an escape
    assert r"Linux <u>|</u> & co\nline 2" in text


# -- diff ----------------------------------------------------------------------------------------


def test_diff_without_regressions_exits_0_and_lists_fixes(tmp_path):
    base = report.load_results(write_json(tmp_path / "b.json", document("ref", ref_records())))
    fixed = [dict(r, outcome="pass", reason=None, paths={"native": 1, "decomposed": 0, "fallback": 0})
             if r["op"] == "linalg.inv" else r for r in ref_records()]
    fixed.append(record("sub"))
    new = report.load_results(write_json(tmp_path / "n.json", document("ref", fixed[1:])))  # "add" removed
    text, code = report.diff(base, new)
    assert code == report.ExitCode.OK == 0
    assert re.search(r"FIXED \(1\).*\n.*linalg\.inv.*fail → pass", text)
    assert "NEW TESTS (1)" in text and "test_ops[sub-float32]" in text
    assert "REMOVED TESTS (1)" in text and "test_ops[add-float32]" in text
    assert "native coverage: 50.0% → 56.2% (+6.2 pts)" in text  # 8/16 → 9/16
    assert "no regressions" in text


def test_diff_with_regressions_exits_1(tmp_path):
    base = report.load_results(write_json(tmp_path / "b.json", document("ref", ref_records())))
    broken = [dict(r, outcome="crash", reason="worker died: SIGABRT", paths=None) if r["op"] == "mul" else r
              for r in ref_records()]
    new = report.load_results(write_json(tmp_path / "n.json", document("ref", broken)))
    text, code = report.diff(base, new)
    assert code == report.ExitCode.REGRESSIONS == 1
    assert re.search(r"REGRESSIONS \(1\).*\n.*test_ops\[mul-float32\].*pass → crash.*SIGABRT", text)


def test_diff_reports_tests_that_moved_to_the_cpu_fallback(tmp_path):
    base = report.load_results(write_json(tmp_path / "b.json", document("ref", [record("add")])))
    new = report.load_results(write_json(tmp_path / "n.json", document("ref", [record("add", fallback=4)])))
    text, code = report.diff(base, new)
    assert code == 0  # still passes, so not a regression, but the lost native coverage is shown
    assert "NOW USING THE CPU FALLBACK (1)" in text and "native coverage: 100.0% → 0.0%" in text


# -- CLI -----------------------------------------------------------------------------------------


def accelkit(capsys, *args: str) -> tuple[int, str, str]:
    """``accelkit ARGS`` in this process (the CLI needs no device): exit code, stdout, stderr."""
    from accelkit._cli import main

    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_report_writes_the_format_its_out_suffix_names(tmp_path, runs, capsys):
    out = tmp_path / "report.html"
    code, stdout, _ = accelkit(capsys, "conformance", "report", runs[0]["source"], runs[1]["source"], "--out", str(out))
    assert code == 0 and "wrote html report on 2 runs" in stdout
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_cli_report_on_a_run_directory_shows_every_backend(tmp_path, runs, capsys):
    code, stdout, _ = accelkit(capsys, "conformance", "report", str(tmp_path), "--format", "md")
    assert code == 0
    assert "- `ref` **FAIL**" in stdout and "- `tpu` **FAIL**" in stdout


def test_cli_diff_exit_codes(tmp_path, runs, capsys):
    ref = runs[0]["source"]
    code, stdout, _ = accelkit(capsys, "conformance", "diff", ref, ref)
    assert code == 0 and "no regressions" in stdout
    broken = [dict(r, outcome="fail", reason="boom") if r["op"] == "add" else r for r in ref_records()]
    worse = write_json(tmp_path / "worse" / "results.json", document("ref", broken))
    code, stdout, _ = accelkit(capsys, "conformance", "diff", ref, str(worse))
    assert code == 1 and "REGRESSIONS (1)" in stdout
    code, _, stderr = accelkit(capsys, "conformance", "diff", ref, str(tmp_path / "missing.json"))
    assert code == 2 and "missing.json: no such file" in stderr


@pytest.mark.parametrize("outcome, reason, extra, expected", [
    ("crash", "worker crashed: Segmentation fault", {}, "died in native code"),
    ("timeout", "Timeout (60s)", {}, "too slow for the profile's timeout"),
    ("error", "UnsupportedDtypeError: tpu:0 does not support float64", {"dtype": "float64"}, "[unsupported_dtypes]"),
    ("error", "FallbackDeniedError: aten.erfinv.default ran on the CPU", {"fallback_ops": ["aten.erfinv.default"]},
     "implement aten.erfinv.default"),
    ("fail", "AssertionError: Tensor-likes are not close!", {"dtype": "bfloat16"}, '[[tolerance]] for "ops/add" for bfloat16'),
    ("error", "NotImplementedError: aten::foo", {}, "implement it"),
    ("error", "RuntimeError: something odd", {}, "rerun it alone (-k)"),
])
def test_every_failure_gets_a_likely_cause_and_what_to_do(outcome, reason, extra, expected):
    from accelkit_conformance.remedies import remedy

    line = remedy({"id": "suites/test_ops.py::test_ops[add-float32-forward]", "suite": "ops", "op": "add",
                   "outcome": outcome, "reason": reason, **extra})
    assert expected in line and "\n" not in line


def test_passes_settled_by_the_float32_reference_are_listed_not_hidden(tmp_path):
    settled, plain = record("linalg.cross", dtype="bfloat16"), record("add", dtype="bfloat16")
    settled["float_reference"] = 2
    run = report.load_results(write_json(tmp_path / "f.json", document("tpu", [settled, plain])))
    rows = report.summarize(run)["suites"]["ops"]["float_reference"]
    assert [(r["op"], r["comparisons"]) for r in rows] == [("linalg.cross", 2)]
    md = report.render_markdown([run])
    assert "### Passed against the float32 reference, not CPU's kernel" in md
    assert r"| linalg.cross | bfloat16 | forward | 2 |" in md
    assert "Passed against the float32 reference" not in report.render_markdown(
        [report.load_results(write_json(tmp_path / "p.json", document("tpu", [plain])))])


def test_a_negative_float_reference_count_is_a_schema_error():
    broken = record("add")
    broken["float_reference"] = -1
    with pytest.raises(ValueError, match="float_reference must be an integer >= 0"):
        document("tpu", [broken])
