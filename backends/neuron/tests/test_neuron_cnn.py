"""A small CNN trains on neuron with no CPU fallback and matches the same training on CPU.

The model (conv → batch norm → relu → max pool, twice, then a linear head) runs forward, backward
and several optimizer steps (SGD with momentum, AdamW) on neuron under ``fallback_policy("deny")``,
and the counters confirm that no op fell back. A CPU copy with the same initial weights takes the
same steps on the same data; the losses agree after every step, and at the end so do the
parameters, batch norm's running statistics (and its batch counter) and an evaluation-mode
forward, which normalises with the running statistics.

Tolerances. Everything is float32. The simulated Tensor engine multiplies fp32 operands in fp32
(the hardware's fp32 matmul path, at a quarter of the bf16 rate) and accumulates in fp32 PSUM, so
neuron and CPU differ only in the order of floating-point sums: a convolution here is a sum over
taps and channel tiles in PSUM, batch-norm statistics are fp32 per-partition reductions (CPU
accumulates them in double), and the CPU's oneDNN/MKL kernels associate differently again. One
reordering moves a result by a few float32 ulps (~1e-7 relative). Training compounds that over
the steps, and AdamW's ``m / (sqrt(v) + eps)`` turns tiny gradient differences into larger
parameter differences where gradients are near zero. Measured after four steps: losses within
2.4e-7, parameters and statistics within 1.4e-7 (both optimizers). Hence rtol = atol = 1e-5:
about fifty times the observed spread and two orders of magnitude above float32's resolution,
yet far below any real error (a wrong gradient, a missed running-statistics update or a broken
optimizer step moves values by 1e-2 or more at these learning rates).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import accelkit

from conftest import assert_native

STEPS = 4
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
INPUT_SHAPE, CLASSES = (4, 3, 8, 8), 10


class SmallCNN(nn.Module):
    """conv → batch norm → relu → max pool, twice, then a linear classifier.

    The convolutions have no bias, as usual before batch norm: the normalisation cancels a bias,
    so its gradient is rounding noise, which AdamW would scale up to full-size steps of
    different noise on each device.
    """

    def __init__(self, classes: int = CLASSES):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.norm1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=1, padding=1, bias=False)
        self.norm2 = nn.BatchNorm2d(16)
        self.head = nn.Linear(16 * 2 * 2, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.norm1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.norm2(self.conv2(x))), 2)
        return self.head(x.flatten(1))


OPTIMIZERS = {
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01),
}


def _batches(seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(INPUT_SHAPE, generator=g), torch.randint(0, CLASSES, (INPUT_SHAPE[0],), generator=g))
            for _ in range(STEPS)]


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, batches: list, device) -> torch.Tensor:
    losses = []
    for x, y in batches:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
        losses.append(loss.detach().to("cpu"))
    return torch.stack(losses)


@pytest.mark.parametrize("optimizer_name", list(OPTIMIZERS))
def test_cnn_training_matches_cpu_without_fallback(dev, optimizer_name):
    torch.manual_seed(0)
    cpu_model = SmallCNN()
    neuron_model = copy.deepcopy(cpu_model).to(dev)
    batches = _batches()

    cpu_losses = _train(cpu_model, OPTIMIZERS[optimizer_name](cpu_model.parameters()), batches, "cpu")
    with accelkit.fallback_policy("deny"):
        neuron_losses = _train(neuron_model, OPTIMIZERS[optimizer_name](neuron_model.parameters()), batches, dev)
        neuron_model.eval()
        cpu_model.eval()
        probe = batches[0][0]
        with torch.no_grad():
            neuron_inference = neuron_model(probe.to(dev)).cpu()
        cpu_inference = cpu_model(probe).detach()

    stats = accelkit.stats()
    assert stats["totals"]["fallback"] == 0, {k: v for k, v in stats["ops"].items() if v["fallback"]}
    assert not torch.equal(cpu_losses[0], cpu_losses[-1])  # training moved the model
    torch.testing.assert_close(neuron_losses, cpu_losses, **TOLERANCE)
    cpu_state, neuron_state = cpu_model.state_dict(), neuron_model.state_dict()
    assert cpu_state.keys() == neuron_state.keys()
    for name, value in cpu_state.items():  # parameters, running statistics, batch counters
        torch.testing.assert_close(neuron_state[name].cpu(), value, **TOLERANCE, msg=name)
    assert not torch.equal(cpu_state["norm1.running_var"], torch.ones(8))  # statistics were updated
    torch.testing.assert_close(neuron_inference, cpu_inference, **TOLERANCE)


def test_cnn_layers_run_as_tile_programs(dev):
    """The layers' own ops are neuron kernels, not decompositions or CPU work."""
    torch.manual_seed(0)
    model = SmallCNN().to(dev)
    with accelkit.fallback_policy("deny"):
        _train(model, torch.optim.SGD(model.parameters(), lr=0.1), _batches()[:1], dev)
    assert_native("aten.convolution_overrideable.default", "aten.convolution_backward_overrideable.default",
                  "aten.native_batch_norm.default", "aten.native_batch_norm_backward.default",
                  "aten.max_pool2d_with_indices.default", "aten.max_pool2d_with_indices_backward.default")
    # The implicit im2col does exactly the convolutions' multiply-adds on the Tensor engine:
    # batch x output positions x out channels x in channels x taps, for both layers.
    batch = INPUT_SHAPE[0]
    expected = 2 * batch * 9 * (8 * 8 * 8 * 3 + 4 * 4 * 16 * 8)
    assert accelkit.stats()["neuron"]["estimate"]["per_op"]["convolution_overrideable.default"]["flops"] == expected


def test_bfloat16_cnn_forward_tracks_float32(dev):
    """In bfloat16 the Tensor engine takes bf16 operands and accumulates in fp32 PSUM; the
    forward stays within a few steps of bf16's resolution (2^-8 ≈ 4e-3 relative) of the float32
    CPU result: measured 6.4e-3 on outputs up to 1.25, asserted at 2e-2."""
    torch.manual_seed(0)
    model = SmallCNN()
    x = torch.randn(INPUT_SHAPE)
    expected = model(x).detach()
    on_device = copy.deepcopy(model).to(dev, torch.bfloat16)
    with accelkit.fallback_policy("deny"):
        got = on_device(x.to(dev, torch.bfloat16)).float().cpu()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)
    assert not torch.equal(got, expected)  # bf16 really rounded
