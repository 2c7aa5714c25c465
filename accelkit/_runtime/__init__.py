"""The PrivateUse1 runtime: turns one backend plugin into a real PyTorch device.

:func:`activate` is the only entry. It gathers the backend's answers to the contract hooks,
renames PrivateUse1, registers the device module, hooks and guard, installs the runtime-owned
ops, the backend's kernels, the boxed fallback, autocast and serialization. PyTorch allows all
of that once per process, so exactly one backend can be active; activating it again is a no-op.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch._C import _acc
from torch._ops import OpOverload

from accelkit._errors import AccelkitError, BackendConflictError, DeviceUnavailableError, PluginError
from accelkit._contract import autocast_policy
from accelkit._plugins import BackendRecord
from accelkit._run.children import report_at_exit
from accelkit._runtime.device import devices as _devices
from accelkit._runtime.device import tensors
from accelkit._runtime.dispatch.attention import install_attention
from accelkit._runtime.dispatch.autocast import install_autocast
from accelkit._runtime.device.context import BackendContext, policy_from_env
from accelkit._runtime.dispatch.core_ops import core_ops
from accelkit._runtime.dispatch.decomp_guards import guard_decompositions
from accelkit._runtime.device.device_module import DeviceModule
from accelkit._runtime.dispatch.pipeline import Pipeline
from accelkit._runtime.patches import (
    install_backward_on_calling_thread,
    install_flex_attention,
    install_triton_interpreter,
    run_backward_on_this_thread,
)
from accelkit._runtime.distributed.backend import install_distributed
from accelkit._runtime.compile.dynamo_hooks import install as install_dynamo_hooks
from accelkit._runtime.dispatch.fallback import CPU_EQUIVALENTS, HOST_MEMORY_COMPOSITES, ROUTED_COMPOSITES
from accelkit._runtime.device.grad_scaler import install_grad_scaler
from accelkit._runtime.dispatch.scalar_checks import guard
from accelkit._runtime.dispatch.schema import is_inplace_op, variants_of
from accelkit._runtime.dispatch.rnn import RNN_DECOMPOSITIONS
from accelkit._runtime.device.serialization import install_serialization
from accelkit.sdk import (
    DeviceAllocator,
    DeviceModel,
    DtypeRules,
    KernelTable,
    default_decompositions,
)

_lock = threading.RLock()
_guard: _acc.DeviceGuard | None = None  # accelkit's PrivateUse1 device guard, once PyTorch holds it
_active: BackendContext | None = None
_failed: str | None = None  # why a half-done activation left PrivateUse1 unusable in this process
_libraries: list[torch.library.Library] = []  # kept alive: dropping one deregisters its kernels
_pipeline: Pipeline | None = None  # the active backend's, for kernels registered after activation
#: What activation registered on PrivateUse1 per aten overload: "runtime" (the runtime's own
#: kernels), "kernel" (the backend's table), "derived" (an in-place/out= variant of a kernel),
#: "routed" (into the pipeline's plan) or "host" (the CPU, by design); read by _coverage.
registered: dict[OpOverload, str] = {}


def active() -> BackendContext | None:
    """The active backend's context, or None when no backend is active."""
    return _active


