"""``logspace`` (``decompositions/logspace.py``) against the CPU, the fallback denied: its
exponents as double-float sums, so float32 results stay within two ulps of the CPU's (a float32
exponent would be up to 12 ulps off at 10^10)."""

from __future__ import annotations

import pytest
import torch

import accelkit
from conftest import assert_decomposed

ULP = torch.finfo(torch.float32).eps

#: (start, end, steps, base): both halves of the CPU's split, large exponents both ways, a base
#: float32 cannot hold exactly (3.7), a base below 1, base 1, two steps, a descending range.
CASES = [(-10.0, 10.0, 41, 10.0), (0.3, 9.7, 17, 10.0), (-37.5, 37.5, 25, 2.0), (4.3, -4.0, 9, 3.7),
         (-20.0, 20.0, 33, 0.5), (-5.0, 5.0, 11, 1.0), (1.0, 3.0, 2, 10.0), (12.1, 3.9, 1000, 2.718281828459045)]


def _assert_close_to_cpu(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(got.isinf(), expected.isinf())
    finite = expected.isfinite()
    torch.testing.assert_close(got[finite], expected[finite], rtol=2 * ULP, atol=0)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_logspace_matches_the_cpu(dev, case):
    start, end, steps, base = case
    with accelkit.fallback_policy("deny"):
        got = torch.logspace(start, end, steps, base=base, device=dev).cpu()
    _assert_close_to_cpu(got, torch.logspace(start, end, steps, base=base))
    assert_decomposed("aten.logspace")
    assert accelkit.stats()["neuron"]["estimate"]["device_seconds"] > 0


def test_tensor_endpoints_and_out_forms(dev):
    expected = torch.logspace(-3.0, 4.5, 7, base=2.0)
    start, end = torch.tensor(-3.0), torch.tensor(4.5)
    with accelkit.fallback_policy("deny"):
        for args in ((start.to(dev), end.to(dev)), (start.to(dev), 4.5), (-3.0, end.to(dev)), (-3.0, 4.5)):
            _assert_close_to_cpu(torch.logspace(*args, 7, base=2.0, device=dev).cpu(), expected)
            out = torch.empty(3, device=dev)  # resized, as the CPU resizes it
            torch.logspace(*args, 7, base=2.0, out=out)
            _assert_close_to_cpu(out.cpu(), expected)
    assert_decomposed("aten.logspace")


def test_bfloat16_rounds_the_float32_value_once(dev):
    expected = torch.logspace(-4.0, 6.0, 21, dtype=torch.bfloat16)
    with accelkit.fallback_policy("deny"):
        got = torch.logspace(-4.0, 6.0, 21, dtype=torch.bfloat16, device=dev).cpu()
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected, rtol=torch.finfo(torch.bfloat16).eps, atol=0)


def test_one_step_and_no_steps(dev):
    """One step is the CPU's double power of the start, rounded once; no steps, an empty result."""
    with accelkit.fallback_policy("deny"):
        for start in (2.5, 9.3, -50.0):
            got = torch.logspace(start, 9.0, 1, device=dev).cpu()
            assert torch.equal(got, torch.logspace(start, 9.0, 1))
        assert torch.logspace(0.0, 1.0, 0, device=dev).shape == (0,)
        # past float's range the CPU's fill refuses the value, and so does the device's
        with pytest.raises(RuntimeError, match="cannot be converted to type float without overflow"):
            torch.logspace(60.0, 9.0, 1, device=dev)
    assert_decomposed("aten.logspace")


def test_integer_results_take_the_cpu(dev):
    """The CPU truncates a double power to an integer: that stays the CPU's (the fallback)."""
    with accelkit.fallback_policy("allow"):
        as_int = torch.logspace(0.0, 3.0, 4, dtype=torch.int64, device=dev).cpu()
    assert torch.equal(as_int, torch.logspace(0.0, 3.0, 4, dtype=torch.int64))
    assert accelkit.stats()["ops"]["aten.logspace.out"]["fallback"] == 1
