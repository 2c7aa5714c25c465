"""A self-contained HTML view of a conformance report: one file, inline CSS and inline SVG charts,
no script and nothing fetched from the network (content and order: :mod:`.render_model`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import re
from html import escape
from typing import Any

from .render_model import Block, build
from .render_words import INCOMPLETE_MARK, OUTCOME_WORDS, percent, visible_controls
from .schema import BAD_OUTCOMES, OUTCOMES

#: Segment colours; ``pass-fallback`` is a pass that used the CPU fallback.
COLORS = {
    "pass": "#1e7b3a", "pass-fallback": "#93d3a2", "xfail": "#aab2bc", "xpass": "#2f6fdd",
    "fail": "#d64541", "error": "#ef8a2b", "crash": "#7a2ca0", "timeout": "#9a6a3a",
    "skip-declared": "#dde3ea", "skip-other": "#f1e3a6", "bad": "#d64541",
    # the coverage audit's paths
    "native": "#1e7b3a", "derived": "#4fa866", "decomposed": "#93d3a2", "fallback": "#d64541",
    "cpu_by_design": "#e8a33d", "refused": "#7a2ca0",
}
_LEGEND = {"pass": "pass (native)", "pass-fallback": "pass via CPU fallback", "bad": "fail / error / crash / timeout"}

_LINE_BREAK = re.compile(r"\r\n?|\n")

#: The stylesheet of accelkit's HTML reports (this one and `accelkit run`'s).
STYLESHEET = """
:root { --fg: #1d2330; --muted: #5f6b7a; --line: #d9dee5; --bg-alt: #f5f7fa; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
       color: var(--fg); margin: 0 auto; padding: 24px 32px 48px; max-width: 1240px; }
