"""The device generator is a counter-based Philox stream (:mod:`accelkit.sdk.random_stream`).

Its state is CUDA's: a 64-bit seed and a 64-bit offset, 16 bytes. Element ``i`` of a random op's
result comes from counter ``offset + i`` and the op advances the offset by its element count
rounded up to 4; each op's values are the stream's, computed here independently on the host with
numpy from the same definition. So a draw split in two equals the draw whole, a compiled random op
the eager one, and (in the distributed tests) a DTensor shard its part of the whole tensor.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from accelkit.sdk import RandomDraw, random_stream


def _offset(dev) -> int:
    return int(getattr(torch, dev.type).get_rng_state()[8:].view(torch.int64))


def _seeded(dev, seed: int) -> RandomDraw:
    torch.manual_seed(seed)
    return RandomDraw(seed, _offset(dev))


def test_the_state_is_a_seed_and_an_offset_laid_out_as_cuda_s(dev):
    module = getattr(torch, dev.type)
    torch.manual_seed(2**40 + 7)
    state = module.get_rng_state()
    assert state.dtype == torch.uint8 and state.numel() == 16
    assert state[:8].view(torch.int64).item() == 2**40 + 7 and state[8:].view(torch.int64).item() == 0
    torch.rand(10, device=dev)
    assert module.get_rng_state()[8:].view(torch.int64).item() == 12  # 10 counters, aligned to 4
    module.set_rng_state(state)
    assert torch.equal(module.get_rng_state(), state)


def test_a_state_of_another_layout_is_refused_with_the_rule(dev):
    module = getattr(torch, dev.type)
    before = module.get_rng_state()
    with pytest.raises(RuntimeError, match="wrong size.*16 bytes"):
        module.set_rng_state(torch.zeros(5056, dtype=torch.uint8))  # a CPU generator's state
    odd = before.clone()
    odd[8:] = torch.tensor([6], dtype=torch.int64).view(torch.uint8)
    with pytest.raises(RuntimeError, match="multiple of 4"):
        module.set_rng_state(odd)
    assert torch.equal(module.get_rng_state(), before)  # a refused state changes nothing


def test_a_draw_split_in_two_equals_the_draw_whole(dev):
    torch.manual_seed(9)
    whole = torch.rand(24, device=dev).cpu()
    torch.manual_seed(9)
    parts = torch.cat([torch.rand(8, device=dev), torch.rand(16, device=dev)]).cpu()
    assert torch.equal(whole, parts)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_uniform_values_are_the_stream_s(dev, dtype):
    draw = _seeded(dev, 21)
    got = torch.empty(5, 7, device=dev, dtype=dtype).uniform_(-1.5, 2.0).cpu()
    want = torch.from_numpy(random_stream.uniform(draw, (5, 7), -1.5, 2.0, False, np)).to(dtype)
    # The same bits; the scaling may be one fused multiply-add (one rounding, not two).
    torch.testing.assert_close(got, want, rtol=0, atol=2 ** -22 if dtype == torch.float32 else 0)
    unit = torch.rand(40, device=dev).cpu()  # no scaling: exact
    assert torch.equal(unit, torch.from_numpy(random_stream.uniform(RandomDraw(21, draw.offset + 36), (40,), 0.0, 1.0,
                                                                        False, np)))


def test_a_zero_dim_tensor_draws_one_value_of_the_stream(dev):
    draw = _seeded(dev, 27)
    got = torch.empty((), device=dev).uniform_()
    assert got.shape == () and got.device.type == dev.type
    want = random_stream.uniform(draw, (), 0.0, 1.0, False, np)
    assert got.item() == float(np.asarray(want).reshape(()))
    ints = torch.empty((), device=dev, dtype=torch.int64).random_(0, 5).cpu()
    assert ints.shape == () and 0 <= ints.item() < 5


def test_normal_values_are_the_stream_s(dev):
    draw = _seeded(dev, 22)
    got = torch.randn(64, device=dev).cpu()
    want = torch.from_numpy(random_stream.normal(draw, (64,), 0.0, 1.0, False, np))
    # The backend's log, sqrt and cos may differ from numpy's in the last bit.
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)


def test_bernoulli_randint_and_randperm_values_are_the_stream_s(dev):
    draw = _seeded(dev, 23)
    mask = torch.empty(50, device=dev).bernoulli_(0.3).cpu()
    assert torch.equal(mask, torch.from_numpy(random_stream.bernoulli(draw, (50,), 0.3, False, np)).float())
    draw = _seeded(dev, 24)
    ints = torch.randint(-5, 1000, (33,), device=dev).cpu()
    assert torch.equal(ints, torch.from_numpy(random_stream.integers(draw, (33,), -5, 999, np)))
    draw = _seeded(dev, 25)
    perm = torch.randperm(40, device=dev).cpu()
    assert torch.equal(perm, torch.from_numpy(random_stream.permutation(draw, 40, np)))


def test_dropout_keeps_the_stream_s_mask(dev):
    x = torch.full((6, 9), 2.0, device=dev)
    draw = _seeded(dev, 26)
    out = torch.nn.functional.dropout(x, 0.25).cpu()
    keep = torch.from_numpy(random_stream.dropout_mask(draw, (6, 9), 0.75, np))
    assert torch.equal(out, torch.where(keep, torch.tensor(2.0 / 0.75), torch.tensor(0.0)))
    assert _offset(dev) == draw.offset + 56


def test_multinomial_values_are_the_stream_s(dev):
    weights = torch.tensor([[0.0, 1.0, 3.0, 0.5, 2.0], [4.0, 0.0, 1.0, 1.0, 0.25]])
    for replacement, samples in ((True, 7), (False, 4)):
        draw = _seeded(dev, 27)
        got = torch.multinomial(weights.to(dev), samples, replacement=replacement).cpu()
        want = random_stream.multinomial(draw, weights.numpy(), samples, replacement, False, np)
        assert torch.equal(got, torch.from_numpy(want)), replacement
        assert _offset(dev) == draw.offset + random_stream.aligned(2 * (samples if replacement else 5))
    assert all(weights[row, got[row]].gt(0).all() for row in range(2))  # zero weights rank last


def test_a_device_generator_draws_its_own_stream(dev):
    generator = torch.Generator(device=dev).manual_seed(31)
    got = torch.rand(9, device=dev, generator=generator).cpu()
    assert torch.equal(got, torch.from_numpy(random_stream.uniform(RandomDraw(31, 0), (9,), 0.0, 1.0, False, np)))
    assert generator.get_state()[8:].view(torch.int64).item() == 12


def test_a_generator_of_another_device_is_refused_as_cuda_refuses_it(dev):
    with pytest.raises(RuntimeError, match=f"Expected a '{dev.type}' device type for generator but found 'cpu'"):
        torch.rand(3, device=dev, generator=torch.Generator())


def test_fork_rng_restores_the_device_stream(dev):
    torch.manual_seed(4)
    with torch.random.fork_rng(device_type=dev.type):
        torch.rand(100, device=dev)
    assert _offset(dev) == 0
    assert torch.equal(torch.rand(5, device=dev).cpu(), torch.from_numpy(
        random_stream.uniform(RandomDraw(4, 0), (5,), 0.0, 1.0, False, np)))


def test_compiled_dropout_draws_the_eager_mask(dev):
    # The backend's own compiler where it registers one with Dynamo, else AOTAutograd eagerly.
    backend = dev.type if dev.type in torch._dynamo.list_backends(exclude_tags=()) else "aot_eager"
    x = torch.ones(4, 16, device=dev)

    def step(t):
        return torch.nn.functional.dropout(t * 3, 0.5) + torch.rand(4, 16, device=t.device)

    torch.manual_seed(8)
    eager = [step(x).cpu() for _ in range(2)]
    compiled = torch.compile(step, backend=backend)
    torch.manual_seed(8)
    assert all(torch.equal(e, compiled(x).cpu()) for e in eager)
