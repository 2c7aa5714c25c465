"""The ``accelkit run`` report as one self-contained HTML page: the conformance report's
stylesheet, inline SVG charts (ops by path, estimated time by op family, memory over the run),
no script and nothing fetched. Every string from the run is escaped: it stays text."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from accelkit._run.report import estimate_sum, format_seconds, headline
from accelkit.sdk import format_bytes
from accelkit_conformance.render_html import STYLESHEET, bars, legend
from accelkit_conformance.render_words import percent

#: The dispatch paths, in the order the ops chart stacks them (colours: the conformance report's).
PATHS = ("native", "decomposed", "fallback")
FAMILY_COLOR = "#2f6fdd"
MEMORY_COLOR = "#7a2ca0"
_EXTRA_CSS = """
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 3px 16px; margin: 6px 0 12px; }
dl.facts dt { color: var(--muted); } dl.facts dd { margin: 0; }
svg.chart { display: block; margin: 6px 0 4px; }
"""
_SVG_FONT = 'style="font: 12px system-ui, sans-serif"'


def render_html(report: Mapping[str, Any]) -> str:
    """The page for ``report`` (see :func:`accelkit._run.report.build`)."""
    parts = ['<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
             f"<title>accelkit run — {escape(' '.join(report['command']))}</title>",
             f"<style>{STYLESHEET}{_EXTRA_CSS}</style></head><body>",
             "<h1>accelkit run</h1>", f"<p>{escape(headline(report))}</p>"]
    parts.append(_facts(report))
    if report["ops"] is None:
        parts.append(f'<p class="note">No accelkit backend ran this script '
                     f'({escape(report["device"]["device"])}): nothing more to report.</p>')
    else:
        parts += [_ops(report["ops"]), _estimate(report["estimate"], report["device"]),
                  _compile(report["compile"]), _memory(report["memory"]), _collectives(report["collectives"])]
    parts.append("</body></html>\n")
    return "".join(parts)


def _facts(report: Mapping[str, Any]) -> str:
    device = report["device"]
    rows = [("device", device["device"]),
            ("target", f"{device['target'] or '-'} ({'simulated' if device['simulated'] else 'real hardware'})"),
            ("command", " ".join(report["command"])), ("started", report["created"]),
            ("wall time", f"{report['wall_seconds']:.2f} s")]
    ending = report["exit"]
    rows.append(("ending", f"exit code {ending['code']}" if ending["code"] is not None
                 else f"killed by {ending['signal']}"))
    if ending["exception"]:
        rows.append(("exception", ending["exception"]))
    if report["rank"] is not None:
        rows.append(("rank", f"{report['rank']} of {report['world_size']}"))
    return '<dl class="facts">' + "".join(f"<dt>{escape(k)}</dt><dd>{escape(str(v))}</dd>" for k, v in rows) + "</dl>"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[int] = ()) -> str:
    head = "".join(f'<th{" class=num" if i in numeric else ""}>{escape(h)}</th>' for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f'<td{" class=num" if i in numeric else ""}>{escape(str(cell))}</td>'
                                    for i, cell in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _ops(ops: Mapping[str, Any]) -> str:
    totals, executions = ops["totals"], ops["executions"]
    return "".join([
        f'<h2>Ops by path</h2><p>{executions} executions of {ops["distinct_ops"]} ops; '
        f'{escape(percent(ops["device_share"]))} ran on the device (fallback policy {escape(ops["policy"])}).</p>',
        legend(PATHS), '<div id="ops-chart">',
        bars([("ops", [(path, totals[path]) for path in PATHS], f"{percent(ops['device_share'])} on the device")]),
        "</div>", _op_tables(ops)])


def _op_tables(ops: Mapping[str, Any]) -> str:
    parts = []
    parts.append(f"<h3>The {len(ops['top_ops'])} most executed ops</h3>")
    parts.append(_table(["op", "native", "decomposed", "CPU fallback"],
                        [(r["op"], r["native"], r["decomposed"], r["fallback"]) for r in ops["top_ops"]],
                        numeric=(1, 2, 3)))
    if ops["top_fallback"]:
        parts.append("<h3>Ops on the CPU fallback, most executed first, and what to do</h3>")
        parts.append(_table(["op", "executions", "what to do"],
                            [(r["op"], r["count"], r["advice"]) for r in ops["top_fallback"]], numeric=(1,)))
        if ops["other_fallback"]:
            parts.append(f'<p class="note">and {ops["other_fallback"]} executions of other ops.</p>')
    else:
        parts.append('<p class="note">Nothing ran on the CPU fallback.</p>')
    return "".join(parts)


def _estimate(estimate: Mapping[str, Any] | None, device: Mapping[str, Any]) -> str:
    if estimate is None:
        return f'<h2>Estimated time on the target</h2><p class="note">{escape(device["backend"])} makes no estimate.</p>'
    families = estimate["by_family"]
    parts = [f'<h2>Estimated time on {escape(estimate["target"])}: {escape(format_seconds(estimate["total_seconds"]))}</h2>',
             f'<p id="estimate-sum">{escape(estimate_sum(estimate))}: device time is what the chip is busy for, '
             'launch time what it waits on the host to hand it each program.</p>',
             f'<p class="note">Estimated, not measured: {escape(estimate["note"])}. Per-family times '
             'are each op\'s own device time; ops that overlap on the device add up to more than the total.</p>']
    if families:
        label_w, bar_w, bar_h, gap = 220, 520, 18, 6
        longest = max(families.values()) or 1.0
        height = len(families) * (bar_h + gap)
        width = label_w + bar_w + 120
        parts.append(f'<svg class="chart" id="family-chart" role="img" width="{width}" height="{height}" '
                     f'viewBox="0 0 {width} {height}" {_SVG_FONT}>')
        for i, (family, seconds) in enumerate(families.items()):
            y = i * (bar_h + gap)
            w = max(bar_w * seconds / longest, 1.0)
            parts.append(f'<text x="{label_w - 8}" y="{y + bar_h - 4}" text-anchor="end">{escape(family)}</text>')
            parts.append(f'<rect class="bar" x="{label_w}" y="{y}" width="{w:.2f}" height="{bar_h}" '
                         f'fill="{FAMILY_COLOR}"><title>{escape(family)}: {escape(format_seconds(seconds))}</title></rect>')
            parts.append(f'<text x="{label_w + w + 6:.2f}" y="{y + bar_h - 4}">{escape(format_seconds(seconds))}</text>')
        parts.append("</svg>")
    facts = []
    if estimate["hbm_bytes"] is not None:
        facts.append(f"HBM traffic {format_bytes(estimate['hbm_bytes'])}")
    if estimate["flops"] is not None:
        facts.append(f"{estimate['flops']:.3g} FLOPs")
    if facts:
        parts.append(f'<p>{escape(", ".join(facts))}.</p>')
    if estimate["by_target"] or estimate["not_estimated"]:
        rows = [[name, format_seconds(row["seconds"]), format_seconds(row["launch_seconds"]),
                 format_seconds(row["total_seconds"]), str(row["launches"]), str(row["syncs"])]
                for name, row in estimate["by_target"].items()]
        rows += [[name, "-", "-", "-", "-", f"not estimated: {why}"] for name, why in estimate["not_estimated"].items()]
        parts.append('<h3 id="estimate-targets">The same run on other targets</h3>'
                     + _table(["target", "device", "launch", "total", "launches", "host waits"], rows, (1, 2, 3, 4)))
    return "".join(parts)


def _compile(c: Mapping[str, Any]) -> str:
    if not c["graphs_captured"] and not c["requested"]:
        return '<h2>Compiled graphs</h2><p class="note">The script compiled nothing (eager only).</p>'
    parts = ["<h2>Compiled graphs</h2>",
             _table(["graphs captured", "programs compiled", "compile time", "program calls", "cache hits",
                     "graph breaks", "recompiles"],
                    [(c["graphs_captured"], c["programs_compiled"], f"{c['compile_seconds']:.2f} s",
                      c["program_calls"], c["program_cache_hits"], c["graph_breaks"], len(c["recompiles"]))],
                    numeric=range(7))]
    if c["recompiles"]:
        parts.append("<h3>Recompiles and their reasons</h3>")
        parts.append(_table(["function", "reason"],
                            [(r.get("function", ""), r.get("reason", "")) for r in c["recompiles"]]))
    if c["graph_break_reasons"]:
        parts.append("<h3>Graph breaks</h3>")
        parts.append(_table(["reason", "count"], sorted(c["graph_break_reasons"].items()), numeric=(1,)))
    if c["eager_nodes"]:
        parts.append("<h3>Graph nodes run eagerly</h3>")
        parts.append(_table(["op", "count"], sorted(c["eager_nodes"].items()), numeric=(1,)))
    if c["hint"]:
        parts.append(f'<p class="note">{escape(c["hint"])}</p>')
    return "".join(parts)


def _memory(m: Mapping[str, Any]) -> str:
    points = m["timeline"]["points"]
    parts = [f'<h2>Memory: peak {escape(format_bytes(m["peak_bytes"]))} of '
             f'{escape(format_bytes(m["capacity_bytes"]))} ({escape(percent(m["peak_share"]))})</h2>']
    if len(points) >= 2:
        width, height, left, bottom = 900, 220, 70, 24
        duration = points[-1][0] or 1.0
        top = max(max(b for _, b in points), m["peak_bytes"], 1)
        def xy(t: float, b: float) -> str:
            return f"{left + (width - left - 10) * t / duration:.1f},{(height - bottom) * (1 - b / top) + 4:.1f}"
        line = " ".join(xy(t, b) for t, b in points)
        base = height - bottom + 4
        parts.append(f'<svg class="chart" id="memory-chart" role="img" width="{width}" height="{height + 10}" '
                     f'viewBox="0 0 {width} {height + 10}" {_SVG_FONT}>')
        parts.append(f'<polygon points="{left},{base} {line} {xy(points[-1][0], 0).split(",")[0]},{base}" '
                     f'fill="{MEMORY_COLOR}" fill-opacity="0.18"/>')
        parts.append(f'<polyline class="series" points="{line}" fill="none" stroke="{MEMORY_COLOR}" stroke-width="1.5"/>')
        parts.append(f'<line x1="{left}" y1="{base}" x2="{width - 10}" y2="{base}" stroke="#5f6b7a"/>')
        parts.append(f'<text x="{left - 6}" y="12" text-anchor="end">{escape(format_bytes(top))}</text>')
        parts.append(f'<text x="{left - 6}" y="{base}" text-anchor="end">0</text>')
        parts.append(f'<text x="{width - 10}" y="{height + 8}" text-anchor="end">{duration:.2f} s</text>')
        parts.append(f'<text x="{left}" y="{height + 8}">0 s</text>')
        parts.append("</svg>")
        parts.append(f'<p class="note">Allocated bytes sampled every {m["timeline"]["interval_seconds"]:.3g} s '
                     '(the peak above is exact; a spike between two samples is not drawn).</p>')
    else:
        parts.append('<p class="note">The run was too short for a memory timeline.</p>')
    return "".join(parts)


def _collectives(coll: Mapping[str, Any] | None) -> str:
    if coll is None:
        return ""
    rows = [(kind, row["calls"], row["world"], format_bytes(row["bytes"]), format_seconds(row["host_seconds"]),
             format_seconds(row["estimated_seconds"]) if row["estimated_seconds"] is not None else "-")
            for kind, row in coll["by_kind"].items()]
    where = f" on {coll['interconnect']}" if coll["interconnect"] else ""
    return ("<h2>Collectives</h2>"
            + _table(["collective", "calls", "ranks", "bytes", "time here", f"estimated{where}"], rows,
                     numeric=(1, 2, 3, 4, 5))
            + f'<p class="note">Here: {escape(coll["transport"])}. {escape(coll["note"])}.</p>')
