"""Wiring the tpu backend into the accelkit runtime: allocator, dtype policy, kernels, stats.

Cheap to import (the plugin's hooks live here): jax is imported when the backend is activated.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from accelkit.sdk import (
    DeviceModel,
    DtypeRules,
    Estimate,
    TargetComparison,
    device_count_from_env,
    env_choice,
    fast_compile,
    hookimpl,
    other_backend_reason,
    requested_targets,
)

FLOAT64_ENV = "ACCELKIT_TPU_FLOAT64"
FLOAT64_POLICIES = ("error", "emulate")

_WIDE = frozenset({torch.float64, torch.complex128})


#: XLA's CPU code generation for quick compiles: without LLVM's optimisations, and with XLA's
#: older LLVM emitters for fusions instead of its MLIR ones. A tiny program (most of a
#: conformance run's) compiles in about a third of the time, a mid-sized one in about half. The
#: HLO and XLA's own passes are the same; floating-point results may differ by rounding (1-2
#: ulp where the optimised code fuses a multiply-add or vectorises rsqrt, tanh or log1p).
_FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")


def _jax() -> Any:
    if fast_compile():
        # XLA reads its flags once, when jax's backends start: before the first jax call. A
        # setting of the user's own wins.
        flags = os.environ.get("XLA_FLAGS", "")
        extra = [flag for flag in _FAST_COMPILE_FLAGS if flag.split("=")[0] not in flags]
        os.environ["XLA_FLAGS"] = " ".join([flags, *extra]).strip()
    import jax

    # PyTorch's int64 indices and float64 tensors need 64-bit types; JAX defaults to 32 bits.
    jax.config.update("jax_enable_x64", True)
    return jax


def jax_device(simulated: bool, index: int = 0) -> Any:
    """The PJRT device behind ``tpu:index``: a chip, or one of XLA's CPU devices (as many as
    ``ACCELKIT_TPU_DEVICES`` asks for) when simulated."""
    jax = _jax()
    if simulated:
        count = device_count_from_env("tpu")
        if count > 1 and not _cpu_devices_configured(jax, count):
            raise RuntimeError(
                f"ACCELKIT_TPU_DEVICES={count} needs {count} XLA CPU devices, but jax was initialised "
                "with fewer before accelkit activated tpu; activate tpu before the first jax call"
            )
    devices = jax.devices("cpu" if simulated else "tpu")
    if index >= len(devices):
        raise RuntimeError(f"tpu:{index} does not exist: jax sees {len(devices)} device(s)")
    return devices[index]


def _cpu_devices_configured(jax: Any, count: int) -> bool:
    """Ask XLA's CPU platform for ``count`` devices (possible until jax's backends start)."""
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # backends already initialised: keep what they have
        pass
    return len(jax.devices("cpu")) >= count


@hookimpl
def accelkit_make_allocator(device_model: DeviceModel, index: int) -> Any:
    from accelkit_backends.tpu.buffers import TpuAllocator

    return TpuAllocator(f"tpu:{index}", device_model.memory_bytes, jax_device(device_model.simulated, index))


@hookimpl
def accelkit_kernels() -> Any:
    from accelkit_backends.tpu.kernels import kernels

    return kernels


@hookimpl
def accelkit_dtype_rules() -> DtypeRules:
    """float64/complex128: refused unless ``ACCELKIT_TPU_FLOAT64=emulate`` (never a silent
    downcast). Dtypes XLA has no type for (complex32, the sub-byte and most float8 types) are
    refused under either policy."""
    from accelkit_backends.tpu.buffers import TORCH_TO_JAX

    emulate = env_choice(FLOAT64_ENV, FLOAT64_POLICIES, "error") == "emulate"
    supported = frozenset(TORCH_TO_JAX) if emulate else frozenset(TORCH_TO_JAX) - _WIDE
    without_xla_type = {
        dtype: f"XLA has no {str(dtype).removeprefix('torch.')} type; convert to {_nearest_xla_type(dtype)} first."
        for dtype in vars(torch).values()
        if isinstance(dtype, torch.dtype) and dtype not in TORCH_TO_JAX
    }
    return DtypeRules(
        supported=supported,
        hint=("TPUs have no 64-bit floating-point hardware. Cast to float32 (or bfloat16) before "
              f"moving to tpu, or set {FLOAT64_ENV}=emulate to accept XLA's slow, partial "
              "emulation on a TPU (exact float64 when simulated on the CPU)."),
        hints=without_xla_type,
    )


def _nearest_xla_type(dtype: torch.dtype) -> str:
    if dtype.is_complex:
        return "complex64"
    if dtype.is_floating_point:
        return "float8_e4m3fn or float8_e5m2" if dtype.itemsize == 1 else "float32"
    return "uint8 or int8"


@hookimpl
def accelkit_backend_activated(device_model: DeviceModel) -> None:
    from accelkit_backends.tpu.cost import COSTS
    from accelkit_backends.tpu.programs import LOADED

    COSTS.model = device_model
    COSTS.comparison = _comparison(device_model)
    _ = LOADED.limit  # a misspelt ACCELKIT_TPU_LIVE_PROGRAMS fails activation, not the first op


def _comparison(active: DeviceModel) -> TargetComparison | None:
    """The generations ``ACCELKIT_ESTIMATE_ON`` asks for (the active one first), or None."""
    from accelkit_backends.tpu.device import TARGETS, device_model, generation

    requested = requested_targets()
    if not requested:
        return None
    names, elsewhere = [active.name], {}
    for name in requested:
        tpu_name = generation(name)
        if tpu_name is None:
            elsewhere[name] = other_backend_reason(name, "tpu", TARGETS)
        elif tpu_name not in names:
            names.append(tpu_name)
    models = [active] + [device_model(name, simulated=active.simulated) for name in names[1:]]
    return TargetComparison(models, elsewhere)


@hookimpl
def accelkit_stats() -> dict[str, Any]:
    """The tpu sections of :func:`accelkit.stats`.

    ``compiles`` (top level, where the conformance suite reads a backend's compilations) is the
    running total of XLA programs compiled in this process: the ops' programs plus the
    data-movement programs (view reads, scatters, casts), recompiles after an unload included.
    It never decreases; the ``tpu`` section breaks it down. ``loaded_programs`` is how many
    executables are loaded now, their bound (``ACCELKIT_TPU_LIVE_PROGRAMS``) and how many were
    unloaded to keep it (see :mod:`.programs`).
    """
    from accelkit_backends.tpu import fused, modes
    from accelkit_backends.tpu.buffers import data_movement_programs
    from accelkit_backends.tpu.cost import COSTS
    from accelkit_backends.tpu.lowering import compile_counts
    from accelkit_backends.tpu.programs import LOADED

    counts = compile_counts()
    moves = data_movement_programs()
    return {
        "compiles": sum(counts.values()) + moves,
        "tpu": {
            "mode": modes.current(),
            "fused": fused.stats(),
            "compiled_programs": counts,
            "compiled_programs_total": sum(counts.values()),
            "data_movement_programs": moves,
            "loaded_programs": LOADED.stats(),
            "estimate": COSTS.summary(),
        },
    }


@hookimpl
def accelkit_reset_stats() -> None:
    from accelkit_backends.tpu import fused
    from accelkit_backends.tpu.cost import COSTS

    COSTS.reset()
    fused.reset_stats()


@hookimpl
def accelkit_estimate() -> Estimate | None:
    from accelkit_backends.tpu.cost import COSTS

    return COSTS.estimate()
