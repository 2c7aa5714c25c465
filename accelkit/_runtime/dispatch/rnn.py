"""The fused RNN cells PyTorch calls on PrivateUse1, as the unfused cell math in aten ops.

``nn.LSTM``/``nn.GRU`` (and ``LSTMCell``/``GRUCell``) pick the fused cell kernels on CUDA and
on PrivateUse1 alike: ``_thnn_fused_lstm_cell`` and ``_thnn_fused_gru_cell``, whose backward
ops (``_thnn_fused_lstm_cell_backward_impl``, ``_thnn_fused_gru_cell_backward``) take the
forward's ``workspace``. Only CUDA has kernels for them and PyTorch has no decomposition, so the
runtime provides these four as decompositions. They follow the CPU's unfused cell, operation for
operation, so results match CPU torch; the workspace layout is private to this module (the
forward writes it, only the backward here reads it):

- LSTM: the activated gates ``[input, forget, cell, output]``, shape ``(batch, 4 * hidden)``;
- GRU: ``[reset, update, new, hx, hidden_new]`` (``hidden_new``: the hidden-side new-gate
  pre-activation, bias included), shape ``(batch, 5 * hidden)``.

A backend with its own kernels or decompositions for these ops keeps them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

aten = torch.ops.aten


def _with_bias(gates: Tensor, bias: Tensor | None) -> Tensor:
    return gates if bias is None else gates + bias


def lstm_cell(
    input_gates: Tensor,
    hidden_gates: Tensor,
    cx: Tensor,
    input_bias: Tensor | None = None,
    hidden_bias: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``_thnn_fused_lstm_cell``: ``(hy, cy, workspace)`` from the gate pre-activations."""
    gates = _with_bias(hidden_gates, hidden_bias) + _with_bias(input_gates, input_bias)
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    hy = o * cy.tanh()
    return hy, cy, torch.cat([i, f, g, o], 1)


def lstm_cell_backward(
    grad_hy: Tensor | None,
    grad_cy: Tensor | None,
    cx: Tensor,
    cy: Tensor,
    workspace: Tensor,
    has_bias: bool,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """``_thnn_fused_lstm_cell_backward_impl``: ``(grad_gates, grad_cx, grad_bias)``, where
    ``grad_gates`` is the gradient of the gate pre-activations and ``grad_bias`` (None without
    bias) its sum over the batch. With neither output gradient defined, all three are None."""
    if grad_hy is None and grad_cy is None:
        return None, None, None
    i, f, g, o = workspace.chunk(4, 1)
    tanh_cy = cy.tanh()
    grad_c = torch.zeros_like(cy) if grad_cy is None else grad_cy
    if grad_hy is not None:
        grad_c = grad_c + grad_hy * o * (1 - tanh_cy * tanh_cy)
        grad_o = grad_hy * tanh_cy
    else:
        grad_o = torch.zeros_like(o)
    grad_gates = torch.cat(
        [
            grad_c * g * i * (1 - i),
            grad_c * cx * f * (1 - f),
            grad_c * i * (1 - g * g),
            grad_o * o * (1 - o),
        ],
        1,
    )
    grad_bias = grad_gates.sum(0) if has_bias else None
    return grad_gates, grad_c * f, grad_bias


def gru_cell(
    input_gates: Tensor,
    hidden_gates: Tensor,
    hx: Tensor,
    input_bias: Tensor | None = None,
    hidden_bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``_thnn_fused_gru_cell``: ``(hy, workspace)`` from the gate pre-activations."""
    ir, iz, in_ = _with_bias(input_gates, input_bias).chunk(3, 1)
    hr, hz, hn = _with_bias(hidden_gates, hidden_bias).chunk(3, 1)
    r = (hr + ir).sigmoid()
    z = (hz + iz).sigmoid()
    n = (in_ + hn * r).tanh()
    hy = (hx - n) * z + n
    return hy, torch.cat([r, z, n, hx, hn], 1)


def gru_cell_backward(
    grad_hy: Tensor, workspace: Tensor, has_bias: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None]:
    """``_thnn_fused_gru_cell_backward``: gradients of ``(input_gates, hidden_gates, hx,
    input_bias, hidden_bias)``; the bias gradients are None without bias."""
    r, z, n, hx, hn = workspace.chunk(5, 1)
    grad_n = grad_hy * (1 - z) * (1 - n * n)
    grad_z = grad_hy * (hx - n) * z * (1 - z)
    grad_r = grad_n * hn * r * (1 - r)
    grad_input_gates = torch.cat([grad_r, grad_z, grad_n], 1)
    grad_hidden_gates = torch.cat([grad_r, grad_z, grad_n * r], 1)
    grad_hx = grad_hy * z
    if not has_bias:
        return grad_input_gates, grad_hidden_gates, grad_hx, None, None
    return grad_input_gates, grad_hidden_gates, grad_hx, grad_input_gates.sum(0), grad_hidden_gates.sum(0)


#: The runtime's decompositions for the fused cells, keyed by aten overload.
RNN_DECOMPOSITIONS: dict[Any, Callable] = {
    aten._thnn_fused_lstm_cell.default: lstm_cell,
    aten._thnn_fused_lstm_cell_backward_impl.default: lstm_cell_backward,
    aten._thnn_fused_gru_cell.default: gru_cell,
    aten._thnn_fused_gru_cell_backward.default: gru_cell_backward,
}
