"""The ref device: host memory presented as a device, with a capacity of its own."""

from __future__ import annotations

import os

import torch

from accelkit.sdk import DeviceModel, DeviceProbe, device_count_from_env, hookimpl

MEMORY_ENV = "ACCELKIT_REF_MEMORY"
DEFAULT_MEMORY = 8 << 30

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MIB": 1 << 20,
          "G": 1 << 30, "GIB": 1 << 30}


def parse_bytes(text: str) -> int:
    """``"512MiB"`` → 536870912. Accepts B, K/KiB, M/MiB, G/GiB (binary units)."""
    value = text.strip().upper()
    number = value.rstrip("KMGIB")
    unit = value[len(number):]
    if not number or unit not in _UNITS:
        raise ValueError(f"{MEMORY_ENV}={text!r} is not a size; write e.g. 512MiB or 4GiB")
    return int(float(number) * _UNITS[unit])


@hookimpl(specname="accelkit_device_model")
def device_model() -> DeviceModel:
    """The ref device: host DRAM with a configurable capacity (``ACCELKIT_REF_MEMORY``)."""
    memory = parse_bytes(os.environ[MEMORY_ENV]) if os.environ.get(MEMORY_ENV) else DEFAULT_MEMORY
    return DeviceModel(
        name="host",
        vendor="accelkit",
        memory_bytes=memory,
        dtypes=frozenset(d for d in vars(torch).values() if isinstance(d, torch.dtype)),
        simulated=True,
        sources={"memory_bytes": f"{MEMORY_ENV} (default 8 GiB); not a hardware figure"},
    )


@hookimpl(specname="accelkit_probe")
def probe() -> DeviceProbe:
    """ref runs wherever torch does; it is a reference device, so it counts as simulated."""
    try:
        count = device_count_from_env("ref")
    except ValueError as exc:
        return DeviceProbe(False, True, reason=str(exc))
    return DeviceProbe(
        available=True,
        simulated=True,
        device_count=count,
        target="host",
        reason="reference backend: host memory, computed with CPU torch",
    )
