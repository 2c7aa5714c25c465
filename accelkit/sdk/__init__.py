"""The backend-author SDK: everything a device backend is built from.

The in-tree backends (``ref``, ``tpu``, ``neuron``) and the conformance suite use exactly this
surface; a third-party backend needs nothing else (a test keeps it so). A backend is a plugin
module of plain ``@hookimpl`` functions (see :mod:`accelkit.hookspecs`) registered under the
entry-point group ``accelkit.backends``; ``accelkit new-backend NAME`` writes one.

- records: :class:`BackendInfo`, :class:`DeviceProbe`, :class:`DeviceModel`,
  :class:`DtypeRules`, :class:`Expectations`, :class:`Estimate` (estimated time on the
  target: device time, and launch time by :class:`LaunchLedger`'s rule, the same on every
  backend);
- memory: :class:`DeviceAllocator` (the base a backend's allocator subclasses), :class:`Buffer`,
  :class:`ViewSpec`;
- kernels: :class:`KernelTable`, :class:`KernelEntry`, :class:`KernelDeclined`, autocast
  policies, :func:`default_decompositions`, :func:`meta_tensor` / :func:`meta_call` for output
  geometry, :func:`register_kernel` after activation;
- the active runtime: :func:`active_backend`, :func:`active_device_model`,
  :func:`device_generator`, :func:`device_draw`, :func:`op_coverage` (which path each aten
  overload takes);
- random numbers: :mod:`accelkit.sdk.random_stream`, the counter-based stream every device
  computes (Philox4x32-10 keyed by the seed, one counter per element, and each distribution's
  values written against an array namespace), and the :class:`RandomDraw` a random kernel gets
  in its ``generator`` argument (with a :class:`ShardWindow` for a DTensor shard);
- discovery, read-only: :func:`backends` (:class:`BackendView`);
- compiling: :class:`GraphLowering` (what a backend's compiler supplies) and
  :func:`graph_compiler` (the shared ``torch.compile`` machinery around it); the entry points
  Dynamo resolves ``backend="<name>"`` through: :mod:`accelkit.sdk.dynamo_backends`;
- collectives: :func:`host_staged_process_group` (the c10d process group
  ``accelkit_make_process_group`` answers with) and :class:`Interconnect` (the device model's
  network, for collective estimates);
- estimates on several targets in one run: :func:`requested_targets` (``ACCELKIT_ESTIMATE_ON``),
  :class:`TargetComparison`, :func:`other_backend_reason`;
- options: :func:`env_choice`, :func:`env_count`, :func:`device_count_from_env`, :func:`fast_compile`.
"""

from accelkit.hookspecs import hookimpl
from accelkit.sdk._active import (
    active_backend,
    active_device_model,
    as_overload,
    device_draw,
    device_generator,
    meta_call,
    meta_tensor,
    op_coverage,
    register_kernel,
)
from accelkit.sdk._collectives import host_staged_process_group
from accelkit.sdk._compile import (
    GraphLowering,
    GraphParts,
    ParameterInputs,
    ParameterStamp,
    graph_compiler,
    graph_parts,
)
from accelkit.sdk._allocator import Buffer, DeviceAllocator, ViewSpec, format_bytes, size_class
from accelkit.sdk._kernels import (
    CUDA_LIKE_AUTOCAST,
    AutocastPolicy,
    CallLayout,
    KernelDeclined,
    KernelEntry,
    KernelTable,
    default_decompositions,
)
from accelkit.sdk._records import (
    CAPABILITIES,
    FALLBACK_POLICIES,
    BackendInfo,
    DeviceModel,
    DeviceProbe,
    DtypeRules,
    Estimate,
    ExpectationRule,
    Expectations,
    Interconnect,
    Tolerance,
    UnsupportedDtypeError,
)
from accelkit.sdk._launches import LaunchLedger
from accelkit.sdk._targets import ESTIMATE_ON_ENV, TargetComparison, other_backend_reason, requested_targets
from accelkit.sdk._options import FAST_COMPILE_ENV, device_count_from_env, env_choice, env_count, fast_compile
from accelkit.sdk._registry_view import BackendView, backends
from accelkit.sdk import random_stream
from accelkit.sdk.random_stream import RandomDraw, ShardWindow

__all__ = [
    "CAPABILITIES",
    "CUDA_LIKE_AUTOCAST",
    "FALLBACK_POLICIES",
    "AutocastPolicy",
    "BackendInfo",
    "BackendView",
    "Buffer",
    "CallLayout",
    "DeviceAllocator",
    "DeviceModel",
    "DeviceProbe",
    "DtypeRules",
    "Estimate",
    "ExpectationRule",
    "Expectations",
    "ESTIMATE_ON_ENV",
    "FAST_COMPILE_ENV",
    "GraphLowering",
    "GraphParts",
    "Interconnect",
    "KernelDeclined",
    "KernelEntry",
    "KernelTable",
    "LaunchLedger",
    "ParameterInputs",
    "ParameterStamp",
    "TargetComparison",
    "RandomDraw",
    "ShardWindow",
    "Tolerance",
    "UnsupportedDtypeError",
    "ViewSpec",
    "active_backend",
    "active_device_model",
    "as_overload",
    "backends",
    "default_decompositions",
    "device_draw",
    "device_generator",
    "device_count_from_env",
    "env_choice",
    "env_count",
    "fast_compile",
    "format_bytes",
    "graph_compiler",
    "graph_parts",
    "host_staged_process_group",
    "hookimpl",
    "meta_call",
    "meta_tensor",
    "op_coverage",
    "other_backend_reason",
    "random_stream",
    "register_kernel",
    "requested_targets",
    "size_class",
]
