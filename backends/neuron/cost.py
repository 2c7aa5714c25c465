"""neuron's estimates: the ledger of estimated device time per op and engine, kernel-instance
counts with the shape-churn warning, and profiles exported as Chrome traces.

**Static shapes.** Each (op, shapes, dtypes, static arguments) is one compiled kernel instance;
instance counts per op are in ``accelkit.stats()["neuron"]["instances"]``. An op that keeps
meeting new shapes warns once (:class:`ShapeChurnWarning`), naming the op and suggesting
bucketing, as the Neuron compiler recompiles for every new shape (hardware-facts §2.4).
"""

from __future__ import annotations

import collections
import json
import os
import threading
import warnings
from pathlib import Path
from typing import Any

from accelkit.sdk import Estimate, LaunchLedger, other_backend_reason, requested_targets
from accelkit_backends.neuron.device import TARGETS, target_name
from accelkit_backends.neuron.sim.timeline import ENGINES, Instruction, KernelRecord

#: Distinct shapes an op may meet before the churn warning (a handful of buckets is normal).
SHAPE_CHURN_LIMIT = 8

ESTIMATE_NOTE = ("estimates from public Trainium specifications on a simulated NeuronCore; "
                 "not measurements")


class ShapeChurnWarning(UserWarning):
    """An op keeps compiling new kernel instances because its input shapes keep changing."""


# ---------------------------------------------------------------------------------------------
# The ledger of estimated device time and kernel instances
# ---------------------------------------------------------------------------------------------


class Ledger:
    """Estimated device time per op and per engine, compiled-instance counts, and launches: each
    kernel run outside a program and each program run is one NEFF execution (:attr:`launches`,
    whose per-launch cost the runtime sets from the device model); the allocator reports host
    waits to it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.launches = LaunchLedger()
        self.reset()

    def reset(self) -> None:
        self.launches.reset()
        with self._lock:
            self.per_op: dict[str, dict[str, float]] = {}
            self.per_engine = dict.fromkeys(ENGINES, 0.0)
            self.device_seconds = 0.0
            self.flops = 0
            self.hbm_bytes = 0
            self.kernels = 0
            self.instances: dict[str, set] = collections.defaultdict(set)
            self.per_program: dict[str, dict[str, Any]] = {}
            self._families: dict[tuple, set] = {}
            self._churn_warned: set[str] = set()

    def record(self, record: KernelRecord, _instructions: list[Instruction]) -> None:
        with self._lock:
            entry = self.per_op.setdefault(record.name, {"calls": 0, "seconds": 0.0, "flops": 0})
            entry["calls"] += 1
            entry["seconds"] += record.latency
            entry["flops"] += record.flops
            for engine, busy in record.busy.items():
                self.per_engine[engine] += busy
            self.device_seconds += record.device_seconds
            self.flops += record.flops
            self.hbm_bytes += record.hbm_bytes
            self.kernels += 1
        if record.advance is None:  # a kernel alone, not one of a program's (counted with it)
            self.launches.launch(record.latency)

    def note_instance(self, op: str, key: tuple) -> None:
        """Count a compiled instance; warn once per op when one call pattern (same ranks,
        dtypes and static arguments) has met more than :data:`SHAPE_CHURN_LIMIT` shapes —
        a varying batch or sequence length, not a model's many fixed layer shapes."""
        structure = _without_sizes(key)
        with self._lock:
            seen = self.instances[op]
            if key in seen:
                return
            seen.add(key)
            family = self._families.setdefault((op, structure), set())
            family.add(key)
            churn = len(family) > SHAPE_CHURN_LIMIT and op not in self._churn_warned
            if churn:
                self._churn_warned.add(op)
        if churn:
            warnings.warn(
                f"neuron: {op} has compiled {len(family)} kernel instances for inputs that differ "
                "only in their sizes. On Trainium every new shape is a new compilation; pad "
                "inputs to a few fixed sizes (bucketing) to keep shapes static.",
                ShapeChurnWarning, stacklevel=3,
            )

    def record_program(self, label: str, records: list[KernelRecord]) -> None:
        """A compiled program's run: its device time (the kernels overlap, so not the sum of
        their latencies), busy time per engine, HBM bytes, bytes its DMAs kept on chip instead
        (:mod:`.sim.residency`) and kernels."""
        with self._lock:
            entry = self.per_program.setdefault(label, {
                "calls": 0, "seconds": 0.0, "hbm_bytes": 0, "kept_bytes": 0, "kernels": 0,
                "per_engine_seconds": dict.fromkeys(ENGINES, 0.0)})
            entry["calls"] += 1
            entry["seconds"] += sum(r.device_seconds for r in records)
            entry["hbm_bytes"] += sum(r.hbm_bytes for r in records)
            entry["kept_bytes"] += sum(r.kept_bytes for r in records)
            entry["kernels"] += len(records)
            for r in records:
                for engine, busy in r.busy.items():
                    entry["per_engine_seconds"][engine] += busy
        if records:
            self.launches.launch(sum(r.device_seconds for r in records))

    def summary(self) -> dict[str, Any]:
        with self._lock:
            return {
                "note": ESTIMATE_NOTE,
                "target": target_name(),
                "device_seconds": self.device_seconds,
                "kernels": self.kernels,
                "flops": self.flops,
                "hbm_bytes": self.hbm_bytes,
                "per_engine_seconds": dict(self.per_engine),
                "per_op": {k: dict(v) for k, v in sorted(self.per_op.items())},
                "per_program": {k: {**v, "per_engine_seconds": dict(v["per_engine_seconds"])}
                                for k, v in sorted(self.per_program.items())},
            }

    def estimate(self) -> Estimate:
        """The ledger as the contract's :class:`Estimate`: kernels under their ops' aten names
        (a fused kernel under its label), those of compiled programs included, where they
        overlap; so the per-op seconds add up to more than the device time."""
        with self._lock:
            per_op = {_aten_name(op): (int(row["calls"]), row["seconds"]) for op, row in self.per_op.items()}
            launches = self.launches.fields()
            target = target_name()
            by_target, not_estimated = _compared(target, self.device_seconds, launches)
            return Estimate(target=target, note=ESTIMATE_NOTE, seconds=self.device_seconds,
                            per_op=per_op, flops=self.flops, hbm_bytes=self.hbm_bytes, **launches,
                            by_target=by_target, not_estimated=not_estimated)