def activate(record: BackendRecord) -> torch.device:
    """Make ``record``'s backend this process's PrivateUse1 device and return ``<name>:0``.

    The plugin's hooks are asked first, and their answers checked, before anything is
    installed: a hook that raises or answers wrongly fails this activation and leaves the
    process as it was. Only ``accelkit_backend_activated`` runs after PrivateUse1 is taken
    (the backend is then the device); if it fails, no backend can be activated in this process.

    :raises BackendConflictError: another backend is already active, or PrivateUse1 is taken.
    :raises DeviceUnavailableError: the backend's probe says it cannot run here.
    :raises PluginError: one of the plugin's hooks raised or answered with the wrong type.
    """
    global _active, _failed
    with _lock:
        if _active is not None:
            if _active.name == record.name:
                return _active.device
            raise conflict_error(_active.name, record.name)
        if _failed is not None:
            raise BackendConflictError(
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
        probe = record.probe()
        if not probe.available:
            raise DeviceUnavailableError(f"backend {record.name!r} is unavailable: {probe.reason}")
        ctx = _build_context(record, probe)
        _check_kernels(ctx)
        try:
            _install(ctx)
            install_dynamo_hooks(ctx, record.plugin_file())
            install_distributed(ctx, record)
        except BaseException as exc:
            _failed = f"activating {record.name!r} failed part-way ({type(exc).__name__}: {exc})"
            raise
        _active = ctx
    report_at_exit(ctx.device)  # in a process started under `accelkit run`
    try:
        record.call("accelkit_backend_activated", name=ctx.name, device=ctx.device, device_model=ctx.model)
    except PluginError as exc:
        with _lock:
            _active = None
            _failed = f"{record.name!r} was installed as PrivateUse1, then its plugin failed ({exc})"
        raise
    return ctx.device


def compile_stats(ctx: BackendContext) -> dict[str, Any]:
    """``stats()["compile"]``: the graph compiler's counters and Dynamo's breaks and recompiles."""
    from accelkit._runtime.compile.stats import STATS
    from accelkit._runtime.compile.graph_compiler import GraphCompiler

    compiler = ctx.compiler if isinstance(ctx.compiler, GraphCompiler) else None
    return STATS.snapshot(compiler.persistent_cache() if compiler else None)


def cpu_by_design_calls(ctx: BackendContext, ops: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, Any]]:
    """``stats()["cpu_by_design"]``: of the counted ``ops``, those that took the CPU fallback as
    declared CPU by design, with their fallback count and the backend's reason."""
    from accelkit._runtime.dispatch.schema import overload_named

    if not ctx.kernels.cpu_reasons:
        return {}
    found = {}
    for name, counts in ops.items():
        op = overload_named(name) if counts.get("fallback") else None
        reason = ctx.cpu_reason(op) if op is not None else None
        if reason is not None:
            found[name] = {"fallback": counts["fallback"], "reason": reason}
    return found


def reset_compile_stats() -> None:
    from accelkit._runtime.compile.stats import STATS

    STATS.reset()


from accelkit._runtime.distributed.backend import distributed_stats, reset_distributed_stats  # noqa: E402


def conflict_error(active_name: str, requested: str) -> BackendConflictError:
    return BackendConflictError(
        f"cannot activate {requested!r}: this process already runs {active_name!r}. PyTorch "
        "offers one custom device type (PrivateUse1) per process, so accelkit activates one "
        f"backend per process. Use {active_name!r} here, or start a new process with "
        f"ACCELKIT_DEVICE={requested} (one process per backend, e.g. with subprocess or "
        "torch.multiprocessing)."
    )


def _build_context(record: BackendRecord, probe: Any) -> BackendContext:
    name = record.name
    model = record.answer("accelkit_device_model", DeviceModel)
    if model is None:
        raise DeviceUnavailableError(f"backend {name!r} does not describe its device (accelkit_device_model)")
    count = max(1, probe.device_count)
    allocators = []
    for index in range(count):
        allocator = record.answer("accelkit_make_allocator", DeviceAllocator, device_model=model, index=index)
        if allocator is None:
            raise DeviceUnavailableError(f"backend {name!r} provides no allocator (accelkit_make_allocator)")
        allocator.index = index
        allocators.append(allocator)
    devices = None
    if count > 1:
        devices = _devices.DeviceSwitch(_native_for(name, count))
        allocator = _devices.CurrentDeviceAllocator(allocators, devices.current)
    decompositions = record.answer("accelkit_decompositions", Mapping)
    return BackendContext(
        name=name,
        info=record.info,
        probe=probe,
        model=model,
        allocator=allocator,
        kernels=record.answer("accelkit_kernels", KernelTable) or KernelTable(name),
        decompositions=guard_decompositions({
            **RNN_DECOMPOSITIONS,  # no CPU kernel to fall back to: a backend may only replace them
            **(default_decompositions() if decompositions is None else decompositions),
        }),
        dtype_rules=record.answer("accelkit_dtype_rules", DtypeRules),
        autocast=autocast_policy(record),
        fallback_policy=policy_from_env(record.info.default_fallback),
        compiler=record.answer("accelkit_make_compiler", Callable),
        allocators=tuple(allocators),
        devices=devices,
    )


