"""Indexing tile programs against CPU torch: gather, scatter, scatter_add, embedding (and its
dense backward), index_select.

Lookups and overwrites move values without arithmetic, so they must be bit-exact; sums
(``scatter_add``, the embedding gradient's one-hot matmul) accumulate in fp32 in another order
than the CPU, so they get float32 rounding room (1e-5). Sizes straddle the 128-partition limit
and the edge cases are the CPU's: empty indices, negative dims, int64 values and indices, and
out-of-range indices raising the CPU's exception type.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_native

import accelkit

SUMS = {"rtol": 1e-5, "atol": 1e-5}


def _generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# -- gather ------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape, dim, index_shape", [
    ((5, 7), 0, (3, 7)),
    ((5, 7), 1, (5, 4)),
    ((4, 3, 6), -1, (2, 3, 9)),      # index longer than the dim, shorter elsewhere
    ((300, 3), 0, (200, 2)),         # more than 128 rows
    ((6,), 0, (0,)),                  # empty index
])
def test_gather_matches_cpu(dev, shape, dim, index_shape):
    g = _generator()
    x = torch.randn(shape, generator=g)
    index = torch.randint(0, shape[dim], index_shape, generator=g)
    got = torch.gather(x.to(dev), dim, index.to(dev))
    assert torch.equal(got.cpu(), torch.gather(x, dim, index))
    assert_native("aten.gather.default")


def test_gather_of_a_transposed_view_and_int64_values(dev):
    x = torch.arange(24, dtype=torch.int64).reshape(4, 6) * 1000
    index = torch.tensor([[0, 3, 3], [1, 1, 0]])
    got = torch.gather(x.to(dev).t(), 1, index.to(dev))
    assert got.dtype == torch.int64
    assert torch.equal(got.cpu(), torch.gather(x.t(), 1, index))


def test_gather_out_of_range_raises_like_cpu(dev):
    x, index = torch.randn(3, 4), torch.tensor([[0, 3]])
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.gather(x, 0, index)
    with pytest.raises(RuntimeError, match="index 3 is out of bounds for dimension 0 with size 3"):
        torch.gather(x.to(dev), 0, index.to(dev))
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.gather(x.to(dev), 1, torch.tensor([[-1]]).to(dev))


# -- scatter -----------------------------------------------------------------------------------


def _unique_rows(rows: int, cols: int, size: int, g: torch.Generator) -> torch.Tensor:
    """An index of ``rows`` distinct targets per column (scatter's result is then defined)."""
    return torch.stack([torch.randperm(size, generator=g)[:rows] for _ in range(cols)], dim=1)


@pytest.mark.parametrize("size, rows, cols", [(5, 3, 4), (200, 150, 3)])
def test_scatter_src_and_value_match_cpu(dev, size, rows, cols):
    g = _generator()
    x, src = torch.randn(size, cols, generator=g), torch.randn(rows + 2, cols, generator=g)
    index = _unique_rows(rows, cols, size, g)
    assert torch.equal(x.to(dev).scatter(0, index.to(dev), src.to(dev)).cpu(), x.scatter(0, index, src))
    assert torch.equal(x.to(dev).scatter(0, index.to(dev), -2.5).cpu(), x.scatter(0, index, -2.5))
    assert_native("aten.scatter.src", "aten.scatter.value")


def test_scatter_along_last_dim_in_place_keeps_the_rest(dev):
    x = torch.zeros(3, 6)
    index = torch.tensor([[5], [0], [2]])
    on_device = x.to(dev)
    on_device.scatter_(-1, index.to(dev), 1.0)
    assert torch.equal(on_device.cpu(), x.scatter(-1, index, 1.0))
    assert on_device.sum().item() == 3


def test_scatter_add_sums_duplicates(dev):
    g = _generator()
    x = torch.randn(4, 5, generator=g)
    index = torch.randint(0, 4, (40, 5), generator=g)  # many duplicates per target
    src = torch.randn(40, 5, generator=g)
    got = x.to(dev).scatter_add(0, index.to(dev), src.to(dev)).cpu()
    torch.testing.assert_close(got, x.scatter_add(0, index, src), **SUMS)
    assert_native("aten.scatter_add.default")


def test_scatter_add_int64_is_exact(dev):
    x = torch.full((3,), 10**9, dtype=torch.int64)
    index = torch.tensor([0, 0, 2])
    src = torch.tensor([7, 11, -5], dtype=torch.int64)
    assert torch.equal(x.to(dev).scatter_add(0, index.to(dev), src.to(dev)).cpu(), x.scatter_add(0, index, src))


def test_scatter_empty_index_copies(dev):
    x = torch.randn(3, 2)
    got = x.to(dev).scatter(0, torch.empty(0, 2, dtype=torch.int64).to(dev), 5.0)
    assert torch.equal(got.cpu(), x)


def test_scatter_out_of_range_raises(dev):
    with pytest.raises(RuntimeError, match="index 4 is out of bounds for dimension 0 with size 4"):
        torch.zeros(4, 2).to(dev).scatter(0, torch.tensor([[4, 0]]).to(dev), 1.0)


# -- embedding and index_select ----------------------------------------------------------------


@pytest.mark.parametrize("vocab, width, index_shape", [(10, 4, (3, 5)), (300, 3, (260,)), (7, 5, (0,))])
def test_embedding_matches_cpu(dev, vocab, width, index_shape):
    g = _generator()
    weight = torch.randn(vocab, width, generator=g)
    index = torch.randint(0, vocab, index_shape, generator=g)
    got = F.embedding(index.to(dev), weight.to(dev))
    assert got.shape == index_shape + (width,)
    assert torch.equal(got.cpu(), F.embedding(index, weight))


def test_embedding_int32_indices(dev):
    weight = torch.randn(6, 3)
    index = torch.tensor([5, 0, 5], dtype=torch.int32)
    assert torch.equal(F.embedding(index.to(dev), weight.to(dev)).cpu(), F.embedding(index, weight))


def test_embedding_out_of_range_raises_index_error(dev):
    weight = torch.randn(10, 4)
    with pytest.raises(IndexError):
        F.embedding(torch.tensor([10]), weight)
    # CPU's message, then the culprit.
    with pytest.raises(IndexError, match=r"index out of range in self \(embedding: index 10 of 10 rows\)"):
        F.embedding(torch.tensor([2, 10]).to(dev), weight.to(dev))
    with pytest.raises(IndexError, match="index out of range in self .*index -1 "):
        F.embedding(torch.tensor([-1]).to(dev), weight.to(dev))


@pytest.mark.parametrize("padding_idx, scale_grad_by_freq", [(None, False), (2, False), (None, True), (0, True)])
def test_embedding_backward_matches_cpu(dev, padding_idx, scale_grad_by_freq):
    g = _generator()
    vocab, width = 140, 6  # vocabulary over one partition tile
    index = torch.randint(0, 8, (150,), generator=g)  # tokens over one tile, many repeats
    index[:3] = torch.tensor([2, 0, 139])
    weight = torch.randn(vocab, width, generator=g)
    grad = torch.randn(150, width, generator=g)
    cpu_weight = weight.clone().requires_grad_()
    F.embedding(index, cpu_weight, padding_idx=padding_idx, scale_grad_by_freq=scale_grad_by_freq).backward(grad)
    neuron_weight = weight.to(dev).requires_grad_()
    F.embedding(index.to(dev), neuron_weight, padding_idx=padding_idx,
                scale_grad_by_freq=scale_grad_by_freq).backward(grad.to(dev))
    torch.testing.assert_close(neuron_weight.grad.cpu(), cpu_weight.grad, **SUMS)
    if padding_idx is not None:
        assert torch.equal(neuron_weight.grad[padding_idx].cpu(), torch.zeros(width))
    assert_native("aten.embedding_dense_backward.default")


@pytest.mark.parametrize("shape, dim", [((5, 7), 0), ((5, 7), -1), ((3, 200, 2), 1), ((4,), 0)])
def test_index_select_matches_cpu(dev, shape, dim):
    g = _generator()
    x = torch.randn(shape, generator=g)
    index = torch.randint(0, shape[dim], (150,), generator=g)
    got = torch.index_select(x.to(dev), dim, index.to(dev))
    assert torch.equal(got.cpu(), torch.index_select(x, dim, index))
    assert_native("aten.index_select.default")


def test_index_select_out_of_range_raises_index_error(dev):
    with pytest.raises(IndexError):
        torch.index_select(torch.randn(3, 2).to(dev), 0, torch.tensor([3]).to(dev))


def test_gather_costs_indirect_dma(dev):
    """The element lookups are real instructions: the kernel's estimate counts DMA work."""
    torch.gather(torch.randn(64, 64).to(dev), 1, torch.randint(0, 64, (64, 8)).to(dev))
    estimate = accelkit.stats()["neuron"]["estimate"]
    assert estimate["per_op"]["gather.default"]["seconds"] > 0
    assert estimate["per_engine_seconds"]["dma"] > 0


# -- advanced indexing (index.Tensor, index_put_) -----------------------------------------------


def _advanced_cases(x: torch.Tensor) -> list:
    i, j = torch.tensor([[2, 0], [1, -1]]), torch.tensor([3, -4])
    return [
        lambda t, d: t[i.to(d)],                        # leading dim, 2-d index
        lambda t, d: t[:, j.to(d)],                     # inner dim, negative indices
        lambda t, d: t[i.to(d), :, j.to(d)],            # separated dims: the broadcast shape leads
        lambda t, d: t[:, j.to(d), j.to(d)],            # adjacent dims stay in place
        lambda t, d: t[t > 0],                           # boolean mask
        lambda t, d: t[(t.sum(-1) > 0)],                 # mask over leading dims
    ]


@pytest.mark.parametrize("case", range(6))
def test_advanced_indexing_matches_cpu(dev, case):
    x = torch.randn(3, 4, 5, generator=_generator())
    fn = _advanced_cases(x)[case]
    got = fn(x.to(dev), dev)
    assert torch.equal(got.cpu(), fn(x, "cpu"))
    assert_native("aten.index.Tensor")


def test_advanced_indexing_over_many_rows_int64(dev):
    x = torch.arange(300 * 2, dtype=torch.int64).reshape(300, 2) * 7
    index = torch.randint(-300, 300, (260,), generator=_generator())
    assert torch.equal(x.to(dev)[index.to(dev)].cpu(), x[index])


def test_advanced_indexing_errors_like_cpu(dev):
    x = torch.randn(3, 4)
    with pytest.raises(IndexError, match="index 3 is out of bounds for dimension 0 with size 3"):
        x.to(dev)[torch.tensor([3]).to(dev)]
    # As on the CPU, the dimension named is the index tensor's position among the indices.
    with pytest.raises(IndexError, match="index -5 is out of bounds for dimension 0 with size 4"):
        x.to(dev)[:, torch.tensor([-5]).to(dev)]
    with pytest.raises(IndexError, match="does not match"):
        x.to(dev)[torch.tensor([True, False]).to(dev)]


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_matches_cpu(dev, accumulate):
    g = _generator()
    x = torch.randn(6, 5, generator=g)
    if accumulate:
        index = torch.tensor([0, 5, 0, -1, 2])   # duplicates all land
    else:
        index = torch.tensor([4, 0, -2])
    values = torch.randn(index.shape[0], 5, generator=g)
    expected = x.clone().index_put_((index,), values, accumulate=accumulate)
    on_device = x.to(dev)
    on_device.index_put_((index.to(dev),), values.to(dev), accumulate=accumulate)
    torch.testing.assert_close(on_device.cpu(), expected, **SUMS)
    assert_native("aten._index_put_impl_.default")


def test_masked_and_broadcast_assignment(dev):
    x = torch.randn(4, 3, generator=_generator())
    expected = x.clone()
    expected[expected < 0] = 0.0
    expected[torch.tensor([1, 3]), 1] = torch.tensor([7.0, 8.0])
    on_device = x.to(dev)
    on_device[on_device < 0] = 0.0
    on_device[torch.tensor([1, 3]).to(dev), 1] = torch.tensor([7.0, 8.0]).to(dev)
    assert torch.equal(on_device.cpu(), expected)


@pytest.mark.parametrize("padding_idx, scale_grad_by_freq", [(None, False), (3, True)])
def test_embedding_backward_of_a_large_table_matches_cpu(dev, padding_idx, scale_grad_by_freq):
    """Over ONE_HOT_MAX_VOCAB rows the gradient is an indirect-DMA scatter-add, not a matmul."""
    from accelkit_backends.neuron.kernels.indexing import ONE_HOT_MAX_VOCAB

    g = _generator()
    vocab = ONE_HOT_MAX_VOCAB + 500
    index = torch.randint(0, 40, (300,), generator=g)
    index[:3] = torch.tensor([3, 1, vocab - 1])
    weight, grad = torch.randn(vocab, 6, generator=g), torch.randn(300, 6, generator=g)
    cpu_weight = weight.clone().requires_grad_()
    F.embedding(index, cpu_weight, padding_idx=padding_idx, scale_grad_by_freq=scale_grad_by_freq).backward(grad)
    neuron_weight = weight.to(dev).requires_grad_()
    F.embedding(index.to(dev), neuron_weight, padding_idx=padding_idx,
                scale_grad_by_freq=scale_grad_by_freq).backward(grad.to(dev))
    torch.testing.assert_close(neuron_weight.grad.cpu(), cpu_weight.grad, **SUMS)
    assert accelkit.stats()["neuron"]["estimate"]["per_op"]["embedding_dense_backward.default"]["flops"] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_matches_cpu(dev, dtype, reduce, include_self):
    """Duplicated targets (9 updates into 5 rows) exercise the serialised read-modify-write."""
    g = _generator()
    x = (torch.randn(5, 4, generator=g) * 10).to(dtype)
    index = torch.randint(0, 5, (9, 4), generator=g)
    src = (torch.randn(9, 4, generator=g) * 10).to(dtype)
    expected = x.scatter_reduce(0, index, src, reduce, include_self=include_self)
    got = x.to(dev).scatter_reduce(0, index.to(dev), src.to(dev), reduce, include_self=include_self)
    torch.testing.assert_close(got.cpu(), expected, **SUMS)
    assert_native("aten.scatter_reduce.two")


@pytest.mark.parametrize("reduce", ["amax", "amin", "sum", "prod"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_of_bool_matches_cpu(dev, reduce, include_self):
    # Without include_self a target starts from the reduction's identity: for bool, False
    # (amax) or True (amin); neuron used to ask numpy for bool's integer range and fail.
    g = _generator()
    x = torch.rand(5, 4, generator=g) > 0.5
    index = torch.randint(0, 5, (9, 4), generator=g)
    src = torch.rand(9, 4, generator=g) > 0.5
    expected = x.scatter_reduce(0, index, src, reduce, include_self=include_self)
    got = x.to(dev).scatter_reduce(0, index.to(dev), src.to(dev), reduce, include_self=include_self)
    assert got.dtype == torch.bool and torch.equal(got.cpu(), expected)


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
@pytest.mark.parametrize("reduce", ["add", "multiply"])
def test_scatter_with_reduce_argument(dev, reduce):
    g = _generator()
    x, src = torch.randn(4, 3, generator=g), torch.randn(6, 3, generator=g)
    index = torch.randint(0, 4, (6, 3), generator=g)
    expected = x.scatter(0, index, src, reduce=reduce)  # deprecated (a warning, once) but supported
    got = x.to(dev).scatter(0, index.to(dev), src.to(dev), reduce=reduce)
    torch.testing.assert_close(got.cpu(), expected, **SUMS)
    torch.testing.assert_close(x.to(dev).scatter(0, index.to(dev), 2.0, reduce=reduce).cpu(),
                               x.scatter(0, index, 2.0, reduce=reduce), **SUMS)
    assert_native("aten.scatter.reduce", "aten.scatter.value_reduce")