def _compared(target: str, device_seconds: float, launches: dict[str, Any]) -> tuple[dict, dict]:
    """``Estimate.by_target`` and ``not_estimated`` for the targets ``ACCELKIT_ESTIMATE_ON`` asks
    for. Only the active generation is estimated: the device time is a simulated schedule of
    each kernel on that generation's core, and simulating every kernel again per generation is
    not built (a run per generation, then ``accelkit compare``, gives the others)."""
    requested = requested_targets()
    if not requested:
        return {}, {}
    by_target = {target: {"seconds": device_seconds, "launch_seconds": launches["launch_seconds"],
                          "total_seconds": device_seconds + launches["launch_seconds"],
                          "launches": launches["launches"], "syncs": launches["syncs"]}}
    not_estimated = {}
    for name in requested:
        generation = name.replace("trainium", "trn").replace("-", "")
        if generation == target:
            continue
        if generation in TARGETS:
            not_estimated[name] = (f"neuron simulates each kernel on the active generation's core ({target}) "
                                   f"only; run again with ACCELKIT_NEURON_TARGET={generation} --report DIR2, "
                                   "then `accelkit compare DIR DIR2`")
        else:
            not_estimated[name] = other_backend_reason(name, "neuron", TARGETS)
    return by_target, not_estimated


def _aten_name(op: str) -> str:
    """``"mm.default"`` -> ``"aten.mm.default"``; a fused kernel's label stays as it is."""
    return op if "(" in op or op.startswith("aten.") else f"aten.{op}"