def _native_for(name: str, count: int) -> Any:
    """accelkit's native extension, for a process with ``count`` devices of ``name``."""
    from accelkit import _native

    try:
        return _native.load()
    except _native.NativeUnavailableError as exc:
        raise DeviceUnavailableError(
            f"{name} has {count} devices in this process (ACCELKIT_{name.upper()}_DEVICES), which needs "
            f"accelkit's native extension: {exc}. Build it with `python -m accelkit native build`, or "
            f"use one device per process (unset ACCELKIT_{name.upper()}_DEVICES)."
        ) from None


def _install_native_hooks(ctx: BackendContext, module: DeviceModule) -> None:
    """Register accelkit's C++ PrivateUse1 hooks, which add pinned host memory and device
    generators to what the Python ones answer, and the device's memory figures (``module``'s)
    for ``torch.accelerator``.

    Without the native extension the Python hooks serve: pinning for the device and
    ``torch.Generator(device=...)`` then raise PyTorch's NotImplementedError, and
    ``torch.accelerator.memory_*`` an internal assert. A failed build says so in a warning;
    ``ACCELKIT_NATIVE=off`` is a choice and says nothing."""
    from accelkit import _native

    try:
        native = _native.load()
    except _native.NativeUnavailableError as exc:
        if _native.disabled_reason() is None:
            warnings.warn(
                f"accelkit: pinned host memory for {ctx.name} (tensor.pin_memory(), DataLoader(pin_memory=True)), "
                f"device generators and torch.accelerator's memory figures need accelkit's native extension, "
                f"which is unavailable: {exc}", stacklevel=3)
        return
    ctx.generator = native.install_generators(ctx.device_count)
    native.install_hooks(ctx.probe.available)
    for allocator in ctx.allocators or (ctx.allocator,):
        allocator._use_native_books(native)  # its books in C (_native/books.cpp)
    native.install_device_memory(module)
    if ctx.devices is None:
        # One device: the native guard answers as the Python one does (device 0 of 1, default
        # streams) and adds the device's own wait for torch.accelerator.synchronize() and
        # current_stream(), which vLLM and accelerate call. The library is loaded already.
        native.install_guard(1, lambda index: ctx.allocator.synchronize())


#: View ops whose PrivateUse1 kernels are PyTorch's own CPU ones when the native extension is
#: loaded (``_native/views.cpp``); otherwise the runtime's Python kernels (``core_ops``), which
#: do the same through the Meta kernel.
_aten = torch.ops.aten
NATIVE_VIEWS = (_aten.as_strided.default, _aten.view.default, _aten._reshape_alias.default, _aten.alias.default)


def _install_native_views() -> tuple[OpOverload, ...]:
    """Register the native view kernels if the extension is loaded (activation loaded it for
    the hooks); the ops they cover, or () when it is not."""
    from accelkit import _native

    native = _native.loaded()
    if native is None or not hasattr(native, "install_views"):
        return ()
    native.install_views()
    return NATIVE_VIEWS


def _install_native_empty(ctx: BackendContext, runtime_ops: Mapping[OpOverload, Callable]) -> tuple[OpOverload, ...]:
    """Make the native kernels of ``empty`` and ``empty_strided`` (``_native/factories.cpp``:
    the common case in C++, the runtime's Python kernels for the rest) the device's when the
    native fronts are on and the process has one device; the ops they cover, or () otherwise."""
    native = _native_front()
    if native is None or not hasattr(native, "install_empty") or ctx.devices is not None:
        return ()
    rules = ctx.dtype_rules
    held = rules.supported if rules is not None else _ALL_DTYPES
    empty, empty_strided = _aten.empty.memory_format, _aten.empty_strided.default
    native.install_empty(runtime_ops[empty], runtime_ops[empty_strided], ctx.allocator, sorted(held, key=str))
    return (empty, empty_strided)


