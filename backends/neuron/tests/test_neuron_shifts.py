"""neuron's bit shifts (``<<``, ``>>``, ``bitwise_*_shift`` and their in-place forms) vs CPU PyTorch.

PyTorch's OpInfo comparison skips the shifts ("some inputs produce undefined outputs"); PyTorch
does define them, and the CPU computes it: a shift by a negative amount or by at least the
type's width gives 0 to the left and the sign fill to the right. The amounts here cover those
cases, in every integer type (int64 within the 32-bit datapath's range). Results are exact.
"""

from __future__ import annotations

import pytest
import torch

from conftest import assert_native

INTEGERS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]


def _operands(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    signed = dtype != torch.uint8
    x = torch.randint(-100 if signed else 0, 100 if signed else 250, (300,), generator=g, dtype=dtype)
    amounts = torch.randint(-3 if signed else 0, 70, (300,), generator=g)
    if dtype == torch.int64:
        amounts = amounts.clamp(max=20)  # results stay within int32, the datapath's range
    return x, amounts.to(dtype)


CASES = {
    "lshift": (lambda x, y: x << y, "aten.__lshift__.Tensor"),
    "rshift": (lambda x, y: x >> y, "aten.__rshift__.Tensor"),
    "left_by_number": (lambda x, y: torch.bitwise_left_shift(x, 3), "aten.bitwise_left_shift.Tensor_Scalar"),
    "right_past_width": (lambda x, y: torch.bitwise_right_shift(x, 9), "aten.bitwise_right_shift.Tensor_Scalar"),
    "number_left": (lambda x, y: torch.bitwise_left_shift(5, y), "aten.bitwise_left_shift.Scalar_Tensor"),
    "number_right": (lambda x, y: torch.bitwise_right_shift(100, y), "aten.bitwise_right_shift.Scalar_Tensor"),
    "ilshift": (lambda x, y: x.clone().__ilshift__(y), "aten.__ilshift__.Tensor"),
    "irshift_number": (lambda x, y: x.clone().__irshift__(2), "aten.__irshift__.Scalar"),
    "left_inplace": (lambda x, y: x.clone().bitwise_left_shift_(y), "aten.bitwise_left_shift_.Tensor"),
    "right_by_one_element": (lambda x, y: x >> y[:1], "aten.__rshift__.Tensor"),
}


@pytest.mark.parametrize("dtype", INTEGERS, ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_shift_matches_cpu(dev, case, dtype):
    fn, op = CASES[case]
    x, y = _operands(dtype)
    expected = fn(x, y)
    actual = fn(x.to(dev), y.to(dev)).cpu()
    assert actual.dtype == expected.dtype
    assert torch.equal(actual, expected)
    assert_native(op)


def test_negative_amount_in_a_signed_type(dev):
    x = torch.tensor([100, -3, 7], dtype=torch.int8)
    y = torch.tensor([2, 9, -1], dtype=torch.int8)
    for fn in (lambda a, b: a << b, lambda a, b: a >> b):
        assert torch.equal(fn(x.to(dev), y.to(dev)).cpu(), fn(x, y))


def test_floating_operands_are_refused_as_on_cpu(dev):
    """A float shift fails on both (the CPU's dtype dispatch, or PyTorch's integral check)."""
    with pytest.raises(RuntimeError, match="lshift"):
        torch.tensor([1.5]) << 1
    with pytest.raises(RuntimeError, match="lshift"):
        torch.tensor([1.5], device=dev) << 1
