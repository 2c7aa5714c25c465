"""``accelkit project``: a saved run's estimate, projected to N chips with a parallelism plan.

``accelkit run --report DIR --estimate-on ...`` records one device's step on each target; this
prices the plan's communication on each of those targets' interconnects with
:func:`accelkit.project_scaling` (its docstring has the equations and what they leave out). The
report's backend describes its targets through its ``accelkit_target_model`` hook, so nothing is
activated and no device is needed here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from accelkit._errors import AccelkitError
from accelkit._run.compare import load_report
from accelkit._run.report import format_seconds
from accelkit._scaling import ScalingPlan, ScalingProjection, project_scaling

_SUFFIXES = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8": torch.float8_e4m3fn}


def parse_bytes(text: str) -> float:
    """``"1.5G"``, ``"512Mi"``, ``"4096"`` (bytes; K/M/G/T decimal, Ki/Mi/Gi/Ti binary; a
    trailing ``B`` is allowed).

    :raises ValueError: anything else, or a negative size.
    """
    found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMGT]i?)?B?\s*", text, re.IGNORECASE)
    if found is None:
        raise ValueError(f"{text!r} is not a size in bytes (e.g. 4096, 1.5G, 512Mi)")
    return float(found.group(1)) * _SUFFIXES[(found.group(2) or "").upper()]


def project_report(path: Path, plan: ScalingPlan, *, parameter_bytes: float, gradient_bytes: float | None = None,
                   activation_bytes: float = 0.0, expert_bytes: float = 0.0, forward_seconds: float | None = None,
                   dtype: torch.dtype = torch.bfloat16) -> list[ScalingProjection]:
    """The projection of the report at ``path`` on each target it estimated (the active one
    first), with the same byte counts and plan for every target.

    :raises AccelkitError: no report there, it has no estimate or no FLOPs, its backend is not
        installed or cannot describe a target, or the plan does not fit a target (the
        projection's own message, naming the target).
    """
    from accelkit._plugins import registry
    from accelkit.sdk import DeviceModel

    report = load_report(path, "accelkit project")
    estimate = report["estimate"]
    if not estimate:
        raise AccelkitError(f"accelkit project: {path} has no estimate (the run's backend estimates nothing)")
    if not estimate.get("flops"):
        raise AccelkitError(f"accelkit project: {path}'s estimate counts no FLOPs, so it has no MFU to project")
    backend = report["device"]["backend"]
    record = registry().get(backend)
    if record is None or not record.supports("accelkit_target_model"):
        why = "is not installed here" if record is None else "cannot describe its generations (accelkit_target_model)"
        raise AccelkitError(f"accelkit project: the report's backend {backend!r} {why}")
    rows = {estimate["target"]: estimate["seconds"]}
    rows.update({name: row["seconds"] for name, row in (estimate.get("by_target") or {}).items() if name not in rows})
    projections = []
    for target, seconds in rows.items():
        model = record.answer("accelkit_target_model", DeviceModel, target=target)
        if model is None:
            raise AccelkitError(f"accelkit project: backend {backend!r} does not know the report's target {target!r}")
        try:
            projections.append(project_scaling(
                {"target": model.name, "seconds": seconds, "flops": estimate["flops"]}, plan,
                parameter_bytes=parameter_bytes, gradient_bytes=gradient_bytes, activation_bytes=activation_bytes,
                expert_bytes=expert_bytes, forward_seconds=forward_seconds, device_model=model, dtype=dtype))
        except ValueError as exc:
            raise AccelkitError(f"accelkit project: {target}: {exc}") from exc
    return projections


def render(projections: Sequence[ScalingProjection], plan: ScalingPlan) -> str:
    """The table ``accelkit project`` prints, and the model's note."""
    header = ("target", "chips", "compute", "data", "fsdp", "tensor", "expert", "exposed", "bubble", "step", "MFU")
    lines: list[tuple[str, ...]] = [header]
    for p in projections:
        s = p.seconds
        lines.append((p.target, str(p.chips), *(format_seconds(s[k]) for k in header[2:9]),
                      format_seconds(p.step_seconds), f"{p.mfu:.1%}"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    table = ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(line, widths)))
             for line in lines]
    fields = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in vars(plan).items()
                       if v != ScalingPlan.__dataclass_fields__[k].default)
    notes = list(dict.fromkeys(f"{p.target}: {p.note}" if len(projections) > 1 else p.note for p in projections))
    return "\n".join([f"plan: {fields or 'one chip'} ({plan.chips} chips)", *table, "",
                      "Estimated, not measured.", *notes])


def as_json(projections: Sequence[ScalingProjection]) -> list[dict[str, Any]]:
    return [p.as_dict() for p in projections]


def dtype_named(text: str) -> torch.dtype:
    """The MFU denominator's dtype from its short name (bf16, fp16, fp32, fp8)."""
    try:
        return _DTYPES[text.lower()]
    except KeyError:
        raise ValueError(f"{text!r} is not one of {', '.join(_DTYPES)}") from None
