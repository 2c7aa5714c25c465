"""neuron's ``roll`` (one index_select per dim) vs CPU PyTorch, fallback denied: several dims,
the flattened form, negative and oversized shifts, and fftshift/ifftshift, which are rolls.
Results are exact (a roll moves elements)."""

from __future__ import annotations

import pytest
import torch

import accelkit

ROLLS = {
    "two_dims": ((1, -2), (0, 1)),
    "flattened": (3,),
    "flattened_negative": (-7,),
    "one_dim": ((2,), (1,)),
    "zero_and_full_turn": ((0, 5), (0, 1)),
    "oversized": ((9,), (0,)),
    "three_dims": ((1, 2, -1), (2, 0, 1)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32], ids=str)
@pytest.mark.parametrize("case", ROLLS, ids=str)
def test_roll_matches_cpu(dev, case, dtype):
    x = torch.arange(60).reshape(4, 5, 3).to(dtype)
    with accelkit.fallback_policy("deny"):
        actual = torch.roll(x.to(dev), *ROLLS[case]).cpu()
    assert torch.equal(actual, torch.roll(x, *ROLLS[case]))
    assert accelkit.stats()["ops"]["aten.roll.default"]["decomposed"] > 0


def test_fftshift_and_ifftshift_match_cpu(dev):
    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(0))
    with accelkit.fallback_policy("deny"):
        shifted = torch.fft.fftshift(x.to(dev))
        back = torch.fft.ifftshift(shifted)
    assert torch.equal(shifted.cpu(), torch.fft.fftshift(x))
    assert torch.equal(back.cpu(), x)


def test_mismatched_shifts_and_dims_fail_as_on_cpu(dev):
    x = torch.zeros(2, 3)
    with pytest.raises(RuntimeError, match="align"):
        torch.roll(x, (1, 2), (0,))
    with pytest.raises(RuntimeError, match="align"):
        torch.roll(x.to(dev), (1, 2), (0,))
