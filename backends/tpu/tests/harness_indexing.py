"""Helpers of the indexing and shape tests: CPU-versus-tpu comparison of one call (values, dtypes,
gradients, views), inputs, and a strict native check (any fallback fails)."""

from __future__ import annotations

import torch

import accelkit
from conftest import on_device, sample  # noqa: F401 - sample: for the tests


def compare(dev, fn, *inputs, **tol):
    """``fn`` on CPU inputs and on tpu copies, with no CPU fallback allowed: results and
    (mutated) inputs must match (``tol``: assert_close tolerances). Returns the device result."""
    cpu_inputs = on_device(tuple(inputs), torch.device("cpu"))  # copies: fn may write to them
    expected = fn(*cpu_inputs)
    device_inputs = on_device(tuple(inputs), dev)
    with accelkit.fallback_policy("deny"):
        actual = fn(*device_inputs)
    assert_same(actual, expected, **tol)
    for d, c in zip(device_inputs, cpu_inputs):
        if isinstance(c, torch.Tensor):
            assert_same(d, c, **tol)
    return actual


def assert_same(actual, expected, **tol):
    if isinstance(expected, tuple | list):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e, **tol)
    elif isinstance(expected, torch.Tensor):
        assert actual.device.type == "tpu"
        torch.testing.assert_close(actual.cpu(), expected, equal_nan=True, **tol)
    else:
        assert actual == expected


def transposed(shape, dtype=torch.float32, seed=0):
    """A non-contiguous tensor of ``shape`` (2-D: a transpose; otherwise a strided slice)."""
    if len(shape) == 2:
        return sample(tuple(reversed(shape)), dtype, seed).T
    wide = sample(shape[:-1] + (2 * shape[-1],), dtype, seed)
    return wide[..., ::2]


def assert_native(*names):
    ops = accelkit.stats()["ops"]
    for name in names:
        counts = ops.get(name, {})
        assert counts.get("native", 0) > 0, f"{name} did not run natively: {counts}"
    fallen = {k: v for k, v in ops.items() if v.get("fallback")}
    assert not fallen, f"CPU fallbacks: {fallen}"


def compare_grad(dev, fn, *inputs):
    """Forward and backward of ``fn`` (with a fixed output gradient) on CPU and on tpu; the
    gradients of the floating inputs must match."""

    def run(args):
        args = [a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                for a in args]
        out = fn(*args)
        weight = torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(out.dtype).to(out.device)
        out.backward(weight)
        return out, [a.grad for a in args if isinstance(a, torch.Tensor) and a.requires_grad]

    expected = run(inputs)
    with accelkit.fallback_policy("deny"):
        actual = run(on_device(tuple(inputs), dev))
    assert_same(actual, expected)
