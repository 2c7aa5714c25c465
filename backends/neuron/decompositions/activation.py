"""Gated and masked activations' remaining ops as decompositions into neuron's native ops:

* ``glu_jvp`` / ``glu_backward_jvp`` (forward-mode derivatives of GLU and of its backward), with
  ``s = sigmoid(b)`` for the gate half ``b``: ``dglu = da * s + glu * (db - s * db)``; the
  backward's tangent ``(dg * s + g * s (1 - s) db, s (1 - s) (dg * a + g * da) + g_b (1 - 2 s) db)``
  with ``g_b = g * a * s * (1 - s)`` the gate's gradient. The backward's is computed in float32
  for reduced floats and rounded once; ``glu_jvp`` of a reduced float is left to the CPU, which
  has no kernel for it (its error).
* ``_masked_softmax`` (a ``True`` mask element is left out): the masked elements set to -inf,
  then a native softmax (0 at the masked elements; NaN along a row masked whole, as the CPU's).
  ``mask_type`` 1 is a ``[batch, keys]`` padding mask for a ``[batch, heads, queries, keys]``
  input; 0 and 2 broadcast as given.
* ``_masked_softmax_backward``: softmax's gradient ``y * (g - sum(g * y))`` over the unmasked
  elements, 0 at the masked ones.

Within float rounding of the CPU (the same formulas; sums in another order).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch._ops import OpOverload

aten = torch.ops.aten


def _math(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.float() if t.dtype in (torch.bfloat16, torch.float16) else t for t in tensors]


def _halves(x: torch.Tensor, dim: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return x.narrow(dim, 0, size), x.narrow(dim, size, size)


def _glu_jvp(glu, x, dx, dim):
    if glu.dtype in (torch.bfloat16, torch.float16):
        return NotImplemented  # the CPU has no reduced-float kernel: its error
    dim = dim % x.dim()
    size = glu.shape[dim]
    _, b = _halves(x, dim, size)
    da, db = _halves(dx, dim, size)
    glu_m, b, da, db = _math(glu, b, da, db)
    s = torch.sigmoid(b)
    return (da * s + glu_m * (db - s * db)).to(glu.dtype)


def _glu_backward_jvp(grad_x, grad_glu, x, dgrad_glu, dx, dim):
    dim = dim % x.dim()
    size = grad_glu.shape[dim]
    a, b = _halves(x, dim, size)
    da, db = _halves(dx, dim, size)
    _, grad_b = _halves(grad_x, dim, size)
    g, dg, a, b, da, db, grad_b = _math(grad_glu, dgrad_glu, a, b, da, db, grad_b)
    s = torch.sigmoid(b)
    slope = s * (1 - s)
    d_grad_a = dg * s + g * slope * db
    d_grad_b = slope * (dg * a + g * da) + grad_b * (1 - 2 * s) * db
    return torch.cat([d_grad_a, d_grad_b], dim=dim).to(grad_x.dtype)


def _expanded_mask(mask: torch.Tensor, shape: torch.Size, mask_type) -> torch.Tensor:
    if mask_type == 1 and len(shape) == 4 and mask.dim() == 2:
        mask = mask.view(mask.shape[0], 1, 1, mask.shape[1])
    return mask.to(torch.bool).expand(shape)


def _masked_softmax(self, mask, dim=None, mask_type=None):
    dim = self.dim() - 1 if dim is None else dim
    masked = _expanded_mask(mask, self.shape, mask_type)
    return torch.softmax(self.masked_fill(masked, float("-inf")), dim)


def _masked_softmax_backward(grad_output, output, mask, dim=None):
    dim = output.dim() - 1 if dim is None else dim
    masked = mask.to(torch.bool).expand(output.shape)
    g, y = _math(grad_output.masked_fill(masked, 0.0), output.masked_fill(masked, 0.0))
    grad = y * (g - (g * y).sum(dim, keepdim=True))
    return grad.masked_fill(masked, 0.0).to(grad_output.dtype)


def decompositions() -> Mapping[OpOverload, Callable]:
    """The decompositions above, keyed by aten overload."""
    return {
        aten.glu_jvp.default: _glu_jvp,
        aten.glu_backward_jvp.default: _glu_backward_jvp,
        aten._masked_softmax.default: _masked_softmax,
        aten._masked_softmax_backward.default: _masked_softmax_backward,
    }
