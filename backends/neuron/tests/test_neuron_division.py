"""Integer division and remainder on neuron, checked against the CPU: a zero divisor raises
PyTorch's ``RuntimeError: ZeroDivisionError`` at the op (the simulator computes on the host, so
it can), for every form of the op and every kind of divisor, and writes nothing; float division
by zero gives IEEE's inf and nan, as on the CPU. An integer power with a negative exponent is
an integer reciprocal, as on the CPU (0 unless the base is 1 or -1)."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_native

import accelkit

INTEGER_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)

#: (name, functional, in-place, out=): each takes (dividend, divisor) — the out= form also the
#: out tensor.
OPS = {
    "floor_divide": (lambda a, b: a // b, lambda a, b: a.floor_divide_(b),
                     lambda a, b, out: torch.floor_divide(a, b, out=out)),
    "div_floor": (lambda a, b: torch.div(a, b, rounding_mode="floor"),
                  lambda a, b: a.div_(b, rounding_mode="floor"),
                  lambda a, b, out: torch.div(a, b, rounding_mode="floor", out=out)),
    "div_trunc": (lambda a, b: torch.div(a, b, rounding_mode="trunc"),
                  lambda a, b: a.div_(b, rounding_mode="trunc"),
                  lambda a, b, out: torch.div(a, b, rounding_mode="trunc", out=out)),
    "remainder": (lambda a, b: a % b, lambda a, b: a.remainder_(b),
                  lambda a, b, out: torch.remainder(a, b, out=out)),
    "fmod": (lambda a, b: torch.fmod(a, b), lambda a, b: a.fmod_(b),
             lambda a, b, out: torch.fmod(a, b, out=out)),
}

#: Ways to pass a zero divisor, from a CPU tensor of divisors to the value the op is given.
DIVISORS = {
    "tensor": lambda dev, dtype: torch.tensor([3, 0, 2], dtype=dtype).to(dev),
    "python": lambda dev, dtype: 0,
    "0-dim": lambda dev, dtype: torch.tensor(0, dtype=dtype).to(dev),
    "host 0-dim": lambda dev, dtype: torch.tensor(0, dtype=dtype),
}


def dividend(dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor([7, 5, 9], dtype=dtype) if dtype == torch.uint8 else torch.tensor([7, -5, 9], dtype=dtype)


def cpu_error(fn) -> str:
    with pytest.raises(RuntimeError) as caught:
        fn()
    return str(caught.value)


@pytest.mark.parametrize("dtype", INTEGER_DTYPES, ids=str)
@pytest.mark.parametrize("divisor", DIVISORS)
@pytest.mark.parametrize("op", OPS)
def test_integer_division_by_zero_raises_as_on_the_cpu_and_writes_nothing(dev, op, divisor, dtype):
    functional, inplace, out_form = OPS[op]
    a = dividend(dtype)
    cpu_zero = DIVISORS[divisor]("cpu", dtype)
    expected = cpu_error(lambda: functional(a, cpu_zero))
    assert expected == "ZeroDivisionError"

    x, zero = a.to(dev), DIVISORS[divisor](dev, dtype)
    assert cpu_error(lambda: functional(x, zero)) == expected
    assert cpu_error(lambda: inplace(x, zero)) == expected
    torch.testing.assert_close(x.cpu(), a, rtol=0, atol=0)  # the in-place form wrote nothing
    out = torch.full((3,), 42, dtype=dtype, device=dev)
    assert cpu_error(lambda: out_form(x, zero, out)) == expected
    torch.testing.assert_close(out.cpu(), torch.full((3,), 42, dtype=dtype), rtol=0, atol=0)
    # the process keeps working: the same op with a non-zero divisor is right
    torch.testing.assert_close(functional(x, 2).cpu(), functional(a, 2), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", INTEGER_DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_integer_division_without_zeros_matches_the_cpu_in_every_form(dev, op, dtype):
    functional, inplace, out_form = OPS[op]
    a = dividend(dtype)
    b = torch.tensor([2, 3, 4], dtype=dtype) if dtype == torch.uint8 else torch.tensor([2, 3, -4], dtype=dtype)
    x, y = a.to(dev), b.to(dev)
    torch.testing.assert_close(functional(x, y).cpu(), functional(a, b), rtol=0, atol=0)
    out = torch.empty(3, dtype=dtype, device=dev)
    torch.testing.assert_close(out_form(x, y, out).cpu(), out_form(a, b, torch.empty(3, dtype=dtype)),
                               rtol=0, atol=0)
    torch.testing.assert_close(inplace(x.clone(), y).cpu(), inplace(a.clone(), b), rtol=0, atol=0)


def test_floor_divide_functional_and_in_place_take_the_same_native_program(dev):
    """``a // b`` used to decompose into ``div(rounding_mode="floor")`` (unchecked) while
    ``a //= b`` fell back to the CPU (checked): now both run the same native kernel."""
    x, y = torch.tensor([7, -5, 9]).to(dev), torch.tensor([2, 3, -4]).to(dev)
    accelkit.reset_stats()
    x // y
    x.clone().floor_divide_(y)
    torch.floor_divide(x, y, out=torch.empty(3, dtype=torch.int64, device=dev))
    assert_native("aten.floor_divide.default", "aten.floor_divide_.Tensor", "aten.floor_divide.out")


