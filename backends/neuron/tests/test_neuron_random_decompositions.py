"""``multinomial`` (``decompositions/random.py``) on the device stream, the fallback denied:
frequencies within about six standard errors of the weights, distinct categories without
replacement (zero weights drawn last), reproducible under ``manual_seed``, the CPU's errors."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import assert_decomposed

N = 20_000


pytestmark = pytest.mark.usefixtures("deny_fallback")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_with_replacement_frequencies_follow_the_weights(dev, dtype):
    weights = torch.tensor([[1.0, 0.0, 3.0, 4.0], [0.0, 0.0, 5.0, 0.0]], dtype=dtype)
    drawn = torch.multinomial(weights.to(dev), N, replacement=True).cpu()
    assert drawn.dtype == torch.int64 and drawn.shape == (2, N)
    p = weights[0].float() / weights[0].float().sum()
    for c in range(4):
        share = (drawn[0] == c).double().mean().item()
        assert abs(share - p[c].item()) < 6 * math.sqrt(p[c].item() * (1 - p[c].item()) / N) + 1e-12, (c, share)
    assert torch.equal(drawn[1], torch.full((N,), 2))
    assert_decomposed("aten.multinomial")


def test_without_replacement_distinct_and_first_draw_by_weight(dev):
    weights = torch.tensor([1.0, 0.0, 2.0, 5.0, 2.0])
    rows = weights.expand(N // 4, 5).contiguous()
    drawn = torch.multinomial(rows.to(dev), 4, replacement=False).cpu()
    assert all(len(set(row.tolist())) == 4 for row in drawn[:200])
    assert not (drawn == 1).any()  # four positive weights: the zero weight is never drawn
    p = weights / weights.sum()
    n = drawn.shape[0]
    for c in (0, 2, 3, 4):
        share = (drawn[:, 0] == c).double().mean().item()
        assert abs(share - p[c].item()) < 6 * math.sqrt(p[c].item() * (1 - p[c].item()) / n), (c, share)
    assert_decomposed("aten.multinomial")


def test_fewer_positive_weights_than_samples_take_zero_weights_last(dev):
    """Without replacement, as on the CPU, no error: the positive categories first, then
    distinct zero-weight ones (the CPU picks those at random; the stream's race, in index order)."""
    drawn = torch.multinomial(torch.tensor([[0.0, 1.0, 0.0, 0.0]]).to(dev), 3, False).cpu()[0].tolist()
    assert drawn[0] == 1 and len(set(drawn)) == 3


@pytest.mark.parametrize("replacement", [True, False])
def test_same_seed_same_draws(dev, replacement):
    weights = torch.rand(3, 10, generator=torch.Generator().manual_seed(0)).to(dev)
    torch.manual_seed(11)
    first = torch.multinomial(weights, 5, replacement).cpu()
    second = torch.multinomial(weights, 5, replacement).cpu()
    torch.manual_seed(11)
    assert torch.equal(first, torch.multinomial(weights, 5, replacement).cpu())
    assert not torch.equal(first, second)


@pytest.mark.parametrize("weights, samples, replacement", [
    ([1.0, -1.0, 2.0], 1, True), ([0.0, 0.0], 1, True), ([1.0, float("nan")], 1, True), ([1.0, 2.0], 3, False)])
def test_invalid_distributions_raise_as_on_the_cpu(dev, weights, samples, replacement):
    with pytest.raises(RuntimeError):
        torch.multinomial(torch.tensor(weights), samples, replacement)
    with pytest.raises(RuntimeError):
        torch.multinomial(torch.tensor(weights).to(dev), samples, replacement)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rrelu_training_draws_slopes_in_range(dev, dtype):
    """Negative (and zero) elements get a slope uniform in [lower, upper), recorded in noise;
    the others pass through with noise 1."""
    x = torch.randn(N, generator=torch.Generator().manual_seed(3)).to(dtype)
    noise = torch.zeros(N, dtype=dtype).to(dev)
    y = torch.ops.aten.rrelu_with_noise(x.to(dev), noise, 0.1, 0.3, True).cpu()
    noise = noise.cpu()
    negative = x <= 0
    slopes = noise[negative].float()
    low, high = (torch.tensor(bound, dtype=dtype).item() for bound in (0.1, 0.3))  # noise holds them rounded
    assert low <= slopes.min().item() and slopes.max().item() <= high
    assert abs(slopes.mean().item() - 0.2) < 6 * (0.2 / math.sqrt(12)) / math.sqrt(len(slopes)) + 2e-3
    assert torch.equal(noise[~negative], torch.ones_like(noise[~negative]))
    assert torch.equal(y[~negative], x[~negative])
    torch.testing.assert_close(y[negative], (x[negative].float() * slopes).to(dtype),
                               **(dict(atol=1e-2, rtol=1e-2) if dtype == torch.bfloat16 else {}))
    assert_decomposed("aten.rrelu_with_noise")


def test_rrelu_not_training_is_the_cpus(dev):
    x = torch.randn(100, generator=torch.Generator().manual_seed(4))
    noise = torch.zeros(100)
    expected = torch.ops.aten.rrelu_with_noise(x, noise.clone(), 0.1, 0.3, False)
    device_noise = noise.to(dev)
    got = torch.ops.aten.rrelu_with_noise(x.to(dev), device_noise, 0.1, 0.3, False).cpu()
    torch.testing.assert_close(got, expected)
    assert torch.equal(device_noise.cpu(), noise)


def test_rrelu_in_place_and_functional_forms(dev):
    x = torch.randn(50, generator=torch.Generator().manual_seed(5)).to(dev)
    torch.manual_seed(9)
    first = torch.nn.functional.rrelu(x, training=True).cpu()
    torch.manual_seed(9)
    again = torch.nn.functional.rrelu(x.clone(), training=True, inplace=True).cpu()
    assert torch.equal(first, again)


@pytest.mark.parametrize("alpha", [0.3, 1.0, 2.5, 10.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_standard_gamma_moments(dev, alpha, dtype):
    """Gamma(alpha, 1): mean alpha, variance alpha, within 6 standard errors (the variance's from the
    fourth moment, 2 alpha^2 + 6 alpha) plus a bfloat16 rounding allowance."""
    x = torch._standard_gamma(torch.full((N,), alpha, dtype=dtype).to(dev)).cpu()
    assert x.dtype == dtype and x.min().item() > 0
    x = x.double()
    assert abs(x.mean().item() - alpha) < 6 * math.sqrt(alpha / N) + 0.01 * alpha
    assert abs(x.var().item() - alpha) < 6 * math.sqrt((6 * alpha + 2 * alpha**2) / N) + 0.02 * alpha
    assert_decomposed("aten._standard_gamma")


def test_gamma_distribution_and_dirichlet(dev):
    torch.manual_seed(3)
    concentration = torch.tensor([0.5, 2.0, 4.0])
    samples = torch.distributions.Dirichlet(concentration.to(dev)).sample((N,)).cpu()
    assert torch.allclose(samples.sum(-1), torch.ones(N), atol=1e-5) and samples.min().item() > 0
    expected = concentration / concentration.sum()
    for k in range(3):
        p = expected[k].item()
        sd = math.sqrt(p * (1 - p) / (concentration.sum().item() + 1))
        assert abs(samples[:, k].double().mean().item() - p) < 6 * sd / math.sqrt(N)
    assert_decomposed("aten._sample_dirichlet")
    rate = torch.distributions.Gamma(torch.tensor(3.0).to(dev), torch.tensor(2.0).to(dev)).sample((N,)).cpu()
    assert abs(rate.double().mean().item() - 1.5) < 6 * math.sqrt(3.0 / 4 / N)


def test_gamma_same_seed_same_samples(dev):
    alpha = torch.tensor([0.4, 1.5, 7.0]).repeat(100).to(dev)
    torch.manual_seed(5)
    first = torch._standard_gamma(alpha).cpu()
    torch.manual_seed(5)
    assert torch.equal(first, torch._standard_gamma(alpha).cpu())


@pytest.mark.parametrize("rate", [0.0, 0.5, 3.0, 9.5, 10.0, 40.0, 500.0])
def test_poisson_moments(dev, rate):
    """Poisson(rate): integers, mean and variance rate (6 standard errors; the variance's from
    the fourth moment, rate + 2 rate^2), and P(0) = exp(-rate) for the small rates."""
    x = torch.poisson(torch.full((N,), rate).to(dev)).cpu().double()
    assert torch.equal(x, x.round()) and x.min().item() >= 0
    assert abs(x.mean().item() - rate) <= 6 * math.sqrt(rate / N)
    assert abs(x.var().item() - rate) <= 6 * math.sqrt((rate + 2 * rate**2) / N) + 1e-12
    if rate < 10:
        p0 = math.exp(-rate)
        assert abs((x == 0).double().mean().item() - p0) <= 6 * math.sqrt(p0 * (1 - p0) / N) + 1e-12
    assert_decomposed("aten.poisson")


def test_poisson_of_mixed_rates_keeps_each_rate(dev):
    rates = torch.tensor([0.2, 25.0]).repeat(N // 2)
    x = torch.poisson(rates.to(dev)).cpu().view(-1, 2).double()
    assert abs(x[:, 0].mean().item() - 0.2) <= 6 * math.sqrt(0.2 / (N // 2))
    assert abs(x[:, 1].mean().item() - 25.0) <= 6 * math.sqrt(25.0 / (N // 2))


@pytest.mark.parametrize("count, p", [(5, 0.3), (40, 0.9), (20, 0.0), (20, 1.0), (1000, 0.2), (300, 0.6), (7, 0.5)])
def test_binomial_moments(dev, count, p):
    """Binomial(count, p): integers in [0, count], mean np and variance np(1-p) (6 standard
    errors), for both the inversion (np < 10) and BTRS (np >= 10) branches, p above 1/2 flipped."""
    x = torch.binomial(torch.full((N,), float(count)).to(dev), torch.full((N,), p).to(dev)).cpu().double()
    assert torch.equal(x, x.round()) and x.min().item() >= 0 and x.max().item() <= count
    mean, var = count * p, count * p * (1 - p)
    assert abs(x.mean().item() - mean) <= 6 * math.sqrt(var / N) + 1e-9
    fourth = var * (1 + 3 * (count - 2) * p * (1 - p))  # the central fourth moment
    assert abs(x.var().item() - var) <= 6 * math.sqrt(max(fourth - var**2, 0) / N) + 1e-9
    assert_decomposed("aten.binomial")
