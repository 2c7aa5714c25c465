"""tpu: PyTorch on XLA through JAX's PJRT client.

On a machine with a TPU (libtpu installed, TPU devices present) it runs on the TPU; otherwise
it runs simulated on XLA's CPU platform with the target generation's rules — memory capacity,
dtype support, cost model — and says so. Select it by name (``select_device("tpu")``) when
simulated; a real TPU is chosen automatically.

The plugin's hooks live in the modules of their contract areas (``device``, ``runtime``,
``compiler``); the
expectations are ``conformance.toml`` next to this file, and autocast is the core's default
(bfloat16 preferred: the MXU's native input type).

Public extras: :func:`execution_mode` (strict / debug) and :func:`register_jax_kernel` (give a
``torch.library`` custom op a JAX implementation).
"""

from __future__ import annotations

from accelkit.sdk import BackendInfo, hookimpl
from accelkit_backends.tpu.collectives import accelkit_make_process_group
from accelkit_backends.tpu.compiler import accelkit_make_compiler
from accelkit_backends.tpu.device import accelkit_device_model, accelkit_target_model, probe
from accelkit_backends.tpu.runtime import (
    accelkit_backend_activated,
    accelkit_dtype_rules,
    accelkit_estimate,
    accelkit_kernels,
    accelkit_make_allocator,
    accelkit_reset_stats,
    accelkit_stats,
)

NAME = "tpu"


@hookimpl
def accelkit_register_backend() -> BackendInfo:
    return BackendInfo(
        name=NAME,
        priority=100,
        description="XLA through JAX's PJRT client (real TPU, else XLA:CPU simulating one)",
        default_fallback="warn",
    )


def execution_mode(mode):
    """Context manager: run a block in ``"strict"`` (async) or ``"debug"`` (per-op sync) mode."""
    from accelkit_backends.tpu.modes import execution_mode as _execution_mode

    return _execution_mode(mode)


def register_jax_kernel(op, fn):
    """Give the custom op ``op`` (a ``torch.library`` op) the JAX implementation ``fn`` on tpu."""
    from accelkit_backends.tpu.custom_ops import register_jax_kernel as _register

    return _register(op, fn)


__all__ = [
    "NAME",
    "accelkit_backend_activated",
    "accelkit_device_model",
    "accelkit_dtype_rules",
    "accelkit_estimate",
    "accelkit_kernels",
    "accelkit_make_allocator",
    "accelkit_make_compiler",
    "accelkit_make_process_group",
    "accelkit_register_backend",
    "accelkit_reset_stats",
    "accelkit_stats",
    "accelkit_target_model",
    "execution_mode",
    "probe",
    "register_jax_kernel",
]
