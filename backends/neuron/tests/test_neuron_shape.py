"""Shape tile programs against CPU torch: cat and constant padding (pure data movement, so the
results must be bit-exact), including strided inputs, mixed dtypes, empty inputs, negative dims
and negative (cropping) pads, over the 128-partition limit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_native

import accelkit


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shapes, dim", [
    ([(2, 3), (4, 3)], 0),
    ([(2, 3), (2, 5), (2, 1)], 1),
    ([(3, 2, 4), (3, 5, 4)], -2),
    ([(300, 2), (10, 2)], 0),            # more than 128 rows
    ([(3000,), (5000,)], 0),             # long vectors refolded onto partitions
])
def test_cat_matches_cpu(dev, shapes, dim):
    parts = [_randn(*s, seed=i) for i, s in enumerate(shapes)]
    got = torch.cat([p.to(dev) for p in parts], dim)
    assert torch.equal(got.cpu(), torch.cat(parts, dim))
    assert_native("aten.cat.default")


def test_cat_of_strided_views_and_mixed_dtypes(dev):
    a = _randn(4, 6)
    b = torch.arange(12, dtype=torch.int64).reshape(3, 4)
    on_a, on_b = a.to(dev), b.to(dev)
    got = torch.cat([on_a[:, ::2], on_b.t().to(torch.float32)], 1)
    assert torch.equal(got.cpu(), torch.cat([a[:, ::2], b.t().float()], 1))
    promoted = torch.cat([on_a[:1, :4], on_b[:1]], 0)  # float32 with int64 -> float32
    assert promoted.dtype == torch.float32
    assert torch.equal(promoted.cpu(), torch.cat([a[:1, :4], b[:1]], 0))


def test_cat_skips_legacy_empty_inputs(dev):
    a = _randn(2, 3)
    got = torch.cat([torch.empty(0).to(dev), a.to(dev), torch.empty(0, 3).to(dev)])
    assert torch.equal(got.cpu(), torch.cat([torch.empty(0), a, torch.empty(0, 3)]))


def test_cat_into_a_bfloat16_result(dev):
    a = _randn(3, 4).to(torch.bfloat16)
    got = torch.cat([a.to(dev), a.to(dev)], 1)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got.cpu(), torch.cat([a, a], 1))


@pytest.mark.parametrize("shape, pad, value", [
    ((2, 3, 5, 5), (1, 1, 1, 1), 0.0),
    ((2, 3, 5, 5), (2, 0, 0, 3), -1.5),
    ((4, 7), (-1, 2, 1, -3), 2.0),          # negative pads crop
    ((3, 2, 4), (0, 0, 0, 0, 1, 2), 0.5),   # pads the first dim too
    ((200, 3), (1, 1), 0.0),                # more than 128 rows
])
def test_constant_pad_matches_cpu(dev, shape, pad, value):
    x = _randn(*shape)
    got = F.pad(x.to(dev), pad, value=value)
    assert torch.equal(got.cpu(), F.pad(x, pad, value=value))
    assert_native("aten.constant_pad_nd.default")


def test_constant_pad_of_a_transposed_int_tensor(dev):
    x = torch.arange(12, dtype=torch.int64).reshape(3, 4)
    got = F.pad(x.to(dev).t(), (1, 0, 0, 2), value=7)
    assert got.dtype == torch.int64
    assert torch.equal(got.cpu(), F.pad(x.t(), (1, 0, 0, 2), value=7))


def test_constant_pad_cropping_everything_leaves_the_fill(dev):
    got = F.pad(_randn(3, 4).to(dev), (-4, 2), value=3.0)
    assert torch.equal(got.cpu(), torch.full((3, 2), 3.0))


def test_copies_are_costed_as_dma(dev):
    torch.cat([_randn(64, 64).to(dev), _randn(64, 64).to(dev)], 0)
    estimate = accelkit.stats()["neuron"]["estimate"]
    assert estimate["per_op"]["cat.default"]["seconds"] > 0
    assert estimate["hbm_bytes"] >= 2 * 2 * 64 * 64 * 4  # every byte read and written once


@pytest.mark.parametrize("dims", [[0], [-1], [1, 3], []])
def test_flip_matches_cpu(dev, dims):
    x = _randn(2, 3, 4, 5)
    assert torch.equal(torch.flip(x.to(dev), dims).cpu(), torch.flip(x, dims))
    assert torch.equal(torch.flip(x.to(dev).transpose(1, 3), dims).cpu(), torch.flip(x.transpose(1, 3), dims))
    assert_native("aten.flip.default")


@pytest.mark.parametrize("args, options", [
    ((10,), {}), ((2, 20, 3), {}), ((-5, 300), {"dtype": torch.float32}), ((0, 70000), {}),
    ((1.5, 7.2, 0.7), {"dtype": torch.bfloat16}), ((0.0, 1.0, 0.1), {}), ((5, -7, -2), {"dtype": torch.int32}),
    # integers from float bounds: start and step are truncated first, as on the CPU
    ((2.1, -2.9, -1.0), {"dtype": torch.int64}), ((-1.5, 4, 1.7), {"dtype": torch.int32}),
])
def test_arange_is_a_native_tile_program(dev, args, options):
    with accelkit.fallback_policy("deny"):
        got = torch.arange(*args, device=dev, **options).cpu()
    expected = torch.arange(*args, **options)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    # fp32 multiply-add on the Vector engine; CPU steps in double: at most one float32 ulp apart
    torch.testing.assert_close(got, expected, rtol=2e-7, atol=1e-7)
    ops = accelkit.stats()["ops"]  # the functional kernel, or the out= variant derived from it
    assert sum(ops.get(f"aten.arange.{o}", {}).get("native", 0) for o in ("start_step", "start_out")) == 1


def test_masked_fill_in_place_and_with_a_tensor_value(dev):
    x = torch.randn(130, 7)
    mask = x > 0.5
    on_device = x.to(dev)
    with accelkit.fallback_policy("deny"):
        on_device.masked_fill_(mask.to(dev), -1.0)
        ints = torch.arange(12).reshape(3, 4).to(dev).masked_fill(mask[:3, :4].to(dev), torch.tensor(7))
    assert torch.equal(on_device.cpu(), x.masked_fill(mask, -1.0))
    assert torch.equal(ints.cpu(), torch.arange(12).reshape(3, 4).masked_fill(mask[:3, :4], 7))
    assert_native("aten.masked_fill_.Scalar", "aten.masked_fill.Tensor")


@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("shape, perm, most_dmas", [
    ((32, 8, 128), (1, 0, 2), 2),           # the outer dim with most rows goes on the partitions
    ((2, 3, 300, 40), (0, 1, 3, 2), None),  # stacked column-major matrices
    ((4, 5, 6, 7), (2, 0, 3, 1), None),
])
def test_a_layout_copy_is_exact_with_few_transfers_and_transposes_in_dma_where_it_can(target, shape, perm,
                                                                                    most_dmas):
    import numpy as np

    from accelkit_backends.neuron.device import core_spec
    from accelkit_backends.neuron.kernels.shape import copy_view
    from accelkit_backends.neuron.sim import NeuronCore

    src = np.arange(np.prod(shape), dtype=np.float32).reshape(shape).transpose(perm)
    dst = np.empty(src.shape, np.float32)
    core = NeuronCore(core_spec(target))
    core.record_instructions = True
    with core.kernel("copy") as k:
        copy_view(k, dst, src)
    record = k.finish()
    assert np.array_equal(dst, src)
    if most_dmas is not None:
        assert record.instructions <= most_dmas
    transposes = sum(i.name == "dma_transpose" for i in k.log)
    column_major = perm[-2] == len(shape) - 1  # the source's contiguous dim is next to last
    assert (transposes > 0) == (column_major and core.spec.transpose_in_dma)