_ALL_DTYPES = frozenset(v for v in vars(torch).values() if isinstance(v, torch.dtype))


#: ``ACCELKIT_NATIVE_LANE=off`` keeps every lane's front, and ``empty``'s, in Python even with
#: the extension loaded.
NATIVE_LANE_ENV = "ACCELKIT_NATIVE_LANE"


def _native_front() -> Any:
    """The native extension when its C++ lane front is to be used (``_native/lane.cpp``): loaded,
    and not switched off by ``ACCELKIT_NATIVE_LANE=off``; otherwise None."""
    from accelkit import _native

    native = _native.loaded()
    if native is None or not hasattr(native, "install_lane_front"):
        return None
    if os.environ.get(NATIVE_LANE_ENV, "").strip().lower() in ("0", "off", "false", "no"):
        return None
    return native


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
    """PrivateUse1's device guard. Python defines only its device type; everything else (one
    device, index 0, default streams) is fixed in PyTorch, so one guard serves every backend."""

    def type_(self) -> Any:
        return torch._C._autograd.DeviceType.PrivateUse1


def register_device_guard() -> None:
    """Give PyTorch accelkit's PrivateUse1 device guard now, before any backend is active.

    PyTorch's autograd engine sets up its per-device worker queues once per process, at the
    first ``backward()``, from the device guards registered at that moment; a device whose
    guard comes later has no queue, and its first backward fails inside PyTorch. So accelkit
    registers the guard when it is imported, which torch's backend autoload does at the end
    of ``import torch`` (loading ``accelkit._autoload`` imports the package, whatever
    ``ACCELKIT_AUTOLOAD`` says); with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` it is ``import
    accelkit``. :func:`activate` checks that it came early enough.

    The cost, from the first backward on (activation runs one): one idle autograd thread for
    PrivateUse1, and, as on any machine with a GPU, PyTorch refuses ``backward()`` in a child
    forked after that (use the ``spawn`` start method). Nothing is registered when another PrivateUse1 backend
    has already claimed the slot.
    """
    global _guard
    with _lock:
        if _guard is not None or torch._C._get_privateuse1_backend_name() != "privateuseone":
            return
        guard = _Guard()
        if _acc.register_python_privateuseone_device_guard(guard):
            _guard = guard


def _probe_tensor(ctx: BackendContext, dtype: torch.dtype) -> torch.Tensor:
    """An empty 0-d tensor on the backend's last device, made without a kernel."""
    if ctx.devices is None:
        return _acc.create_empty_tensor([], dtype)
    from accelkit import _native

    return _native.load().device_tensor([], [], dtype, ctx.device_count - 1, 0, 0)


class _EngineProbe(torch.autograd.Function):
    """A backward whose gradient lives on the device, running no device kernel."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        return make()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None]:
        return None, None


def _check_autograd_engine(ctx: BackendContext) -> None:
    """Run one backward on the last device now, so that a process whose autograd engine has no
    queue for it (a backward ran before :func:`register_device_guard`, or, with several devices,
    before activation) fails at selection, with the reason, and never inside PyTorch at the
    user's first backward."""
    name = ctx.name
    with torch.inference_mode(False), torch.enable_grad(), torch.autograd.set_multithreading_enabled(True):
        x = torch.zeros((), requires_grad=True)
        try:
            make = functools.partial(_probe_tensor, ctx, x.dtype)
            torch.autograd.backward(_EngineProbe.apply(x, make), make())
        except RuntimeError as exc:
            if "fork-based multiprocessing" in str(exc):
                return  # a forked child: PyTorch refuses every backward here with this reason
            if "device_ready_queues_" not in str(exc):
                raise
            raise DeviceUnavailableError(
                f"{name} cannot run backward() in this process: a backward() ran before accelkit "
                "registered its device with PyTorch's autograd engine, which sets up its device "
                "queues once, at the first backward of a process. Start a new process that imports "
                "accelkit before its first backward: torch's backend autoload does so at "
                "`import torch` unless TORCH_DEVICE_BACKEND_AUTOLOAD=0 is set; otherwise put "
                "`import accelkit` at the top of the program."
            ) from None


