"""The ``accelkit`` command: ``accelkit devices [--json]``, ``accelkit select [SPEC]`` and
``accelkit conformance {run,report,diff}`` (see :mod:`accelkit_conformance`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from accelkit._errors import AccelkitError


def _devices(args: argparse.Namespace) -> int:
    from accelkit import devices

    reports = devices()
    if args.json:
        print(json.dumps([r.as_dict() for r in reports], indent=2))
        return 0
    rows = [("DEVICE", "KIND", "STATUS", "MODE", "COUNT", "TARGET", "NOT SUPPORTED", "NOTE")]
    for r in reports:
        status = "active" if r.active else "available" if r.available else "unavailable"
        mode = "simulated" if r.simulated else "real"
        note = r.reason or ""
        if r.kind == "plugin" and r.available and r.simulated:
            note = f"select by name: select_device({r.name!r})"
        missing = ",".join(area for area, ok in r.supports.items() if not ok) or "-"
        rows.append((r.name, r.kind, status, mode, str(r.device_count), r.target or "-", missing, note))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
    conflicts = [(r.name, line) for r in reports for line in r.conflicts]
    if conflicts:
        print("\nrefused plugins (a backend name has one owner):")
        for name, line in conflicts:
            print(f"  {name}: {line}")
    return 0


def _select(args: argparse.Namespace) -> int:
    from accelkit import explain_selection

    print(explain_selection(args.spec))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="accelkit", description="One accelerator layer for PyTorch.")
    commands = parser.add_subparsers(dest="command", required=True)
    devices = commands.add_parser("devices", help="list backends and devices, and why any is unavailable")
    devices.add_argument("--json", action="store_true", help="print machine-readable JSON")
    devices.set_defaults(run=_devices)
    select = commands.add_parser("select", help="show which device select_device() picks, and why")
    select.add_argument("spec", nargs="?", default=None, help="name or preference list, e.g. 'tpu,cpu'")
    select.set_defaults(run=_select)
    commands.add_parser(
        "conformance", add_help=False,
        help="run the conformance suites against backends, render and compare results (run, report, diff)",
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["conformance"]:
        # Parsed by the conformance package, imported only when asked for.
        from accelkit_conformance.__main__ import main as conformance_main

        return conformance_main(argv[1:])
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except AccelkitError as exc:
        print(f"accelkit: error: {exc}", file=sys.stderr)
        return 2