def test_a_number_divided_by_a_tensor_with_a_zero_raises(dev):
    z = torch.tensor([3, 0]).to(dev)
    assert cpu_error(lambda: 5 % torch.tensor([3, 0])) == "ZeroDivisionError"
    assert cpu_error(lambda: 5 % z) == "ZeroDivisionError"
    assert cpu_error(lambda: 5 // z) == "ZeroDivisionError"
    torch.testing.assert_close((5 % torch.tensor([3, 2]).to(dev)).cpu(), 5 % torch.tensor([3, 2]))
    assert_native("aten.remainder.Scalar_Tensor")


def test_an_empty_division_by_zero_is_empty_as_on_the_cpu(dev):
    empty = torch.empty(0, dtype=torch.int64)
    assert (empty.to(dev) // 0).cpu().shape == (empty // 0).shape == (0,)
    assert (empty.to(dev) % torch.tensor(0).to(dev)).cpu().shape == (0,)


@pytest.mark.parametrize("op", ["floor_divide", "div_floor", "div_trunc", "remainder", "fmod"])
def test_float_division_by_zero_gives_inf_and_nan_as_on_the_cpu(dev, op):
    functional = OPS[op][0]
    a, b = torch.tensor([1.0, -1.0, 0.0, 2.5]), torch.tensor([0.0, 0.0, 0.0, -0.0])
    torch.testing.assert_close(functional(a.to(dev), b.to(dev)).cpu(), functional(a, b), equal_nan=True)
    torch.testing.assert_close(functional(a.to(dev), 0).cpu(), functional(a, 0), equal_nan=True)


def test_an_integer_tensor_divided_by_a_float_zero_is_float_and_does_not_raise(dev):
    a = torch.tensor([7, -5, 0])
    torch.testing.assert_close((a.to(dev) // 0.0).cpu(), a // 0.0, equal_nan=True)
    torch.testing.assert_close((a.to(dev) % torch.tensor([0.0]).to(dev)).cpu(), a % torch.tensor([0.0]),
                               equal_nan=True)


@pytest.mark.parametrize("dtype", INTEGER_DTYPES, ids=str)
def test_true_division_of_integers_by_zero_is_float_as_on_the_cpu(dev, dtype):
    a, b = dividend(dtype), torch.tensor([3, 0, 2], dtype=dtype)
    expected = torch.true_divide(a, b)
    assert expected.dtype == torch.float32
    torch.testing.assert_close(torch.true_divide(a.to(dev), b.to(dev)).cpu(), expected, equal_nan=True)
    torch.testing.assert_close((a.to(dev) / 0).cpu(), a / 0, equal_nan=True)


@pytest.mark.parametrize("dtype", (torch.int8, torch.int32, torch.int64), ids=str)
def test_integer_powers_with_negative_exponents_are_integer_reciprocals_as_on_the_cpu(dev, dtype):
    base = torch.tensor([[-8], [6], [1], [-1], [0], [2]], dtype=dtype)
    exponent = torch.tensor([-3, -2, -1, 0, 3], dtype=dtype)
    assert torch.equal(torch.pow(base.to(dev), exponent.to(dev)).cpu(), torch.pow(base, exponent))
    assert torch.equal((3 ** exponent.to(dev)).cpu(), 3 ** exponent)
    assert torch.equal(((-1) ** exponent.to(dev)).cpu(), (-1) ** exponent)



@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_truncating_division_of_reduced_floats_rounds_the_quotient_first_as_on_the_cpu(dev, dtype):
    # CPU rounds a bfloat16/float16 quotient to its dtype before truncating (17.99 is 18 in
    # bfloat16, so 18); neuron truncated the fp32 quotient, 7.6% of bfloat16 quotients apart.
    # A one-element divisor is a scalar to CPU's kernel, which divides by it in float32.
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(4000, generator=g) * 30).to(dtype)
    y = (torch.randn(4000, generator=g) * 2).to(dtype)
    for divisor in (y, y[:1], 1.7):
        on_device = divisor.to(dev) if isinstance(divisor, torch.Tensor) else divisor
        assert torch.equal(torch.div(x.to(dev), on_device, rounding_mode="trunc").cpu(),
                           torch.div(x, divisor, rounding_mode="trunc"))
    # fmod's gradient for its divisor is -trunc(x / y): the conformance run found it apart.
    assert torch.equal(torch.fmod(x.to(dev), y.to(dev)).cpu(), torch.fmod(x, y))
