"""The native-coverage audit: which path every aten overload with a CPU kernel takes on a
backend, without running a test (``accelkit conformance coverage``).

Each backend is audited in a subprocess of its own (one PrivateUse1 backend per process) that
activates it and asks :func:`accelkit.sdk.op_coverage`; paths and their meaning are documented
there. An audit is a versioned JSON (``schema`` :data:`SCHEMA`): the backend, its target, the
versions, counts per path, the families left (op families with ops on the CPU fallback, most
first) and every overload's path and detail. Ops a backend declared CPU by design (path
``cpu_by_design``, detail: its reason) have their own column and their own list, with the
reason for each; they run on the CPU all the same, so they never count as on the device. It renders as text, Markdown and HTML like the
other reports, and :func:`diff_audits` compares two audits of a backend.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .render_model import Block
from .report_diff import ExitCode
from .summary import op_family

SCHEMA = "accelkit-coverage/1"
PATHS = ("native", "derived", "decomposed", "fallback", "cpu_by_design", "refused")
#: Better paths first: a move to a later one is a regression in :func:`diff_audits`. A move
#: between ``fallback`` and ``cpu_by_design`` is neither (both run on the CPU).
_RANK = {"native": 0, "derived": 0, "decomposed": 1, "fallback": 2, "cpu_by_design": 2, "refused": 3}
#: Paths that run on the device (the others run on the CPU or not at all).
_ON_DEVICE = ("native", "derived", "decomposed")
#: Families listed as left, and ops named per family.
FAMILIES_LEFT = 25
OPS_PER_FAMILY = 4

_AUDIT = textwrap.dedent("""
    import json, sys, torch, accelkit
    from accelkit.sdk import op_coverage
    device = accelkit.select_device(sys.argv[1])
    row = next(r for r in accelkit.devices() if r.name == device.type)
    print(json.dumps({"target": row.target, "simulated": row.simulated, "torch": torch.__version__,
                      "accelkit": accelkit.__version__, "ops": op_coverage()}))
""")


class AuditError(Exception):
    """An audit could not be made or read; the message names the backend or file and why."""


def audit(backend: str, timeout: float = 600) -> dict[str, Any]:
    """Audit ``backend`` in a fresh process; the audit document (see the module docstring)."""
    env = {k: v for k, v in os.environ.items() if k != "ACCELKIT_DEVICE"}
    done = subprocess.run([sys.executable, "-c", _AUDIT, backend], env=env, capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise AuditError(f"could not audit {backend!r}: {last}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    ops = {op: {**row, "family": op_family(op)} for op, row in found.pop("ops").items()}
    return {"schema": SCHEMA, "backend": backend,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            **found, "counts": {p: sum(1 for r in ops.values() if r["path"] == p) for p in PATHS},
            "cpu_by_design": {op: row["detail"] for op, row in ops.items() if row["path"] == "cpu_by_design"},
            "total": len(ops), "families_left": families_left(ops), "ops": ops}


def families_left(ops: Mapping[str, Mapping[str, str]]) -> list[dict[str, Any]]:
    """Families with overloads on the CPU fallback: most such overloads first."""
    by_family: dict[str, Counter[str]] = {}
    names: dict[str, list[str]] = {}
    for op, row in sorted(ops.items()):
        by_family.setdefault(row["family"], Counter())[row["path"]] += 1
        if row["path"] == "fallback":
            names.setdefault(row["family"], []).append(op)
    rows = [{"family": family, "total": sum(c.values()), **{p: c[p] for p in PATHS},
             "fallback_ops": names[family][:OPS_PER_FAMILY]}
            for family, c in by_family.items() if c["fallback"]]
    rows.sort(key=lambda r: (-r["fallback"], r["family"]))
    return rows


def load_audit(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise AuditError(f"{path}: not a readable audit ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise AuditError(f"{path}: not a coverage audit (schema {SCHEMA!r}); make one with "
                         "`accelkit conformance coverage --backend NAME`")
    return doc


# -- views -----------------------------------------------------------------------------------


def _on_device(audit: Mapping[str, Any]) -> str:
    """The share of an audit's overloads that run on the device."""
    return _share(sum(audit["counts"].get(p, 0) for p in _ON_DEVICE), audit["total"])


def _share(n: int, total: int) -> str:
    return f"{100 * n / total:.1f}%" if total else "-"


