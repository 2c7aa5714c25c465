"""``torch.<name>``: the device module, mirroring the ``torch.cuda`` essentials.

PyTorch itself calls a few of these (``is_available``, ``device_count``, ``current_device``,
the RNG functions, ``get_amp_supported_dtype``, ``device``); the rest serve user code that
was written for ``torch.cuda``.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from accelkit._runtime.device.context import BackendContext
from accelkit._runtime.device.streams import event_class, stream_class, stream_context
from accelkit.sdk import DeviceModel


@dataclass(frozen=True)
class DeviceProperties:
    """What ``torch.<name>.get_device_properties()`` returns.

    ``name`` is the hardware's name as its vendor's software reports it (``"TPU v5e"``,
    ``"trn2"``: the device model's ``product``), on a simulated device too, which ``simulated``
    says; ``get_device_name()`` adds the backend and whether it is simulated. ``peak_flops``
    holds the target's peak FLOP/s per dtype name (``"bfloat16"``) and ``sources`` where each
    figure comes from: model FLOP/s over ``peak_flops[dtype]`` is the MFU.
    """

    name: str
    vendor: str
    target: str
    total_memory: int
    simulated: bool
    memory_bandwidth: float | None
    peak_flops: dict[str, float] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, model: DeviceModel) -> DeviceProperties:
        return cls(
            name=model.product,
            vendor=model.vendor,
            target=model.name,
            total_memory=model.memory_bytes,
            simulated=model.simulated,
            memory_bandwidth=model.memory_bandwidth,
            peak_flops={str(d).removeprefix("torch."): f for d, f in model.peak_flops.items()},
            sources=dict(model.sources),
        )


class DeviceModule(types.ModuleType):
    """The module registered as ``torch.<name>`` for the active backend."""

    def __init__(self, ctx: BackendContext):
        super().__init__(f"torch.{ctx.name}", f"accelkit device module for {ctx.name!r}")
        self._ctx = ctx
        self.Stream = stream_class(ctx.name, ctx.current_index)
        self.Event = event_class(ctx.name, ctx.allocator.synchronize, ctx.current_index)

    # -- identity and availability ---------------------------------------------------------

    def is_available(self) -> bool:
        return self._ctx.probe.available

    def is_built(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    #: Read as a module attribute (like ``torch.cuda._initialized``) by torch.utils.checkpoint,
    #: which saves and restores the device RNG state for recomputation only when it is set.
    _initialized = True

    def init(self) -> None:
        """Nothing to do: the backend is initialised when it is activated."""

    def _is_in_bad_fork(self) -> bool:
        return False

    def device_count(self) -> int:
        """Devices usable as tensor locations in this process (``ACCELKIT_<NAME>_DEVICES`` for a
        simulated backend, default 1)."""
        return self._ctx.device_count if self._ctx.probe.available else 0

    def current_device(self) -> int:
        return self._ctx.current_index()

    def _index(self, device: Any) -> int:
        """The index ``device`` (None: the current device, an int, a string or torch.device) names."""
        if device is None:
            return self._ctx.current_index()
        if isinstance(device, int):
            index = device
        else:
            d = torch.device(device)
            if d.type != self._ctx.name:
                raise ValueError(f"expected a {self._ctx.name} device, got {d}")
            index = self._ctx.current_index() if d.index is None else d.index
        if index == -1:
            return self._ctx.current_index()
        count = self._ctx.device_count
        if not 0 <= index < count:
            raise ValueError(
                f"{self._ctx.name}:{index} does not exist: this process has {count} {self._ctx.name} "
                f"device(s); ACCELKIT_{self._ctx.name.upper()}_DEVICES sets how many a simulated "
                f"{self._ctx.name} has, or run one process per device (torch.distributed)"
            )
        return index

    def _allocator(self, device: Any) -> Any:
        return self._ctx.allocator_of(self._index(device))

    def set_device(self, device: Any) -> None:
        index = self._index(device)
        if self._ctx.devices is not None:
            self._ctx.devices.set(index)

    @contextlib.contextmanager
    def device(self, device: Any) -> Iterator[None]:
        """Context manager making ``device`` the current device for the block."""
        with self._ctx.on_device(self._index(device)):
            yield

    def synchronize(self, device: Any = None) -> None:
        """Wait until all work queued on the device is done."""
        self._allocator(device).synchronize()

    # -- streams (one in-order queue; see accelkit/_runtime/device/streams.py) -----------------------

    def current_stream(self, device: Any = None) -> torch.Stream:
        return self.Stream(self._index(device))

    default_stream = current_stream

    def set_stream(self, stream: torch.Stream) -> None:
        """Accepted for any stream of the device: they are all its one queue."""
        if stream.device.type != self._ctx.name:
            raise ValueError(f"torch.{self._ctx.name}.set_stream() needs a {self._ctx.name} stream, got {stream}")

    def stream(self, stream: torch.Stream | None) -> Any:
        return stream_context(self._ctx.name, stream)

    # -- properties ------------------------------------------------------------------------

    def get_device_properties(self, device: Any = None) -> DeviceProperties:
        self._index(device)
        return DeviceProperties.of(self._ctx.model)

    def get_device_name(self, device: Any = None) -> str:
        """The hardware's name, the backend running it and whether it is simulated:
        ``"TPU v5e (simulated tpu)"``."""
        props = self.get_device_properties(device)
        return f"{props.name} ({'simulated ' if props.simulated else ''}{self._ctx.name})"

    # -- RNG -------------------------------------------------------------------------------

    def manual_seed(self, seed: int) -> None:
        self._ctx.generator.manual_seed(int(seed))

    manual_seed_all = manual_seed

    def seed(self) -> None:
        self._ctx.generator.seed()

    seed_all = seed

    def initial_seed(self) -> int:
        return self._ctx.generator.initial_seed()

    def get_rng_state(self, device: Any = "cpu") -> torch.Tensor:
        return self._ctx.generator.get_state()

    def set_rng_state(self, new_state: torch.Tensor, device: Any = "cpu") -> None:
        self._ctx.generator.set_state(new_state)

    def get_rng_state_all(self) -> list[torch.Tensor]:
        """One state per device; the devices of a process share one generator, so they are equal."""
        return [self.get_rng_state() for _ in range(self.device_count())]

    def set_rng_state_all(self, new_states: list[torch.Tensor]) -> None:
        self.set_rng_state(new_states[0])

    # -- AMP -------------------------------------------------------------------------------

    def get_amp_supported_dtype(self) -> list[torch.dtype]:
        return list(self._ctx.autocast.dtypes)

    def is_bf16_supported(self, including_emulation: bool = True) -> bool:
        return torch.bfloat16 in self._ctx.autocast.dtypes

    # -- memory ----------------------------------------------------------------------------

    def memory_allocated(self, device: Any = None) -> int:
        return self._allocator(device).memory_allocated()

    def max_memory_allocated(self, device: Any = None) -> int:
        return self._allocator(device).max_memory_allocated()

    def memory_reserved(self, device: Any = None) -> int:
        return self._allocator(device).memory_reserved()

    def max_memory_reserved(self, device: Any = None) -> int:
        return self._allocator(device).max_memory_reserved()

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        self._allocator(device).reset_peak_stats()

    def empty_cache(self) -> None:
        for allocator in self._ctx.allocators or (self._ctx.allocator,):
            allocator.empty_cache()

    def memory_stats(self, device: Any = None) -> dict[str, int]:
        return self._allocator(device).memory_stats()

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        """``(free, total)`` bytes, where free excludes cached blocks."""
        allocator = self._allocator(device)
        return allocator.capacity - allocator.memory_reserved(), allocator.capacity
