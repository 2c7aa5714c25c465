"""neuron's ``_add_relu`` (the fused add + ReLU that quantization-aware and JIT-fused models call)
vs CPU PyTorch, in the types the CPU computes it in; bfloat16 is refused as on the CPU.

The CPU's vectorized kernel clamps the sum to ``[0, largest value]``: an infinite sum gives
float32's largest finite value, a NaN stays NaN. Its scalar tail (the last few elements) turns a
NaN into 0 instead, so the NaN here sits far from the end.
"""

from __future__ import annotations

import pytest
import torch

from conftest import assert_native

aten = torch.ops.aten


def _operands(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(300, generator=g), torch.randn(300, generator=g)
    if dtype.is_floating_point:
        x[5], y[7], x[9], y[9] = float("nan"), float("inf"), -0.0, 0.0
        return x.to(dtype), y.to(dtype)
    return (x * 50).to(dtype), (y * 50).to(dtype)


CASES = {
    "tensor_alpha": (lambda x, y: aten._add_relu(x, y, alpha=2), "aten._add_relu.Tensor"),
    "number": (lambda x, y: aten._add_relu(x, 3), "aten._add_relu.Scalar"),
    "in_place": (lambda x, y: aten._add_relu_(x.clone(), y), "aten._add_relu_.Tensor"),
    "one_element": (lambda x, y: aten._add_relu(x, y[:1]), "aten._add_relu.Tensor"),
    "out": (lambda x, y: aten._add_relu.out(x, y, out=torch.empty_like(x)), "aten._add_relu.out"),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8, torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_add_relu_matches_cpu(dev, case, dtype):
    fn, op = CASES[case]
    x, y = _operands(dtype)
    expected = fn(x, y)
    actual = fn(x.to(dev), y.to(dev)).cpu()
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)
    assert_native(op)


def test_bfloat16_is_refused_as_on_cpu(dev):
    with pytest.raises(RuntimeError) as on_cpu:
        aten._add_relu(torch.ones(3, dtype=torch.bfloat16), torch.ones(3, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError) as on_device:
        aten._add_relu(torch.ones(3, dtype=torch.bfloat16, device=dev), torch.ones(3, dtype=torch.bfloat16, device=dev))
    assert str(on_device.value).splitlines()[0] == str(on_cpu.value).splitlines()[0]
