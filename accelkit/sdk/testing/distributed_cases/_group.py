"""What every scenario shares: the groups a rank joins, its input values, an outcome's record."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch


Case = Callable[[torch.device, Any, int, int], list[torch.Tensor]]


_joined: tuple[torch.device, Any, int, int] | None = None


def _join(timeout_s: float = 60.0) -> tuple[torch.device, Any, int, int]:
    """Activate the device, join its process group and a gloo group of the same ranks, once per
    process (scenarios run together share them): ``(device, gloo group, rank, world size)``."""
    global _joined
    if _joined is not None:
        return _joined
    import torch.distributed as dist

    import accelkit

    device = accelkit.select_device(os.environ["ACCELKIT_DEVICE"])
    if os.environ.get("ACCELKIT_TEST_LOCAL_DEVICE"):
        # CUDA's pattern under torchrun: each rank takes the device of its local rank.
        device = torch.device(device.type, int(os.environ["LOCAL_RANK"]))
        getattr(torch, device.type).set_device(device)
    bound = {"device_id": device} if os.environ.get("ACCELKIT_TEST_DEVICE_ID") else {}
    dist.init_process_group(device.type, timeout=timedelta(seconds=timeout_s), **bound)
    gloo = dist.new_group(backend="gloo")
    _joined = device, gloo, dist.get_rank(), dist.get_world_size()
    return _joined


def _values(rank: int, n: int, dtype: torch.dtype = torch.float32, salt: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + salt)
    if dtype.is_floating_point:
        return torch.randn(n, generator=g).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    return torch.randint(-8, 9, (n,), generator=g).to(dtype)


def _outcome(fn: Callable[[], Any]) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        fn()
        return {"raised": None, "seconds": time.perf_counter() - started}
    except Exception as exc:
        return {"raised": type(exc).__name__, "message": str(exc), "seconds": time.perf_counter() - started}
