"""accelkit's HTML pages — the ``accelkit run`` report and the conformance report — opened in a
real headless Chromium (the system's, driven by Playwright): they load with no console errors
and fetch nothing, their charts draw, and hostile strings in the data stay text.

``make test`` installs Chromium from the system packages first and requires it
(``ACCELKIT_REQUIRE_BROWSER=1``); elsewhere the tests skip when no Chromium is installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from test_conformance_report import document, hostile_run, ref_records, write_json

HOSTILE = "<img src=x onerror=alert(1)><script>alert(2)</script><iframe src=//e.com></iframe>&amp;\"'"
#: Elements no page has unless a hostile string became markup.
INJECTED = "img, script, iframe, object, embed, a[href^='javascript']"


def chromium() -> str | None:
    return os.environ.get("ACCELKIT_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser():
    executable = chromium()
    if executable is None:
        message = "no Chromium here: `make test` installs it (apt-get install chromium)"
        if os.environ.get("ACCELKIT_REQUIRE_BROWSER"):
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield launched
        launched.close()


def open_page(browser, path: Path):
    """Load ``path``; return the page and what went wrong while loading (console errors and
    warnings, page errors, requests for anything but the page itself)."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("request", lambda r: problems.append(f"request: {r.url}") if r.url != path.as_uri() else None)
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    return page, problems


def assert_text_stays_text(page, *strings: str) -> None:
    assert page.evaluate(f"document.querySelectorAll({INJECTED!r}).length") == 0
    shown = page.evaluate("document.body.innerText")
    for s in strings:
        assert s in shown


@pytest.fixture(scope="module")
def run_report(tmp_path_factory) -> Path:
    """A real ``accelkit run`` report (neuron: it has an estimate and a compiled graph) whose
    command line and exception carry hostile strings, with more put in its op names, advice,
    families and recompile reasons, then rendered again."""
    from accelkit._run.render_html import render_html

    tmp = tmp_path_factory.mktemp("run")
    script = tmp / "train.py"
    script.write_text(textwrap.dedent(f"""
        import accelkit, torch
        dev = accelkit.select_device()
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).to(dev)
        step = torch.compile(model, backend=dev.type)
        for _ in range(3):
            step(torch.randn(4, 8).to(dev)).sum().backward()
        raise ValueError({HOSTILE!r})
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELKIT_", "ACCELERATE_"))}
    result = subprocess.run([sys.executable, "-m", "accelkit", "run", "--device", "neuron", "--report", str(tmp),
                             str(script), HOSTILE], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    report = json.loads((tmp / "report.json").read_text())
    report["ops"]["top_fallback"] = [{"op": HOSTILE, "count": 2, "advice": HOSTILE}]
    report["estimate"]["by_family"][HOSTILE] = report["estimate"]["seconds"] / 2
    report["compile"]["recompiles"] = [{"function": HOSTILE, "reason": HOSTILE}]
    page = tmp / "hostile.html"
    page.write_text(render_html(report), encoding="utf-8")
    return page


def test_the_run_report_loads_clean_and_its_charts_draw(browser, run_report):
    page, problems = open_page(browser, run_report)
    assert problems == []
    report = json.loads((run_report.parent / "report.json").read_text())
    # ops by path: the segments fill the bar in proportion to the executions
    segments = page.evaluate("[...document.querySelectorAll('#ops-chart rect.segment')].map(r => r.getBBox().width)")
    bar = page.evaluate("document.querySelector('#ops-chart rect.track').getBBox().width")
    drawn = [n for n in report["ops"]["totals"].values() if n]
    assert len(segments) == len(drawn) and all(w > 0 for w in segments)
    assert sum(segments) == pytest.approx(bar, rel=1e-3)
    # time by family: one drawn bar per family, the longest for the family with the most time
    bars = page.evaluate("[...document.querySelectorAll('#family-chart rect.bar')].map(r => r.getBBox().width)")
    assert len(bars) == len(report["estimate"]["by_family"]) + 1 and all(w > 0 for w in bars)
    # memory over the run: a line with length, inside the chart
    length = page.evaluate("document.querySelector('#memory-chart polyline.series').getTotalLength()")
    assert length > 0
    for chart in ("#ops-chart", "#family-chart", "#memory-chart"):
        box = page.evaluate("c => { const b = document.querySelector(c).getBoundingClientRect(); "
                            "return [b.width, b.height]; }", chart)
        assert box[0] > 0 and box[1] > 0, chart


def test_hostile_strings_in_the_run_report_stay_text(browser, run_report):
    page, problems = open_page(browser, run_report)
    assert problems == []
    assert_text_stays_text(page, HOSTILE)
    assert page.title().startswith("accelkit run")


def test_the_conformance_report_loads_clean_draws_and_keeps_hostile_strings_text(browser, tmp_path):
    from accelkit_conformance import report

    clean = report.load_results(write_json(tmp_path / "ref.json", document("ref", ref_records(), target="host")))
    page_path = tmp_path / "conformance.html"
    page_path.write_text(report.render_html([clean, hostile_run(tmp_path)]), encoding="utf-8")
    page, problems = open_page(browser, page_path)
    assert problems == []
    charts = page.evaluate("[...document.querySelectorAll('svg')].map(s => s.getBoundingClientRect().width)")
    assert charts and all(w > 0 for w in charts)
    segments = page.evaluate("[...document.querySelectorAll('svg rect[fill]')].filter(r => r.getBBox().width > 0).length")
    assert segments > len(charts)  # bars drawn, not only their backgrounds
    assert_text_stays_text(page, "<script>alert('id')</script>", "<script>alert(1)</script>")


def test_the_coverage_audit_page_loads_clean_and_draws(browser, tmp_path):
    from accelkit_conformance.coverage import audit, render

    done = audit("ref")
    page_path = tmp_path / "coverage.html"
    page_path.write_text(render([done], "html"), encoding="utf-8")
    page, problems = open_page(browser, page_path)
    assert problems == []
    segments = page.evaluate("[...document.querySelectorAll('svg rect[fill]')].filter(r => r.getBBox().width > 0)"
                             ".map(r => r.getAttribute('fill'))")
    drawn = [p for p, n in done["counts"].items() if n]
    assert len(segments) == 1 + len(drawn)  # the bar's background and one segment per path present
    assert done["families_left"][0]["family"] in page.evaluate("document.body.innerText")
