"""Helpers of the reduction, softmax, sorting and matmul-family tests: CPU-versus-tpu comparison of
one call (values, dtypes, gradients), inputs."""

from __future__ import annotations

import torch

from conftest import on_device
from conftest import sample as shared_sample


ALL_DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool]


def sample(shape, dtype, seed=0, low=-4, high=5):
    """:func:`conftest.sample` with this family's integer range."""
    return shared_sample(shape, dtype, seed, low, high)


def compare(dev, fn, *inputs, **tol):
    """Run ``fn`` on the CPU inputs and on tpu copies; the results must match. Returns the
    device result."""
    expected = fn(*inputs)
    actual = fn(*on_device(inputs, dev))
    assert_same(actual, expected, **tol)
    return actual


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


def transposed(shape, dtype, seed=0):
    """A non-contiguous input of ``shape``: the transpose of a contiguous tensor."""
    return sample(tuple(reversed(shape)), dtype, seed).T if len(shape) == 2 else sample(shape, dtype, seed)
