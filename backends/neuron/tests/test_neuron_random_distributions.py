"""The in-place distributions (``exponential_``, ``cauchy_``, ``log_normal_``, ``geometric_``,
``bernoulli_(Tensor)``) drawn on the engines from the device stream, never on the CPU fallback.

Their values are the device stream's, not the CPU generator's, so they are checked by their
distribution: moments (or, for the Cauchy, which has none, quantiles) within about six standard
errors for N samples, ranges, and the same values again under the same ``manual_seed``.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_native

N = 20_000


def _close(value: float, expected: float, sigma: float, n: int = N) -> None:
    bound = 6 * sigma / math.sqrt(n)
    assert abs(value - expected) < bound, (value, expected, bound)


def _fraction_below(x: torch.Tensor, q: float) -> float:
    return (x < q).double().mean().item()


@pytest.mark.parametrize("rate", [1.0, 4.0])
def test_exponential_moments(dev, rate):
    x = torch.empty(N, device=dev).exponential_(rate).cpu()
    assert x.min().item() > 0 and torch.isfinite(x).all()
    _close(x.mean().item(), 1 / rate, 1 / rate)
    # P(X < ln 2 / rate) = 1/2 (the median): a Bernoulli(1/2) proportion
    _close(_fraction_below(x, math.log(2) / rate), 0.5, 0.5)
    assert_native("aten.exponential_.default")


def test_cauchy_quantiles(dev):
    median, sigma = 1.5, 2.0
    x = torch.empty(N, device=dev).cauchy_(median, sigma).cpu()
    for q in (0.1, 0.25, 0.5, 0.75, 0.9):
        point = median + sigma * math.tan(math.pi * (q - 0.5))
        _close(_fraction_below(x, point), q, math.sqrt(q * (1 - q)))
    assert_native("aten.cauchy_.default")


def test_log_normal_is_exp_of_a_normal(dev):
    mean, std = 0.5, 0.75
    x = torch.empty(N, device=dev).log_normal_(mean, std).cpu()
    assert x.min().item() > 0
    logs = x.log()
    _close(logs.mean().item(), mean, std)
    _close(logs.var().item(), std**2, std**2 * math.sqrt(2))
    assert_native("aten.log_normal_.default")


@pytest.mark.parametrize("p", [0.2, 0.7])
def test_geometric_counts_trials(dev, p):
    x = torch.empty(N, device=dev).geometric_(p).cpu()
    assert x.min().item() >= 1 and torch.equal(x, x.round())
    _close(x.mean().item(), 1 / p, math.sqrt(1 - p) / p)
    _close((x == 1).double().mean().item(), p, math.sqrt(p * (1 - p)))
    assert_native("aten.geometric_.default")


def test_geometric_into_an_integer_tensor(dev):
    x = torch.zeros(N, dtype=torch.int64, device=dev).geometric_(0.5).cpu()
    assert x.dtype == torch.int64 and x.min().item() >= 1
    _close(x.double().mean().item(), 2.0, math.sqrt(0.5) / 0.5)


def test_bernoulli_with_a_tensor_of_probabilities(dev):
    """``bernoulli_(p)`` with ``p`` a column broadcast along rows: each row's frequency is its p."""
    probabilities = torch.tensor([[0.1], [0.5], [0.9]])
    x = torch.empty(3, N, device=dev).bernoulli_(probabilities.to(dev)).cpu()
    assert set(x.unique().tolist()) <= {0.0, 1.0}
    for row, p in zip(x, probabilities.flatten().tolist()):
        _close(row.mean().item(), p, math.sqrt(p * (1 - p)))
    assert_native("aten.bernoulli_.Tensor")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("draw", [
    lambda t: t.exponential_(2.0), lambda t: t.cauchy_(), lambda t: t.log_normal_(0.0, 0.5),
    lambda t: t.geometric_(0.3), lambda t: t.bernoulli_(torch.full_like(t, 0.25)),
], ids=["exponential", "cauchy", "log_normal", "geometric", "bernoulli"])
def test_same_seed_same_values_and_the_stream_advances(dev, dtype, draw):
    torch.manual_seed(7)
    first = draw(torch.empty(1000, dtype=dtype, device=dev)).cpu()
    second = draw(torch.empty(1000, dtype=dtype, device=dev)).cpu()
    torch.manual_seed(7)
    again = draw(torch.empty(1000, dtype=dtype, device=dev)).cpu()
    assert first.dtype == dtype
    assert torch.equal(first, again)
    assert not torch.equal(first, second)
