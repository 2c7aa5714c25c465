"""Helpers of the elementwise and activation tests: CPU-versus-tpu comparison of one call (values,
dtypes, gradients), inputs, tolerances."""

from __future__ import annotations

import torch

import accelkit
from conftest import on_device, sample  # noqa: F401 - sample: for the tests


BF16_TOL = {"rtol": 1.6e-2, "atol": 1e-2}


def compare(dev, fn, *inputs, **tol):
    """Run ``fn`` on the CPU inputs and on tpu copies (no CPU fallback allowed); the results
    must match in value and dtype. Returns the device result. (The copies are made first, so
    ``fn`` may write to its inputs.)"""
    device_inputs = on_device(inputs, dev)
    expected = fn(*inputs)
    with accelkit.fallback_policy("deny"):
        actual = fn(*device_inputs)
    assert_same(actual, expected, **{**tolerance(*inputs), **tol})
    return actual


def assert_same(device_result, cpu_result, **tol):
    if isinstance(cpu_result, tuple | list):
        assert len(device_result) == len(cpu_result)
        for d, c in zip(device_result, cpu_result):
            assert_same(d, c, **tol)
        return
    assert device_result.device.type == "tpu"
    torch.testing.assert_close(device_result.cpu(), cpu_result, equal_nan=True, **tol)


def transposed(shape, dtype, seed=0, **kw):
    """A non-contiguous 2-D input of ``shape``: the transpose of a contiguous tensor."""
    return sample(tuple(reversed(shape)), dtype, seed, **kw).T


def tolerance(*tensors):
    """bfloat16 tolerances if any input is bfloat16, else assert_close's defaults."""
    if any(isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 for t in tensors):
        return dict(BF16_TOL)
    return {}
