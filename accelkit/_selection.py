"""Choosing a device: names, preference lists, ``ACCELKIT_DEVICE``, and why others were not chosen.

Order with no preference: real accelerators from plugins (highest priority first), then
PyTorch's own CUDA, XPU and MPS, then the CPU. Simulated backends are chosen only by name.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

import torch

from accelkit import _runtime
from accelkit._errors import (
    AccelkitError,
    BackendConflictError,
    DeviceUnavailableError,
    PluginError,
    UnknownDeviceError,
)
from accelkit._plugins import BackendRecord, describe, registry

DEVICE_ENV = "ACCELKIT_DEVICE"
BUILTIN = ("cuda", "xpu", "mps", "cpu")

#: Optional contract areas and the hook that provides each; without it the area is "not supported".
OPTIONAL_AREAS = {"compile": "accelkit_make_compiler", "collectives": "accelkit_make_process_group"}

log = logging.getLogger("accelkit")


@dataclass(frozen=True)
class DeviceReport:
    """One line of ``accelkit devices``: a backend or built-in device and its state here."""

    name: str
    kind: str  # "plugin" or "builtin"
    available: bool
    simulated: bool
    device_count: int
    target: str | None
    priority: int | None
    active: bool
    reason: str | None
    origin: str
    supports: dict[str, bool] = field(default_factory=dict)
    #: other plugins' claims on this name, each a sentence naming the plugin and why it was refused
    conflicts: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def _builtin_report(name: str) -> DeviceReport:
    if name == "cpu":
        available, count, reason = True, 1, None
    elif name == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        available = count > 0
        reason = None if available else (
            "no CUDA device found" if torch.backends.cuda.is_built() else "this torch build has no CUDA"
        )
    elif name == "mps":
        available = torch.backends.mps.is_available()
        count = int(available)
        reason = None if available else "MPS needs Apple silicon and a torch build with MPS"
    else:  # xpu
        available = hasattr(torch, "xpu") and torch.xpu.is_available()
        count = torch.xpu.device_count() if available else 0
        reason = None if available else "no Intel XPU device found"
    return DeviceReport(
        name, "builtin", available, False, count, None, None, False, reason, "torch",
        conflicts=list(registry().conflicts.get(name, ())),
    )


def _plugin_report(record: BackendRecord) -> DeviceReport:
    probe = record.probe()
    ctx = _runtime.active()
    available = probe.available and record.load_error is None and record.init_error is None
    reason = record.init_error or probe.reason
    return DeviceReport(
        name=record.name,
        kind="plugin",
        available=available,
        simulated=probe.simulated,
        device_count=probe.device_count if available else 0,
        target=probe.target,
        priority=record.info.priority if record.info else None,
        active=ctx is not None and ctx.name == record.name,
        reason=reason,
        origin=record.origin,
        supports={area: record.supports(hook) for area, hook in OPTIONAL_AREAS.items()},
        conflicts=list(registry().conflicts.get(record.name, ())),
    )


def _refused_report(name: str, conflicts: list[str]) -> DeviceReport:
    """A name only refused claims were made on (a PyTorch device type without a row here)."""
    return DeviceReport(
        name, "plugin", False, False, 0, None, None, False, conflicts[0], "", conflicts=list(conflicts)
    )


def devices() -> list[DeviceReport]:
    """Every discovered backend and built-in device, in automatic-selection order."""
    reg = registry()
    plugins = sorted(
        (_plugin_report(r) for r in reg.records()),
        key=lambda d: (d.simulated, -(d.priority or 0), d.name),
    )
    listed = {r.name for r in plugins} | set(BUILTIN)
    refused = [_refused_report(n, lines) for n, lines in reg.conflicts.items() if n not in listed]
    return plugins + sorted(refused, key=lambda d: d.name) + [_builtin_report(n) for n in BUILTIN]


def parse_spec(spec: str | torch.device | Sequence[str | torch.device]) -> list[tuple[str, int | None]]:
    """``"tpu:1,cpu"`` → ``[("tpu", 1), ("cpu", None)]``."""
    items: Iterable = [spec] if isinstance(spec, (str, torch.device)) else spec
    prefs = []
    for item in items:
        if isinstance(item, torch.device):
            prefs.append((item.type, item.index))
            continue
        for part in str(item).split(","):
            part = part.strip().lower()
            if not part:
                continue
            name, _, index = part.partition(":")
            if index and not index.isdigit():
                raise UnknownDeviceError(f"device {part!r}: the index after ':' must be a number, e.g. {name}:0")
            prefs.append((name, int(index) if index else None))
    return prefs


def _known(name: str, reports: dict[str, DeviceReport]) -> None:
    if name in reports:
        return
    names = sorted(reports)
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise UnknownDeviceError(f"unknown device {name!r}.{hint} Known devices: {', '.join(names)}.")


def _activate(name: str) -> torch.device:
    record = registry().get(name)
    ctx = _runtime.active()
    if ctx is not None and ctx.name != name:
        raise _runtime.conflict_error(ctx.name, name)
    try:
        return _runtime.activate(record)
    except (DeviceUnavailableError, PluginError) as exc:
        error: Exception = exc
    except AccelkitError:
        raise  # a conflict or a bad setting (ACCELKIT_FALLBACK=...): not the backend's failure
    except Exception as exc:
        error = exc
    # A PluginError already names the plugin, the hook and the exception.
    why = str(error) if isinstance(error, PluginError) else describe(error)
    record.init_error = f"failed to initialise: {why}"
    raise DeviceUnavailableError(f"backend {name!r} {record.init_error}") from error


def _device(name: str, index: int | None, report: DeviceReport) -> torch.device:
    if index is not None and index >= max(report.device_count, 1):
        raise DeviceUnavailableError(
            f"{name}:{index} does not exist: {report.device_count} {name} device(s) visible"
        )
    if report.kind == "plugin":
        if index not in (None, 0):
            raise DeviceUnavailableError(
                f"{name}:{index}: accelkit uses {name}:0 in each process; run one process per device"
            )
        return _activate(name)
    return torch.device(name, index) if index is not None else torch.device(name)


def choose(spec=None) -> tuple[torch.device, list[str]]:
    """Pick a device and say why each earlier candidate was passed over.

    :returns: the device and the reasons, one line per candidate not chosen.
    """
    reports = {r.name: r for r in devices()}
    if spec is None:
        spec = os.environ.get(DEVICE_ENV, "")
    prefs = parse_spec(spec) if spec else []
    skipped: list[str] = []
    if prefs:
        for name, _ in prefs:
            _known(name, reports)
        for name, index in prefs:
            report = reports[name]
            if not report.available:
                skipped.append(f"{name}: {report.reason}")
                continue
            try:
                return _device(name, index, report), skipped
            except DeviceUnavailableError as exc:
                if len(prefs) == 1:
                    raise
                skipped.append(f"{name}: {exc}")
        if len(prefs) == 1:
            raise DeviceUnavailableError(f"device {prefs[0][0]!r} is unavailable: {skipped[0].split(': ', 1)[1]}")
        raise DeviceUnavailableError(
            "none of the requested devices is available:\n  " + "\n  ".join(skipped)
        )
    for report in reports.values():
        if not report.available:
            skipped.append(f"{report.name}: {report.reason}")
        elif report.simulated:
            skipped.append(f"{report.name}: simulated; chosen only by name (select_device({report.name!r}))")
        else:
            try:
                return _device(report.name, None, report), skipped
            except (DeviceUnavailableError, BackendConflictError) as exc:
                skipped.append(f"{report.name}: {exc}")
    raise AssertionError("the CPU is always available")


def select_device(spec=None) -> torch.device:
    """Return the best available device, or the first available one of ``spec``.

    :param spec: ``None`` (use ``ACCELKIT_DEVICE``, else automatic), a name (``"tpu"``), a name
        with index (``"cuda:1"``), a ``torch.device``, or a preference list
        (``["tpu", "cpu"]`` or ``"tpu,cpu"``).
    :returns: a ``torch.device``. A plugin backend is activated as this process's PrivateUse1
        device; selecting the active backend again is a no-op.
    :raises UnknownDeviceError: a name no backend answers to (with a suggestion).
    :raises DeviceUnavailableError: the named device(s) cannot run here; the message says why.
    :raises BackendConflictError: a different backend is already active in this process.
    """
    device, skipped = choose(spec)
    for line in skipped:
        log.info("accelkit: not chosen: %s", line)
    log.info("accelkit: selected %s", device)
    return device


def explain_selection(spec=None) -> str:
    """Select like :func:`select_device` and return a readable account of the choice."""
    device, skipped = choose(spec)
    lines = [f"selected {device}"]
    lines += [f"  not chosen: {line}" for line in skipped]
    return "\n".join(lines)


def autoload() -> torch.device | None:
    """Activate a backend during ``import torch`` when that is unambiguous.

    Only when ``ACCELKIT_DEVICE`` names a plugin backend (the first available preference), or
    when no preference is set and exactly one real accelerator plugin is available.
    """
    spec = os.environ.get(DEVICE_ENV, "")
    reports = {r.name: r for r in devices()}
    if spec:
        prefs = parse_spec(spec)
        for name, _ in prefs:
            _known(name, reports)  # a typo must surface (as a warning), not be ignored
        for name, _ in prefs:
            report = reports[name]
            if not report.available:
                continue
            return _activate(name) if report.kind == "plugin" else None
        return None
    real = [r for r in reports.values() if r.kind == "plugin" and r.available and not r.simulated]
    if len(real) == 1:
        return _activate(real[0].name)
    return None
