"""Several devices per process: one allocator per device, and every op on its tensors' device.

With one device (the default) nothing here is installed: ``ctx.allocator`` is that device's
allocator and kernels run as registered. With more (the probe's ``device_count`` > 1, e.g.
``ACCELKIT_TPU_DEVICES=4``), accelkit's native extension (:mod:`accelkit._native`) gives
PyTorch a device guard with a current device per thread and makes tensors at any index, and:

- ``ctx.allocator`` is a :class:`CurrentDeviceAllocator`: the allocator of the current device;
- every PrivateUse1 kernel runs with the current device switched to its op's device
  (:func:`on_op_device`), as CUDA's generated kernels do with a device guard: the device of its
  device tensors (all on one, else PyTorch's "Expected all tensors to be on the same device"),
  else the factory's ``device=``, else the current one. So memory for results is taken from
  the device their inputs are on, and a backend's kernels see one device's arrays at a time;
- copies between two devices are the only ops that take tensors of two devices.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from accelkit.sdk import DeviceAllocator

aten = torch.ops.aten

#: Ops that move data between two devices of the backend, routed by their destination.
CROSS_DEVICE_OPS = frozenset({
    aten.copy_.default, aten._copy_from.default, aten._copy_from_and_resize.default, aten._to_copy.default,
})


class CurrentDeviceAllocator:
    """The allocator of the calling thread's current device, for a process with several.

    Every method of the backend's allocator is forwarded at call time, so a method taken once
    (``read = ctx.allocator.read``) still reaches the allocator of the device current when it
    is called. ``allocators[i]`` is device ``i``'s own.
    """

    def __init__(self, allocators: Sequence[DeviceAllocator], current_device: Callable[[], int]):
        self.allocators = tuple(allocators)
        self._current_device = current_device
        kind = type(self.allocators[0])
        for name in dir(kind):
            if not name.startswith("__") and callable(getattr(kind, name)):
                setattr(self, name, self._forwarded(name))

    def _forwarded(self, name: str) -> Callable[..., Any]:
        allocators, current_device = self.allocators, self._current_device

        def forward(*args: Any, **kwargs: Any) -> Any:
            return getattr(allocators[current_device()], name)(*args, **kwargs)

        forward.__name__ = name
        return forward

    def __getattr__(self, name: str) -> Any:  # data attributes: device, capacity, ...
        return getattr(self.allocators[self._current_device()], name)


class DeviceSwitch:
    """The native guard's current device, as the runtime uses it."""

    def __init__(self, native: Any):
        self.current = native.current_device
        self.exchange = native.exchange_device
        self._set = native.set_device

    def set(self, index: int) -> None:
        self._set(index)

    @contextlib.contextmanager
    def on(self, index: int) -> Iterator[None]:
        """Make ``index`` the current device for the block (and restore the previous one)."""
        previous = self.exchange(index)
        try:
            yield
        finally:
            self._set(previous)


def _same_device_error(name: str, first: int, other: int) -> RuntimeError:
    return RuntimeError(
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"{name}:{first} and {name}:{other}! Move them to one device with .to('{name}:{first}')."
    )


def op_device(name: str, args: tuple, kwargs: dict, cross_device: bool) -> int | None:
    """The device index an op with these arguments runs on, or None for "the current one".

    :raises RuntimeError: device tensors of two devices, unless ``cross_device`` (a copy,
        whose destination, its first device tensor, decides).
    """
    found = None
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            candidates: Any = (value,)
        elif isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
            candidates = value
        else:
            continue
        for tensor in candidates:
            if not isinstance(tensor, torch.Tensor):
                continue
            device = tensor.device
            if device.type != name:
                continue
            if found is None:
                found = device.index
                if cross_device:
                    return found
            elif device.index != found:
                raise _same_device_error(name, found, device.index)
    if found is None:
        device = kwargs.get("device")
        if device is not None:
            device = torch.device(device)
            if device.type == name and device.index is not None:
                return device.index
    return found


def on_op_device(name: str, switch: DeviceSwitch, op: Any, kernel: Callable[..., Any],
                 boxed: bool = False) -> Callable[..., Any]:
    """``kernel`` run with the current device switched to its op's device (:func:`op_device`).
    ``boxed``: the kernel is the boxed fallback, called as ``kernel(op, *args, **kwargs)``."""
    exchange, restore = switch.exchange, switch.set

    if boxed:
        @functools.wraps(kernel)
        def run_boxed(op: Any, *args: Any, **kwargs: Any) -> Any:
            index = op_device(name, args, kwargs, op in CROSS_DEVICE_OPS)
            if index is None:
                return kernel(op, *args, **kwargs)
            previous = exchange(index)
            try:
                return kernel(op, *args, **kwargs)
            finally:
                restore(previous)

        return run_boxed

    cross_device = op in CROSS_DEVICE_OPS

    @functools.wraps(kernel)
    def run(*args: Any, **kwargs: Any) -> Any:
        index = op_device(name, args, kwargs, cross_device)
        if index is None:
            return kernel(*args, **kwargs)
        previous = exchange(index)
        try:
            return kernel(*args, **kwargs)
        finally:
            restore(previous)

    return run


def on_inputs_device(name: str, switch: DeviceSwitch, program: Callable[..., Any]) -> Callable[..., Any]:
    """A compiled program run with the current device switched to its inputs' device, so its
    results are on it (the backward runs in the autograd engine's thread for that device,
    which the engine has already switched). Keeps Dynamo's boxed calling convention."""
    exchange, restore = switch.exchange, switch.set

    def run(*args: Any) -> Any:
        inputs = args[0] if len(args) == 1 and isinstance(args[0], list) else args
        index = op_device(name, tuple(t for t in inputs if isinstance(t, torch.Tensor)), {}, False)
        if index is None:
            return program(*args)
        previous = exchange(index)
        try:
            return program(*args)
        finally:
            restore(previous)

    run._boxed_call = getattr(program, "_boxed_call", False)  # type: ignore[attr-defined]
    return functools.update_wrapper(run, program) if hasattr(program, "__name__") else run