def _backward_on_calling_thread() -> None:
    """Run ``backward()`` on the thread that calls it, as PyTorch does for CPU tensors.

    Otherwise PyTorch's autograd engine hands every backward of device tensors to a thread of
    its own per device and waits for it: two thread wake-ups per ``backward()``, about
    0.2-0.5 ms of a small training step on a 2-core machine, that buy nothing for a device
    whose kernels are driven by host Python under one interpreter lock. Kernels still run on
    their tensors' device (see :mod:`accelkit._runtime.device.devices`). PyTorch keeps this switch per thread: it is
    set here for the activating thread, where training loops run, and at their first backward
    for the others (:func:`accelkit._runtime.patches.install_backward_on_calling_thread`, which says why);
    ``torch.autograd.set_multithreading_enabled(True)`` restores the device threads.
    """
    run_backward_on_this_thread()
    install_backward_on_calling_thread()


def _install(ctx: BackendContext) -> None:
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    register_device_guard()
    if ctx.devices is not None:
        # The native guard replaces the Python one (registered at import, before any backward).
        from accelkit import _native

        native = _native.load()
        native.install_guard(ctx.device_count, lambda index: ctx.allocators[index].synchronize())
        tensors.use_native_devices(native)
    module = DeviceModule(ctx)
    _install_native_hooks(ctx, module)
    install_flex_attention(ctx.name)
    install_triton_interpreter()
    _setup_privateuseone_for_python_backend(  # its Python hooks stand in if the native ones are absent
        rename=ctx.name, backend_module=module, hook=_Hooks(ctx), device_guard=_guard or _Guard()
    )
    _check_autograd_engine(ctx)
    _backward_on_calling_thread()
    global _pipeline
    pipeline = _pipeline = Pipeline(ctx)
    kernels = _KernelLibrary(ctx, torch.library.Library("aten", "IMPL"))
    native_views = _install_native_views()
    runtime_ops = core_ops(ctx)
    native_factories = _install_native_empty(ctx, runtime_ops)
    for op, fn in runtime_ops.items():
        if op not in native_views and op not in native_factories:
            kernels.impl(op, fn, "PrivateUse1")
        registered[op] = "runtime"
    owned = set(runtime_ops)
    # Every native kernel goes behind PyTorch's number-fits-the-dtype check (a no-op wrapper
    # for the ops the CPU does not check; see _scalar_checks).
    native_front = _native_front()
    for entry in ctx.kernels:
        kernel = _native_kernel(ctx, pipeline, entry.op, entry.fn)
        if native_front is None or is_inplace_op(entry.op) or not pipeline.install_native_front(
                native_front, entry.op, entry.fn, kernel):
            kernels.impl(entry.op, kernel, "PrivateUse1")
        owned.add(entry.op)
        registered[entry.op] = "kernel"
    for entry in ctx.kernels:
        if not entry.derive_variants:
            continue
        inplace, out = variants_of(entry.op)
        if inplace is not None and inplace not in owned:
            kernels.impl(inplace, guard(ctx, inplace, pipeline.native_inplace(inplace, entry.fn)), "PrivateUse1")
            owned.add(inplace)
            registered[inplace] = "derived"
        if out is not None and out not in owned:
            kernels.impl(out, guard(ctx, out, pipeline.native_out(out, entry.fn, entry.op)), "PrivateUse1")
            owned.add(out)
            registered[out] = "derived"
    for op in (*CPU_EQUIVALENTS, *ROUTED_COMPOSITES):
        # Device-hook ops have a CompositeExplicitAutograd kernel that only raises, and a few
        # others one that is wrong on PrivateUse1; either would win over the boxed fallback,
        # so route them into the pipeline explicitly.
        if op not in owned:
            kernels.impl(op, functools.partial(pipeline.fallback, op), "PrivateUse1")
            registered[op] = "routed"
    install_attention(kernels)
    for op in HOST_MEMORY_COMPOSITES:
        if op not in owned:
            kernels.impl(op, functools.partial(pipeline.cpu_fallback, op), "PrivateUse1")
            registered[op] = "host"
            if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
                # Such a kernel also runs above the backend, on the autograd key: take that too
                # (the CPU's own composite records no autograd graph either).
                kernels.impl(op, _below_autograd(op), "AutogradPrivateUse1")
    fallbacks = torch.library.Library("_", "IMPL")
    fallback = pipeline.fallback
    if ctx.devices is not None:
        fallback = _devices.on_op_device(ctx.name, ctx.devices, None, fallback, boxed=True)
    fallbacks.fallback(fallback, dispatch_key="PrivateUse1")
    fallbacks.fallback(torch.library.fallthrough_kernel, dispatch_key="AutocastPrivateUse1")
    autocast = torch.library.Library("aten", "IMPL")
    install_autocast(autocast, ctx.name, ctx.autocast)
    install_grad_scaler(ctx)
    _libraries.extend((kernels.library, fallbacks, autocast))
    install_serialization(ctx)
    tensors.install_storage_resize(ctx)
    _install_formatting(ctx)
    from accelkit._runtime.compile.graph_compiler import CACHE_ENV, GraphCompiler

    if os.environ.get(CACHE_ENV) and isinstance(ctx.compiler, GraphCompiler):
        ctx.compiler.use_cache_directory()  # eager programs use the persistent cache too


