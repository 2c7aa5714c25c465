"""``torch.<device>.Event``, as training loops and profilers time device work with it: a timed
pair measures the work recorded between them (the device's one in-order queue), and the misuse
CUDA refuses is refused with its reason."""

from __future__ import annotations

import pytest
import torch


def test_timed_events_measure_the_work_between_them(dev):
    module = torch.get_device_module(dev.type)
    start, end = module.Event(enable_timing=True), module.Event(enable_timing=True)
    start.record()
    x = torch.randn(64, 64, device=dev)
    for _ in range(5):
        x = x @ x
    end.record()
    end.synchronize()
    assert end.query()
    assert start.elapsed_time(end) > 0
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        module.Event().elapsed_time(end)
    with pytest.raises(RuntimeError, match="recorded first"):
        module.Event(enable_timing=True).elapsed_time(end)
