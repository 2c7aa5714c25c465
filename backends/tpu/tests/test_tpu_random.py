"""tpu random ops (kernels/random.py): normal (scalar and tensor mean and std), uniform, bernoulli,
random_ integer ranges, exponential, log-normal, Cauchy, geometric, multinomial and dropout. They
cannot match CPU element by element (the device draws from JAX's stream), so they are checked for
seeded reproducibility, their contracts (range, in-place writes, masks, distinct indices without
replacement) and statistics well inside their bounds.

Run with ``pytest backends/tpu/tests`` (its own process: see ``conftest.py`` there).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import accelkit
from conftest import assert_native

aten = torch.ops.aten

FLOAT_DTYPES = [torch.float32, torch.bfloat16]


def tolerance(dtype):
    """bfloat16 keeps 8 bits of mantissa: one rounding is up to 2**-8 relative."""
    return {"rtol": 1.6e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {}


# ---------------------------------------------------------------------------------------------
# Random
# ---------------------------------------------------------------------------------------------
#
# Every draw has N elements: programs are compiled per shape, so sharing one shape keeps the
# file fast, and N is large enough for the bounds below to sit 5+ standard errors away.

N = 4096

RANDOM_CALLS = {
    "randn": (lambda d: torch.randn(N, device=d), "aten.normal_.default"),
    "rand": (lambda d: torch.rand(N, device=d), "aten.uniform_.default"),
    "randint": (lambda d: torch.randint(0, 1000, (N,), device=d), "aten.random_.from"),
    "bernoulli": (lambda d: torch.bernoulli(torch.full((N,), 0.5, device=d)), "aten.bernoulli.default"),
    "bernoulli_p": (lambda d: torch.empty(N, device=d).bernoulli_(0.5), "aten.bernoulli_.float"),
    "exponential": (lambda d: torch.empty(N, device=d).exponential_(), "aten.exponential_.default"),
    "dropout": (lambda d: F.dropout(torch.ones(N, device=d), 0.5), "aten.native_dropout.default"),
}


@pytest.mark.parametrize("name", sorted(RANDOM_CALLS))
def test_random_draws_are_seeded_by_the_device_generator(dev, name):
    call, op = RANDOM_CALLS[name]
    with accelkit.fallback_policy("deny"):
        torch.manual_seed(1234)
        first, second = call(dev).cpu(), call(dev).cpu()
        torch.manual_seed(1234)
        again = call(dev).cpu()
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    assert not torch.equal(first, second), "consecutive draws must differ"
    assert_native(op)


def test_fork_rng_restores_the_device_stream(dev):
    torch.manual_seed(5)
    with torch.random.fork_rng(device_type="tpu"):
        inside = torch.randn(N, device=dev).cpu()
    after = torch.randn(N, device=dev).cpu()
    torch.testing.assert_close(after, inside, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_normal_statistics_and_in_place_write(dev, dtype):
    x = torch.zeros(N, device=dev, dtype=dtype)
    with accelkit.fallback_policy("deny"):
        same = x.normal_(2.0, 3.0)
        standard = torch.randn(N, device=dev, dtype=dtype).cpu().float()
    assert same is x and x.dtype == dtype
    values = x.cpu().float()
    assert abs(values.mean().item() - 2.0) < 0.25 and abs(values.std().item() - 3.0) < 0.2
    assert abs(standard.mean().item()) < 0.08 and abs(standard.std().item() - 1.0) < 0.06
    # Beyond 3 sigma: about 11 of N values, never none and never many.
    assert 0 < (standard.abs() > 3).sum().item() < 40
    assert_native("aten.normal_.default")


def test_random_ops_write_through_strided_views(dev):
    base = torch.zeros(6, 8, device=dev)
    with accelkit.fallback_policy("deny"):
        base[:, ::2].normal_()
        base[1].uniform_(5, 6)
        base[2:4, 3].bernoulli_(1.0)
    host = base.cpu()
    assert (host[:, ::2] != 0).all()
    assert ((host[1] >= 5) & (host[1] < 6)).all()
    assert (host[2:4, 3] == 1).all()
    assert (host[[0, 4, 5]][:, 1::2] == 0).all() and (host[2:4][:, [1, 5, 7]] == 0).all()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_uniform_range_and_mean(dev, dtype):
    with accelkit.fallback_policy("deny"):
        x = torch.empty(N, device=dev, dtype=dtype).uniform_(-2, 3).cpu().float()
        unit = torch.rand(N, device=dev, dtype=dtype).cpu().float()
    assert x.min() >= -2 and x.max() <= 3 and abs(x.mean().item() - 0.5) < 0.12
    assert unit.min() >= 0 and unit.max() <= 1 and abs(unit.mean().item() - 0.5) < 0.03
    assert abs(unit.std().item() - math.sqrt(1 / 12)) < 0.02
    assert_native("aten.uniform_.default")


def test_bernoulli_forms(dev):
    with accelkit.fallback_policy("deny"):
        frequency = torch.empty(N, device=dev).bernoulli_(0.3).cpu()
        p = torch.tensor([0.0, 1.0, 0.0, 1.0], device=dev).repeat(N // 4)
        certain = torch.empty(N, device=dev).bernoulli_(p).cpu()
        functional = torch.bernoulli(torch.full((N,), 0.8, device=dev, dtype=torch.bfloat16)).cpu()
        with_p = torch.bernoulli(torch.empty(N, device=dev), 0.25).cpu()
    assert set(frequency.unique().tolist()) <= {0.0, 1.0} and abs(frequency.mean().item() - 0.3) < 0.04
    torch.testing.assert_close(certain, p.cpu())  # p = 0 and p = 1 are deterministic
    assert functional.dtype == torch.bfloat16 and abs(functional.float().mean().item() - 0.8) < 0.04
    assert abs(with_p.mean().item() - 0.25) < 0.04
    assert_native("aten.bernoulli_.float", "aten.bernoulli_.Tensor", "aten.bernoulli.default",
                  "aten.bernoulli.p")


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32], ids=str)
def test_random_integer_ranges(dev, dtype):
    with accelkit.fallback_policy("deny"):
        ranged = torch.empty(N, device=dev, dtype=dtype).random_(-3, 7).cpu()
        upto = torch.empty(N, device=dev, dtype=dtype).random_(5).cpu()
        full = torch.empty(N, device=dev, dtype=dtype).random_().cpu()
    assert set(ranged.tolist()) == set(range(-3, 7))  # every value, `to` excluded
    assert set(upto.tolist()) == set(range(5))
    assert_full_range(full, dtype)
    assert_native("aten.random_.from", "aten.random_.to", "aten.random_.default")


def assert_full_range(values, dtype):
    """``random_()`` without bounds: integers from 0 up to the dtype's limit — for floats the
    largest integer it holds exactly, 2 ** (mantissa bits + 1) — spread over the whole range."""
    if dtype.is_floating_point:
        top = 2 ** (1 - round(math.log2(torch.finfo(dtype).eps)))
    else:
        top = 1 if dtype == torch.bool else torch.iinfo(dtype).max
    values = values.double()
    assert values.min() >= 0 and values.max() <= top and (values == values.round()).all()
    assert values.mean().item() > top / 4


@pytest.mark.parametrize("dtype", [torch.int8, torch.bool, torch.bfloat16], ids=str)
def test_random_full_range_of_small_dtypes(dev, dtype):
    torch.manual_seed(0)  # N draws over at most 257 values: each is drawn ~16 times or more
    with accelkit.fallback_policy("deny"):
        values = torch.empty(N, device=dev, dtype=dtype).random_().cpu()
    assert_full_range(values, dtype)
    assert len(values.unique()) == {torch.bool: 2, torch.int8: 128, torch.bfloat16: 257}[dtype]


def test_random_covers_the_int64_range(dev):
    with accelkit.fallback_policy("deny"):
        wide = torch.randint(-(2**63), 2**63 - 1, (N,), device=dev).cpu()
    assert (wide < 0).any() and (wide > 0).any() and wide.double().abs().mean() > 2**61


def test_exponential_statistics(dev):
    with accelkit.fallback_policy("deny"):
        x = torch.empty(N, device=dev).exponential_(2.0).cpu()
    assert x.min() >= 0 and abs(x.mean().item() - 0.5) < 0.05 and abs(x.std().item() - 0.5) < 0.06
    assert_native("aten.exponential_.default")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_dropout_scales_kept_values_and_backward_uses_the_same_mask(dev, dtype):
    x = (torch.rand(N) + 0.5).to(dtype)
    x_dev = x.to(dev).requires_grad_()
    with accelkit.fallback_policy("deny"):
        y = F.dropout(x_dev, p=0.3, training=True)
        y.backward(torch.ones_like(y))
    kept = (y.detach().cpu() != 0)
    assert abs(kept.float().mean().item() - 0.7) < 0.04
    expected = torch.where(kept, x / 0.7, torch.zeros_like(x))
    torch.testing.assert_close(y.detach().cpu(), expected, **tolerance(dtype))
    grad = torch.where(kept, torch.full_like(x, 1 / 0.7), torch.zeros_like(x))
    torch.testing.assert_close(x_dev.grad.cpu(), grad, **tolerance(dtype))
    assert_native("aten.native_dropout.default", "aten.native_dropout_backward.default")


def test_native_dropout_edge_probabilities_and_eval(dev):
    x = torch.randn(8, 9, generator=torch.Generator().manual_seed(0)).to(dev)
    with accelkit.fallback_policy("deny"):
        dropped, dropped_mask = aten.native_dropout(x, 1.0, True)
        kept, kept_mask = aten.native_dropout(x, 0.0, True)
        evaluated, eval_mask = aten.native_dropout(x, 0.5, False)
    assert (dropped.cpu() == 0).all() and not dropped_mask.cpu().any() and dropped_mask.dtype == torch.bool
    torch.testing.assert_close(kept.cpu(), x.cpu())
    assert kept_mask.cpu().all()
    torch.testing.assert_close(evaluated.cpu(), x.cpu())
    assert eval_mask.cpu().all()
    grad = aten.native_dropout_backward(torch.ones_like(x), kept_mask, 2.0)
    torch.testing.assert_close(grad.cpu(), torch.full((8, 9), 2.0))


# ---------------------------------------------------------------------------------------------
# Normal with tensor mean and std; log-normal, Cauchy and geometric draws
# ---------------------------------------------------------------------------------------------


def test_normal_with_tensor_mean_and_std(dev):
    torch.manual_seed(0)
    means, stds = torch.tensor([-10.0, 0.0, 10.0]), torch.tensor([0.5, 1.0, 2.0])
    mean, std = means.repeat(6000, 1).to(dev), stds.to(dev)
    draws = [  # (samples of shape (6000, 3), expected column means, expected column stds)
        (torch.normal(mean, std), means, stds),
        (torch.normal(mean, 2.0), means, torch.full((3,), 2.0)),
        (torch.normal(3.0, std.expand(6000, 3)), torch.full((3,), 3.0), stds),
    ]
    for sample, want_mean, want_std in draws:
        sample = sample.cpu()
        torch.testing.assert_close(sample.mean(0), want_mean, atol=0.15, rtol=0)
        torch.testing.assert_close(sample.std(0), want_std, atol=0, rtol=0.1)
    assert_native("aten.normal.Tensor_Tensor", "aten.normal.Tensor_float", "aten.normal.float_Tensor")


def test_seeded_draws_repeat(dev):
    m = torch.zeros(100).to(dev)
    torch.manual_seed(3)
    a = torch.normal(m, 1.0).cpu()
    torch.manual_seed(3)
    b = torch.normal(m, 1.0).cpu()
    assert torch.equal(a, b)


def test_log_normal_cauchy_geometric_distributions(dev):
    torch.manual_seed(0)
    x = torch.empty(20000).to(dev)
    logs = x.log_normal_(1.0, 0.5).cpu().log()
    assert abs(logs.mean().item() - 1.0) < 0.05 and abs(logs.std().item() - 0.5) < 0.05
    c = x.cauchy_(2.0, 3.0).cpu()
    assert abs(c.median().item() - 2.0) < 0.2
    assert abs(((c - 2.0).abs() < 3.0).float().mean().item() - 0.5) < 0.03  # sigma is the half-width
    g = x.geometric_(0.25).cpu()
    assert g.min().item() >= 1 and torch.equal(g, g.round())
    assert abs(g.mean().item() - 4.0) < 0.2
    assert_native("aten.log_normal_.default", "aten.cauchy_.default", "aten.geometric_.default")


# ---------------------------------------------------------------------------------------------
# Multinomial
# ---------------------------------------------------------------------------------------------
#
# The checks are distributional (frequencies against the weights), structural (distinct indices
# without replacement, zero weights drawn last, shapes and dtype) and reproducibility under
# torch.manual_seed.


def draw_multinomial(dev, weights, n, replacement=False):
    with accelkit.fallback_policy("deny"):
        return torch.multinomial(weights.to(dev), n, replacement=replacement).cpu()


def test_frequencies_follow_the_weights_with_replacement(dev):
    weights = torch.tensor([[1.0, 0.0, 6.0, 3.0], [2.0, 2.0, 2.0, 2.0]])
    samples = draw_multinomial(dev, weights, 40000, replacement=True)
    assert samples.shape == (2, 40000) and samples.dtype == torch.int64
    for row, w in zip(samples, weights):
        frequency = torch.bincount(row, minlength=4) / row.numel()
        torch.testing.assert_close(frequency, w / w.sum(), atol=0.01, rtol=0)
    assert_native("aten.multinomial.default")


def test_without_replacement_indices_are_distinct_and_zero_weights_come_last(dev):
    weights = torch.tensor([[0.0, 5.0, 0.0, 1.0, 2.0]] * 50)
    samples = draw_multinomial(dev, weights, 5)
    for row in samples:
        assert sorted(row.tolist()) == [0, 1, 2, 3, 4]
        assert set(row[:3].tolist()) == {1, 3, 4}
    first = torch.bincount(samples[:, 0], minlength=5)
    assert first[1] > first[3]  # the heaviest category leads most often


def test_one_dimensional_and_empty_inputs(dev):
    assert draw_multinomial(dev, torch.tensor([0.2, 0.8]), 1).shape == (1,)
    assert draw_multinomial(dev, torch.ones(0, 3), 2).shape == (0, 2)


def test_reproducible_under_manual_seed(dev):
    weights = torch.rand(3, 10)
    torch.manual_seed(7)
    first = draw_multinomial(dev, weights, 6)
    torch.manual_seed(7)
    assert torch.equal(draw_multinomial(dev, weights, 6), first)
