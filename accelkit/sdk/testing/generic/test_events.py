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


def test_torch_accelerator_synchronizes_and_names_the_current_stream(dev):
    # vLLM and accelerate call these through torch.accelerator, not the device module.
    x = torch.randn(32, 32, device=dev) @ torch.randn(32, 32, device=dev)
    torch.accelerator.synchronize()
    torch.accelerator.synchronize(dev)
    stream = torch.accelerator.current_stream()
    assert stream.device == torch.device(dev.type, dev.index or 0)
    assert stream == torch.get_device_module(dev.type).current_stream()
    assert x.shape == (32, 32)
