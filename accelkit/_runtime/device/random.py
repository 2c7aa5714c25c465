"""The device generator and the draws random ops make from it.

The stream itself (Philox, counters, distributions) is defined in :mod:`accelkit.sdk.random_stream`.
Here: the generator's state when accelkit's native extension is unavailable
(:class:`PhiloxGenerator`; with it, the device generators are the native ones of
``accelkit/_native/generator.cpp``, with the same state and rules), and :func:`reserve`, which every
path of a random op goes through (native kernels, the CPU fallback, compiled programs): it resolves
the generator the op was given, takes the counters the op draws and advances the offset.

A DTensor random op runs inside DTensor's RNG tracker region; :func:`shard_window` (entered by the
tracker's accelkit patch, :mod:`accelkit._runtime.patches`) tells the next draw of the shard's size where the shard
lies in the whole tensor, so its elements take the counters they have there.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from accelkit.sdk.random_stream import (
    DEFAULT_SEED,
    OFFSET_ALIGNMENT,
    STATE_BYTES,
    RandomDraw,
    ShardWindow,
    aligned,
    philox4x32,
)

_MASK64 = (1 << 64) - 1


class PhiloxGenerator:
    """A device generator's Philox state in Python: seed and offset, 16 bytes of state. It answers
    what the device module and :func:`reserve` ask of a ``torch.Generator`` (``manual_seed``,
    ``seed``, ``initial_seed``, ``get_offset``/``set_offset``, ``get_state``/``set_state``)."""

    def __init__(self, device: torch.device | None = None):
        self.device = device
        self._lock = threading.Lock()
        self._seed = DEFAULT_SEED
        self._offset = 0

    def manual_seed(self, seed: int) -> PhiloxGenerator:
        with self._lock:
            self._seed, self._offset = int(seed) & _MASK64, 0
        return self

    def seed(self) -> int:
        seed = int.from_bytes(os.urandom(8), "little")
        self.manual_seed(seed)
        return seed

    def initial_seed(self) -> int:
        return self._seed

    def get_offset(self) -> int:
        return self._offset

    def set_offset(self, offset: int) -> None:
        offset = int(offset)
        if offset % OFFSET_ALIGNMENT:
            raise RuntimeError(f"offset must be a multiple of {OFFSET_ALIGNMENT} (device generators advance by "
                               f"whole blocks of 4 counters, as CUDA's), got {offset}")
        with self._lock:
            self._offset = offset & _MASK64

    def get_state(self) -> torch.Tensor:
        with self._lock:
            packed = struct.pack("<QQ", self._seed, self._offset)
        return torch.frombuffer(bytearray(packed), dtype=torch.uint8)

    def set_state(self, state: torch.Tensor) -> None:
        if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.device.type != "cpu":
            raise TypeError("RNG state must be a torch.ByteTensor")
        if state.numel() != STATE_BYTES:
            raise RuntimeError(f"RNG state is wrong size: a device generator's state is {STATE_BYTES} bytes "
                               f"(a 64-bit seed and a 64-bit offset, as CUDA's), got {state.numel()}")
        seed, offset = struct.unpack("<QQ", bytes(state.contiguous().tolist()))
        if offset % OFFSET_ALIGNMENT:
            raise RuntimeError(f"RNG state's offset must be a multiple of {OFFSET_ALIGNMENT}, got {offset}")
        with self._lock:
            self._seed, self._offset = seed, offset

    def reserve(self, count: int) -> tuple[int, int]:
        """(seed, offset) for a draw of ``count`` counters; the offset advances past them."""
        with self._lock:
            start = self._offset
            self._offset = (start + aligned(count)) & _MASK64
            return self._seed, start


# ---------------------------------------------------------------------------------------------
# Draws
# ---------------------------------------------------------------------------------------------


class _Window(threading.local):
    #: The pending shard window and how far the tracker moved the offset for it.
    pending: tuple[ShardWindow, int] | None = None


_window = _Window()


@contextlib.contextmanager
def shard_window(window: ShardWindow, shifted_by: int) -> Iterator[None]:
    """Within the block, the first draw of exactly the window's shard size takes the counters its
    elements have in the whole tensor, starting ``shifted_by`` counters before the generator's
    current offset (where DTensor's tracker put the shard's start)."""
    previous = _window.pending
    _window.pending = (window, shifted_by)
    try:
        yield
    finally:
        _window.pending = previous


def reserve(ctx: Any, generator: Any, count: int) -> RandomDraw:
    """The draw of ``count`` counters a random op makes from ``generator`` (the device generator
    when None); the generator's offset advances past them.

    :raises RuntimeError: ``generator`` belongs to another device (CUDA's message and rule: a
        device op draws from a generator of its device).
    """
    if generator is None:
        generator = ctx.generator
    if isinstance(generator, PhiloxGenerator):
        seed, offset = generator.reserve(count)
    else:
        seed, offset = _reserve_native(ctx, generator, count)
    pending = _window.pending
    if pending is not None and count == _numel(pending[0].shape):
        _window.pending = None  # one draw per region takes the window
        return RandomDraw(seed, (offset - pending[1]) & _MASK64, pending[0])
    return RandomDraw(seed, offset)


def _numel(shape: tuple[int, ...]) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


def _reserve_native(ctx: Any, generator: torch.Generator, count: int) -> tuple[int, int]:
    kind = generator.device.type
    if kind != ctx.name:
        raise RuntimeError(
            f"Expected a '{ctx.name}' device type for generator but found '{kind}': a {ctx.name} op draws "
            f"from a generator of its device; make it with torch.Generator(device='{ctx.name}')")
    from accelkit import _native

    native = _native.loaded()
    drawn = native.reserve(generator, int(count)) if native is not None else None
    if drawn is None:
        raise RuntimeError(f"{generator!r} is not one of accelkit's {ctx.name} generators")
    return drawn


def host_generator(draw: RandomDraw) -> torch.Generator:
    """A CPU generator seeded from ``draw``'s first counter, for the few random ops computed by
    PyTorch's CPU kernels (their values then follow the seed and offset, but an element's value is
    not a function of its counter alone)."""
    w = philox4x32(np.asarray([draw.offset], dtype=np.uint64), draw.seed, np)
    return torch.Generator().manual_seed(int(w[0][0]) | (int(w[1][0]) << 32))
