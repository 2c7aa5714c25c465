"""Where the suites' sample tensors get their random values: drawn on the CPU, then copied.

PyTorch's OpInfo and ModuleInfo samples come from ``torch.testing.make_tensor(..., device=D)``,
which fills a fresh device tensor with ``uniform_``. On a compiling backend every new shape of
that fill is a program of its own (on tpu, XLA compiling one ``uniform`` per sample shape, about
29 ms each; drawing on the CPU took a cold quick tpu run from 3:54 to 3:21), while the suites
test the op that reads the sample, not the fill that made it. So within our own suites the fill
draws on the CPU (same bounds, PyTorch's CPU generator, seeded per op as before) and copies the
values into the device tensor, which keeps its shape, dtype, layout and ``requires_grad``. The
device's random ops are still tested: ``uniform_``, ``normal_``, ``bernoulli`` and the rest have
OpInfos of their own. PyTorch's own test files (the upstream suite) run unchanged.
"""

from __future__ import annotations

import torch


def draw_on_the_cpu(device_type: str) -> None:
    """Make ``make_tensor``'s random fill of ``device_type`` tensors draw on the CPU."""
    from torch.testing import _creation

    fill = _creation._uniform_random_
    if getattr(fill, "_accelkit_device_type", None) == device_type:
        return

    def uniform_random_(t: torch.Tensor, low: float, high: float) -> torch.Tensor:
        if t.device.type != device_type:
            return fill(t, low, high)
        host = fill(torch.empty(t.shape, dtype=t.dtype), low, high)
        with torch.no_grad():
            return t.copy_(host)

    uniform_random_._accelkit_device_type = device_type
    _creation._uniform_random_ = uniform_random_
