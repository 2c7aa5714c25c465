"""``torch.autocast(<device>)``: a fallthrough for every op, and cast kernels for the policy's ops.

PyTorch 2.13 gives the PrivateUse1 autocast key no fallthrough, so without one every op fails
under autocast. On top of it, the backend's :class:`~accelkit.sdk.AutocastPolicy` decides which
ops run in the low dtype, which in float32 and which at the widest input dtype — as on CUDA.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._C import DispatchKey, DispatchKeySet
from torch._ops import OpOverload

from accelkit.sdk import AutocastPolicy

_AUTOCAST = DispatchKeySet(DispatchKey.AutocastPrivateUse1)
_LOW = (torch.float16, torch.bfloat16)


def _overloads(names: tuple[str, ...]) -> Iterator[OpOverload]:
    for name in names:
        packet = getattr(torch.ops.aten, name, None)
        if packet is None:
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if not any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
                yield op


def _map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(v, fn) for v in value)
    return value


def _floating_dtypes(values: Any, device: str) -> Iterator[torch.dtype]:
    for v in values:
        if isinstance(v, torch.Tensor):
            if v.device.type == device and v.is_floating_point():
                yield v.dtype
        elif isinstance(v, (list, tuple)):
            yield from _floating_dtypes(v, device)


def _cast_kernel(op: OpOverload, device: str, rule: str) -> Callable:
    def run(*args: Any, **kwargs: Any) -> Any:
        if rule == "lower":
            target = torch.get_autocast_dtype(device)
            eligible = (torch.float32, *_LOW)
        elif rule == "float32":
            target, eligible = torch.float32, _LOW
        else:
            present = list(_floating_dtypes((*args, *kwargs.values()), device))
            target = max(present, key=lambda d: (d.itemsize, d == torch.float16), default=None)
            eligible = (torch.float32, torch.float64, *_LOW)

        def cast(t: torch.Tensor) -> torch.Tensor:
            if target is not None and t.device.type == device and t.dtype in eligible and t.dtype != target:
                return t.to(target)
            return t

        args = _map_tensors(args, cast)
        kwargs = {k: _map_tensors(v, cast) for k, v in kwargs.items()}
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST):
            return op(*args, **kwargs)

    return run


def install_autocast(lib: torch.library.Library, device: str, policy: AutocastPolicy) -> None:
    """Register the policy's cast kernels on ``AutocastPrivateUse1`` through ``lib``."""
    for rule, names in (
        ("lower", policy.lower_precision),
        ("float32", policy.float32),
        ("promote", policy.promote),
    ):
        for op in _overloads(names):
            lib.impl(op, _cast_kernel(op, device, rule), "AutocastPrivateUse1")
