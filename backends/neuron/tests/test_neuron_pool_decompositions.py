"""neuron's 3-d and fractional pooling (``pool3d.py``'s decompositions) vs CPU PyTorch, fallback denied.

Max pooling's values and indices are compared exactly, NaN and all ``-inf`` windows included;
average pooling and every backward within float32's last bits (the additions' grouping
differs), bfloat16 within a step or two (the CPU's max-pool backward rounds every addition to
bfloat16, neuron's rounds the sum once). avg_pool3d has no bfloat16 form on the CPU and is
refused on neuron as there.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import accelkit

MAX_CASES = {
    "plain": lambda t: F.max_pool3d(t, 3, 2, 1, return_indices=True),
    "dilated_ceil": lambda t: F.max_pool3d(t, (2, 3, 2), (2, 1, 3), (1, 1, 0), dilation=(2, 1, 1),
                                           ceil_mode=True, return_indices=True),
    "unbatched": lambda t: F.max_pool3d(t[0], 2, return_indices=True),
    "adaptive": lambda t: F.adaptive_max_pool3d(t, (4, 3, 5), return_indices=True),
    "adaptive_grow": lambda t: F.adaptive_max_pool3d(t, (7, 9, 8), return_indices=True),
}

AVG_CASES = {
    "plain": lambda t: F.avg_pool3d(t, 3, 2, 1),
    "exclusive_ceil": lambda t: F.avg_pool3d(t, (2, 3, 3), (2, 2, 2), (1, 1, 0), ceil_mode=True,
                                             count_include_pad=False),
    "divisor_unbatched": lambda t: F.avg_pool3d(t[0], 2, divisor_override=3),
    "adaptive": lambda t: F.adaptive_avg_pool3d(t, (4, 3, 5)),
    "adaptive_unbatched": lambda t: F.adaptive_avg_pool3d(t[1], (5, 7, 3)),
}


def _input(dtype: torch.dtype, special: bool = False) -> torch.Tensor:
    x = torch.randn(2, 3, 6, 7, 8, generator=torch.Generator().manual_seed(0))
    if special:
        x[0, 0, 1, 2, 3] = float("nan")
        x[0, 1] = -float("inf")
    return x.to(dtype)


def _run(fn, x: torch.Tensor, device):
    """The op's outputs and the input's gradient for a fixed output gradient."""
    leaf = x.detach().to(device).requires_grad_()
    outputs = fn(leaf)
    values = outputs[0] if isinstance(outputs, tuple) else outputs
    grad = torch.randn(values.shape, generator=torch.Generator().manual_seed(1)).to(values.dtype)
    values.backward(grad.to(device))
    outputs = tuple(o.detach().cpu() for o in outputs) if isinstance(outputs, tuple) else (values.detach().cpu(),)
    return outputs, leaf.grad.cpu()


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    if expected.dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6, equal_nan=True)
    else:
        # the CPU's max-pool backward rounds each addition to bfloat16; neuron's adds round once
        step = expected.float().abs().max().item() * 2.0 ** -7
        torch.testing.assert_close(actual.float(), expected.float(), rtol=2.0 ** -6, atol=step)


def _on_device(fn, x, dev):
    accelkit.reset_stats()
    with accelkit.fallback_policy("deny"):
        result = _run(fn, x, dev)
    assert not any(counts.get("fallback", 0) for counts in accelkit.stats()["ops"].values())
    return result


@pytest.mark.parametrize("special", [False, True], ids=["finite", "nan_and_inf"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", MAX_CASES, ids=str)
def test_max_pool3d_matches_cpu(dev, case, dtype, special):
    x = _input(dtype, special)
    (values, indices), grad = _run(MAX_CASES[case], x, "cpu")
    (actual_values, actual_indices), actual_grad = _on_device(MAX_CASES[case], x, dev)
    assert torch.equal(actual_indices, indices)
    torch.testing.assert_close(actual_values, values, rtol=0, atol=0, equal_nan=True)
    _close(actual_grad, grad)


@pytest.mark.parametrize("case", AVG_CASES, ids=str)
def test_avg_pool3d_matches_cpu(dev, case):
    x = _input(torch.float32)
    (values,), grad = _run(AVG_CASES[case], x, "cpu")
    (actual,), actual_grad = _on_device(AVG_CASES[case], x, dev)
    _close(actual, values)
    _close(actual_grad, grad)


@pytest.mark.parametrize("case", ["adaptive", "adaptive_unbatched"], ids=str)
def test_adaptive_avg_pool3d_bfloat16_matches_cpu(dev, case):
    x = _input(torch.bfloat16)
    (values,), grad = _run(AVG_CASES[case], x, "cpu")
    (actual,), actual_grad = _on_device(AVG_CASES[case], x, dev)
    _close(actual, values)
    _close(actual_grad, grad)


def test_avg_pool3d_refuses_bfloat16_as_the_cpu_does(dev):
    x = _input(torch.bfloat16)
    with pytest.raises(NotImplementedError):
        F.avg_pool3d(x, 2)
    with pytest.raises(NotImplementedError, match="avg_pool3d"):
        F.avg_pool3d(x.to(dev), 2)


def test_all_minus_inf_window_reports_its_first_in_bounds_position(dev):
    x = torch.full((1, 1, 3, 3, 3), -float("inf"))
    _, indices = F.max_pool3d(x.to(dev), 2, 2, 1, return_indices=True)
    # output (od, oh, ow) = (1, 1, 1) starts at input (1, 1, 1): flat index 13
    assert indices.cpu()[0, 0, 1, 1, 1].item() == 13
    assert torch.equal(indices.cpu(), F.max_pool3d(x, 2, 2, 1, return_indices=True)[1])


FRACTIONAL = {
    "2d": (F.fractional_max_pool2d, (2, 3, 9, 11), (3, 2), (4, 5)),
    "2d_unbatched_dense": (F.fractional_max_pool2d, (3, 9, 11), 2, (8, 10)),
    "2d_one_output": (F.fractional_max_pool2d, (1, 2, 5, 6), 2, (1, 1)),
    "3d": (F.fractional_max_pool3d, (2, 2, 7, 8, 9), (2, 3, 2), (3, 4, 5)),
    "3d_unbatched_more_samples": (F.fractional_max_pool3d, (4, 5, 5, 5), 2, (2, 2, 2)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", FRACTIONAL, ids=str)
def test_fractional_max_pool_matches_cpu(dev, case, dtype):
    """Same random samples on both: the windows, values and indices are the CPU's exactly."""
    fn, shape, kernel, output_size = FRACTIONAL[case]
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(shape, generator=generator).to(dtype)
    x.view(-1)[5] = float("nan")
    rank = len(output_size)
    batch = shape[0] if len(shape) == rank + 2 else 1
    if case.endswith("more_samples"):  # nn.FractionalMaxPool3d's module test: the CPU reads the first
        batch = 2
    samples = torch.rand(batch, shape[-rank - 1], rank, generator=generator).to(dtype)

    def pool(t):
        return fn(t, kernel, output_size=output_size, return_indices=True,
                  _random_samples=samples.to(t.device))

    (values, indices), grad = _run(pool, x, "cpu")
    (actual_values, actual_indices), actual_grad = _on_device(pool, x, dev)
    assert torch.equal(actual_indices, indices)
    torch.testing.assert_close(actual_values, values, rtol=0, atol=0, equal_nan=True)
    _close(actual_grad, grad)


def test_adaptive_avg_pool3d_backward_out_form(dev):
    x = _input(torch.float32)
    grad = torch.randn(2, 3, 3, 4, 5, generator=torch.Generator().manual_seed(3))
    expected = torch.ops.aten._adaptive_avg_pool3d_backward(grad, x)
    out = torch.empty(0, device=dev)
    with accelkit.fallback_policy("deny"):
        torch.ops.aten.adaptive_avg_pool3d_backward.grad_input(grad.to(dev), x.to(dev), grad_input=out)
    _close(out.cpu(), expected)
