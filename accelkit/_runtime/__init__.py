"""The PrivateUse1 runtime: turns one backend plugin into a real PyTorch device.

:func:`activate` is the only entry. It gathers the backend's answers to the contract hooks,
renames PrivateUse1, registers the device module, hooks and guard, installs the runtime-owned
ops, the backend's kernels, the boxed fallback, autocast and serialization. PyTorch allows all
of that once per process, so exactly one backend can be active; activating it again is a no-op.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch
from torch._C import _acc

from accelkit._errors import BackendConflictError, DeviceUnavailableError
from accelkit._plugins import BackendRecord, Registry
from accelkit._runtime import _tensors
from accelkit._runtime._autocast import install_autocast
from accelkit._runtime._context import BackendContext, policy_from_env
from accelkit._runtime._core_ops import core_ops
from accelkit._runtime._decomp_guards import guard_decompositions
from accelkit._runtime._device_module import DeviceModule
from accelkit._runtime._dispatch import Pipeline
from accelkit._runtime._fallback import CPU_EQUIVALENTS
from accelkit._runtime._scalar_checks import guard
from accelkit._runtime._schema import is_inplace_op, variants_of
from accelkit._runtime._rnn import RNN_DECOMPOSITIONS
from accelkit._runtime._serialization import install_serialization
from accelkit.sdk import CUDA_LIKE_AUTOCAST, KernelTable, default_decompositions

_lock = threading.RLock()
_active: BackendContext | None = None
_failed: str | None = None  # why a half-done activation left PrivateUse1 unusable in this process
_libraries: list[torch.library.Library] = []  # kept alive: dropping one deregisters its kernels


def active() -> BackendContext | None:
    """The active backend's context, or None when no backend is active."""
    return _active


def activate(record: BackendRecord, registry: Registry) -> torch.device:
    """Make ``record``'s backend this process's PrivateUse1 device and return ``<name>:0``.

    :raises BackendConflictError: another backend is already active.
    :raises DeviceUnavailableError: the backend's probe says it cannot run here.
    """
    global _active, _failed
    with _lock:
        if _active is not None:
            if _active.name == record.name:
                return _active.device
            raise conflict_error(_active.name, record.name)
        if _failed is not None:
            raise DeviceUnavailableError(
                f"cannot activate {record.name!r}: {_failed}. PyTorch registers PrivateUse1 once "
                "per process, so start a new process."
            )
        foreign = torch._C._get_privateuse1_backend_name()
        if foreign != "privateuseone":
            raise BackendConflictError(
                f"PrivateUse1 is already taken by {foreign!r}, registered outside accelkit, so "
                f"{record.name!r} cannot be activated in this process. Start a new process "
                f"without {foreign!r} (e.g. TORCH_DEVICE_BACKEND_AUTOLOAD=0)."
            )
        probe = record.probe(registry.pm)
        if not probe.available:
            raise DeviceUnavailableError(f"backend {record.name!r} is unavailable: {probe.reason}")
        ctx = _build_context(record, probe, registry)
        _check_kernels(ctx)
        try:
            _install(ctx)
        except Exception as exc:
            _failed = f"activating {record.name!r} failed part-way ({type(exc).__name__}: {exc})"
            raise
        _active = ctx
    registry.pm.hook.accelkit_backend_activated(name=ctx.name, device=ctx.device)
    return ctx.device


def conflict_error(active_name: str, requested: str) -> BackendConflictError:
    return BackendConflictError(
        f"cannot activate {requested!r}: this process already runs {active_name!r}. PyTorch "
        "offers one custom device type (PrivateUse1) per process, so accelkit activates one "
        f"backend per process. Use {active_name!r} here, or start a new process with "
        f"ACCELKIT_DEVICE={requested} (one process per backend, e.g. with subprocess or "
        "torch.multiprocessing)."
    )


def _build_context(record: BackendRecord, probe: Any, registry: Registry) -> BackendContext:
    hook = registry.pm.hook
    name = record.name
    model = hook.accelkit_device_model(name=name)
    if model is None:
        raise DeviceUnavailableError(f"backend {name!r} does not describe its device (accelkit_device_model)")
    allocator = hook.accelkit_make_allocator(name=name, device_model=model)
    if allocator is None:
        raise DeviceUnavailableError(f"backend {name!r} provides no allocator (accelkit_make_allocator)")
    decompositions = hook.accelkit_decompositions(name=name)
    return BackendContext(
        name=name,
        info=record.info,
        probe=probe,
        model=model,
        allocator=allocator,
        kernels=hook.accelkit_kernels(name=name) or KernelTable(name),
        decompositions=guard_decompositions({
            **RNN_DECOMPOSITIONS,  # no CPU kernel to fall back to: a backend may only replace them
            **(default_decompositions() if decompositions is None else decompositions),
        }),
        dtype_rules=hook.accelkit_dtype_rules(name=name),
        autocast=hook.accelkit_autocast_policy(name=name) or CUDA_LIKE_AUTOCAST,
        fallback_policy=policy_from_env(record.info.default_fallback),
        compiler=hook.accelkit_make_compiler(name=name),
    )


