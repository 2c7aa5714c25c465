"""The conformance report: read results, summarize them, render them, compare two runs.

The public surface, used by ``accelkit conformance report`` / ``diff`` (:mod:`.cli`)::

    runs = [load_results("out/ref/results.json"), load_results("out/tpu/results.jsonl")]
    print(render_terminal(runs))            # or render_markdown(runs), render_html(runs)
    text, code = diff(runs[0], load_results("baseline/ref/results.json"))

Modules: :mod:`.report_load` reads and validates a results file; :mod:`.summary` defines the
figures (ran, pass rate, native coverage, verdict, op families); :mod:`.render_model` decides
what a report says and in which order; :mod:`.render_text` / :mod:`.render_html` lay it out;
:mod:`.report_diff` compares two runs. Standard library only.
"""

from __future__ import annotations

from .render_html import render_html
from .render_text import render_markdown, render_terminal
from .render_words import final_line, percent, verdict_line
from .report_diff import ExitCode, diff
from .report_load import ResultsError, load_results
from .summary import op_family, summarize

__all__ = [
    "ExitCode",
    "ResultsError",
    "diff",
    "final_line",
    "load_results",
    "op_family",
    "percent",
    "render_html",
    "render_markdown",
    "render_terminal",
    "summarize",
    "verdict_line",
]
