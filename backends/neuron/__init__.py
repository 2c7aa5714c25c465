"""neuron: PyTorch on a simulated AWS NeuronCore (Trainium trn1, trn2, trn3).

AWS's Neuron compiler and runtime cannot be installed from public registries, so this backend
executes every kernel as a tile program on a NeuronCore simulator that follows the published
architecture (SBUF/PSUM, 128 partitions, Tensor/Vector/Scalar/GpSimd engines, DMA queues) and
says so. Numbers are computed in numpy with Trainium's numerics; every time figure is an
estimate from public specifications. Select it by name: ``select_device("neuron")``; the target
generation is ``ACCELKIT_NEURON_TARGET`` (default trn2).

Public extras: :func:`profile` (a timeline exported as a Chrome trace) and
:func:`stochastic_rounding` (bf16 rounding mode).
"""

from __future__ import annotations

from accelkit.sdk import BackendInfo, hookimpl

NAME = "neuron"


@hookimpl
def accelkit_register_backend():
    return BackendInfo(
        name=NAME,
        priority=90,
        description="AWS Trainium NeuronCore (simulated: tile programs on a modelled core)",
        default_fallback="warn",
    )


@hookimpl
def accelkit_probe(name):
    if name == NAME:
        from accelkit_backends.neuron.device import probe

        return probe()


@hookimpl
def accelkit_device_model(name):
    if name == NAME:
        from accelkit_backends.neuron.device import device_model

        return device_model()


@hookimpl
def accelkit_make_allocator(name, device_model):
    if name == NAME:
        from accelkit_backends.neuron.runtime import make_allocator

        return make_allocator(device_model)


@hookimpl
def accelkit_kernels(name):
    if name == NAME:
        from accelkit_backends.neuron.kernels import kernels

        return kernels


@hookimpl
def accelkit_dtype_rules(name):
    if name == NAME:
        from accelkit_backends.neuron.runtime import dtype_rules

        return dtype_rules()


@hookimpl
def accelkit_autocast_policy(name):
    if name == NAME:
        from accelkit_backends.neuron.runtime import autocast_policy

        return autocast_policy()


@hookimpl
def accelkit_backend_activated(name, device):
    if name == NAME:
        from accelkit_backends.neuron.runtime import on_activated

        on_activated()


@hookimpl
def accelkit_stats(name):
    if name == NAME:
        from accelkit_backends.neuron.runtime import stats

        return stats()


@hookimpl
def accelkit_reset_stats(name):
    if name == NAME:
        from accelkit_backends.neuron.runtime import reset_stats

        reset_stats()


@hookimpl
def accelkit_conformance_expectations(name):
    if name == NAME:
        from pathlib import Path

        from accelkit.sdk import Expectations

        return Expectations.from_toml(Path(__file__).with_name("conformance.toml"))


def profile():
    """Context manager recording the kernels and instructions run inside it (a ``Profile``
    with ``export_chrome_trace(path)``)."""
    from accelkit_backends.neuron.runtime import profile as _profile

    return _profile()


def stochastic_rounding(enabled: bool = True):
    """Context manager: round fp32 results to bf16 stochastically (or to nearest-even)."""
    from accelkit_backends.neuron.sim.numerics import stochastic_rounding as _stochastic_rounding

    return _stochastic_rounding(enabled)