class _Hooks(_acc.PrivateUse1Hooks):
    def __init__(self, ctx: BackendContext):
        super().__init__()
        self._ctx = ctx

    def is_available(self) -> bool:
        return self._ctx.probe.available

    def is_built(self) -> bool:
        return True

    def has_primary_context(self, device_index: int) -> bool:
        return True


class _Guard(_acc.DeviceGuard):
    def type_(self) -> Any:
        return torch._C._autograd.DeviceType.PrivateUse1


def _install(ctx: BackendContext) -> None:
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    _setup_privateuseone_for_python_backend(
        rename=ctx.name, backend_module=DeviceModule(ctx), hook=_Hooks(ctx), device_guard=_Guard()
    )
    pipeline = Pipeline(ctx)
    kernels = torch.library.Library("aten", "IMPL")
    for op, fn in core_ops(ctx).items():
        kernels.impl(op, fn, "PrivateUse1")
    owned = set(core_ops(ctx))
    # Every native kernel goes behind PyTorch's number-fits-the-dtype check (a no-op wrapper
    # for the ops the CPU does not check; see _scalar_checks).
    for entry in ctx.kernels:
        wrap = pipeline.native_inplace if is_inplace_op(entry.op) else pipeline.native
        kernels.impl(entry.op, guard(ctx, entry.op, wrap(entry.op, entry.fn)), "PrivateUse1")
        owned.add(entry.op)
    for entry in ctx.kernels:
        if not entry.derive_variants:
            continue
        inplace, out = variants_of(entry.op)
        if inplace is not None and inplace not in owned:
            kernels.impl(inplace, guard(ctx, inplace, pipeline.native_inplace(inplace, entry.fn)), "PrivateUse1")
            owned.add(inplace)
        if out is not None and out not in owned:
            kernels.impl(out, guard(ctx, out, pipeline.native_out(out, entry.fn)), "PrivateUse1")
            owned.add(out)
    for op in CPU_EQUIVALENTS:
        # Device-hook ops have a CompositeExplicitAutograd kernel that only raises, which would
        # win over the boxed fallback; route them into the pipeline explicitly.
        if op not in owned:
            kernels.impl(op, functools.partial(pipeline.fallback, op), "PrivateUse1")
    fallbacks = torch.library.Library("_", "IMPL")
    fallbacks.fallback(pipeline.fallback, dispatch_key="PrivateUse1")
    fallbacks.fallback(torch.library.fallthrough_kernel, dispatch_key="AutocastPrivateUse1")
    autocast = torch.library.Library("aten", "IMPL")
    install_autocast(autocast, ctx.name, ctx.autocast)
    _libraries.extend((kernels, fallbacks, autocast))
    install_serialization(ctx)
    _install_formatting(ctx)


def _check_kernels(ctx: BackendContext) -> None:
    for entry in ctx.kernels:
        if torch._C._dispatch_has_kernel_for_dispatch_key(entry.op.name(), "CompositeImplicitAutograd"):
            raise ValueError(
                f"{ctx.name}: {entry.op} is CompositeImplicitAutograd; a device kernel for it would "
                "bypass its autograd formula. Register kernels for the ops it decomposes into "
                "(e.g. mm/bmm for matmul) instead."
            )


def _install_formatting(ctx: BackendContext) -> None:
    """Let ``print(t)`` work under any fallback policy, uncounted.

    PyTorch computes display statistics with ordinary ops on the tensor's device; they are not
    the program's work, so they neither obey ``deny`` nor appear in the op counters.
    """
    from torch import _tensor_str

    original = _tensor_str._str

    @functools.wraps(original)
    def formatted(self: torch.Tensor, *args: Any, **kwargs: Any) -> str:
        if self.device.type != ctx.name:
            return original(self, *args, **kwargs)
        with ctx.formatting():
            return original(self, *args, **kwargs)

    _tensor_str._str = formatted


__all__ = ["activate", "active", "conflict_error", "_tensors"]
