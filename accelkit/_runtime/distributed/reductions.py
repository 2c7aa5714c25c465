"""Reduce ops as a host-staged group runs them: gloo's own, or gloo's SUM with a device op around it.

Gloo has no ``PREMUL_SUM``, and its ``AVG`` is not NCCL's, so both run as NCCL defines them
(what FSDP2 and DDP are written against) around gloo's SUM:

- ``PREMUL_SUM(factor)``: each rank multiplies its input by its factor, then the inputs are
  summed. The factor (a Python float or a one-element tensor, on any device) is rounded to the
  data's dtype first, as NCCL reads it; ranks may pass different factors. Only float16,
  bfloat16, float32 and float64 data (and complex, as pairs of those) can be multiplied; any
  other dtype raises ``TypeError``, as NCCL's process group does.
- ``AVG`` on floating-point (and complex) data: ``PREMUL_SUM`` by ``1 / world size`` rounded to
  the data's dtype. On integer data: the sum divided by the world size, rounded toward zero
  (NCCL's integer average). On bool data it raises ``TypeError``, as NCCL's process group does.

The multiplication runs on the tensor's own device, before the bytes are staged; the division
on the device after the sum is written back. Neither touches the caller's tensors: an in-place
collective writes its result into them as any collective does (no dispatch, no version bump),
an out-of-place one leaves its input as it was.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from accelkit._runtime.distributed.agreement import describe_tensor

_NAMES = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM")

#: Dtypes NCCL's process group multiplies by a PREMUL_SUM factor (complex as their real pairs).
_MULTIPLIED = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128)

_REAL = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def reduce_op_name(op: Any) -> str:
    """``"SUM"``, ``"PREMUL_SUM"``, ... for a ``ReduceOp``, its ``RedOpType``, or a PREMUL_SUM with a factor."""
    return next((name for name in _NAMES if op == getattr(dist.ReduceOp, name)), str(op))


@dataclass(frozen=True)
class Reduction:
    """One collective's reduce op as the group runs it.

    :ivar name: the op's name, what the ranks' agreement check compares (a PREMUL_SUM's factor
        is each rank's own, so it is not part of it).
    :ivar label: the op in messages, with a float factor: ``PREMUL_SUM(0.25)``.
    :ivar world: the group's size.
    :ivar factor: PREMUL_SUM's factor (a float or a one-element tensor), else None.
    """

    name: str
    label: str
    world: int
    factor: float | torch.Tensor | None = None

    @property
    def plain(self) -> bool:
        """Whether gloo runs the op itself, with nothing done on the device."""
        return self.name not in ("PREMUL_SUM", "AVG")

    def gloo_options(self, opts: Any) -> Any:
        """``opts`` for gloo: as given for a plain op, else a copy that asks for SUM."""
        if self.plain:
            return opts
        summing = type(opts)()
        for field in ("timeout", "asyncOp", "rootRank", "rootTensor"):
            if hasattr(opts, field):
                setattr(summing, field, getattr(opts, field))
        summing.reduceOp = dist.ReduceOp.SUM
        return summing

    def before(self, tensor: torch.Tensor) -> torch.Tensor:
        """What ``tensor`` contributes to gloo's sum: a new tensor on its device holding it
        times the factor (rounded to its dtype), or ``tensor`` itself when nothing multiplies it."""
        if self.name == "PREMUL_SUM":
            factor = self.factor
        elif self.name == "AVG" and _multiplies(tensor.dtype):
            factor = 1.0 / self.world
        else:
            return tensor
        real = _REAL.get(tensor.dtype, tensor.dtype)
        if isinstance(factor, torch.Tensor):
            factor = factor.detach().to(device=tensor.device, dtype=real).reshape(())
        else:
            factor = torch.tensor(factor, dtype=real).item()
        with torch.no_grad():
            return tensor.detach() * factor

    def after(self, tensor: torch.Tensor) -> torch.Tensor:
        """The result in ``tensor`` of gloo's sum: for an integer AVG a new tensor on its device
        holding the sum divided by the world size, rounded toward zero; else ``tensor`` itself."""
        if self.name != "AVG" or _multiplies(tensor.dtype):
            return tensor
        with torch.no_grad():
            return torch.div(tensor.detach(), self.world, rounding_mode="trunc")


def reduction(kind: str, op: Any, dtypes: Iterable[torch.dtype], world: int, device_type: str) -> Reduction:
    """How the group runs ``op`` on data of ``dtypes`` in a group of ``world`` ranks.

    :raises TypeError: the op cannot reduce one of the dtypes (PREMUL_SUM on anything but
        floating point or complex, AVG on bool), or a PREMUL_SUM factor is not a real number.
    """
    name = reduce_op_name(op)
    if name == "PREMUL_SUM":
        factor = _factor(kind, getattr(op, "factor", None))
        for dtype in dtypes:
            if not _multiplies(dtype):
                raise TypeError(
                    f"{kind} with ReduceOp.PREMUL_SUM on {_dtype_name(dtype)} data: the factor multiplies "
                    f"only float16, bfloat16, float32, float64 and complex tensors, as NCCL's process group "
                    f"does. Reduce a floating-point tensor, or multiply this one yourself and use ReduceOp.SUM"
                )
        return Reduction(name, _label(factor), world, factor)
    if name == "AVG":
        for dtype in dtypes:
            if dtype == torch.bool:
                raise TypeError(
                    f"{kind} with ReduceOp.AVG on bool data: an average of booleans is not a boolean "
                    f"(NCCL's process group refuses it too). Use ReduceOp.MAX for 'any', ReduceOp.MIN for "
                    f"'all', or convert to a number type first"
                )
            if (dtype.is_floating_point or dtype.is_complex) and not _multiplies(dtype):
                raise TypeError(
                    f"{kind} with ReduceOp.AVG on {_dtype_name(dtype)} data: {device_type}'s process group "
                    f"averages float16, bfloat16, float32, float64, complex and integer tensors; convert "
                    f"this one to one of those first"
                )
    return Reduction(name, name, world)


def _multiplies(dtype: torch.dtype) -> bool:
    return dtype in _MULTIPLIED


def _factor(kind: str, factor: Any) -> float | torch.Tensor:
    if isinstance(factor, torch.Tensor):
        if factor.dtype == torch.bool or factor.is_complex():
            raise TypeError(
                f"{kind} with ReduceOp.PREMUL_SUM: the factor is a {describe_tensor(factor)} tensor; it "
                f"must be a real number (a Python float, or a one-element floating-point tensor)"
            )
        return factor
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        raise TypeError(f"{kind} with ReduceOp.PREMUL_SUM: the factor {factor!r} is not a real number")
    return float(factor)


def _label(factor: float | torch.Tensor) -> str:
    if isinstance(factor, torch.Tensor):
        return f"PREMUL_SUM(a {describe_tensor(factor)} factor on {factor.device})"
    return f"PREMUL_SUM({factor:g})"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
