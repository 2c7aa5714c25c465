"""``torch.<name>.Stream``, ``Event`` and the stream context: honest in-order semantics.

An accelkit device runs its work in program order on one queue, so every stream of a device is
that queue (``stream_id`` 0, the default stream the device guard gives PrivateUse1): waits
between streams hold trivially, ``record_stream`` has nothing to protect, and code written for
CUDA streams (DDP, FSDP2's all-gather and reduce-scatter streams) runs correctly, without
overlap. An event marks the point in that order where it was recorded; its timestamp is taken
after the device finished the work queued before it, so ``elapsed_time`` measures device work.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch


def stream_class(device_type: str, current_index: Callable[[], int]) -> type:
    class Stream(torch.Stream):
        """A stream of a device (default: the current one): its one in-order queue (see the
        module docstring)."""

        def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> Stream:
            return super().__new__(cls, device=_device(device_type, device, current_index), priority=priority)

    Stream.__qualname__ = Stream.__name__ = "Stream"
    Stream.__module__ = f"torch.{device_type}"
    return Stream


def event_class(device_type: str, synchronize: Callable[[], None], current_index: Callable[[], int]) -> type:
    class Event(torch.Event):
        """A point in the device's queue. ``synchronize()``/``query()`` see the work before it;
        with ``enable_timing=True``, ``elapsed_time(end)`` is the milliseconds of device work
        between two events."""

        def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                    **kwargs: Any) -> Event:
            event = super().__new__(cls, device=torch.device(device_type, current_index()), enable_timing=enable_timing,
                                    blocking=blocking, interprocess=interprocess)
            event._timing = enable_timing
            event._recorded_at = None
            return event

        def record(self, stream: Any = None) -> None:
            super().record(stream) if stream is not None else super().record()
            if self._timing:
                synchronize()
                self._recorded_at = time.perf_counter()

        def elapsed_time(self, end_event: Event) -> float:
            for event in (self, end_event):
                if not getattr(event, "_timing", False):
                    raise RuntimeError("elapsed_time needs both events created with enable_timing=True")
                if event._recorded_at is None:
                    raise RuntimeError("elapsed_time needs both events recorded first (event.record())")
            return (end_event._recorded_at - self._recorded_at) * 1000.0

        def synchronize(self) -> None:
            synchronize()

        def query(self) -> bool:
            synchronize()
            return True

    Event.__qualname__ = Event.__name__ = "Event"
    Event.__module__ = f"torch.{device_type}"
    return Event


def _device(device_type: str, device: Any, current_index: Callable[[], int]) -> torch.device:
    if device is None:
        return torch.device(device_type, current_index())
    if isinstance(device, int):
        return torch.device(device_type, device)
    return torch.device(device)


@contextlib.contextmanager
def stream_context(device_type: str, stream: Any) -> Iterator[Any]:
    """``torch.<name>.stream(s)``: runs the block on ``s``, which is the device's one queue."""
    if stream is not None and stream.device.type != device_type:
        raise ValueError(f"torch.{device_type}.stream() needs a {device_type} stream, got {stream}")
    yield stream
