"""The backend contract: every hook a device backend may implement.

A backend is a plugin module (or object) registered through the entry-point group
``accelkit.backends``. It announces itself with :func:`accelkit_register_backend`; every other
hook is called on the plugin that announced the backend and on no other, so a backend's module
is a list of plain ``@hookimpl`` functions. An implementation names only the arguments it uses
(pluggy passes those and no others): ``def accelkit_kernels(): ...`` is complete. ``name``, on
every per-backend hook, is the backend's own name, for a plugin object that serves several
instances of one class. Mind that pluggy also passes a parameter *with a default* whose name
is a spec argument's: ``def device_model(name=None)`` as ``accelkit_device_model`` receives
the backend's name.

Every spec's docstring says, in this order: what the hook answers; its kind; its parameters;
what it returns and what ``None`` (or leaving the hook out) means; who calls it and when.

Kinds:

- *firstresult*: the plugin's answer, or ``None``.
- *1:N*: pluggy collects every implementation's answer in a list; called on the owning plugin
  only, so the list has at most one answer.

Leaving out an optional hook is always allowed: the core's default applies (stated per hook),
or the area is reported as not supported (compiler, collectives). Nothing a hook raises
crashes the core: it becomes a :class:`accelkit.PluginError` naming the plugin and the hook.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    import torch

    from accelkit.sdk import (
        AutocastPolicy,
        BackendInfo,
        DeviceAllocator,
        DeviceModel,
        DeviceProbe,
        DtypeRules,
        Estimate,
        Expectations,
        KernelTable,
    )

PROJECT = "accelkit"
hookspec = pluggy.HookspecMarker(PROJECT)
#: Marks a backend's hook implementations (re-exported as ``accelkit.sdk.hookimpl``).
hookimpl = pluggy.HookimplMarker(PROJECT)


# ---------------------------------------------------------------------------------------------
# Discovery
# ---------------------------------------------------------------------------------------------


@hookspec
def accelkit_register_backend() -> BackendInfo | None:
    """Announce the backend this plugin hosts: its name, selection priority and defaults.

    Kind: 1:N, on the plugin being loaded.

    :returns: the backend's :class:`accelkit.sdk.BackendInfo`; ``None``: the plugin hosts no
        backend, and none of its other hooks is ever called.

    Called by the core once per plugin, when plugins are loaded (``import accelkit``'s first
    use of the registry). Must be cheap: no device is opened and no heavy library imported.
    """


@hookspec(firstresult=True)
def accelkit_probe(name: str) -> DeviceProbe | None:
    """Tell whether the backend can run here, on real hardware or simulated.

    Kind: firstresult. Required.

    :param name: the backend's name.
    :returns: a :class:`accelkit.sdk.DeviceProbe` (available, simulated, device count, target,
        reason); ``None`` or a missing hook: unavailable, the reason says the hook is missing.

    Called by the core once per process, on the first selection or ``accelkit devices``. It
    may look for hardware but must not allocate device memory; an exception it raises becomes
    the reason the backend is unavailable.
    """


# ---------------------------------------------------------------------------------------------
# Device
# ---------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelkit_device_model(name: str) -> DeviceModel | None:
    """Describe the target the backend runs as: capacity, bandwidth, peak FLOPs, dtypes.

    Kind: firstresult. Required for activation.

    :param name: the backend's name.
    :returns: a :class:`accelkit.sdk.DeviceModel`, data with a source per figure; ``None``:
        the backend cannot be activated (the error names this hook).

    Called by the core at activation, before the allocator is made. The record backs
    ``torch.<name>.get_device_properties()``, the allocator's capacity and
    :func:`accelkit.sdk.active_device_model`.
    """


@hookspec(firstresult=True)
def accelkit_target_model(name: str, target: str) -> DeviceModel | None:
    """Describe one of the backend's generations by its name, without activating the backend.

    Kind: firstresult. Optional: without it, tools that work from a saved run report
    (``accelkit project``) cannot price that backend's targets and say so.

    :param name: the backend's name.
    :param target: a generation as a user spells it (``"v6e"``, ``"trn1"``).
    :returns: that generation's :class:`accelkit.sdk.DeviceModel` (the same record
        :func:`accelkit_device_model` gives when it is the one selected), or ``None`` when it is
        not one of this backend's generations.

    Must not probe hardware or allocate: it is data.
    """


@hookspec
def accelkit_backend_activated(name: str, device: torch.device, device_model: DeviceModel) -> None:
    """React to the backend becoming this process's PrivateUse1 device.

    Kind: 1:N, on the owning plugin. Optional.

    :param name: the activated backend.
    :param device: ``torch.device(name, 0)``.
    :param device_model: the record :func:`accelkit_device_model` returned.
    :returns: nothing.

    Called by the core once, after PrivateUse1 is taken and the runtime installed: the place
    for lazy initialisation that must not happen at load time (opening a PJRT client, say).
    If it raises, activation fails and no backend can be activated in this process.
    """


# ---------------------------------------------------------------------------------------------
# Allocator / buffers
# ---------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelkit_make_allocator(name: str, device_model: DeviceModel, index: int) -> DeviceAllocator | None:
    """Create the allocator that owns one device's memory.

    Kind: firstresult. Required for activation.

    :param name: the backend's name.
    :param device_model: the record from :func:`accelkit_device_model`; its ``memory_bytes``
        is the capacity of each device.
    :param index: which device (``name:index``), from 0 to the probe's ``device_count`` - 1.
        Each device has its own allocator, so its own accounting and capacity; the results
        that the runtime hands an allocator come from kernels run on its device.
    :returns: a subclass of :class:`accelkit.sdk.DeviceAllocator`, which adds caching,
        statistics and the capacity check (``torch.OutOfMemoryError``) around the backend's
        raw primitives; ``None``: the backend cannot be activated.

    Called by the core at activation, once per device.
    """


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelkit_kernels(name: str) -> KernelTable | None:
    """Return the backend's native kernels, keyed by aten overload.

    Kind: firstresult. Optional.

    :param name: the backend's name.
    :returns: a :class:`accelkit.sdk.KernelTable`; kernels compute on backend arrays, never on
        torch tensors, and the runtime derives in-place and ``out=`` variants of functional
        kernels. ``None``: no native kernels, everything goes through decompositions and the
        CPU fallback.

    Called by the core at activation, once; kernels added later go through
    :func:`accelkit.sdk.register_kernel`.
    """


@hookspec(firstresult=True)
def accelkit_decompositions(name: str) -> Mapping[Any, Callable] | None:
    """Return the decompositions the runtime may use for ops without a native kernel.

    Kind: firstresult. Optional.

    :param name: the backend's name.
    :returns: aten overload -> decomposition; an empty mapping disables decomposition.
        ``None``: :func:`accelkit.sdk.default_decompositions` (PyTorch's core-ATen table).

    Called by the core at activation, once.
    """


@hookspec(firstresult=True)
def accelkit_dtype_rules(name: str) -> DtypeRules | None:
    """State which dtypes the device holds and what the error says about the others.

    Kind: firstresult. Optional.

    :param name: the backend's name.
    :returns: :class:`accelkit.sdk.DtypeRules`; ``None``: every dtype is held.

    Called by the core at activation, once. The runtime enforces the rules wherever device
    memory is allocated, so an unsupported dtype fails with a message naming it and the fix
    and never silently changes results.
    """


@hookspec(firstresult=True)
def accelkit_autocast_policy(name: str) -> AutocastPolicy | None:
    """Return the lower-precision policy for ``torch.autocast(<name>)``.

    Kind: firstresult. Optional.

    :param name: the backend's name.
    :returns: an :class:`accelkit.sdk.AutocastPolicy`; ``None``:
        :data:`accelkit.sdk.CUDA_LIKE_AUTOCAST` (matmul/linear/conv/bmm/baddbmm in the low
        dtype, bfloat16 preferred; reductions and losses in float32).

    Called by the core at activation, and by the conformance suite's autocast tests.
    """


# ---------------------------------------------------------------------------------------------
# Compiler
# ---------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelkit_make_compiler(name: str) -> Callable | None:
    """Return a ``torch.compile`` backend for graphs on this device.

    Kind: firstresult. Optional.

    :param name: the backend's name.
    :returns: a callable with the ``torch.compile`` backend signature
        ``(gm, example_inputs) -> callable``, normally ``accelkit.sdk.graph_compiler(lowering)``; ``None`` or a missing hook: compilation is not
        supported, and ``torch.compile(backend=name)`` fails saying so.

    Called by the core at activation, so it must be cheap: import compiler machinery inside
    the returned callable. For ``backend="<name>"`` to resolve, the backend's package also
    declares ``<name> = "accelkit.sdk.dynamo_backends:<name>"`` in the entry-point group
    ``torch_dynamo_backends``.
    """


# ---------------------------------------------------------------------------------------------
# Collectives
# ---------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelkit_make_process_group(
    name: str, store: Any, rank: int, world_size: int, timeout: Any
) -> Any | None:
    """Create a c10d process group for tensors on this device.

    Kind: firstresult. Optional. Called by c10d (through the runtime) for every group created on
    the backend: ``init_process_group("<name>")``, ``new_group``, device meshes.

    :param name: the backend's name.
    :param store: the c10d store of the group's rendezvous.
    :param rank: this process's rank in the group.
    :param world_size: the number of processes in the group.
    :param timeout: the group's timeout (a ``datetime.timedelta``).
    :returns: a ``torch.distributed.ProcessGroup`` implementing c10d's collectives (allreduce,
        broadcast, reduce, allgather, all_gather_single, reduce_scatter, reduce_scatter_single,
        alltoall, alltoall_base, gather, scatter, send, recv, barrier);
        :func:`accelkit.sdk.host_staged_process_group` is the shared one. A missing hook:
        ``init_process_group("<name>")`` raises, saying the backend has no collectives.
    """


# ---------------------------------------------------------------------------------------------
# Conformance and reporting
# ---------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelkit_conformance_expectations(name: str) -> Expectations | None:
    """Declare what the backend knowingly does not support, each entry with a reason.

    Kind: firstresult. Optional.

    :param name: the backend's name.
    :returns: :class:`accelkit.sdk.Expectations`. A missing hook: the ``conformance.toml``
        next to the plugin's module, when there is one, else no declared gaps; ``None``: no
        declared gaps.

    Called by the conformance suite before a run; each entry becomes a declared skip or an
    expected failure.
    """


@hookspec
def accelkit_stats(name: str) -> dict[str, Any] | None:
    """Contribute backend-specific sections to :func:`accelkit.stats`.

    Kind: 1:N, on the owning plugin. Optional.

    :param name: the backend's name.
    :returns: a dict merged into the stats under its keys (compile-cache counts, estimated
        device time, ...); ``None``: nothing to add.

    Called by :func:`accelkit.stats` while the backend is active.
    """


@hookspec(firstresult=True)
def accelkit_estimate(name: str) -> Estimate | None:
    """Estimate how long the work since the last reset would take on the backend's target.

    Kind: firstresult. Optional.

    :param name: the backend's name.
    :returns: an :class:`accelkit.sdk.Estimate` (target, seconds, per-op seconds, how it was
        estimated); ``None`` or a missing hook: the backend makes no estimate (``stats()``
        says ``"estimate": None``).

    Called by :func:`accelkit.stats` while the backend is active; zeroed with the rest by
    ``accelkit_reset_stats``.
    """


@hookspec
def accelkit_reset_stats(name: str) -> None:
    """Zero the backend-specific statistics contributed by :func:`accelkit_stats`.

    Kind: 1:N, on the owning plugin. Optional. Compile caches are not statistics and stay.

    :param name: the backend's name.
    :returns: nothing.

    Called by :func:`accelkit.reset_stats` while the backend is active.
    """
