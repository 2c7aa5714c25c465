"""Ops PyTorch registers for every device but implements by reading tensor memory on the host
(``_saturate_weight_to_fp16``, the CPU fallback of ``grid_sampler_2d``): on a device tensor
their own C++ would read a device address and crash the process. They run as on the CPU:
same values, same aliasing (``_saturate_weight_to_fp16`` clamps its argument in place and
returns it), same gradients.
"""

from __future__ import annotations

import torch


def test_saturate_weight_to_fp16_clamps_in_place_as_on_the_cpu(dev):
    weight = torch.randn(3, 4) * 1e5
    on_device = weight.to(dev)
    got = torch._saturate_weight_to_fp16(on_device)
    want = torch._saturate_weight_to_fp16(weight)
    assert want.data_ptr() == weight.data_ptr()  # the CPU's: in place, the argument returned
    assert got.data_ptr() == on_device.data_ptr()
    assert torch.equal(got.cpu(), want) and torch.equal(on_device.cpu(), weight)
    assert want.abs().max() == 65504.0


def test_grid_sampler_cpu_fallback_and_its_gradient_match_the_cpu(dev):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 4, 4, generator=gen, requires_grad=True)
    grid = torch.rand(1, 3, 3, 2, generator=gen) * 2 - 1
    x_dev = x.detach().to(dev).requires_grad_()
    want = torch._grid_sampler_2d_cpu_fallback(x, grid, 0, 0, False)
    got = torch._grid_sampler_2d_cpu_fallback(x_dev, grid.to(dev), 0, 0, False)
    torch.testing.assert_close(got.cpu(), want)
    want.square().sum().backward()
    got.square().sum().backward()
    torch.testing.assert_close(x_dev.grad.cpu(), x.grad)