h1 { font-size: 22px; margin: 0 0 16px; }
h2 { font-size: 17px; margin: 30px 0 10px; padding-bottom: 4px; border-bottom: 2px solid var(--line); }
h3 { font-size: 14px; margin: 18px 0 6px; color: var(--muted); }
table { border-collapse: collapse; margin: 4px 0 8px; font-size: 13px; }
th, td { padding: 3px 10px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
thead th { background: var(--bg-alt); font-weight: 600; white-space: nowrap; }
tbody tr:nth-child(even) td { background: #fafbfc; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.prov th[scope=row] { color: var(--muted); font-weight: 500; white-space: nowrap; }
td.id { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px;
        word-break: break-all; }
.tag { display: inline-block; padding: 0 6px; border-radius: 3px; font-size: 11px; font-weight: 700;
       color: #fff; letter-spacing: .02em; }
.verdicts { display: grid; grid-template-columns: max-content max-content 1fr; gap: 6px 12px;
            align-items: baseline; margin: 6px 0 14px; font-size: 16px; }
.verdicts .name { font-weight: 700; }
.verdicts .rest { font-size: 15px; }
.verdicts .rest b { font-size: 19px; }
.badge { min-width: 10ch; text-align: center; padding: 1px 8px; border-radius: 4px; font-weight: 800;
         color: #fff; }
.cols { display: flex; flex-wrap: wrap; gap: 6px 28px; align-items: flex-start; }
.cols .colhead { font-weight: 700; margin-top: 4px; }
td.nowrap { white-space: nowrap; }
.PASS { background: #1e7b3a; } .FAIL { background: #d64541; } .INCOMPLETE, .EMPTY { background: #c98a00; }
.legend { font-size: 12px; color: var(--muted); margin: 2px 0 6px; }
.legend span { display: inline-block; margin-right: 14px; white-space: nowrap; }
.legend i { display: inline-block; width: 11px; height: 11px; margin-right: 4px; vertical-align: -1px;
            border-radius: 2px; }
.wrong { color: #d64541; font-weight: 700; }
pre.final { background: var(--bg-alt); padding: 10px 14px; border-radius: 4px; font-size: 13px; }
pre.final span { display: block; font-weight: 700; }
pre.final .v-PASS { color: #1e7b3a; } pre.final .v-FAIL { color: #c0392b; }
pre.final .v-INCOMPLETE, pre.final .v-EMPTY { color: #a86f00; }
p.note { color: var(--muted); }
"""


def legend(keys: Sequence[str]) -> str:
    """The colour key of :func:`bars` for ``keys`` (names of :data:`COLORS`)."""
    items = "".join(f'<span><i style="background:{COLORS[k]}"></i>{escape(_LEGEND.get(k, k))}</span>' for k in keys)
    return f'<div class="legend">{items}</div>'


def bars(rows: list[tuple[str, list[tuple[str, int]], str]], width: int = 1000) -> str:
    """Horizontal 100% stacked bars: one per ``(label, [(key, count)], right-hand note)``, each
    key coloured from :data:`COLORS` (also the ops-by-path chart of ``accelkit run``'s page).
    Each bar is a ``rect.track`` with its ``rect.segment`` parts on it."""
    label_w, note_w, bar_h, gap = 110, 250, 24, 10
    bar_w = width - label_w - note_w
    height = len(rows) * (bar_h + gap)
    parts = [(f'<svg role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
              f'style="font: 12px system-ui, sans-serif">')]
    for i, (label, segments, note) in enumerate(rows):
        y = i * (bar_h + gap)
        total = sum(n for _, n in segments)
        parts.append(f'<text x="{label_w - 10}" y="{y + bar_h / 2 + 5}" text-anchor="end" font-weight="700" '
                     f'font-size="14">{escape(label)}</text>')
        parts.append(f'<rect class="track" x="{label_w}" y="{y}" width="{bar_w}" height="{bar_h}" fill="#f5f7fa" '
                     'stroke="#d9dee5"/>')
        x = float(label_w)
        for key, n in segments:
            if not n or not total:
                continue
            w = bar_w * n / total
            title = f"{label}: {n} {OUTCOME_WORDS.get(key, _LEGEND.get(key, key))} ({percent(n / total)})"
            parts.append(f'<rect class="segment" x="{x:.2f}" y="{y}" width="{w:.2f}" height="{bar_h}" fill="{COLORS[key]}">'
                         f'<title>{escape(title)}</title></rect>')
            if w >= 8 * len(str(n)) + 8:
                dark = key in ("pass-fallback", "skip-declared", "skip-other", "xfail", "decomposed")
                parts.append(f'<text x="{x + w / 2:.2f}" y="{y + bar_h / 2 + 4}" text-anchor="middle" '
                             f'fill="{"#1d2330" if dark else "#fff"}">{n}</text>')
            x += w
        parts.append(f'<text x="{label_w + bar_w + 10}" y="{y + bar_h / 2 + 5}" fill="#1d2330">{escape(note)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _coverage_chart(data: Mapping[str, Any]) -> str:
    rows = []
    for name, s in zip(data["names"], data["summaries"]):
        o = s["overall"]
        c = o["counts"]
        segments = [("pass", o["native"]), ("pass-fallback", o["passed"] - o["native"]), ("xfail", c["xfail"]),
                    ("xpass", c["xpass"]), ("bad", sum(c[k] for k in BAD_OUTCOMES))]
        rows.append((name, segments, f"native {percent(o['native_rate'])} · with fallback {percent(o['pass_rate'])}"))
    return (legend(["pass", "pass-fallback", "xfail", "xpass", "bad"]) + bars(rows)
            + '<p class="note">Share of the tests that ran (skips excluded). Native coverage: passes that used '
              'no CPU fallback.</p>')


def _outcome_chart(data: Mapping[str, Any]) -> str:
    keys = ["pass", "pass-fallback", *(o for o in OUTCOMES if o != "pass")]
    rows, used = [], set()
    for name, s in data["rows"]:
        c = dict(s["counts"], **{"pass": s["native"], "pass-fallback": s["passed"] - s["native"]})
        used |= {k for k in keys if c[k]}
        rows.append((name, [(k, c[k]) for k in keys], f"{s['total']} tests · {s['ran']} ran"))
    return legend([k for k in keys if k in used]) + bars(rows)


def _text(text: str) -> str:
    """``text`` escaped for HTML, its line breaks kept as ``<br>``, other control characters as escapes."""
    return "<br>".join(escape(visible_controls(line)) for line in _LINE_BREAK.split(text)) if text else ""


def _cell(text: str, header: str, numeric: bool) -> str:
    lowered = text.lower()
    if lowered in OUTCOMES:
        style = f' style="background:{COLORS[lowered]}{";color:#1d2330" if lowered.startswith("skip") else ""}"'
        body = f'<span class="tag"{style}>{escape(text)}</span>'
    elif "WRONG" in text:
        body = _text(text).replace("WRONG", '<span class="wrong">WRONG</span>')
    else:
        body = _text(text)
    cls = ("num" if numeric else "id" if header in ("test", "expectation entry to remove")
           else "nowrap" if header in ("case", "shapes", "family") else "")
    return f"<td{f' class={cls!r}' if cls else ''}>{body}</td>"


def _table(block: Block, provenance: bool) -> str:
    head = "".join(f"<th{' class=num' if i in block.numeric else ''}>{escape(h)}</th>"
                   for i, h in enumerate(block.headers))
    body = []
    for row in block.rows:
        if provenance:
            cells = f'<th scope="row">{_text(row[0])}</th>' + "".join(f"<td>{_text(c)}</td>" for c in row[1:])
        else:
            cells = "".join(_cell(c, h, i in block.numeric) for i, (c, h) in enumerate(zip(row, block.headers)))
        body.append(f"<tr>{cells}</tr>")
    cls = ' class="prov"' if provenance else ""
    return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _verdict(label: str, verdict: str, rest: str) -> str:
    incomplete = rest.endswith(INCOMPLETE_MARK)
    rest = rest.removesuffix(INCOMPLETE_MARK)
    headline, sep, tail = rest.partition(" (")  # "native 71.2%" is the headline figure
    tag = ' <span class="tag INCOMPLETE">incomplete run</span>' if incomplete else ""
    return (f'<span class="badge {escape(verdict)}">{escape(verdict)}</span><span class="name">{escape(label)}</span>'
            f'<span class="rest"><b>{escape(headline)}</b>{escape(sep + tail)}{tag}</span>')


def render_html(runs: Sequence[Mapping[str, Any]]) -> str:
    """The report as one self-contained HTML page, one column (or bar) per run in ``runs``.

    Inline CSS, inline SVG bar charts (coverage per backend; outcomes per suite and backend),
    SVG ``<title>`` tooltips; no JavaScript, no external resource. All result text is escaped.
    """
    blocks = build(runs)
    names = ", ".join(row[0] for b in blocks if b.kind == "verdicts" for row in b.rows)
    return html_of_blocks(blocks, f"accelkit conformance — {names}")


def html_of_blocks(blocks: Sequence[Block], title: str) -> str:
    """Any report's blocks as one self-contained page titled ``title``; see :func:`render_html`.
    A ``chart`` block draws stacked bars: ``coverage``, ``outcomes`` or ``bars`` (its
    ``data["rows"]`` as :func:`bars` takes them, ``data["keys"]`` its legend)."""
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{escape(title)}</title>", f"<style>{STYLESHEET}</style></head><body>"]
    section = ""
    for block in blocks:
        if block.kind == "title":
            out.append(f"<h1>{escape(block.text)}</h1>")
        elif block.kind == "heading":
            section = block.text if block.level == 2 else section
            out.append(f"<h{block.level}>{escape(block.text)}</h{block.level}>")
        elif block.kind == "table":
            out.append(_table(block, provenance=section == "Provenance"))
        elif block.kind == "tables":
            out.append('<div class="cols">' + "".join(
                f'<div><div class="colhead">{escape(label)}</div>{_table(table, provenance=False)}</div>'
                for label, table in block.data["tables"]) + "</div>")
        elif block.kind == "verdicts":
            out.append('<div class="verdicts">' + "".join(_verdict(*row) for row in block.rows) + "</div>")
        elif block.kind == "chart" and block.data["chart"] == "coverage":
            out.append(_coverage_chart(block.data))
        elif block.kind == "chart" and block.data["chart"] == "outcomes":
            out.append(_outcome_chart(block.data))
        elif block.kind == "chart" and block.data["chart"] == "bars":
            out.append(legend(block.data["keys"]) + bars(block.data["rows"]))
        elif block.kind == "text":
            out.append(f'<p class="note">{escape(block.text)}</p>')
        elif block.kind == "final":
            out.append('<pre class="final">' + "".join(
                f'<span class="v-{escape(v)}">{escape(line)}</span>' for v, line in block.rows) + "</pre>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
