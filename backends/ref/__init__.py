"""ref: the reference backend — the smallest complete implementation of the accelkit contract.

Host-memory buffers, a small native kernel set computed with CPU torch, everything else through
decompositions and the CPU fallback (allowed by default). It needs no accelerator, no jax and
no simulator, so the core's tests run on it. Select it by name: ``select_device("ref")``.
"""

from __future__ import annotations

from accelkit.sdk import BackendInfo, hookimpl

NAME = "ref"


@hookimpl
def accelkit_register_backend():
    return BackendInfo(
        name=NAME,
        priority=0,
        description="reference backend: host memory, kernels from CPU torch",
        default_fallback="allow",
    )


@hookimpl
def accelkit_probe(name):
    if name == NAME:
        from accelkit_backends.ref.device import probe

        return probe()


@hookimpl
def accelkit_device_model(name):
    if name == NAME:
        from accelkit_backends.ref.device import device_model

        return device_model()


@hookimpl
def accelkit_make_allocator(name, device_model):
    if name == NAME:
        from accelkit_backends.ref.buffers import RefAllocator

        return RefAllocator(f"{NAME}:0", device_model.memory_bytes)


@hookimpl
def accelkit_kernels(name):
    if name == NAME:
        from accelkit_backends.ref.kernels import kernels

        return kernels


@hookimpl
def accelkit_make_compiler(name):
    if name == NAME:
        from accelkit_backends.ref.compiler import compile_graph

        return compile_graph


@hookimpl
def accelkit_conformance_expectations(name):
    if name == NAME:
        from pathlib import Path

        from accelkit.sdk import Expectations

        return Expectations.from_toml(Path(__file__).with_name("conformance.toml"))
