"""Two adjustments to ``torch.compile`` that every accelkit backend needs.

**The runtime is opaque to Dynamo.** Inside a compiled function's dynamic extent, Dynamo
intercepts every new Python frame, including the frames of our kernels when the autograd
engine or a graph break runs device ops eagerly. Tracing into them would capture the
runtime's own Python (and JAX's, and the logging it calls) as if it were the model. Every code
object of the runtime, the SDK and the active backend (not their tests) is marked, at
activation, to run without Dynamo, it and everything it calls: a kernel is a kernel, compiled
or not. (Dynamo's skip list would not do: it skips a frame but still traces what it calls.)

**The default backend finds the device's compiler.** ``torch.compile(model)`` means Inductor,
and torch 2.13's Inductor has a built-in ``tpu`` device (Pallas through the ``torch_tpu``
package) it would pick for our tensors and then fail deep inside code generation. Inductor
cannot generate code for an accelkit device, so a graph whose inputs live on the active
device is handed to the backend's own compiler instead (as TorchNeuron does on its device),
with one log line saying so; a backend without a compiler fails at once, naming the options.
"""

from __future__ import annotations

import logging
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch

from accelkit._errors import AccelkitError

log = logging.getLogger("accelkit.compile")

def install(ctx: Any, plugin_file: str | None) -> None:
    """Make the runtime's and the backend's code opaque to Dynamo and route the default
    backend's graphs on ``ctx``'s device to ``ctx.compiler``."""
    from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy

    opaque = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
    for code in _codes(_opaque_modules(plugin_file)):
        set_code_exec_strategy(code, opaque)
    _route_inductor(ctx)


def _opaque_modules(plugin_file: str | None) -> list[Any]:
    """The loaded modules of the runtime, the SDK (not its shipped tests) and the backend's
    package (not its tests)."""
    prefixes = ["accelkit."]
    package = _package_of(plugin_file) if plugin_file and os.path.basename(plugin_file) == "__init__.py" else None
    if package is not None:
        prefixes.append(package + ".")
    modules = []
    for name, module in list(sys.modules.items()):
        if not any(name.startswith(p) for p in prefixes) or module is None:
            continue
        if name.startswith("accelkit.sdk.testing") or ".tests" in name or name.rsplit(".", 1)[-1].startswith("test"):
            continue
        modules.append(module)
    return modules


def _package_of(init_file: str) -> str | None:
    """The name under which the package with this ``__init__.py`` was imported."""
    wanted = os.path.abspath(init_file)
    for name, module in list(sys.modules.items()):
        if os.path.abspath(getattr(module, "__file__", None) or "") == wanted:
            return name
    return None


def _codes(modules: list[Any]) -> Iterator[types.CodeType]:
    """Every code object defined in ``modules``: functions, methods, nested functions."""
    seen: set[int] = set()

    def walk(code: types.CodeType) -> Iterator[types.CodeType]:
        if id(code) in seen:
            return
        seen.add(id(code))
        yield code
        for constant in code.co_consts:
            if isinstance(constant, types.CodeType):
                yield from walk(constant)

    def of(value: Any, owner: str, depth: int = 0) -> Iterator[types.CodeType]:
        value = getattr(value, "__func__", value)  # static and class methods
        if isinstance(value, property):
            for accessor in (value.fget, value.fset, value.fdel):
                if accessor is not None:
                    yield from of(accessor, owner, depth)
            return
        code = getattr(value, "__code__", None)
        if isinstance(code, types.CodeType) and getattr(value, "__module__", None) == owner:
            yield from walk(code)
        elif isinstance(value, type) and value.__module__ == owner and depth < 2:
            for member in vars(value).values():
                yield from of(member, owner, depth + 1)

    for module in modules:
        for value in list(vars(module).values()):
            yield from of(value, module.__name__)


def _route_inductor(ctx: Any) -> None:
    wrapper = torch._TorchCompileInductorWrapper
    if getattr(wrapper.__call__, "_accelkit", False):
        return
    inductor = wrapper.__call__

    def call(self: Any, model: Any, inputs: Any) -> Any:
        if not any(isinstance(t, torch.Tensor) and t.device.type == ctx.name for t in inputs):
            return inductor(self, model, inputs)
        if ctx.compiler is None:
            raise AccelkitError(
                f"torch.compile's default backend (Inductor) cannot generate code for {ctx.name} "
                f"tensors, and the {ctx.name!r} backend has no compiler of its own. Use "
                "torch.compile(model, backend='aot_eager') to run captured graphs op by op."
            )
        if ("inductor-route",) not in ctx._warned:
            ctx._warned.add(("inductor-route",))
            log.info("torch.compile: graphs on %s go to backend=%r (Inductor has no %s code generator)",
                     ctx.name, ctx.name, ctx.name)
        return ctx.compiler(model, inputs)

    call._accelkit = True  # type: ignore[attr-defined]
    wrapper.__call__ = call  # type: ignore[method-assign]
