"""Which dtypes an op's ``out=`` tensors may have, decided by PyTorch's CPU kernel.

An ``out=`` tensor of another dtype than the result is a rule of each op: ``exp`` casts into
any dtype the result can be cast to, ``mm``, ``neg`` and ``tril`` take only the result's own
dtype, ``bernoulli`` writes its float draws into an integer tensor, ``nonzero`` writes only
int64, ``nansum`` computes in the ``out=`` dtype and has no integer kernel. No generic cast rule
says all of that, nor do the Meta kernels (they skip the dtype dispatch, and some ops have
none), so a derived ``out=`` variant asks the CPU kernel itself (:class:`OutDtypeRule`).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
from torch._ops import OpOverload

from accelkit._runtime.dispatch.schema import functional_of, out_arg_names

_Tensor = torch.Tensor

#: Stand-ins of at most this many elements are real zeros; larger ones are one zero expanded
#: (no memory), which the CPU kernel reads just as well.
_DENSE_STAND_IN = 1 << 16

_CACHE_SIZE = 4096

#: What the stand-ins hold, tried in turn: zeros, ones, the arguments' own values (None).
_FILLS = (0, 1, None)


@functools.cache
def _type_name(dtype: torch.dtype) -> str:
    """PyTorch's name for a dtype in error messages (``Float``, ``Long``, ``BFloat16``)."""
    return torch.empty(0, dtype=dtype).type().removeprefix("torch.").removesuffix("Tensor")


def cast_error(result: torch.dtype, out: torch.dtype) -> RuntimeError:
    """PyTorch's error for a result that cannot be cast to an ``out=`` (or ``self``) dtype."""
    return RuntimeError(
        f"result type {_type_name(result)} can't be cast to the desired output type {_type_name(out)}"
    )


class _Unknown:
    """The CPU kernel refused the stand-ins for another reason than the ``out=`` dtypes."""


_UNKNOWN = _Unknown()


class OutDtypeRule:
    """Checks the dtypes of a call's ``out=`` tensors as PyTorch's CPU kernel does.

    :meth:`check` runs the ``out=`` overload on the CPU with stand-ins: tensors of the call's
    shapes and dtypes (zeros, and ``out=`` tensors of its out dtypes). When that raises while the
    functional overload accepts the same stand-ins, the out dtypes are the culprit, and the CPU's
    exception (same type, same words) is raised. When both raise, zeros are no valid input
    (``multinomial``'s probabilities, ``lu_solve``'s 1-based pivots, ``cholesky``'s matrix):
    the stand-ins are ones, then copies of the arguments' own values. Only if the functional
    overload refuses those too does the generic rule decide: no result may narrow its dtype
    category.

    Verdicts are kept per call signature (op, dtypes, shapes, other arguments), so a loop pays
    the CPU run once. Nothing the stand-ins do is visible: warnings are silenced, and the CPU
    generator is left as it was.
    """

    def __init__(self, device_type: str):
        self._device_type = device_type
        self._verdicts: dict[tuple, Any] = {}

    def check(self, op: OpOverload, args: tuple, kwargs: dict, outs: list[_Tensor],
              results: list[torch.dtype]) -> None:
        """Raise PyTorch's error when ``op`` (an ``out=`` overload) refuses ``outs`` for this
        call; ``kwargs`` are the caller's, without the outs; ``results`` are the dtypes the
        call computed, one per out."""
        key = _key(op, args, kwargs, outs)
        verdict = self._verdicts.get(key) if key is not None else None
        if verdict is None:
            verdict = self._ask_cpu(op, args, kwargs, outs)
            if key is not None:
                if len(self._verdicts) >= _CACHE_SIZE:
                    self._verdicts.clear()
                self._verdicts[key] = verdict
        if verdict is _UNKNOWN:
            for out, dtype in zip(outs, results):
                if not torch.can_cast(dtype, out.dtype):
                    raise cast_error(dtype, out.dtype)
        elif verdict is not True:
            kind, message = verdict
            raise _rebuilt(kind, message) from None

    def _ask_cpu(self, op: OpOverload, args: tuple, kwargs: dict, outs: list[_Tensor]) -> Any:
        """True (accepted), ``(exception type, message)`` (refused because of the outs), or
        :data:`_UNKNOWN`."""
        names, functional = out_arg_names(op), functional_of(op)[0]
        for fill in _FILLS:
            stand_args = [self._stand_in(a, fill) for a in args]
            stand_kwargs = {k: self._stand_in(v, fill) for k, v in kwargs.items()}
            stand_outs = {n: torch.zeros(o.shape, dtype=o.dtype) for n, o in zip(names, outs)}
            try:
                _quietly(op, stand_args, {**stand_kwargs, **stand_outs})
                return True
            except Exception as refusal:
                verdict = (type(refusal), str(refusal))
            if functional is None:
                return _UNKNOWN
            try:
                _quietly(functional, stand_args, stand_kwargs)
            except Exception:
                continue  # no valid input: the refusal says nothing about the outs
            return verdict
        return _UNKNOWN

    def _stand_in(self, value: Any, fill: int | None) -> Any:
        """``value`` as the CPU kernel gets it: a device tensor as a CPU tensor of its shape
        and dtype holding ``fill`` (None: its own values)."""
        if isinstance(value, _Tensor):
            if value.device.type != self._device_type:
                return value  # a host operand (a CPU scalar) stays as it is
            if fill is None:
                return value.cpu()
            if value.numel() <= _DENSE_STAND_IN:
                return torch.full(value.shape, fill, dtype=value.dtype)
            return torch.full((), fill, dtype=value.dtype).expand(value.shape)
        if isinstance(value, (list, tuple)):
            return type(value)(self._stand_in(v, fill) for v in value)
        if isinstance(value, torch.device) and value.type == self._device_type:
            return torch.device("cpu")
        if isinstance(value, str) and value.split(":")[0] == self._device_type:
            return "cpu"
        if isinstance(value, torch.Generator):
            return torch.Generator()
        return value


def _quietly(op: OpOverload, args: list, kwargs: dict) -> None:
    """Run ``op`` on the CPU, its warnings silenced and the CPU default generator restored."""
    seeded = torch.Tag.nondeterministic_seeded in op.tags
    state = torch.default_generator.get_state() if seeded else None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            op(*args, **kwargs)
    finally:
        if state is not None:
            torch.default_generator.set_state(state)


def _rebuilt(kind: type, message: str) -> Exception:
    try:
        return kind(message)
    except Exception:
        return RuntimeError(message)


def _key(op: OpOverload, args: tuple, kwargs: dict, outs: list[_Tensor]) -> tuple | None:
    """A hashable signature of the call, or None when an argument has none."""
    try:
        key = (op, _signature(args), _signature(tuple(kwargs.items())),
               tuple(o.dtype for o in outs))
        hash(key)
    except TypeError:
        return None
    return key


def _signature(value: Any) -> Any:
    if isinstance(value, _Tensor):
        return (value.dtype, tuple(value.shape), value.device.type)
    if isinstance(value, (list, tuple)):
        return tuple(_signature(v) for v in value)
    if isinstance(value, torch.Generator):
        return torch.Generator
    if isinstance(value, (float, complex)):
        return type(value)  # a number's kind takes part in type promotion, its value does not
    return (type(value), value)
