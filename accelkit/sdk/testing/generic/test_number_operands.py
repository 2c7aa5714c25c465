"""A Python number as the second operand of every binary op that has one: the device gives the
CPU's values and dtype, or the CPU's error.

The ops are those PyTorch gives both a ``.Tensor`` and a ``.Scalar`` overload. A backend that
implements only ``.Tensor`` still receives the number: PyTorch's ``.Scalar`` kernel wraps it in
a tensor and calls ``.Tensor``, and a kernel (or its shape inference) that expects a tensor
there fails (neuron's ``copysign(x, -3.14)`` did).

Device-generic: runs on ref, and on tpu and neuron through ``--accelkit-device``.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from accelkit.sdk.testing import device_under_test

DEVICE = device_under_test()


def _binary_ops_taking_a_number() -> list[str]:
    names = []
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name, None)
        if not hasattr(packet, "overloads") or name.endswith("_"):
            continue
        overloads = packet.overloads()
        if "Tensor" in overloads and "Scalar" in overloads and callable(getattr(torch, name, None)):
            names.append(name)
    return sorted(names)


OPS = _binary_ops_taking_a_number()
OPERANDS = {torch.float32: (-3.25, 2), torch.int64: (3, -2.5), torch.bool: (True, 1.5)}


def _outcome(fn):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn()
    except Exception as error:  # the error is the outcome compared
        return type(error)


def test_the_walk_finds_the_ops_it_is_about():
    assert {"add", "copysign", "eq", "remainder"} <= set(OPS)


def _x(dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.tensor([[True, False, True]])
    return (torch.arange(-3, 3).reshape(2, 3) * 0.75).to(dtype)


def _cases(cpu_raises: bool) -> list:
    cases = []
    for dtype, numbers in OPERANDS.items():
        for name in OPS:
            for number in numbers:
                if isinstance(_outcome(lambda: getattr(torch, name)(_x(dtype), number)), type) == cpu_raises:
                    cases.append(pytest.param(name, dtype, number, id=f"{name}-{str(dtype)[6:]}-{number}",
                                              marks=_known_gap(name, dtype) if cpu_raises else ()))
    return cases


def _known_gap(name: str, dtype: torch.dtype) -> tuple:
    """Where a device does not yet refuse what the CPU refuses, or refuses it with another
    exception type (the CPU's refusals come from its per-dtype kernel tables)."""
    reason = None
    if name.startswith("bitwise_"):
        reason = "a bitwise op with a float operand raises TypeError on tpu and neuron; CPU raises NotImplementedError"
    elif name in ("fmod", "remainder") and dtype == torch.bool:
        reason = "tpu and neuron compute fmod/remainder of bool tensors, which CPU refuses (NotImplementedError)"
    elif name in ("sub", "subtract", "rsub") and dtype == torch.bool:
        reason = "bool subtraction: neuron computes it and tpu raises TypeError; CPU raises RuntimeError"
    elif name == "searchsorted" and DEVICE.type == "tpu":
        reason = "searchsorted with a number for sorted_sequence: tpu raises AttributeError; CPU raises RuntimeError"
    # Gaps of tpu and neuron; the reference backend runs CPU's kernels and has none.
    gap = reason is not None and DEVICE.type in ("tpu", "neuron")
    return (pytest.mark.xfail(reason=reason, strict=True),) if gap else ()


@pytest.mark.parametrize("name, dtype, number", _cases(cpu_raises=False))
def test_a_number_operand_gives_cpus_result(dev, name, dtype, number):
    fn, x = getattr(torch, name), _x(dtype)
    want = fn(x, number)
    got = _outcome(lambda: fn(x.to(dev), number))
    if not isinstance(want, torch.Tensor):  # result_type: a dtype
        assert got == want
        return
    assert isinstance(got, torch.Tensor), f"{name}(x, {number!r}) raised {got.__name__} on the device"
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, equal_nan=True, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name, dtype, number", _cases(cpu_raises=True))
def test_a_number_operand_the_cpu_refuses_is_refused_alike(dev, name, dtype, number):
    fn, x = getattr(torch, name), _x(dtype)
    want = _outcome(lambda: fn(x, number))
    got = _outcome(lambda: fn(x.to(dev), number))
    assert got is want, f"{name}(x, {number!r}): CPU raises {want.__name__}, the device gave {got!r}"