def _without_sizes(key: Any) -> Any:
    """An instance key with array sizes and strides blanked (ranks and dtypes kept)."""
    if isinstance(key, tuple):
        if len(key) == 4 and key[0] == "array":
            return ("array", len(key[1]), key[2])
        return tuple(_without_sizes(k) for k in key)
    return key


LEDGER = Ledger()
# ---------------------------------------------------------------------------------------------
# Profiling: a timeline of kernels and instructions, exported as a Chrome trace
# ---------------------------------------------------------------------------------------------


class Profile:
    """The kernels and instructions executed inside :func:`profile`, on the device's clock.

    :meth:`export_chrome_trace` writes Chrome's trace-event JSON (opens in Perfetto or
    ``chrome://tracing``): one track for kernels, one per engine. Times are estimates.
    """

    def __init__(self) -> None:
        self.kernels: list[KernelRecord] = []
        self.instructions: list[Instruction] = []
        #: Compiled programs run: (label, start, end) on the device clock.
        self.programs: list[tuple[str, float, float]] = []

    def _collect(self, record: KernelRecord, instructions: list[Instruction]) -> None:
        self.kernels.append(record)
        self.instructions.extend(instructions)

    def _collect_program(self, label: str, records: list[KernelRecord]) -> None:
        if records:
            self.programs.append((label, min(r.start for r in records), max(r.end for r in records)))

    @property
    def device_seconds(self) -> float:
        return sum(k.device_seconds for k in self.kernels)

    def trace_events(self) -> list[dict[str, Any]]:
        tracks = ("programs", "kernels", *ENGINES)
        events: list[dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": f"neuron {target_name()} (simulated)"}},
        ]
        events += [{"ph": "M", "name": "thread_name", "pid": 0, "tid": i, "args": {"name": t}}
                   for i, t in enumerate(tracks)]
        for label, start, end in self.programs:
            events.append({"ph": "X", "name": label, "cat": "program", "pid": 0, "tid": 0,
                           "ts": start * 1e6, "dur": (end - start) * 1e6})
        for k in self.kernels:
            events.append({"ph": "X", "name": k.name, "cat": "kernel", "pid": 0, "tid": 1,
                           "ts": k.start * 1e6, "dur": k.latency * 1e6,
                           "args": {"instructions": k.instructions, "flops": k.flops,
                                    "busy_us": {e: v * 1e6 for e, v in k.busy.items()}}})
        for ins in self.instructions:
            events.append({"ph": "X", "name": ins.name, "cat": ins.kernel, "pid": 0,
                           "tid": tracks.index(ins.engine), "ts": ins.start * 1e6,
                           "dur": (ins.end - ins.start) * 1e6, "args": {"detail": ins.detail}})
        return events

    def export_chrome_trace(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        payload = {"traceEvents": self.trace_events(), "displayTimeUnit": "ns",
                   "otherData": {"note": ESTIMATE_NOTE}}
        path.write_text(json.dumps(payload))
        return path


class profile:
    """Context manager recording a :class:`Profile` of the neuron work done inside it::

        with accelkit_backends.neuron.profile() as prof:
            loss = model(x).sum(); loss.backward()
        prof.export_chrome_trace("step.json")

    Under adaptive eager the open region is flushed on the way in (work recorded before the
    block is not profiled) and on the way out (work recorded inside it is).
    """

    def __init__(self) -> None:
        self.result = Profile()

    def __enter__(self) -> Profile:
        from accelkit_backends.neuron import adaptive
        from accelkit_backends.neuron.runtime import core

        adaptive.flush("profile")
        c = core()
        c.listeners.append(self.result._collect)
        c.program_listeners.append(self.result._collect_program)
        self._previous = c.record_instructions
        c.record_instructions = True
        return self.result

    def __exit__(self, *exc: Any) -> None:
        from accelkit_backends.neuron import adaptive
        from accelkit_backends.neuron.runtime import core

        try:
            adaptive.flush("profile")
        finally:
            c = core()
            c.listeners.remove(self.result._collect)
            c.program_listeners.remove(self.result._collect_program)
            c.record_instructions = self._previous
