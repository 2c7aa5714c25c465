"""Two adjustments to ``torch.compile`` that every accelkit backend needs.

**The runtime is opaque to Dynamo.** Inside a compiled function's dynamic extent, Dynamo
intercepts every new Python frame, including the frames of our kernels when the autograd
engine or a graph break runs device ops eagerly. Tracing into them would capture the
runtime's own Python (and JAX's) as if it were the model. The runtime, the SDK's private
modules, the active backend's modules (not its tests) and the substrate's libraries (jax,
jaxlib, ml_dtypes) join Dynamo's skip list as soon as Dynamo is imported, so their frames
always run as plain Python: a kernel is a kernel, compiled or not.

**The default backend finds the device's compiler.** ``torch.compile(model)`` means Inductor,
and torch 2.13's Inductor has a built-in ``tpu`` device (Pallas through the ``torch_tpu``
package) it would pick for our tensors and then fail deep inside code generation. Inductor
cannot generate code for an accelkit device, so a graph whose inputs live on the active
device is handed to the backend's own compiler instead (as TorchNeuron does on its device),
with one log line saying so; a backend without a compiler fails at once, naming the options.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import logging
import os
import pkgutil
import sys
from typing import Any

import torch

from accelkit._errors import AccelkitError

log = logging.getLogger("accelkit.compile")

_SUBSTRATE_LIBRARIES = ("jax", "jaxlib", "ml_dtypes")


def install(ctx: Any, plugin_file: str | None) -> None:
    """Make the runtime opaque to Dynamo (now or when Dynamo is imported) and route the
    default backend's graphs on ``ctx``'s device to ``ctx.compiler``."""
    skipped = _opaque_modules(plugin_file)
    if "torch._dynamo" in sys.modules:
        _skip(skipped)
    else:
        sys.meta_path.insert(0, _RunAfterImport("torch._dynamo", lambda: _skip(skipped)))
    _route_inductor(ctx)


def _opaque_modules(plugin_file: str | None) -> list[str]:
    names = ["accelkit._runtime", *_package_modules("accelkit", skip=("sdk", "testing"))]
    names += [f"accelkit.sdk.{m}" for m in _module_names("accelkit.sdk") if m != "testing"]
    if plugin_file and os.path.basename(plugin_file) == "__init__.py":
        package = _package_of(plugin_file)
        if package is not None:
            names += [f"{package}.{m}" for m in _module_names(package) if not m.startswith("test")]
    return names + list(_SUBSTRATE_LIBRARIES)


def _package_of(init_file: str) -> str | None:
    """The name under which the package with this ``__init__.py`` was imported."""
    wanted = os.path.abspath(init_file)
    for name, module in list(sys.modules.items()):
        if os.path.abspath(getattr(module, "__file__", None) or "") == wanted:
            return name
    return None


def _module_names(package: str) -> list[str]:
    module = sys.modules.get(package) or importlib.import_module(package)
    return [info.name for info in pkgutil.iter_modules(getattr(module, "__path__", []))]


def _package_modules(package: str, skip: tuple[str, ...]) -> list[str]:
    return [f"{package}.{m}" for m in _module_names(package) if m not in skip and m != "_runtime"]


def _skip(modules: list[str]) -> None:
    from torch._dynamo import trace_rules

    for name in modules:
        try:
            trace_rules.add(name)
        except (ImportError, ValueError):
            continue


class _RunAfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback`` once, right after the module ``name`` has been imported."""

    def __init__(self, name: str, callback: Any):
        self._name = name
        self._callback = callback

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self._name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader, callback = spec.loader, self._callback
        execute = loader.exec_module

        def exec_module(module: Any) -> None:
            execute(module)
            callback()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


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
