"""``multinomial`` (``random_decompositions.py``) on the device stream, the fallback denied:
frequencies within about six standard errors of the weights, distinct categories without
replacement (zero weights drawn last), reproducible under ``manual_seed``, the CPU's errors."""

from __future__ import annotations

import math

import pytest
import torch

import accelkit

N = 20_000


@pytest.fixture(autouse=True)
def _no_fallback():
    with accelkit.fallback_policy("deny"):
        yield


def _decomposed(packet: str) -> None:
    counts = {name: c for name, c in accelkit.stats()["ops"].items() if name.startswith(packet + ".")}
    assert sum(c.get("decomposed", 0) for c in counts.values()) > 0, f"{packet}: {counts}"
    assert not any(c.get("fallback") for c in counts.values()), f"{packet}: {counts}"


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
    _decomposed("aten.multinomial")


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
    _decomposed("aten.multinomial")


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
