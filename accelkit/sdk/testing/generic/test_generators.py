"""Generators of the device: ``torch.Generator(device=...)``, as diffusers' pipelines and many
samplers create them, behaves as a CPU or CUDA generator does.

The numbers need not be the CPU's (a device has its own random algorithms); the contract is a
generator's: a seed fixes the stream, ``get_state``/``set_state`` rewind it, two generators with
one seed draw the same numbers, and drawing from one leaves the device's default stream (and any
other generator) alone.
"""

from __future__ import annotations

import pytest
import torch

DRAWS = {
    "randn": lambda d, g: torch.randn(40, generator=g, device=d),
    "rand": lambda d, g: torch.rand(40, generator=g, device=d),
    "randint": lambda d, g: torch.randint(0, 1000, (40,), generator=g, device=d),
    "randperm": lambda d, g: torch.randperm(40, generator=g, device=d),
    "normal_": lambda d, g: torch.empty(40, device=d).normal_(2.0, 3.0, generator=g),
    "uniform_": lambda d, g: torch.empty(40, device=d).uniform_(-1, 1, generator=g),
    "bernoulli": lambda d, g: torch.bernoulli(torch.full((40,), 0.5, device=d), generator=g),
    "multinomial": lambda d, g: torch.multinomial(torch.ones(40, device=d), 10, generator=g),
    "exponential_": lambda d, g: torch.empty(40, device=d).exponential_(generator=g),
}


def test_a_device_generator_starts_as_a_cpu_generator_does(dev):
    generator = torch.Generator(device=dev)
    assert generator.device.type == dev.type
    assert generator.initial_seed() == torch.Generator().initial_seed()
    assert generator.manual_seed(7) is generator and generator.initial_seed() == 7


@pytest.mark.parametrize("draw", DRAWS.values(), ids=DRAWS.keys())
def test_a_seed_fixes_what_a_device_generator_draws(dev, draw):
    generator = torch.Generator(device=dev)
    first = draw(dev, generator.manual_seed(2024))
    assert first.device.type == dev.type
    second = draw(dev, generator.manual_seed(2024))
    other = draw(dev, generator.manual_seed(2025))
    same_seed_elsewhere = draw(dev, torch.Generator(device=dev).manual_seed(2024))
    assert torch.equal(first.cpu(), second.cpu()) and torch.equal(first.cpu(), same_seed_elsewhere.cpu())
    assert not torch.equal(first.cpu(), other.cpu())


def test_get_and_set_state_rewind_a_device_generator(dev):
    generator = torch.Generator(device=dev).manual_seed(3)
    torch.randn(10, generator=generator, device=dev)
    state = generator.get_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    expected = torch.randn(10, generator=generator, device=dev).cpu()
    torch.randn(10, generator=generator, device=dev)
    generator.set_state(state)
    assert torch.equal(torch.randn(10, generator=generator, device=dev).cpu(), expected)


def test_a_device_generator_leaves_the_default_stream_alone(dev):
    torch.manual_seed(11)
    expected = torch.randn(10, device=dev).cpu()
    torch.manual_seed(11)
    own = torch.Generator(device=dev).manual_seed(11)
    torch.randn(1000, generator=own, device=dev)
    assert torch.equal(torch.randn(10, device=dev).cpu(), expected)
    following = torch.randn(10, generator=own, device=dev).cpu()
    torch.randn(1000, device=dev)  # and the default stream leaves the generator alone
    own.manual_seed(11)
    torch.randn(1000, generator=own, device=dev)
    assert torch.equal(torch.randn(10, generator=own, device=dev).cpu(), following)
