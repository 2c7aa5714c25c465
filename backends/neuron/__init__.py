"""neuron: PyTorch on a simulated AWS NeuronCore (Trainium trn1, trn2, trn3).

AWS's Neuron compiler and runtime cannot be installed from public registries, so this backend
executes every kernel as a tile program on a NeuronCore simulator that follows the published
architecture (SBUF/PSUM, 128 partitions, Tensor/Vector/Scalar/GpSimd engines, DMA queues) and
says so. Numbers are computed in numpy with Trainium's numerics; every time figure is an
estimate from public specifications. Select it by name: ``select_device("neuron")``; the target
generation is ``ACCELKIT_NEURON_TARGET`` (default trn2).

The plugin's hooks live in the modules of their contract areas (``device``, ``runtime``,
``compiler``, ``collectives``); the
expectations are ``conformance.toml`` next to this file, and autocast is the core's default.

Eager ops run adaptively by default, as TorchNeuron's do: recorded, and run as one scheduled
program per region at the next flush (``adaptive.py``). ``ACCELKIT_NEURON_EAGER=strict`` or
:func:`eager_mode` ``("strict")`` runs each op as its own program, at once.

Public extras: :func:`profile` (a timeline exported as a Chrome trace),
:func:`stochastic_rounding` (bf16 rounding mode) and :func:`eager_mode`.
"""

from __future__ import annotations

from accelkit.sdk import BackendInfo, hookimpl
from accelkit_backends.neuron.collectives import accelkit_make_process_group
from accelkit_backends.neuron.compiler import accelkit_make_compiler
from accelkit_backends.neuron.device import accelkit_target_model, device_model, probe
from accelkit_backends.neuron.runtime import (
    accelkit_backend_activated,
    accelkit_decompositions,
    accelkit_dtype_rules,
    accelkit_estimate,
    accelkit_kernels,
    accelkit_make_allocator,
    accelkit_reset_stats,
    accelkit_stats,
)

NAME = "neuron"


@hookimpl
def accelkit_register_backend() -> BackendInfo:
    return BackendInfo(
        name=NAME,
        priority=90,
        description="AWS Trainium NeuronCore (simulated: tile programs on a modelled core)",
        default_fallback="warn",
    )


def profile():
    """Context manager recording the kernels and instructions run inside it (a ``Profile``
    with ``export_chrome_trace(path)``)."""
    from accelkit_backends.neuron.cost import profile as _profile

    return _profile()


def eager_mode(mode: str):
    """Context manager: neuron's eager ops run ``"adaptive"`` (recorded, one program per region)
    or ``"strict"`` (one program per op, at once) inside; the open region is flushed on the way
    in and out."""
    from accelkit_backends.neuron.adaptive import eager_mode as _eager_mode

    return _eager_mode(mode)


def stochastic_rounding(enabled: bool = True):
    """Context manager: round fp32 results to bf16 stochastically (or to nearest-even)."""
    from accelkit_backends.neuron.sim.numerics import stochastic_rounding as _stochastic_rounding

    return _stochastic_rounding(enabled)


__all__ = [
    "NAME",
    "accelkit_backend_activated",
    "accelkit_decompositions",
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
    "device_model",
    "eager_mode",
    "probe",
    "profile",
    "stochastic_rounding",
]
