"""The active backend: everything the runtime needs about the device this process runs on."""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from accelkit._errors import AccelkitError, FallbackDeniedError
from accelkit._runtime.device.random import PhiloxGenerator
from accelkit._stats import OpCounters
from accelkit.sdk import (
    FALLBACK_POLICIES,
    AutocastPolicy,
    BackendInfo,
    DeviceAllocator,
    DeviceModel,
    DeviceProbe,
    DtypeRules,
    KernelTable,
)

FALLBACK_ENV = "ACCELKIT_FALLBACK"


def policy_from_env(default: str) -> str:
    """The fallback policy ``ACCELKIT_FALLBACK`` asks for, else ``default``."""
    value = os.environ.get(FALLBACK_ENV, "").strip().lower()
    if not value:
        return default
    if value not in FALLBACK_POLICIES:
        raise AccelkitError(
            f"{FALLBACK_ENV}={value!r} is not a fallback policy; use one of "
            f"{', '.join(FALLBACK_POLICIES)}"
        )
    return value


@dataclass
class BackendContext:
    """The process's active PrivateUse1 backend and its runtime state.

    Created once by :func:`accelkit._runtime.activate`; never replaced (one backend per process).
    """

    name: str
    info: BackendInfo
    probe: DeviceProbe
    model: DeviceModel
    allocator: DeviceAllocator
    kernels: KernelTable
    decompositions: Mapping[Any, Callable]
    dtype_rules: DtypeRules | None
    autocast: AutocastPolicy
    fallback_policy: str
    compiler: Callable | None = None
    #: One allocator per device; ``allocator`` is the only one, or, with several, the current
    #: device's (a :class:`~accelkit._runtime.device.devices.CurrentDeviceAllocator`).
    allocators: tuple[DeviceAllocator, ...] = ()
    #: The current-device switch of a process with several devices, else None.
    devices: Any = None
    #: The device generator (shared by the process's devices): a Philox state, the native
    #: extension's ``torch.Generator`` once it is installed, else a :class:`PhiloxGenerator`.
    generator: Any = field(default_factory=PhiloxGenerator)
    counters: OpCounters = field(default_factory=OpCounters)
    _warned: set = field(default_factory=set)
    _local: threading.local = field(default_factory=threading.local)

    @property
    def device(self) -> torch.device:
        return torch.device(self.name, 0)

    @property
    def device_count(self) -> int:
        return len(self.allocators) or 1

    def allocator_of(self, index: int) -> DeviceAllocator:
        """Device ``index``'s allocator."""
        return self.allocators[index] if self.allocators else self.allocator

    def current_index(self) -> int:
        return self.devices.current() if self.devices is not None else 0

    def on_device(self, index: int) -> contextlib.AbstractContextManager:
        """Run the block with ``index`` as the current device (a no-op with one device)."""
        return self.devices.on(index) if self.devices is not None else contextlib.nullcontext()

    def check_dtype(self, dtype: torch.dtype) -> None:
        # Formatting for print computes display statistics in float64, and GradScaler the
        # reciprocal of its scale; neither is the program's data, so the device's dtype rules
        # do not apply to them.
        rules = self.dtype_rules
        if rules is not None and dtype not in rules.supported and not getattr(self._local, "formatting", 0):
            if dtype == torch.float64 and getattr(self._local, "float64_bookkeeping", 0):
                return
            rules.check(dtype, f"{self.name}:0")

    # -- fallback policy -------------------------------------------------------------------

    def cpu_reason(self, op: Any) -> str | None:
        """Why the backend declared ``op`` CPU by design (``KernelTable.on_cpu``; an in-place or
        ``out=`` overload follows its functional op), or None for an op it did not declare."""
        from accelkit._runtime.dispatch.schema import functional_of

        reasons = self.kernels.cpu_reasons
        if op in reasons:
            return reasons[op]
        functional = functional_of(op)[0] if isinstance(op, torch._ops.OpOverload) else None
        return reasons.get(functional) if functional is not None else None

    def admit_fallback(self, op: Any) -> bool:
        """Apply the policy to a CPU fallback of ``op``; True when it should be counted.

        Raises :class:`FallbackDeniedError` under ``deny``; warns once per op under ``warn``.
        Both say the backend's reason for an op it declared CPU by design.
        Formatting a tensor for display is always admitted and not counted.
        """
        if getattr(self._local, "formatting", 0):
            return False
        if self.fallback_policy == "deny":
            reason = self.cpu_reason(op)
            if reason:
                why, remedy = f"{op} runs on the CPU by design on {self.name} ({reason})", ""
            elif op in self.kernels:  # it has a kernel, which handed these arguments to the CPU
                why = f"{op}'s {self.name} kernel declined these arguments"
                remedy = ", or extend the kernel to cover them"
            else:
                why = f"{op} has no kernel or decomposition on {self.name}"
                remedy = f", or give the {self.name} backend a kernel for this op"
            raise FallbackDeniedError(
                f"{why} and the CPU fallback is denied (policy 'deny'). Allow it with "
                f"{FALLBACK_ENV}=warn or accelkit.fallback_policy('allow'){remedy}."
            )
        if self.fallback_policy == "warn" and op not in self._warned:
            self._warned.add(op)
            reason = self.cpu_reason(op)
            what = (f"{op} runs on the CPU by design on {self.name}: {reason}" if reason else
                    f"{op} is not supported natively on {self.name}; running it on the CPU")
            warnings.warn(f"{what} (set {FALLBACK_ENV}=allow to silence, =deny to forbid)", stacklevel=3)
        return True

    @contextlib.contextmanager
    def float64_bookkeeping(self) -> Iterator[None]:
        """Let PyTorch's own library code on the current thread compute in float64 on a device
        whose rules refuse it (GradScaler's reciprocal of its scale)."""
        self._local.float64_bookkeeping = getattr(self._local, "float64_bookkeeping", 0) + 1
        try:
            yield
        finally:
            self._local.float64_bookkeeping -= 1

    @contextlib.contextmanager
    def formatting(self) -> Iterator[None]:
        """Mark the current thread as formatting a tensor for ``print``/``repr``."""
        self._local.formatting = getattr(self._local, "formatting", 0) + 1
        try:
            with self.counters.paused():
                yield
        finally:
            self._local.formatting -= 1
