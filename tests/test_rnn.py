"""Recurrent layers on the ref device: PyTorch routes them to the fused cell ops (as on CUDA),
which the runtime decomposes; outputs and every gradient must match CPU torch."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import accelkit

# The CPU reference warns that oneDNN does not do projections; it is not about the device.
pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections is not supported")

LAYERS = {
    "lstm": lambda: nn.LSTM(4, 5),
    "lstm_no_bias_batch_first": lambda: nn.LSTM(4, 5, bias=False, batch_first=True),
    "lstm_two_layers_projection": lambda: nn.LSTM(4, 5, num_layers=2, proj_size=3),
    "lstm_bidirectional": lambda: nn.LSTM(4, 5, bidirectional=True),
    "gru": lambda: nn.GRU(4, 5),
    "gru_no_bias_bidirectional": lambda: nn.GRU(4, 5, bias=False, bidirectional=True),
    "gru_two_layers": lambda: nn.GRU(4, 5, num_layers=2),
    "lstm_cell": lambda: nn.LSTMCell(4, 5),
    "gru_cell": lambda: nn.GRUCell(4, 5),
}


def first(output):
    return output[0] if isinstance(output, tuple) else output


def run(module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The module's first output and the gradients of its input and parameters."""
    x = x.detach().requires_grad_()
    out = first(module(x))
    weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(out.device)
    (out * weights).sum().backward()
    return out, [x.grad, *(p.grad for p in module.parameters())]


@pytest.mark.parametrize("make", LAYERS.values(), ids=LAYERS.keys())
def test_recurrent_layer_forward_and_gradients_match_cpu(dev, make):
    torch.manual_seed(0)
    cpu = make()
    device = copy.deepcopy(cpu).to(dev)
    x = torch.randn(2, 4) if "Cell" in type(cpu).__name__ else torch.randn(3, 2, 4)
    accelkit.reset_stats()
    out, grads = run(device, x.to(dev))
    expected, expected_grads = run(cpu, x)
    assert out.device.type == "ref"
    torch.testing.assert_close(out.cpu(), expected)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got.cpu(), want)
    fused = {k: v for k, v in accelkit.stats()["ops"].items() if "_thnn_fused" in k}
    assert fused and all(v["decomposed"] and not v["fallback"] for v in fused.values())


def test_lstm_cell_gradient_through_the_cell_state_only_matches_cpu(dev):
    torch.manual_seed(0)
    cpu = nn.LSTMCell(3, 4)
    device = copy.deepcopy(cpu).to(dev)
    x = torch.randn(2, 3)
    grads = []
    for module, inp in ((cpu, x), (device, x.to(dev))):
        _, c = module(inp)
        c.sum().backward()
        grads.append([p.grad.cpu() for p in module.parameters()])
    for got, want in zip(*reversed(grads)):
        torch.testing.assert_close(got, want)


def test_lstm_cell_double_backward_matches_cpu(dev):
    torch.manual_seed(0)
    cpu = nn.LSTMCell(3, 4)
    device = copy.deepcopy(cpu).to(dev)
    x = torch.randn(2, 3)
    results = []
    for module, inp in ((cpu, x), (device, x.to(dev))):
        inp = inp.clone().requires_grad_()
        h, _ = module(inp)
        (g,) = torch.autograd.grad(h.square().sum(), inp, create_graph=True)
        g.sum().backward()
        results.append((g.detach().cpu(), inp.grad.cpu()))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want)


def test_bfloat16_lstm_matches_cpu(dev):
    torch.manual_seed(0)
    cpu = nn.LSTM(4, 5).bfloat16()
    device = copy.deepcopy(cpu).to(dev)
    x = torch.randn(3, 2, 4).bfloat16()
    out, _ = run(device, x.to(dev))
    expected, _ = run(cpu, x)
    torch.testing.assert_close(out.cpu(), expected, rtol=0.016, atol=0.01)
