"""Plain records a backend hands to the core: who it is, whether it can run, what it runs as."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

FALLBACK_POLICIES = ("deny", "warn", "allow")


@dataclass(frozen=True, slots=True)
class BackendInfo:
    """What a plugin says about its backend when it is loaded (see ``accelkit_register_backend``).

    :ivar name: the device type users write (``"tpu"``); becomes the PrivateUse1 name.
    :ivar priority: order among *real* accelerators in automatic selection; higher wins.
    :ivar description: one line for ``accelkit devices``.
    :ivar default_fallback: CPU-fallback policy when ``ACCELKIT_FALLBACK`` is unset:
        ``"deny"``, ``"warn"`` or ``"allow"``.
    """

    name: str
    priority: int = 0
    description: str = ""
    default_fallback: str = "warn"

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or not self.name.islower():
            raise ValueError(
                f"backend name {self.name!r} must be a lower-case identifier, e.g. 'tpu'"
            )
        if self.default_fallback not in FALLBACK_POLICIES:
            raise ValueError(
                f"backend {self.name!r}: default_fallback must be one of {FALLBACK_POLICIES}, "
                f"not {self.default_fallback!r}"
            )


@dataclass(frozen=True, slots=True)
class DeviceProbe:
    """The answer to "can this backend run here?" (see ``accelkit_probe``).

    :ivar available: the backend can be activated in this process.
    :ivar simulated: it runs on a model of the hardware, not the hardware. Automatic selection
        never picks a simulated backend; it must be named.
    :ivar device_count: devices visible to this process.
    :ivar target: the hardware generation it runs as (``"v5e"``, ``"trn2"``), if any.
    :ivar reason: why it is unavailable (required when ``available`` is False), or a note.
    """

    available: bool
    simulated: bool
    device_count: int = 0
    target: str | None = None
    reason: str | None = None

    def __post_init__(self) -> None:
        if not self.available and not self.reason:
            raise ValueError("an unavailable DeviceProbe must say why (reason=...)")


def _frozen(mapping: Mapping | None) -> Mapping:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class DeviceModel:
    """A target generation as data: every figure the simulators and estimates read.

    :ivar name: target name, e.g. ``"v5e"`` or ``"host"``.
    :ivar vendor: who makes it.
    :ivar memory_bytes: device memory per device; the allocator's capacity.
    :ivar memory_bandwidth: bytes per second, if known.
    :ivar peak_flops: peak FLOP/s per dtype.
    :ivar dtypes: dtypes the device holds natively.
    :ivar simulated: whether this process runs a model of the target rather than the target.
    :ivar sources: where each figure comes from, keyed by field name.
    :ivar extra: further figures (MXU shape, SBUF size, ...), also with sources.
    """

    name: str
    vendor: str
    memory_bytes: int
    memory_bandwidth: float | None = None
    peak_flops: Mapping[torch.dtype, float] = field(default_factory=dict)
    dtypes: frozenset[torch.dtype] = frozenset()
    simulated: bool = False
    sources: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.memory_bytes <= 0:
            raise ValueError(f"device model {self.name!r}: memory_bytes must be positive")
        object.__setattr__(self, "peak_flops", _frozen(self.peak_flops))
        object.__setattr__(self, "sources", _frozen(self.sources))
        object.__setattr__(self, "extra", _frozen(self.extra))
        object.__setattr__(self, "dtypes", frozenset(self.dtypes))


class UnsupportedDtypeError(TypeError):
    """A dtype the device cannot hold was asked for; the message names it and the way out."""


@dataclass(frozen=True)
class DtypeRules:
    """Which dtypes a device holds, and the policy for the rest (see ``accelkit_dtype_rules``).

    :ivar supported: dtypes device memory may hold.
    :ivar hint: the fix to print when another dtype is asked for, e.g. "cast to float32 first".
    """

    supported: frozenset[torch.dtype]
    hint: str = ""

    def check(self, dtype: torch.dtype, device: str) -> None:
        """Raise :class:`UnsupportedDtypeError` unless ``dtype`` is supported on ``device``."""
        if dtype not in self.supported:
            raise UnsupportedDtypeError(f"{dtype} is not supported on {device}. {self.hint}".rstrip())


@dataclass(frozen=True)
class Expectations:
    """A backend's declared gaps; each value is the reason (see ``accelkit_conformance_expectations``).

    :ivar unsupported: ops or features the backend will not support.
    :ivar known_failures: ops or features that fail today and should (expected failures).
    :ivar unsupported_dtypes: dtypes, by name, that the device cannot hold.
    """

    unsupported: Mapping[str, str] = field(default_factory=dict)
    known_failures: Mapping[str, str] = field(default_factory=dict)
    unsupported_dtypes: Mapping[str, str] = field(default_factory=dict)
