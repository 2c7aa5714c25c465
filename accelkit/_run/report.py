"""The end-of-run report: :func:`accelkit.stats` at the script's end, reduced to what an engineer
asks first — how much ran natively, what fell back and what to do about it, what compiled and
why it recompiled, memory against capacity, and the estimated time on the target.

The report is a JSON-ready dict (``schema`` :data:`SCHEMA`). Its figures are the stats' own
(``report["stats"]`` is the whole snapshot); the derived ones — shares, top lists, time by op
family — are computed from it here and nowhere else. Definitions:

* **on the device** — executions by a native kernel or a decomposition into native kernels;
  ``device_share`` is their share of all executions; the rest ran on the CPU fallback.
* **op family** — the conformance report's rule (:func:`accelkit_conformance.summary.op_family`);
  a fused kernel is its own family, ``fused``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

SCHEMA = "accelkit-run-report/1"
#: Fallback ops listed with advice (the rest are summed).
TOP_FALLBACK = 10
#: Ops listed by executions in the HTML page.
TOP_OPS = 15
#: Op families shown in the estimated-time breakdown (the rest are summed as "other").
TOP_FAMILIES = 10


def build(*, target: Sequence[str], device: torch.device, ending: Mapping[str, Any], started: float,
          wall_seconds: float, memory: Sequence[tuple[float, int]], sample_interval: float | None,
          compile_requested: bool, compile_redirects: int) -> dict[str, Any]:
    """The report of a run that ended as ``ending`` (see :class:`~accelkit._run.launch.Ending`).

    ``memory`` is the sampled timeline ``[(seconds since start, allocated bytes)]``.
    """
    import accelkit

    stats = accelkit.stats()
    backend = stats["backend"] if stats["backend"] == device.type else None
    rank, world = _rank()
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "created": _dt.datetime.fromtimestamp(started, _dt.timezone.utc).isoformat(timespec="seconds"),
        "command": list(target),
        "exit": dict(ending),
        "wall_seconds": wall_seconds,
        "rank": rank,
        "world_size": world,
        "device": _device(device, backend),
    }
    if backend is None:
        return report | {"ops": None, "compile": None, "memory": None, "estimate": None, "collectives": None,
                          "stats": None}
    report["ops"] = _ops(stats, backend)
    report["compile"] = _compile(stats["compile"], compile_requested, compile_redirects)
    report["memory"] = _memory(stats["memory"], memory, sample_interval)
    report["estimate"] = _estimate(stats["estimate"])
    report["collectives"] = _collectives(stats["distributed"])
    report["stats"] = stats
    return report


def _rank() -> tuple[int | None, int | None]:
    world = os.environ.get("WORLD_SIZE")
    if world is None or int(world) <= 1:
        return None, None
    return int(os.environ.get("RANK", "0")), int(world)


def _device(device: torch.device, backend: str | None) -> dict[str, Any]:
    from accelkit import devices

    row = next((r for r in devices() if r.name == device.type), None)
    return {
        "device": str(device),
        "backend": backend,
        "target": row.target if row else None,
        "simulated": bool(row and row.simulated),
        "device_count": row.device_count if row else None,
    }


def _ops(stats: Mapping[str, Any], backend: str) -> dict[str, Any]:
    totals = stats["totals"]
    executions = sum(totals.values())
    fallbacks = sorted(((c["fallback"], op) for op, c in stats["ops"].items() if c["fallback"]), reverse=True)
    top = [{"op": op, "count": n, "advice": fallback_advice(op, backend)} for n, op in fallbacks[:TOP_FALLBACK]]
    busiest = sorted(stats["ops"].items(), key=lambda item: (-sum(item[1].values()), item[0]))[:TOP_OPS]
    return {
        "policy": stats["fallback_policy"],
        "executions": executions,
        "totals": dict(totals),
        "device_share": (totals["native"] + totals["decomposed"]) / executions if executions else None,
        "distinct_ops": len(stats["ops"]),
        "fallback_ops": len(fallbacks),
        "top_fallback": top,
        "top_ops": [{"op": op, **counts} for op, counts in busiest],
        "other_fallback": sum(n for n, _ in fallbacks[TOP_FALLBACK:]),
    }


def fallback_advice(op: str, backend: str) -> str:
    """One line on why ``op`` ran on the CPU and what to do about it."""
    from accelkit import _runtime
    from accelkit._runtime.dispatch.schema import overload_named

    overload = overload_named(op)
    ctx = _runtime.active()
    if overload is not None and ctx is not None and overload in ctx.kernels:
        return (f"{backend} has a kernel but declined these arguments (a dtype, layout or size it "
                "does not take); cast or reshape the inputs, or extend the kernel")
    if overload is not None and overload in torch._decomp.decomposition_table:
        return (f"no {backend} kernel, but torch._decomp decomposes it: the backend can declare that "
                "decomposition (accelkit_decompositions) and run it on the device")
    return (f"no {backend} kernel or decomposition: implement it in the backend's kernel table, "
            "or avoid the op; ACCELKIT_FALLBACK=deny raises where it is called")


def _compile(compile_stats: Mapping[str, Any], requested: bool, redirects: int) -> dict[str, Any]:
    hint = None
    if requested and not compile_stats["graphs_captured"]:
        hint = ("--compile compiles what the script passes to torch.compile for the device; this "
                "script compiled nothing: wrap the model or the step in torch.compile")
    return {
        "graphs_captured": compile_stats["graphs_captured"],
        "programs_compiled": compile_stats["programs_compiled"],
        "program_calls": compile_stats["program_calls"],
        "program_cache_hits": compile_stats["program_cache_hits"],
        "compile_seconds": compile_stats["compile_seconds"],
        "graph_breaks": compile_stats["graph_breaks"],
        "graph_break_reasons": dict(compile_stats["graph_break_reasons"]),
        "recompiles": list(compile_stats["recompiles"]),
        "eager_nodes": dict(compile_stats["eager_nodes"]),
        "requested": requested,
        "redirected_calls": redirects,
        "hint": hint,
    }


def _memory(memory_stats: Mapping[str, int], timeline: Sequence[tuple[float, int]],
            interval: float | None) -> dict[str, Any]:
    peak = memory_stats["allocated_bytes.peak"]
    capacity = memory_stats["capacity_bytes"]
    return {
        "peak_bytes": peak,
        "capacity_bytes": capacity,
        "peak_share": peak / capacity if capacity else None,
        "current_bytes": memory_stats["allocated_bytes.current"],
        "ooms": memory_stats["num_ooms"],
        "timeline": {"interval_seconds": interval, "points": [[round(t, 4), b] for t, b in timeline]},
    }


def estimate_sum(e: Mapping[str, Any]) -> str:
    """"X device + Y launch = Z (N launches, M host waits)": the report's one line of an estimate."""
    return (f"{format_seconds(e['seconds'])} device + {format_seconds(e['launch_seconds'])} launch = "
            f"{format_seconds(e['total_seconds'])} ({e['launches']} launches, {e['syncs']} host waits)")


