"""GradScaler's ops on neuron (``decompositions/amp.py``) against the CPU, the fallback denied:
unscaling (float32 and bfloat16 gradients, with and without infs and NaNs), the scale update's
every branch, and a whole scaled training loop that never leaves the device."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_decomposed

aten = torch.ops.aten


pytestmark = pytest.mark.usefixtures("deny_fallback")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("poison", [None, float("inf"), float("nan")])
@pytest.mark.parametrize("found_before", [0.0, 1.0])
def test_unscale_and_check(dev, dtype, poison, found_before):
    generator = torch.Generator().manual_seed(0)
    grads = [torch.randn(7, generator=generator).to(dtype) * 1000, torch.randn(3, 5, generator=generator).to(dtype),
             torch.empty(0, dtype=dtype)]
    if poison is not None:
        grads[1][2, 3] = poison
    inv_scale = torch.tensor([1 / 3.0])
    found, found_device = torch.tensor([found_before]), torch.tensor([found_before]).to(dev)
    on_device = [g.to(dev) for g in grads]
    aten._amp_foreach_non_finite_check_and_unscale_(grads, found, inv_scale)
    aten._amp_foreach_non_finite_check_and_unscale_(on_device, found_device, inv_scale.to(dev))
    assert torch.equal(found, found_device.cpu())
    for expected, got in zip(grads, on_device):
        assert torch.equal(expected.nan_to_num(nan=7.0), got.cpu().nan_to_num(nan=7.0))
    assert_decomposed("aten._amp_foreach_non_finite_check_and_unscale_.default")


@pytest.mark.parametrize("found_inf", [0.0, 1.0])
@pytest.mark.parametrize("tracker", [0, 2, 4])
@pytest.mark.parametrize("scale", [1024.0, 3.0e38])
def test_update_scale_every_branch(dev, found_inf, tracker, scale):
    args = (torch.tensor([found_inf]), 2.0, 0.5, 3)
    cpu_scale, cpu_tracker = torch.tensor([scale]), torch.tensor([tracker], dtype=torch.int32)
    scale_device, tracker_device = cpu_scale.to(dev), cpu_tracker.to(dev)
    aten._amp_update_scale_(cpu_scale, cpu_tracker, *args)
    returned = aten._amp_update_scale_(scale_device, tracker_device, args[0].to(dev), *args[1:])
    assert torch.equal(cpu_scale, scale_device.cpu()) and torch.equal(returned.cpu(), cpu_scale)
    assert torch.equal(cpu_tracker, tracker_device.cpu())
    assert_decomposed("aten._amp_update_scale_.default")


def test_grad_scaler_training_loop_stays_on_the_device(dev):
    """An overflow backs the scale off, ``growth_interval`` clean steps grow it, on the device."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to(dev)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(dev.type, init_scale=2.0**16, growth_interval=2)
    scales = []
    for step in range(4):
        optimizer.zero_grad()
        loss = model(torch.randn(5, 4).to(dev)).sum()
        scaler.scale(loss * (float("inf") if step == 1 else 1.0)).backward()
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
    assert scales == [2.0**16, 2.0**15, 2.0**15, 2.0**16]
    assert_decomposed("aten._amp_update_scale_.default")
