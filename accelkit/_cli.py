"""The ``accelkit`` command: ``accelkit devices [--json]``, ``accelkit select [SPEC]``,
``accelkit new-backend NAME [--dir DIR]`` (see :mod:`accelkit._scaffold`),
``accelkit native {build,status}`` (see :mod:`accelkit._native`),
``accelkit run [options] script.py args...`` (see :mod:`accelkit._run`) and
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
    collective = [r.name for r in reports if r.kind == "plugin" and r.supports.get("collectives")]
    if collective:
        print(f"\ntorch.distributed (init_process_group(\"<name>\")): {', '.join(collective)}. accelkit's "
              "shared process group is host-staged: device tensors go through host memory and gloo "
              "over TCP, not the device interconnect (whose time stats()['distributed'] estimates).")
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


def _new_backend(args: argparse.Namespace) -> int:
    from shlex import quote

    from accelkit._scaffold import Names, new_backend

    root, files = new_backend(args.name, args.dir)
    names = Names.of(args.name)
    print(f"wrote {names.distribution} (package {names.package}, backend {args.name!r}) into {root}:")
    for relative in files:
        print(f"  {relative}")
    print(
        "\nnext, in the environment that has accelkit:\n"
        f"  pip install -e {quote(str(root))}\n"
        "  accelkit devices\n"
        f"  python -m pytest {quote(str(root / 'tests'))}\n"
        f"  accelkit conformance run --backend {args.name} --profile quick\n"
        f"kernels go in {root / names.package / 'kernels.py'}; see its README.md"
    )
    return 0


def _native(args: argparse.Namespace) -> int:
    from accelkit import _native

    if args.action == "build":
        path, seconds = _native.build(force=args.force)
        print(f"built in {seconds:.1f} s: {path}" if seconds else f"already built: {path}")
    else:
        print(_native.status())
    return 0


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from accelkit._run import RunOptions, run

    target = ["-m", *args.module] if args.module is not None else list(args.args)
    if not target:
        raise AccelkitError("accelkit run: name a script (accelkit run train.py ...) or a module (-m pkg.train)")
    return run(RunOptions(target=target, device=args.device, fallback=args.fallback, compile=args.compile,
                          report_dir=Path(args.report) if args.report else None, estimate_on=args.estimate_on))


def _compare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from accelkit._run.compare import compare_reports

    print(compare_reports([Path(p) for p in args.reports]))
    return 0


def _project(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from accelkit._run.project import as_json, dtype_named, parse_bytes, project_report, render
    from accelkit._scaling import ScalingPlan

    try:
        plan = ScalingPlan.parse(args.plan)
        sizes = {name: parse_bytes(value) for name, value in (
            ("parameter_bytes", args.parameter_bytes), ("gradient_bytes", args.gradient_bytes),
            ("activation_bytes", args.activation_bytes), ("expert_bytes", args.expert_bytes)) if value is not None}
        dtype = dtype_named(args.dtype)
    except ValueError as exc:
        raise AccelkitError(f"accelkit project: {exc}") from exc
    projections = project_report(Path(args.report), plan, forward_seconds=args.forward_seconds, dtype=dtype, **sizes)
    print(json.dumps(as_json(projections), indent=2) if args.json else render(projections, plan))
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
    new = commands.add_parser(
        "new-backend", help="write an installable plugin package for a new device backend",
        description="Write a plugin package for a new device backend: host memory and kernels from CPU "
                    "torch, so that after `pip install -e DIR` it is listed, its tests pass and it "
                    "passes the quick conformance profile. Nothing is written if NAME or DIR is refused.",
    )
    new.add_argument("name", metavar="NAME", help="the backend's name, a lower-case identifier, e.g. 'mychip'")
    new.add_argument("--dir", default=None, metavar="DIR",
                     help="where to write the package, new or empty (default: accelkit-NAME in the current directory)")
    new.set_defaults(run=_new_backend)
    native = commands.add_parser(
        "native", help="build accelkit's native extension (pinned memory, device generators, several devices per process)",
        description="Build (or show the state of) accelkit's C++ extension, compiled against the installed "
                    "torch with the system compiler; see accelkit._native.",
    )
    native.add_argument("action", choices=("build", "status"))
    native.add_argument("--force", action="store_true", help="rebuild even when it is built already")
    native.set_defaults(run=_native)
    run = commands.add_parser(
        "run", help="run a PyTorch script on a backend and report what ran where",
        description="Run an unmodified PyTorch script (as `python script.py args...` would, or a module "
                    "as `python -m`) with a backend selected and activated, then report: ops by path "
                    "(native, decomposed, CPU fallback) with what to do about each fallback, compiled "
                    "graphs and recompiles, memory against capacity, and the estimated time on the "
                    "target. The script's exit code, exception and signals pass through. Works under "
                    "torchrun: `torchrun --nproc-per-node 2 -m accelkit run train.py`.",
    )
    run.add_argument("--device", default=None, metavar="SPEC",
                     help="device name or preference list (default: ACCELKIT_DEVICE, else the best here)")
    run.add_argument("--fallback", default=None, choices=("deny", "warn", "allow"),
                     help="CPU-fallback policy for the run (default: ACCELKIT_FALLBACK, else the backend's)")
    run.add_argument("--compile", action="store_true",
                     help="torch.compile calls that name no backend (or 'inductor') compile for the device")
    run.add_argument("--report", default=None, metavar="DIR",
                     help="also write report.json and report.html (report-rank<N>.* per rank) into DIR")
    run.add_argument("--estimate-on", default=None, metavar="TARGETS",
                     help="also estimate the run on these generations of the backend, e.g. 'v5e,v6e,7x' "
                          "(default: ACCELKIT_ESTIMATE_ON); another backend's targets are named, with how to "
                          "get them (a run there, then accelkit compare)")
    # As with python -m, everything after the module is the module's (vLLM's --model too).
    run.add_argument("-m", dest="module", nargs=argparse.REMAINDER, default=None, metavar="MODULE args",
                     help="-m MODULE args...: run a module, as python -m (the arguments after it are its own)")
    run.add_argument("args", nargs=argparse.REMAINDER, metavar="script.py args",
                     help="the script and its arguments (after -m MODULE: the module's arguments)")
    run.set_defaults(run=_run)
    compare = commands.add_parser(
        "compare", help="put the estimates of several accelkit run reports in one table",
        description="One table of the estimated time on each target from several `accelkit run --report DIR` "
                    "reports (runs on different backends, or with different --estimate-on targets): device, "
                    "launch and total time, and each total against the first row's.",
    )
    compare.add_argument("reports", nargs="+", metavar="REPORT",
                         help="a report directory (its report.json or report-rank0.json) or a report JSON file")
    compare.set_defaults(run=_compare)
    project = commands.add_parser(
        "project", help="project a run report's step to N chips with a parallelism plan (step time, MFU)",
        description="Estimate one training step at N chips from an `accelkit run --report DIR` of one device's "
                    "step (or one layer of it), on every target the report estimated: the plan's collectives "
                    "priced on each target's interconnect, data/fsdp ones overlapped with compute, tensor/expert "
                    "ones blocking, a 1F1B pipeline bubble. A model, not a measurement: the note printed with "
                    "the table says what it leaves out.",
    )
    project.add_argument("report", metavar="REPORT", help="a report directory or report JSON file")
    project.add_argument("--plan", required=True, metavar="PLAN",
                         help="e.g. 'fsdp=256,layers=48' or 'dp=8,tp=8,pp=4,microbatches=16,layers=12' "
                              "(dp, fsdp, tp, pp, ep, layers, batches, microbatches, recompute, overlap)")
    project.add_argument("--parameter-bytes", required=True, metavar="BYTES",
                         help="the run's parameter bytes (per layer when the plan repeats it), e.g. 1.2G")
    project.add_argument("--gradient-bytes", metavar="BYTES", help="gradient bytes as reduced (default: parameters)")
    project.add_argument("--activation-bytes", metavar="BYTES",
                         help="what one tensor-parallel all-reduce carries (needed with tp > 1)")
    project.add_argument("--expert-bytes", metavar="BYTES",
                         help="what one chip sends in one expert all-to-all (needed with ep > 1)")
    project.add_argument("--forward-seconds", type=float, metavar="S",
                         help="device seconds of the run's forward alone (needed with recompute)")
    project.add_argument("--dtype", default="bf16", help="the peak MFU is measured against (default bf16)")
    project.add_argument("--json", action="store_true", help="print machine-readable JSON")
    project.set_defaults(run=_project)
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
