"""``torch.amp.GradScaler("<device>")`` on a device without float64.

GradScaler computes the reciprocal of its scale in float64 (``self._scale.double().reciprocal()
.float()``), on the scale's device; only for MPS does PyTorch take the float32 path. On a device
whose dtype rules refuse float64 (tpu, neuron) that one scalar would fail the whole step, so
while ``unscale_`` runs for this device the rules let float64 through: the backend computes the
0-d reciprocal as it can (XLA's float64 on tpu, the simulator's on neuron), and every tensor the
program itself makes in float64 is still refused. Everything else — skipping a step whose
gradients hold inf/NaN, backing the scale off and growing it — is PyTorch's own code on the
device, with CUDA's semantics.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from accelkit._runtime.device.context import BackendContext


def install_grad_scaler(ctx: BackendContext) -> None:
    rules = ctx.dtype_rules
    if rules is None or torch.float64 in rules.supported:
        return
    scaler = torch.amp.GradScaler
    original = scaler.unscale_

    @functools.wraps(original)
    def unscale_(self: Any, optimizer: torch.optim.Optimizer) -> None:
        if self._device != ctx.name:
            return original(self, optimizer)
        with ctx.float64_bookkeeping():
            return original(self, optimizer)

    scaler.unscale_ = unscale_
