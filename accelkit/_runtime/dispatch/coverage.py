"""Which path each aten overload takes on the active backend, read from what activation
registered and from the pipeline's plan, without running anything (the coverage audit).

The universe is every ``aten`` overload with a CPU kernel: what PyTorch itself can run on a
CPU, so what a device could be asked for. Each gets one path:

* ``native`` — a kernel of the backend's table, the runtime's own (memory, copies), or a view
  (metadata only, on any backend);
* ``derived`` — the in-place or ``out=`` variant the runtime derives from a native functional
  kernel;
* ``decomposed`` — a decomposition into other ops (the backend's, PyTorch's default table, or
  the functional op of an in-place/``out=`` overload), or PyTorch's own composite kernel;
* ``fallback`` — the CPU fallback: no kernel and no decomposition (or host memory by design);
* ``cpu_by_design`` — the CPU fallback too, for an op the backend declared its hardware has no
  way to compute (``KernelTable.on_cpu``); the detail is the backend's reason;
* ``refused`` — a sparse, quantized, MKL-DNN or nested layout, which the runtime's dense strided
  storage cannot hold: it fails on any backend without a kernel of its own for it.

A decomposition's own ops take their own paths; an op classified ``decomposed`` may still end
on the CPU through one of them.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch._ops import OpOverload

from accelkit._runtime.dispatch.schema import functional_of, overload_named, variants_of

PATHS = ("native", "derived", "decomposed", "fallback", "cpu_by_design", "refused")

#: Overload names of layouts the dense strided storage cannot hold.
_REFUSED = re.compile(r"sparse|mkldnn|quantiz|^q_|_nested|nested_|fbgemm|int_repr|qscheme|_coo|_csr|_csc|_bsr|_bsc")


def aten_overloads_with_cpu_kernels() -> list[OpOverload]:
    """Every ``aten`` overload PyTorch has a CPU kernel for, sorted by name."""
    found = []
    for name in sorted(torch._C._dispatch_get_all_op_names()):
        if name.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU"):
            op = overload_named(name)
            if op is not None:
                found.append(op)
    return found


def op_paths() -> dict[str, dict[str, str]]:
    """``{overload: {"path": ..., "detail": ...}}`` for the active backend (module docstring).

    :raises AccelkitError: no backend is active.
    """
    from accelkit import _runtime
    from accelkit._errors import AccelkitError

    ctx, pipeline = _runtime.active(), _runtime._pipeline
    if ctx is None or pipeline is None:
        raise AccelkitError("the coverage audit needs an active backend: call accelkit.select_device(...) first")
    paths: dict[OpOverload, tuple[str, str]] = {}

    def path_of(op: OpOverload) -> tuple[str, str]:
        if op not in paths:
            paths[op] = _classify(ctx, pipeline, op, path_of)
        return paths[op]

    return {str(op): dict(zip(("path", "detail"), path_of(op))) for op in aten_overloads_with_cpu_kernels()}


def _classify(ctx: Any, pipeline: Any, op: OpOverload, path_of: Any) -> tuple[str, str]:
    from accelkit import _runtime
    from accelkit._runtime.dispatch.pipeline import _run_meta

    kind = _runtime.registered.get(op)
    if kind == "runtime":
        return "native", "the runtime's own kernel (memory, copies)"
    if kind == "kernel":
        return "native", f"{ctx.name}'s kernel"
    if kind == "derived":
        functional, variant = functional_of(op)
        return "derived", f"the {variant} variant of {ctx.name}'s kernel for {functional}"
    if _REFUSED.search(op._schema.name.removeprefix("aten::")):
        return "refused", "a sparse, quantized, MKL-DNN or nested layout: dense strided storage cannot hold it"
    if kind == "host":
        return "fallback", "runs on the CPU by design (host memory)"
    if kind is None and _has_kernel(op, "CompositeExplicitAutogradNonFunctional"):
        # A structured op: PyTorch runs its functional and in-place forms as the out= form.
        functional = op if not functional_of(op)[0] else functional_of(op)[0]
        out = variants_of(functional)[1]
        if out is not None and out != op:
            path, detail = path_of(out)
            return path, f"runs as {out}: {detail}"
    if kind is None and _has_kernel(op, "CompositeExplicitAutograd"):
        return "decomposed", "PyTorch's composite kernel"
    plan = pipeline._plan(op)
    if plan is _run_meta:
        return "native", "a view: metadata only"
    if plan == pipeline.cpu_fallback:
        reason = ctx.cpu_reason(op)
        if reason is not None:
            return "cpu_by_design", f"declared CPU by design: {reason}"
        return "fallback", "no kernel and no decomposition"
    return "decomposed", _decomposition_detail(ctx, op)


def _has_kernel(op: OpOverload, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key)


def _decomposition_detail(ctx: Any, op: OpOverload) -> str:
    if op in ctx.decompositions:
        return "a decomposition"
    functional, variant = functional_of(op)
    return f"the {variant} variant of {functional}'s decomposition"
