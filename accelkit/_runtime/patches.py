"""accelkit's patches of PyTorch's Python, listed in one place.

Engines on top of PyTorch (TorchTitan, vLLM, accelerate) ask a device questions whose CUDA answers
they depend on. Where PyTorch's Python answers them for CUDA only, accelkit changes that Python
for the active backend's device type alone: every other device behaves exactly as before, and
each patch is installed once, marked, and undone by nothing (a process has one backend).

Installed here:

- ``torch.nn.attention.flex_attention._validate_device`` (at activation): FlexAttention refuses
  any device but CUDA, CPU, XPU, HPU and MPS, and backward on the CPU. For the accelkit device it
  accepts both: the higher-order op runs through the device's kernels eagerly, and through its
  compiler under ``torch.compile``.
- ``torch.distributed.tensor._random.OffsetBasedRNGTracker._distribute_region`` (at the device's
  first process group; DTensor is imported only by distributed programs): DTensor moves the
  device generator's offset to where a shard starts; the patch also tells the shard's random op
  where the shard lies in the whole tensor (:func:`accelkit._runtime.device.random.shard_window`), so
  each element takes its counter in the whole tensor and a sharded random op equals the whole one
  for any placement (``Shard(1)``, several mesh dimensions, uneven shards).

- ``torch.autograd.graph._engine_run_backward`` and its import in ``torch.autograd`` (at
  activation): each thread's first ``backward()``/``grad()`` turns off autograd's device threads
  for that thread, so device backwards run on the calling thread on every thread, as on the
  activating one (see ``_backward_on_calling_thread``). Besides their cost, the device threads
  meet a race in torch 2.13 at exit: the engine's thread drops a finished backward's task (which
  holds the Python context torch stashes for it) just after ``backward()`` returns, and if the
  interpreter is finalizing by then, its wait for the GIL ends the thread inside a C++ destructor
  and a script that succeeded aborts ("terminate called without an active exception", exit
  code 134). ``torch.autograd.set_multithreading_enabled(True)`` after a thread's first
  backward brings the device threads back for that thread, and that race with them.
- ``TRITON_INTERPRET=1`` (at activation, unless the variable is set or CUDA is available):
  Triton has no driver for an accelkit device, so a Triton kernel a library launches on one
  (TorchTitan's MoE builds its token permutation with one) fails with "0 active drivers".
  Triton's interpreter runs the kernel instead, on host copies of its tensors written back
  after, which is what a device without a Triton backend can offer. Triton reads the variable
  when a kernel is defined: activation through ``ACCELKIT_DEVICE`` at ``import torch`` comes
  before any.

Elsewhere, each beside the code it serves:

- ``torch.UntypedStorage.resize_`` (:mod:`accelkit._runtime.device.tensors`) and the ``cpu``/``clone``/``new``/
  ``_byteswap`` methods of device storages (:mod:`accelkit._runtime.device.serialization`);
- ``torch.amp.GradScaler.unscale_`` for the device (:mod:`accelkit._runtime.device.grad_scaler`);
- the Autograd kernels of a few decompositions while Dynamo traces (:mod:`accelkit._runtime.dispatch.decomp_guards`).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

import torch

from accelkit._runtime.device.random import shard_window
from accelkit.sdk.random_stream import ShardWindow

_MARK = "_accelkit_patched_for"


def _installed(function: Any) -> str | None:
    return getattr(function, _MARK, None)


TRITON_INTERPRET = "TRITON_INTERPRET"


def install_triton_interpreter() -> bool:
    """Run Triton kernels in Triton's interpreter when no Triton driver can take them (above);
    True when this set the variable."""
    import os

    if TRITON_INTERPRET in os.environ or torch.cuda.is_available():
        return False
    os.environ[TRITON_INTERPRET] = "1"
    return True


_backward_threads = threading.local()


def run_backward_on_this_thread() -> None:
    """Turn autograd's device threads off for the calling thread, once: a later
    ``torch.autograd.set_multithreading_enabled(True)`` on it is the user's and stays."""
    _backward_threads.seen = True
    torch._C._set_multithreading_enabled(False)


def install_backward_on_calling_thread() -> None:
    """Run every thread's device backwards on that thread (above)."""
    from torch import autograd
    from torch.autograd import graph

    original = graph._engine_run_backward
    if _installed(original):
        return

    @functools.wraps(original)
    def _engine_run_backward(*args: Any, **kwargs: Any) -> Any:
        if not getattr(_backward_threads, "seen", False):
            run_backward_on_this_thread()
        return original(*args, **kwargs)

    setattr(_engine_run_backward, _MARK, "every device")
    graph._engine_run_backward = _engine_run_backward
    autograd._engine_run_backward = _engine_run_backward


def install_flex_attention(device_type: str) -> None:
    """Let ``flex_attention`` run on ``device_type`` (forward and backward)."""
    from torch.nn.attention import flex_attention as module

    original = module._validate_device
    if _installed(original):
        return

    @functools.wraps(original)
    def _validate_device(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        if query.device.type == device_type:
            return
        original(query, key, value)

    setattr(_validate_device, _MARK, device_type)
    module._validate_device = _validate_device


def install_dtensor_random(device_type: str) -> None:
    """Give DTensor random ops on ``device_type`` the counters of the whole tensor (above)."""
    from torch.distributed.tensor import _random as dtensor_random

    tracker = dtensor_random.OffsetBasedRNGTracker
    original = tracker._distribute_region
    if _installed(original):
        return

    @contextlib.contextmanager
    def _distribute_region(self: Any, spec: Any, generator: torch.Generator | None = None) -> Iterator[None]:
        placed = _window(self, spec) if self._device.type == device_type and self.distribute_region_enabled else None
        with original(self, spec, generator):
            if placed is None:
                yield
            else:
                with shard_window(*placed):
                    yield

    setattr(_distribute_region, _MARK, device_type)
    tracker._distribute_region = _distribute_region


def _window(tracker: Any, spec: Any) -> tuple[ShardWindow, int] | None:
    """This rank's shard of ``spec`` as a window, and how far the tracker moves the offset for
    it; None where the shard is no block of the whole tensor (a strided shard)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    from torch.distributed.tensor.placement_types import Shard

    if any(p.is_shard() and type(p) is not Shard for p in spec.placements):
        return None
    shape, start = compute_local_shape_and_global_offset(spec.shape, spec.mesh, spec.placements)
    if len(start) != len(spec.shape):
        return None  # this rank holds no part of it
    shifted_by, _ = tracker._compute_rng_offsets(spec)
    window = ShardWindow(tuple(int(s) for s in spec.shape), tuple(int(s) for s in start), tuple(int(s) for s in shape))
    return window, int(shifted_by)
