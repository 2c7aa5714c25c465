"""Wiring the neuron backend into the accelkit runtime: the simulated core, the dtype policy,
the allocator and the stats. Cheap to import (the plugin's hooks live here); the simulator is
imported when the backend is activated.

**Dtype policy** (Trainium has no 64-bit engines, N-ndt):

- ``float64`` and ``complex128`` are refused with a message naming the fix. Setting
  ``ACCELKIT_NEURON_FLOAT64=downcast`` stores float64 tensors but computes them in float32, as
  torch-neuronx maps F64 to F32 (PTX-dtype); a warning says so once per process. It leaves
  complex128 refused.
- ``complex64`` is stored as interleaved float32 (real, imaginary) pairs and computed as real
  arithmetic on the engines, as the Neuron compiler lowers it (``kernels/complex.py``); an op
  without a complex program takes the CPU fallback.
- ``int64`` is stored at full width in HBM and computed as int32, as neuronx-cc does by default
  (N-cli); a value outside int32 raises :class:`NeuronDtypeError` instead of wrapping.
"""

from __future__ import annotations

import threading
import warnings
from typing import TYPE_CHECKING, Any

import torch

from accelkit.sdk import DeviceModel, DtypeRules, Estimate, env_choice, hookimpl

if TYPE_CHECKING:
    from accelkit_backends.neuron.sim.core import NeuronCore

FLOAT64_ENV = "ACCELKIT_NEURON_FLOAT64"
FLOAT64_POLICIES = ("error", "downcast")

_REFUSED = frozenset({torch.float64, torch.complex128, torch.complex32,
                      torch.uint64})
_warned_downcast = False
_COMPLEX_HINT = (
    "NeuronCores have no 64-bit floating-point or complex engines: complex64 is stored as "
    "float32 (real, imaginary) pairs and computed on the engines, other complex dtypes are "
    "refused. Cast to torch.complex64 before moving to neuron "
    f"({FLOAT64_ENV}=downcast applies to float64 only).")


@hookimpl
def accelkit_dtype_rules() -> DtypeRules:
    refused = set(_REFUSED)
    if env_choice(FLOAT64_ENV, FLOAT64_POLICIES, "error") == "downcast":
        refused.discard(torch.float64)
        _warn_downcast()
    supported = frozenset(d for d in vars(torch).values() if isinstance(d, torch.dtype)) - refused
    return DtypeRules(
        supported=supported,
        hint=("NeuronCores have no 64-bit floating-point or complex engines. Cast to float32 "
              f"(or bfloat16) before moving to neuron, or set {FLOAT64_ENV}=downcast to store "
              "float64 tensors and compute them in float32."),
        hints={**dict.fromkeys((torch.complex128, torch.complex32), _COMPLEX_HINT), torch.uint64: (
            "NeuronCores have no 64-bit unsigned integers. Cast to int64 (values below 2**63) or "
            "to uint32 before moving to neuron.")},
    )


def _warn_downcast() -> None:
    global _warned_downcast
    if not _warned_downcast:
        _warned_downcast = True
        warnings.warn(f"{FLOAT64_ENV}=downcast: float64 tensors on neuron are computed in float32",
                      stacklevel=3)


@hookimpl
def accelkit_make_allocator(device_model: DeviceModel, index: int) -> Any:
    from accelkit_backends.neuron.buffers import NeuronAllocator

    return NeuronAllocator(f"neuron:{index} ({device_model.name})", device_model.memory_bytes)


@hookimpl
def accelkit_decompositions() -> Any:
    """PyTorch's core-ATen table plus neuron's own (the ``decompositions`` package)."""
    from accelkit.sdk import default_decompositions
    from accelkit_backends.neuron.decompositions import decompositions

    return {**default_decompositions(), **decompositions()}


@hookimpl
def accelkit_kernels() -> Any:
    from accelkit_backends.neuron.kernels import kernels

    return kernels


_core: NeuronCore | None = None
_core_lock = threading.Lock()


def core() -> NeuronCore:
    """The simulated NeuronCore of the selected target (created on first use)."""
    global _core
    if _core is None:
        with _core_lock:
            if _core is None:
                from accelkit_backends.neuron.cost import LEDGER
                from accelkit_backends.neuron.device import core_spec, device_model
                from accelkit_backends.neuron.sim.core import NeuronCore

                LEDGER.launches.launch_seconds = device_model().launch_seconds
                created = NeuronCore(core_spec())
                created.listeners.append(LEDGER.record)
                created.program_listeners.append(LEDGER.record_program)
                _core = created
    return _core


@hookimpl
def accelkit_backend_activated() -> None:
    core()


@hookimpl
def accelkit_stats() -> dict[str, Any]:
    from accelkit_backends.neuron import adaptive
    from accelkit_backends.neuron.cost import LEDGER
    from accelkit_backends.neuron.launch import REPLAY_COUNTS

    adaptive.flush("stats")  # what the open region will cost is known once it ran
    instances = {op: len(keys) for op, keys in sorted(LEDGER.instances.items())}
    return {
        "compiles": sum(instances.values()),
        "neuron": {"instances": instances, "instances_total": sum(instances.values()),
                   "estimate": LEDGER.summary(),
                   # Static kernel runs the simulator replayed (numerics only) or recorded, and
                   # the kernels that cannot replay, with the reason.
                   "replay": {"replayed": REPLAY_COUNTS["replayed"], "recorded": REPLAY_COUNTS["recorded"],
                              "refused": dict(REPLAY_COUNTS["refused"])},
                   # Adaptive eager: regions flushed (and why), ops and in-place writes recorded,
                   # region programs built and reused.
                   "adaptive": adaptive.stats()},
    }


@hookimpl
def accelkit_reset_stats() -> None:
    from accelkit_backends.neuron import adaptive
    from accelkit_backends.neuron.cost import LEDGER
    from accelkit_backends.neuron.launch import REPLAY_COUNTS

    # Ops recorded before the reset are counted before it (their region runs now).
    adaptive.flush("stats")
    adaptive.reset_stats()
    LEDGER.reset()
    REPLAY_COUNTS.update(replayed=0, recorded=0)


@hookimpl
def accelkit_estimate() -> Estimate:
    from accelkit_backends.neuron import adaptive
    from accelkit_backends.neuron.cost import LEDGER

    adaptive.flush("stats")
    return LEDGER.estimate()
