"""Reports of the processes a run starts.

Engines move the device work out of the process a user launches: vLLM's API server runs the model
in an engine process it spawns, a training launcher in its workers. Under ``accelkit run`` the
launcher puts a directory in :data:`CHILD_REPORTS`; every process that inherits it and activates
an accelkit backend writes its report there when it exits (:func:`report_at_exit`), and the
launcher shows those that ran ops, after its own (:func:`collect`).

A child's report is the same as the launcher's (``report.build``) but for what only the launcher
knows: its exit status (a child's report is written by its exit handlers, or last by the engine
that called :func:`write_report`, so it says "ended"), the memory timeline (the child's peak is in
its memory section) and the compile redirect. A child that is killed before it writes, or still
runs when the launcher ends, has no report; an engine whose processes are killed at shutdown (vLLM)
rewrites its report as it runs (:func:`write_report_at_most_every`). A child also writes when its
device's process group is destroyed (``accelkit._runtime.distributed.backend``): Ray Train destroys
its workers' group at the end of a run, then kills them.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

#: The directory children write their reports into (set by ``accelkit run`` for its children).
CHILD_REPORTS = "ACCELKIT_RUN_CHILD_REPORTS"

# Where and since when this process reports (set by report_at_exit), and when it last wrote.
_pending: dict[str, Any] = {}


def report_at_exit(device: torch.device) -> bool:
    """In a process started under ``accelkit run`` (``CHILD_REPORTS`` set), write this process's
    report into that directory at exit (and whenever :func:`write_report` is called); return
    whether it will."""
    directory = os.environ.get(CHILD_REPORTS)
    if not directory:
        return False
    _pending.update(directory=Path(directory), device=device, started=time.time(), clock=time.perf_counter())
    atexit.register(write_report)
    return True


def reporting() -> bool:
    """Whether this process writes a report for ``accelkit run`` (see :func:`report_at_exit`)."""
    return bool(_pending)


def annotate_report(section: str, summary: str, **figures: Any) -> None:
    """Add an engine's own figures to this process's report, as ``report["sections"][section]``
    (``summary``, one line for the terminal, and ``figures``); the next write carries them."""
    if _pending:
        _pending.setdefault("sections", {})[section] = {"summary": summary, **figures}


def write_report_at_most_every(seconds: float) -> bool:
    """:func:`write_report`, unless this process wrote it less than ``seconds`` ago: for engines
    whose processes may be killed without warning, to call at each step."""
    if not _pending or time.perf_counter() - _pending.get("written", float("-inf")) < seconds:
        return False
    return write_report()


def write_report() -> bool:
    """Write this process's report now, if it was started under ``accelkit run`` (a later call,
    or the one at exit, writes it again with the figures then). Engines whose processes are
    stopped by a signal call it from their shutdown, which comes before the signal's default
    action can end the process. Never raises; returns whether the report was written."""
    if not _pending:
        return False
    from accelkit._run import report

    try:
        built = report.build(
            target=_command(), device=_pending["device"], ending={"code": None, "exception": None, "signal": None},
            started=_pending["started"], wall_seconds=time.perf_counter() - _pending["clock"], memory=[],
            sample_interval=None, compile_requested=False, compile_redirects=0,
        )
        built["pid"] = os.getpid()
        built["sections"] = dict(_pending.get("sections", {}))
        path = _pending["directory"] / f"child-{os.getpid()}.json"
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(built, default=str) + "\n", encoding="utf-8")
        partial.replace(path)
        _pending["written"] = time.perf_counter()
        return True
    except FileNotFoundError:
        return False  # the launcher has ended and removed the directory: nobody would read it
    except Exception as exc:  # noqa: BLE001 - a process's exit is not the place to fail
        print(f"accelkit run: process {os.getpid()} could not write its report: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return False


def _command() -> list[str]:
    """How this process is named in its report: a multiprocessing child by its process name
    (vLLM's ``EngineCore_DP0``; its command line is multiprocessing's bootstrap), a Ray worker by
    Ray's name for it (:func:`_ray_worker_name`), any other by its command line."""
    import multiprocessing

    if multiprocessing.parent_process() is not None:
        return [multiprocessing.current_process().name]
    ray_name = _ray_worker_name()
    if ray_name is not None:
        return [ray_name]
    return list(sys.orig_argv[1:])


def _ray_worker_name() -> str | None:
    """In a Ray worker process, Ray's name for it: ``ray::RayTrainWorker`` for an actor (its
    class), else what ``ps`` shows (``ray::f`` while task ``f`` runs); its command line is Ray's
    worker bootstrap with a score of internal arguments. ``None`` elsewhere."""
    worker = sys.modules.get("ray._private.worker")
    if worker is None or getattr(worker.global_worker, "mode", None) != getattr(worker, "WORKER_MODE", object()):
        return None
    try:
        import ray

        context = ray.get_runtime_context()
        if context.get_actor_id() is not None:
            return "ray::" + context.current_actor._ray_actor_creation_function_descriptor.class_name
        return ray._raylet.getproctitle() or None
    except Exception:  # noqa: BLE001 - Ray's internals moved: the command line names it
        return None


def collect(directory: Path) -> list[dict[str, Any]]:
    """The reports children wrote into ``directory`` that ran ops on an accelkit device, oldest
    first."""
    reports = []
    for path in sorted(directory.glob("child-*.json"), key=lambda p: p.stat().st_mtime):
        try:
            built = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if built.get("ops") and built["ops"]["executions"]:
            reports.append(built)
    return reports