def blocks(audits: Sequence[Mapping[str, Any]]) -> list[Block]:
    """The audits side by side, as report blocks (rendered by the conformance renderers)."""
    names = [a["backend"] for a in audits]
    out = [Block("title", text=f"accelkit native coverage — {', '.join(names)}"),
           Block("text", text="Every aten overload PyTorch has a CPU kernel for, classified by the path it takes "
                              "on each backend, from the backend's registrations (no test ran). native: a kernel "
                              "of the backend, the runtime's, or a view; derived: the in-place/out= variant of a "
                              "native kernel; decomposed: into other ops; fallback: the CPU; cpu_by_design: the "
                              "CPU too, for an op the backend declared its hardware cannot compute (each listed "
                              "below with its reason); refused: sparse, quantized, MKL-DNN or nested layouts.")]
    out.append(Block("chart", data={"chart": "bars", "keys": list(PATHS), "rows": [
        (a["backend"], [(p, a["counts"].get(p, 0)) for p in PATHS],
         f"on the device {_on_device(a)}")
        for a in audits]}))
    out.append(Block("table", headers=["backend", "target", "overloads", *PATHS, "on the device"],
                     numeric=set(range(2, 4 + len(PATHS))),
                     rows=[[a["backend"], f"{a['target']} ({'simulated' if a['simulated'] else 'real'})",
                            str(a["total"]), *(str(a["counts"].get(p, 0)) for p in PATHS),
                            _on_device(a)]
                           for a in audits]))
    for a in audits:
        out.append(Block("heading", text=f"{a['backend']}: families left (most CPU-fallback overloads first)"))
        rows = [[f["family"], str(f["total"]), str(f["native"] + f["derived"]), str(f["decomposed"]),
                 str(f["fallback"]), ", ".join(op.removeprefix("aten.") for op in f["fallback_ops"])
                 + (" …" if f["fallback"] > len(f["fallback_ops"]) else "")]
                for f in a["families_left"][:FAMILIES_LEFT]]
        out.append(Block("table", headers=["family", "overloads", "native", "decomposed", "fallback", "on the CPU"],
                         numeric={1, 2, 3, 4}, rows=rows))
        if len(a["families_left"]) > FAMILIES_LEFT:
            out.append(Block("text", text=f"and {len(a['families_left']) - FAMILIES_LEFT} more families; "
                                          "the JSON lists every overload."))
        declared = a.get("cpu_by_design", {})
        if declared:
            out.append(Block("heading", text=f"{a['backend']}: on the CPU by design ({len(declared)} overloads, "
                                             "declared by the backend with its reason)"))
            out.append(Block("table", headers=["overload", "reason"],
                             rows=[[op.removeprefix("aten."), detail.removeprefix("declared CPU by design: ")]
                                   for op, detail in sorted(declared.items())]))
    return out


def render(audits: Sequence[Mapping[str, Any]], fmt: str) -> str:
    """The audits as ``terminal``, ``md`` or ``html``."""
    from .render_html import html_of_blocks
    from .render_text import markdown_of_blocks, terminal_of_blocks

    made = blocks(audits)
    if fmt == "html":
        return html_of_blocks(made, made[0].text)
    return markdown_of_blocks(made) if fmt == "md" else terminal_of_blocks(made)


# -- diff ------------------------------------------------------------------------------------


def diff_audits(base: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[str, ExitCode]:
    """What changed path between two audits, and the exit code: ``REGRESSIONS`` when an
    overload moved to a worse path (native/derived, decomposed, fallback, refused in order)."""
    lines = [f"coverage diff: {base['backend']} ({base['created']}) -> {new['backend']} ({new['created']})"]
    for p in PATHS:
        before, after = base["counts"].get(p, 0), new["counts"].get(p, 0)
        lines.append(f"  {p:<14}{before:>6} -> {after:<6}({after - before:+d})")
    worse, better, other = [], [], []
    for op in sorted(set(base["ops"]) | set(new["ops"])):
        a = base["ops"].get(op, {}).get("path", "absent")
        b = new["ops"].get(op, {}).get("path", "absent")
        if a == b:
            continue
        line = f"    {op}: {a} -> {b}"
        if a in _RANK and b in _RANK and _RANK[b] > _RANK[a]:
            worse.append(line)
        elif a in _RANK and b in _RANK and _RANK[b] < _RANK[a]:
            better.append(line)
        else:
            other.append(line)
    for title, listed in (("moved to a worse path", worse), ("moved to a better path", better),
                          ("other changes (new, removed, native <-> derived)", other)):
        if listed:
            lines += [f"  {title} ({len(listed)}):", *listed]
    if not (worse or better or other):
        lines.append("  no overload changed path")
    return "\n".join(lines) + "\n", ExitCode.REGRESSIONS if worse else ExitCode.OK
