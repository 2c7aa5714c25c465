"""Foreach lowerings: ``torch._foreach_add_`` and the other list ops that optimizers call once
per step for all their tensors.

PyTorch's own kernel for these on a new device loops over the list and dispatches the
single-tensor op once per tensor. Here one program applies the single-tensor lowering to every
tensor of the list, so an optimizer step dispatches a few programs, not a few per parameter.
In a call, list arguments (tensors or numbers) go element by element with ``self``; everything
else (a number, a 0-dim tensor, ``alpha``) is shared by every element. The runtime derives the
in-place overloads (``_foreach_add_.List``), writing every result only once all are checked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import torch

from accelkit_backends.tpu.kernels import elementwise  # noqa: F401  (the per-tensor lowerings)
from accelkit_backends.tpu.lowering import kernels, lowering

aten = torch.ops.aten

#: foreach op -> (its overloads lowered here, the single-tensor op whose lowering each applies)
_FOREACH: dict[str, tuple[tuple[str, ...], Any]] = {
    "add": (("List", "Scalar", "ScalarList", "Tensor"), aten.add.Tensor),
    "sub": (("List", "Scalar", "ScalarList"), aten.sub.Tensor),
    "mul": (("List", "Scalar", "ScalarList", "Tensor"), aten.mul.Tensor),
    "div": (("List", "Scalar", "ScalarList", "Tensor"), aten.div.Tensor),
    "maximum": (("List",), aten.maximum.default),
    "minimum": (("List",), aten.minimum.default),
    "lerp": (("List", "Scalar", "ScalarList"), aten.lerp.Scalar),
    "addcmul": (("Scalar", "ScalarList"), aten.addcmul.default),
    "addcdiv": (("Scalar", "ScalarList"), aten.addcdiv.default),
    **{name: (("default",), getattr(aten, name).default)
       for name in ("sqrt", "rsqrt", "exp", "log", "neg", "abs", "reciprocal", "sign")},
}


def _applied_to_each(single: Callable[..., Any]) -> Callable[..., list]:
    """The foreach form of a single-tensor lowering."""

    def each(selves: list, *args: Any, **kwargs: Any) -> list:
        return [single(x, *[a[i] if isinstance(a, list) else a for a in args], **kwargs)
                for i, x in enumerate(selves)]

    each.__name__ = each.__qualname__ = f"foreach_{single.__name__}"
    return each


for _name, (_overloads, _single) in _FOREACH.items():
    _packet = getattr(aten, f"_foreach_{_name}")
    _ops = [getattr(_packet, o) for o in _overloads if o in _packet.overloads()]
    lowering(*_ops)(_applied_to_each(kernels.get(_single).fn.fn))
del _name, _overloads, _single, _packet, _ops


@lowering(aten._foreach_norm.Scalar, static=("ord",))
def foreach_norm(selves: list, ord=2, dtype=None) -> list:
    """Each tensor's vector norm (``clip_grad_norm_``'s first step)."""
    norm = kernels.get(aten.linalg_vector_norm.default).fn.fn
    return [norm(x, ord, None, False, dtype=dtype) for x in selves]


@lowering(aten._foreach_zero.default)
def foreach_zero(selves: list) -> list:
    """Zeros like each tensor (``zero_grad(set_to_none=False)`` uses the in-place form)."""
    return [jnp.zeros_like(x) for x in selves]
