"""tpu softmax and log-softmax (kernels/softmax.py: ``_softmax``, ``_log_softmax`` and their
backward ops) compared with PyTorch on CPU: float32 and bfloat16 along either dimension, a float32
``dtype=``, rows of -inf (all, or some), 0-d input, and the backward through each.

Every check runs the same call on CPU tensors and on their tpu copies (often non-contiguous views,
made on the device), compares values and dtypes, and asserts the op ran natively. bfloat16 results
are compared with bfloat16 tolerances, and against the bfloat16 rounding of the float32 result.
"""

from __future__ import annotations

import pytest
import torch

from conftest import assert_native, on_device

FLOAT_DTYPES = [torch.float32, torch.bfloat16]


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def sample(shape, dtype, seed=0, low=-4, high=5):
    """Reproducible input: normal floats, small integers (with ties), random booleans."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(low, high, shape, generator=g, dtype=dtype)


def transposed(shape, dtype, seed=0):
    """A non-contiguous input of ``shape``: the transpose of a contiguous tensor."""
    return sample(tuple(reversed(shape)), dtype, seed).T if len(shape) == 2 else sample(shape, dtype, seed)


def assert_same(device_result, cpu_result, **tol):
    if isinstance(cpu_result, tuple | list):
        assert len(device_result) == len(cpu_result)
        for d, c in zip(device_result, cpu_result):
            assert_same(d, c, **tol)
        return
    if isinstance(cpu_result, torch.Tensor):
        assert device_result.device.type == "tpu"
        torch.testing.assert_close(device_result.cpu(), cpu_result, equal_nan=True, **tol)
    else:
        assert device_result == cpu_result


def compare(dev, fn, *inputs, **tol):
    """Run ``fn`` on the CPU inputs and on tpu copies; the results must match. Returns the
    device result."""
    expected = fn(*inputs)
    actual = fn(*on_device(inputs, dev))
    assert_same(actual, expected, **tol)
    return actual


# ---------------------------------------------------------------------------------------------
# Softmax
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_softmax_and_log_softmax_match_cpu(dev, dtype):
    x = transposed((5, 7), dtype) * 4
    # The tpu rounds bfloat16 results once from float32; CPU's bfloat16 log_softmax loses up to
    # about an ulp of the input's magnitude (4 here) to cancellation: a looser atol against CPU,
    # and the bfloat16 rounding of the float32 result checked with default tolerances.
    tol = {"atol": 4e-2, "rtol": 1.6e-2} if dtype == torch.bfloat16 else {}

    def fn(t):
        return t.softmax(1), t.softmax(0), t.log_softmax(-1), t.log_softmax(-2)

    result = compare(dev, fn, x, **tol)
    assert_same(result, tuple(r.to(dtype) for r in fn(x.float())))
    compare(dev, lambda t: (t.softmax(1, dtype=torch.float32), t.log_softmax(0, dtype=torch.float32)), x)
    rows = x.clone()
    rows[0] = float("-inf")  # an all -inf row is NaN on CPU
    rows[1, :3] = float("-inf")
    compare(dev, lambda t: (t.softmax(1), t.log_softmax(1)), rows, **tol)
    compare(dev, lambda t: (t.softmax(0), t.log_softmax(-1)), torch.tensor(0.3, dtype=dtype))
    assert_native("aten._softmax.default", "aten._log_softmax.default")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_softmax_backward_matches_cpu(dev, dtype, log):
    x = sample((4, 6), dtype)
    weight = sample((4, 6), dtype, seed=1)

    def run(t, w):
        t = t.detach().requires_grad_()
        y = t.log_softmax(1) if log else t.softmax(1)
        (y * w).sum().backward()
        return y, t.grad

    compare(dev, run, x, weight)
    op = "_log_softmax" if log else "_softmax"
    assert_native(f"aten.{op}.default", f"aten.{op}_backward_data.default")
