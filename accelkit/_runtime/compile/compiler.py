"""``torch.compile(model, backend="<name>")`` for accelkit backends.

Dynamo finds compiler backends through the entry-point group ``torch_dynamo_backends``; an
accelkit backend declares ``<name> = "accelkit.sdk.dynamo_backends:<name>"`` there, which
resolves through :func:`compiler_for`. Resolving ``<name>`` yields a compiler function that
hands the graph to the active backend's compiler (``accelkit_make_compiler``), so nothing
compile-related is imported until a model is compiled.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from accelkit._errors import AccelkitError, DeviceUnavailableError


def compiler_for(name: str) -> Callable[..., Any]:
    """The torch.compile backend function for the accelkit backend ``name``."""

    def compile_graph(gm: Any, example_inputs: list) -> Callable[..., Any]:
        from accelkit import _runtime

        ctx = _runtime.active()
        if ctx is None or ctx.name != name:
            active = f"{ctx.name!r} is active" if ctx else "no accelkit backend is active"
            raise DeviceUnavailableError(
                f"torch.compile(backend={name!r}) needs the {name!r} backend active in this "
                f"process, but {active}. Call accelkit.select_device({name!r}) first."
            )
        if ctx.compiler is None:
            raise AccelkitError(
                f"the {name!r} backend does not support torch.compile (it provides no "
                "accelkit_make_compiler); use backend='aot_eager' to run graphs op by op."
            )
        from accelkit._runtime.compile.stats import STATS

        # A compiler built on the shared machinery counts its captures; any other is counted here.
        captured, started = STATS.graphs_captured, time.perf_counter()
        compiled = ctx.compiler(gm, example_inputs)
        if STATS.graphs_captured == captured:
            STATS.add(graphs_captured=1, compile_seconds=time.perf_counter() - started)
        if ctx.devices is not None:
            from accelkit._runtime.device.devices import on_inputs_device

            compiled = on_inputs_device(ctx.name, ctx.devices, compiled)
        return compiled

    compile_graph.__name__ = compile_graph.__qualname__ = f"accelkit_{name}"
    return compile_graph


def __getattr__(name: str) -> Callable[..., Any]:
    if name.startswith("__"):
        raise AttributeError(name)
    return compiler_for(name)