def _estimate(estimate: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if estimate is None:
        return None
    from accelkit_conformance.summary import op_family

    families: dict[str, float] = {}
    for op, row in estimate["per_op"].items():
        family = "fused" if op.startswith("fused(") else op_family(op)
        families[family] = families.get(family, 0.0) + row["seconds"]
    ranked = sorted(families.items(), key=lambda item: (-item[1], item[0]))
    by_family = dict(ranked[:TOP_FAMILIES])
    if len(ranked) > TOP_FAMILIES:
        by_family["other"] = sum(seconds for _, seconds in ranked[TOP_FAMILIES:])
    return {
        "target": estimate["target"],
        "note": estimate["note"],
        "seconds": estimate["seconds"],
        "launch_seconds": estimate["launch_seconds"],
        "total_seconds": estimate["total_seconds"],
        "launches": estimate["launches"],
        "syncs": estimate["syncs"],
        "hbm_bytes": estimate["hbm_bytes"],
        "flops": estimate["flops"],
        "by_family": by_family,
        "by_target": dict(estimate.get("by_target") or {}),
        "not_estimated": dict(estimate.get("not_estimated") or {}),
    }


def _collectives(distributed: Mapping[str, Any]) -> dict[str, Any] | None:
    """The collectives the run made, with the interconnect their estimate is for."""
    if not distributed["collectives"]:
        return None
    interconnect = distributed["interconnect"]
    return {
        "transport": distributed["transport"],
        "interconnect": interconnect["name"] if interconnect else None,
        "note": distributed["estimate_note"],
        "by_kind": {kind: dict(row) for kind, row in sorted(distributed["collectives"].items())},
        "estimated_seconds": sum(row["estimated_seconds"] for row in distributed["collectives"].values()),
    }


# -- files and text --------------------------------------------------------------------------


def write(report: Mapping[str, Any], directory: Path, stem: str | None = None) -> list[Path]:
    """Write ``<stem>.json`` and ``<stem>.html`` into ``directory`` (by default ``report``, or
    ``report-rank<N>`` for one rank of several); return the paths."""
    from accelkit._run.render_html import render_html

    directory.mkdir(parents=True, exist_ok=True)
    if stem is None:
        stem = "report" if report["rank"] is None else f"report-rank{report['rank']}"
    json_path, html_path = directory / f"{stem}.json", directory / f"{stem}.html"
    json_path.write_text(json.dumps(report, indent=1, default=str) + "\n", encoding="utf-8")
    html_path.write_text(render_html(report), encoding="utf-8")
    return [json_path, html_path]


def format_seconds(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def headline(report: Mapping[str, Any]) -> str:
    """One line: what ran where and how it ended."""
    device = report["device"]
    where = device["device"]
    if device["target"]:
        where += f" (target {device['target']}, {'simulated' if device['simulated'] else 'real'})"
    ending = report["exit"]
    if ending["code"] is not None:
        how = f"exit {ending['code']}"
    else:  # a child process's report is written as it exits, before its status exists
        how = f"killed by {ending['signal']}" if ending["signal"] else "ended"
    if ending["exception"]:
        how += f", {ending['exception']}"
    rank = f" [rank {report['rank']} of {report['world_size']}]" if report["rank"] is not None else ""
    return f"{' '.join(report['command'])} on {where}{rank}: {how}, {report['wall_seconds']:.1f} s"


def render_text(report: Mapping[str, Any], written: Sequence[Path] = (), process: str | None = None) -> str:
    """The report for the terminal: a dozen lines (``process``: whose, when not the launcher's)."""
    from accelkit.sdk import format_bytes
    from accelkit_conformance.render_words import percent

    whose = f" {process} of the run," if process else ""
    lines = ["", f"accelkit run:{whose} {headline(report)}"]
    ops = report["ops"]
    if ops is None:
        lines.append(f"  no accelkit backend ran this script ({report['device']['device']}): nothing to report")
        return "\n".join(lines)
    totals = ops["totals"]
    lines.append(
        f"  ops       {ops['executions']} executions of {ops['distinct_ops']} ops: {totals['native']} native, "
        f"{totals['decomposed']} decomposed, {totals['fallback']} on the CPU fallback "
        f"({percent(ops['device_share'])} on the device; fallback policy {ops['policy']})")
    for row in ops["top_fallback"]:
        lines.append(f"  fallback  {row['op']} ×{row['count']}: {row['advice']}")
    if ops["other_fallback"]:
        lines.append(f"  fallback  {ops['other_fallback']} more executions of other ops")
    c = report["compile"]
    if c["graphs_captured"] or c["requested"]:
        lines.append(
            f"  compile   {c['graphs_captured']} graphs captured, {c['programs_compiled']} programs compiled "
            f"in {c['compile_seconds']:.2f} s, {c['program_calls']} program calls, {c['graph_breaks']} graph breaks, "
            f"{len(c['recompiles'])} recompiles")
        for recompile in c["recompiles"][:5]:
            lines.append(f"  recompile {_recompile_text(recompile)}")
        if c["hint"]:
            lines.append(f"  compile   {c['hint']}")
    m = report["memory"]
    lines.append(f"  memory    peak {format_bytes(m['peak_bytes'])} of {format_bytes(m['capacity_bytes'])} "
                 f"({percent(m['peak_share'])}), {m['ooms']} out-of-memory errors")
    e = report["estimate"]
    if e is None:
        lines.append(f"  estimate  {report['device']['backend']} makes no estimate of its target's time")
    else:
        families = ", ".join(f"{family} {percent(seconds / e['seconds'] if e['seconds'] else None)}"
                             for family, seconds in list(e["by_family"].items())[:5])
        lines.append(f"  estimate  {estimate_sum(e)} on {e['target']}, estimated: {e['note']}")
        if families:
            lines.append(f"            device time by op family: {families}")
        for name, row in e["by_target"].items():
            if name != e["target"]:
                lines.append(f"            on {name}: {estimate_sum(row)}")
        for name, why in e["not_estimated"].items():
            lines.append(f"            on {name}: no estimate from this run: {why}")
    coll = report["collectives"]
    if coll:
        for kind, row in coll["by_kind"].items():
            estimated = (f", estimated {format_seconds(row['estimated_seconds'])} on {coll['interconnect']}"
                         if coll["interconnect"] and row["estimated_seconds"] is not None else "")
            lines.append(f"  {'collective':<9} {kind} ×{row['calls']} over {row['world']} ranks: "
                         f"{format_bytes(row['bytes'])}, {format_seconds(row['host_seconds'])} here "
                         f"(host-staged through gloo){estimated}")
        if e is not None and coll["interconnect"]:
            compute, communication = e["seconds"], coll["estimated_seconds"]
            total = compute + communication
            lines.append(f"  {'split':<9} compute {format_seconds(compute)} + communication "
                         f"{format_seconds(communication)} on {e['target']}, estimated "
                         f"({percent(communication / total if total else None)} communication, no overlap assumed)")
    for name, section in report.get("sections", {}).items():  # an engine's own figures
        lines.append(f"  {name:<9} {section['summary']}")
    for path in written:
        lines.append(f"  report    {path}")
    return "\n".join(lines)


def _recompile_text(recompile: Any) -> str:
    if isinstance(recompile, Mapping):
        return "; ".join(f"{k}: {v}" for k, v in recompile.items())
    return str(recompile)
