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

from conftest import assert_native
from harness_reductions import assert_same, compare, sample, transposed

FLOAT_DTYPES = [torch.float32, torch.bfloat16]


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


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
