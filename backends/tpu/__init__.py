"""tpu: PyTorch on XLA through JAX's PJRT client.

On a machine with a TPU (libtpu installed, TPU devices present) it runs on the TPU; otherwise
it runs simulated on XLA's CPU platform with the target generation's rules — memory capacity,
dtype support, cost model — and says so. Select it by name (``select_device("tpu")``) when
simulated; a real TPU is chosen automatically.

Public extras: :func:`execution_mode` (strict / debug) and :func:`register_jax_kernel` (give a
``torch.library`` custom op a JAX implementation).
"""

from __future__ import annotations

from accelkit.sdk import BackendInfo, hookimpl

NAME = "tpu"


@hookimpl
def accelkit_register_backend():
    return BackendInfo(
        name=NAME,
        priority=100,
        description="XLA through JAX's PJRT client (real TPU, else XLA:CPU simulating one)",
        default_fallback="warn",
    )


@hookimpl
def accelkit_probe(name):
    if name == NAME:
        from accelkit_backends.tpu.device import probe

        return probe()


@hookimpl
def accelkit_device_model(name):
    if name == NAME:
        from accelkit_backends.tpu.device import device_model, probe

        return device_model(simulated=probe().simulated)


@hookimpl
def accelkit_make_allocator(name, device_model):
    if name == NAME:
        from accelkit_backends.tpu.runtime import make_allocator

        return make_allocator(device_model)


@hookimpl
def accelkit_kernels(name):
    if name == NAME:
        from accelkit_backends.tpu.kernels import kernels

        return kernels


@hookimpl
def accelkit_dtype_rules(name):
    if name == NAME:
        from accelkit_backends.tpu.runtime import dtype_rules

        return dtype_rules()


@hookimpl
def accelkit_autocast_policy(name):
    if name == NAME:
        from accelkit_backends.tpu.runtime import autocast_policy

        return autocast_policy()


@hookimpl
def accelkit_backend_activated(name, device):
    if name == NAME:
        from accelkit_backends.tpu.runtime import on_activated

        on_activated()


@hookimpl
def accelkit_stats(name):
    if name == NAME:
        from accelkit_backends.tpu.runtime import stats

        return stats()


@hookimpl
def accelkit_reset_stats(name):
    if name == NAME:
        from accelkit_backends.tpu.cost import COSTS

        COSTS.reset()


def execution_mode(mode):
    """Context manager: run a block in ``"strict"`` (async) or ``"debug"`` (per-op sync) mode."""
    from accelkit_backends.tpu.modes import execution_mode as _execution_mode

    return _execution_mode(mode)


def register_jax_kernel(op, fn):
    """Give the custom op ``op`` (a ``torch.library`` op) the JAX implementation ``fn`` on tpu."""
    from accelkit_backends.tpu.custom_ops import register_jax_kernel as _register

    return _register(op, fn)


@hookimpl
def accelkit_conformance_expectations(name):
    if name == NAME:
        from pathlib import Path

        from accelkit.sdk import Expectations

        return Expectations.from_toml(Path(__file__).with_name("conformance.toml"))
