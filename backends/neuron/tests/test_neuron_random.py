"""Random tile programs: right distributions, drawn from the device generator.

The values are the engines' PRNG stream, not the CPU's, so they are checked statistically. With
n = 20 000 samples the standard error of a mean is sigma / sqrt(n) ≈ 0.007 sigma; the bounds below
are about six standard errors wide (a correct sampler fails them with probability < 1e-8, a
wrong scale, shift or probability misses them by far).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_native

N = 20_000


def _close(value: float, expected: float, sigma: float, n: int = N) -> None:
    bound = 6 * sigma / math.sqrt(n)
    assert abs(value - expected) < bound, (value, expected, bound)


def test_rand_is_uniform_on_the_unit_interval(dev):
    u = torch.rand(N, device=dev).cpu()
    assert 0.0 <= u.min().item() and u.max().item() < 1.0
    _close(u.mean().item(), 0.5, math.sqrt(1 / 12))
    _close(u.var().item(), 1 / 12, math.sqrt(1 / 180))  # sd of (u - 1/2)^2 is sqrt(1/180)
    assert len(u.unique()) > N * 0.99  # 24 random bits per value: few repeats
    assert_native("aten.uniform_.default")


def test_uniform_range(dev):
    u = torch.empty(N, device=dev).uniform_(-2.0, 5.0).cpu()
    assert -2.0 <= u.min().item() and u.max().item() < 5.0
    _close(u.mean().item(), 1.5, 7 / math.sqrt(12))


@pytest.mark.parametrize("mean, std", [(0.0, 1.0), (2.0, 3.0)])
def test_normal_moments(dev, mean, std):
    x = torch.empty(N, device=dev).normal_(mean, std).cpu()
    _close(x.mean().item(), mean, std)
    _close(x.var().item(), std**2, std**2 * math.sqrt(2))
    skew = ((x - x.mean()) ** 3).mean().item() / x.std().item() ** 3
    _close(skew, 0.0, math.sqrt(6))
    assert_native("aten.normal_.default")


@pytest.mark.parametrize("form", ["tensor_tensor", "tensor_float", "float_tensor", "out"])
def test_normal_with_tensor_mean_or_std(dev, form):
    """``torch.normal`` with per-element means and stds: two halves of different distributions,
    each with the moments its mean and std give; a mean broadcast against a std."""
    half = N // 2
    mean = torch.cat([torch.full((half,), -3.0), torch.full((half,), 2.0)]).to(dev)
    std = torch.cat([torch.full((half,), 0.5), torch.full((half,), 4.0)]).to(dev)
    if form == "tensor_tensor":
        x, op = torch.normal(mean, std), "aten.normal.Tensor_Tensor"
    elif form == "tensor_float":
        x, op, std = torch.normal(mean, 2.0), "aten.normal.Tensor_float", torch.full((N,), 2.0)
    elif form == "float_tensor":
        x, op, mean = torch.normal(1.0, std), "aten.normal.float_Tensor", torch.full((N,), 1.0)
    else:
        x, op = torch.normal(mean, std, out=torch.empty(N, device=dev)), "aten.normal.Tensor_Tensor_out"
    x, mean, std = x.cpu(), mean.cpu(), std.cpu()
    for part in (slice(0, half), slice(half, N)):
        _close(x[part].mean().item(), mean[part][0].item(), std[part][0].item(), n=half)
        _close(x[part].std().item(), std[part][0].item(), std[part][0].item() / math.sqrt(2), n=half)
    assert_native(op)
    broadcast = torch.normal(torch.zeros(4, 1, device=dev), torch.ones(3, device=dev))
    assert broadcast.shape == (4, 3)


def test_normal_refuses_a_negative_std_as_on_cpu(dev):
    with pytest.raises(RuntimeError, match="normal expects all elements of std >= 0.0"):
        torch.normal(torch.zeros(3, device=dev), torch.tensor([1.0, -1.0, 1.0], device=dev))


def test_randn_in_bfloat16(dev):
    x = torch.randn(N, device=dev, dtype=torch.bfloat16)
    assert x.dtype == torch.bfloat16
    _close(x.float().cpu().var().item(), 1.0, math.sqrt(2))


@pytest.mark.parametrize("p", [0.1, 0.7])
def test_bernoulli(dev, p):
    b = torch.empty(N, device=dev).bernoulli_(p).cpu()
    assert set(b.unique().tolist()) == {0.0, 1.0}
    _close(b.mean().item(), p, math.sqrt(p * (1 - p)))
    probabilities = torch.linspace(0, 1, N)
    drawn = torch.bernoulli(probabilities.to(dev)).cpu()
    assert drawn[0] == 0 and drawn[-1] == 1  # p = 0 and p = 1 are certain
    _close(drawn.mean().item(), 0.5, 0.5)
    assert_native("aten.bernoulli_.float", "aten.bernoulli.default")


def test_dropout_scales_kept_values_and_its_gradient(dev):
    p = 0.25
    x = torch.ones(N, device=dev, requires_grad=True)
    y = F.dropout(x, p, training=True)
    kept = (y != 0).cpu()
    _close(kept.float().mean().item(), 1 - p, math.sqrt(p * (1 - p)))
    torch.testing.assert_close(y.cpu()[kept], torch.full((int(kept.sum()),), 1 / (1 - p)))
    y.sum().backward()
    assert torch.equal(x.grad.cpu(), y.detach().cpu())  # gradient = mask / (1 - p)
    assert torch.equal(F.dropout(x, p, training=False).cpu(), x.detach().cpu())
    assert torch.equal(F.dropout(x, 1.0, training=True).cpu(), torch.zeros(N))
    assert_native("aten.native_dropout.default", "aten.native_dropout_backward.default")


def test_manual_seed_repeats_and_the_generator_advances(dev):
    torch.manual_seed(123)
    before = torch.neuron.get_rng_state()
    first = torch.rand(8, device=dev).cpu()
    after = torch.neuron.get_rng_state()
    assert not torch.equal(before, after)  # drawing the seed advanced the device generator
    second = torch.rand(8, device=dev).cpu()
    torch.manual_seed(123)
    again = torch.rand(8, device=dev).cpu()
    assert torch.equal(first, again)  # the seed governs the stream
    assert not torch.equal(first, second)  # each call draws new numbers
    torch.manual_seed(124)
    assert not torch.equal(torch.rand(8, device=dev).cpu(), first)


def test_randint_is_uniform_over_its_range(dev):
    x = torch.randint(-5, 5, (N,), device=dev).cpu()
    assert x.dtype == torch.int64
    assert x.min().item() == -5 and x.max().item() == 4
    counts = torch.bincount(x + 5, minlength=10).float()
    assert (counts - N / 10).abs().max().item() < 6 * math.sqrt(N * 0.1 * 0.9)
    assert_native("aten.random_.from")


def test_random_without_bounds_covers_the_exact_integers(dev):
    x = torch.empty(N, device=dev, dtype=torch.bfloat16).random_().cpu().float()
    assert x.min().item() >= 0 and x.max().item() <= 256  # bf16 holds integers exactly up to 2^8
    assert torch.equal(x, x.round())
    flags = torch.empty(N, device=dev, dtype=torch.bool).random_().cpu().float()
    _close(flags.mean().item(), 0.5, 0.5)
    y = torch.empty(N, device=dev).random_(3).cpu()
    assert set(y.unique().tolist()) == {0.0, 1.0, 2.0}
    assert_native("aten.random_.default", "aten.random_.to")