def _below_autograd(op: OpOverload) -> Callable:
    def redispatch(*args: Any, **kwargs: Any) -> Any:
        with torch._C._AutoDispatchBelowADInplaceOrView():
            return op(*args, **kwargs)

    return redispatch


class _KernelLibrary:
    """A ``torch.library.Library`` whose PrivateUse1 kernels run on their op's device when the
    process has several (see :mod:`accelkit._runtime.device.devices`)."""

    def __init__(self, ctx: BackendContext, library: torch.library.Library):
        self.ctx, self.library = ctx, library

    def impl(self, op: Any, fn: Callable, dispatch_key: str) -> None:
        if self.ctx.devices is not None:
            fn = _devices.on_op_device(self.ctx.name, self.ctx.devices, op, fn)
        self.library.impl(op, fn, dispatch_key)


def _native_kernel(ctx: BackendContext, pipeline: Pipeline, op: OpOverload, fn: Callable) -> Callable:
    """The PrivateUse1 kernel for a backend kernel ``fn`` of ``op`` (functional or in-place), behind
    PyTorch's number-fits-the-dtype check (a no-op wrapper for the ops the CPU does not check)."""
    wrap = pipeline.native_inplace if is_inplace_op(op) else pipeline.native
    return guard(ctx, op, wrap(op, fn))


def register_kernel(op: OpOverload, fn: Callable) -> None:
    """Install ``fn`` as the active backend's native kernel for ``op`` after activation, wrapped
    exactly as a kernel of the backend's table is (dispatch pipeline, scalar checks).

    :raises AccelkitError: no backend is active, or ``op`` already has a PrivateUse1 kernel
        (the message names the op).
    """
    ctx, pipeline = _active, _pipeline
    if ctx is None or pipeline is None:
        raise AccelkitError(
            f"registering a kernel for {op} needs an active backend: call accelkit.select_device() first"
        )
    if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "PrivateUse1"):
        raise AccelkitError(f"{op} already has a {ctx.name} kernel; a kernel is registered once per process")
    namespace = op._schema.name.split("::")[0]
    library = _KernelLibrary(ctx, torch.library.Library(namespace, "IMPL"))
    library.impl(op, _native_kernel(ctx, pipeline, op, fn), "PrivateUse1")
    _libraries.append(library.library)
    registered[op] = "kernel"


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


__all__ = ["activate", "active", "conflict_error", "register_device_guard", "register_kernel"]
