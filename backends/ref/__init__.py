"""ref: the reference backend — the smallest complete implementation of the accelkit contract.

Host-memory buffers, a small native kernel set computed with CPU torch, everything else through
decompositions and the CPU fallback (allowed by default). It needs no accelerator, no jax and
no simulator, so the core's tests run on it. Select it by name: ``select_device("ref")``.

Each hook lives in the module of its contract area (``device``, ``buffers``, ``kernels``,
``compiler``) and is listed here; the expectations are ``conformance.toml`` next to this file.
"""

from __future__ import annotations

from accelkit.sdk import BackendInfo, hookimpl
from accelkit_backends.ref.buffers import accelkit_make_allocator
from accelkit_backends.ref.collectives import accelkit_make_process_group
from accelkit_backends.ref.compiler import accelkit_make_compiler
from accelkit_backends.ref.device import device_model, probe
from accelkit_backends.ref.kernels import accelkit_kernels

NAME = "ref"


@hookimpl
def accelkit_register_backend() -> BackendInfo:
    return BackendInfo(
        name=NAME,
        priority=0,
        description="reference backend: host memory, kernels from CPU torch",
        default_fallback="allow",
    )


__all__ = [
    "NAME",
    "accelkit_kernels",
    "accelkit_make_allocator",
    "accelkit_make_compiler",
    "accelkit_make_process_group",
    "accelkit_register_backend",
    "device_model",
    "probe",
]
