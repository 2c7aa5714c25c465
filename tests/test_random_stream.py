"""The stream's definition (accelkit.sdk.random_stream) and the Python generator state used when the
native extension is unavailable; the devices' use of it is in the device-generic tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from accelkit._runtime.device.random import PhiloxGenerator
from accelkit.sdk import RandomDraw, ShardWindow, random_stream

aten = torch.ops.aten


def _u32(*values: int) -> tuple[np.ndarray, ...]:
    return tuple(np.array([v], dtype=np.uint32) for v in values)


@pytest.mark.parametrize("counter, key, expected", [
    # Random123's known-answer vectors for Philox4x32-10 (kat_vectors).
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox_matches_the_published_answers(counter, key, expected):
    got = random_stream.philox4x32_10(_u32(*counter), key, np)
    assert tuple(int(w[0]) for w in got) == expected


def test_the_seed_keys_the_block_and_the_offset_counts_elements():
    seed, offset = 0x0123456789ABCDEF, 2**32 - 2  # the counter carries into its high word
    words = random_stream.words(RandomDraw(seed, offset), (3,), np)
    for i in range(3):
        counter = offset + i
        direct = random_stream.philox4x32_10(_u32(counter & 0xFFFFFFFF, counter >> 32, 0, 0),
                                             (seed & 0xFFFFFFFF, seed >> 32), np)
        assert [int(w[i]) for w in words] == [int(d[0]) for d in direct]


def test_a_window_gives_a_shard_the_counters_of_its_elements_in_the_whole_tensor():
    whole = random_stream.element_counters(RandomDraw(1, 40), (5, 6, 3), np)
    window = ShardWindow(whole_shape=(5, 6, 3), start=(2, 4, 0), shape=(3, 2, 3))
    shard = random_stream.element_counters(RandomDraw(1, 40, window), (3, 2, 3), np)
    assert np.array_equal(shard, whole[2:5, 4:6, :])
    # A result of another shape is no shard of the window: plain counters.
    other = random_stream.element_counters(RandomDraw(1, 40, window), (4,), np)
    assert np.array_equal(other, np.arange(40, 44, dtype=np.uint64))


def test_units_are_exact_and_in_range():
    draw = RandomDraw(7, 0)
    words = random_stream.words(draw, (20000,), np)
    for double in (False, True):
        closed = random_stream._unit(words, double, np)
        open_ = random_stream._open_unit(words, double, np)
        assert closed.min() >= 0 and closed.max() < 1
        assert open_.min() > 0 and open_.max() < 1
    f32 = random_stream._unit(words, False, np)
    assert np.array_equal(f32 * 2**24, np.floor(f32 * 2**24))  # multiples of 2**-24
    assert abs(f32.mean() - 0.5) < 0.01


def test_distributions_have_their_moments():
    n = 40000
    draw = RandomDraw(3, 0)
    normal = random_stream.normal(draw, (n,), 1.0, 2.0, False, np)
    assert abs(normal.mean() - 1.0) < 0.05 and abs(normal.std() - 2.0) < 0.05
    exponential = random_stream.exponential(draw, (n,), 4.0, False, np)
    assert exponential.min() > 0 and abs(exponential.mean() - 0.25) < 0.01
    geometric = random_stream.geometric(draw, (n,), 0.25, False, np)
    assert geometric.min() >= 1 and abs(geometric.mean() - 4.0) < 0.1
    ints = random_stream.integers(draw, (n,), -3, 3, np)
    assert set(np.unique(ints).tolist()) == set(range(-3, 4))
    wide = random_stream.integers(draw, (8,), -(2**63), 2**63 - 1, np)
    assert wide.dtype == np.int64 and (wide < 0).any() and (wide > 0).any()
    perm = random_stream.permutation(draw, 100, np)
    assert sorted(perm.tolist()) == list(range(100))


def test_multinomial_follows_the_weights_and_never_draws_a_zero_weight():
    weights = np.array([[0.0, 1.0, 3.0], [2.0, 0.0, 2.0]])
    drawn = random_stream.multinomial(RandomDraw(5, 0), weights, 6000, True, False, np)
    assert not (drawn[0] == 0).any() and not (drawn[1] == 1).any()
    assert abs((drawn[0] == 2).mean() - 0.75) < 0.03
    distinct = random_stream.multinomial(RandomDraw(5, 0), np.ones((4, 10)), 10, False, False, np)
    assert all(sorted(row.tolist()) == list(range(10)) for row in distinct)


def test_the_counters_each_op_draws():
    x = torch.empty(3, 5)
    assert random_stream.counters_drawn(aten.uniform_.default, (x,), {}) == 15
    assert random_stream.counters_drawn(aten.native_dropout.default, (x, 0.5, True), {}) == 15
    assert random_stream.counters_drawn(aten.multinomial.default, (x, 4), {"replacement": True}) == 12
    assert random_stream.counters_drawn(aten.multinomial.default, (x, 4), {}) == 15
    assert random_stream.counters_drawn(aten.randperm.generator, (9,), {"generator": None}) == 9
    assert random_stream.counters_drawn(aten.normal.Tensor_Tensor, (torch.empty(3, 1), torch.empty(5)), {}) == 15
    assert random_stream.counters_drawn(aten.normal.float_float, (0.0, 1.0, [2, 7]), {}) == 14
    assert random_stream.aligned(15) == 16 and random_stream.aligned(16) == 16


def test_the_python_generator_keeps_cuda_s_state_and_rules():
    generator = PhiloxGenerator().manual_seed(2**64 - 1)
    assert generator.reserve(10) == (2**64 - 1, 0)
    assert generator.reserve(1) == (2**64 - 1, 12)
    state = generator.get_state()
    assert state.tolist() == [255] * 8 + [16] + [0] * 7
    fresh = PhiloxGenerator()
    assert fresh.initial_seed() == torch.Generator().initial_seed()
    fresh.set_state(state)
    assert fresh.reserve(4) == (2**64 - 1, 16)
    with pytest.raises(RuntimeError, match="wrong size"):
        fresh.set_state(torch.zeros(5056, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="multiple of 4"):
        fresh.set_offset(6)
    assert fresh.get_offset() == 20
