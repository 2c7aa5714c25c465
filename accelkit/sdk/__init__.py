"""The backend-author SDK: everything a device backend is built from.

The in-tree backends (``ref``, ``tpu``, ``neuron``) use exactly this surface; a third-party
backend needs nothing else. A backend is a plugin module with ``@hookimpl`` functions (see
:mod:`accelkit.hookspecs`) registered under the entry-point group ``accelkit.backends``.
"""

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
    FALLBACK_POLICIES,
    BackendInfo,
    DeviceModel,
    DeviceProbe,
    DtypeRules,
    ExpectationRule,
    Expectations,
    Tolerance,
    UnsupportedDtypeError,
)
from accelkit._plugins import hookimpl

__all__ = [
    "CUDA_LIKE_AUTOCAST",
    "FALLBACK_POLICIES",
    "AutocastPolicy",
    "BackendInfo",
    "Buffer",
    "CallLayout",
    "DeviceAllocator",
    "DeviceModel",
    "DeviceProbe",
    "DtypeRules",
    "ExpectationRule",
    "Expectations",
    "KernelDeclined",
    "KernelEntry",
    "KernelTable",
    "Tolerance",
    "UnsupportedDtypeError",
    "ViewSpec",
    "default_decompositions",
    "format_bytes",
    "hookimpl",
    "size_class",
]
