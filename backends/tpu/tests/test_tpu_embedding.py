"""tpu embedding ops (kernels/embedding.py) compared with PyTorch on CPU: ``F.embedding`` forward
and backward (``padding_idx``, ``scale_grad_by_freq``, bfloat16), and under
``fallback_policy("deny")`` ``F.embedding_bag`` forward (``_embedding_bag_forward_only``: sum,
mean and max bags, empty bags, ``include_last_offset``, ``padding_idx``, per-sample weights, 2-d
index batches, ``max_norm``) and ``embedding`` with ``max_norm`` (``embedding_renorm_`` rescales
the named rows of the weight in place: repeated indices, rows under the limit, several norm
types, a 2-d index batch).

The forward-and-backward checks are ``harness_nn.compare``; float32 is compared at 1e-5
(XLA sums in another order than PyTorch's CPU kernels: a few ulps), bfloat16 at its resolution.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import accelkit
from conftest import assert_native
from harness_nn import BF16, compare, sample


def check(dev, indices, weight, **kwargs):
    want = F.embedding_bag(indices, weight, **kwargs)
    on_device = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    with accelkit.fallback_policy("deny"):
        got = F.embedding_bag(indices.to(dev), weight.to(dev), **on_device)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


WEIGHT = torch.randn(10, 4, generator=torch.Generator().manual_seed(0))
INDICES = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("include_last_offset", [False, True])
@pytest.mark.parametrize("padding_idx", [None, 2])
def test_bags_with_offsets(dev, mode, include_last_offset, padding_idx):
    # The second bag is empty; with include_last_offset the last offset closes the last bag
    # (it must be len(indices): CPU's modes disagree with each other for other values).
    offsets = torch.tensor([0, 4, 4, 6, 8] if include_last_offset else [0, 4, 4, 6])
    check(dev, INDICES, WEIGHT, offsets=offsets, mode=mode, include_last_offset=include_last_offset,
          padding_idx=padding_idx)
    assert_native("aten._embedding_bag_forward_only.default")


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_two_dimensional_indices(dev, mode):
    check(dev, INDICES.reshape(2, 4), WEIGHT, mode=mode)


def test_per_sample_weights_and_ties(dev):
    check(dev, INDICES, WEIGHT, offsets=torch.tensor([0, 3]), mode="sum", per_sample_weights=torch.rand(8))
    tied = torch.ones(6, 3)
    check(dev, torch.tensor([0, 5, 3, 1]), tied, offsets=torch.tensor([0, 2]), mode="max")


def test_max_norm(dev):
    check(dev, INDICES, WEIGHT * 3, offsets=torch.tensor([0, 5]), mode="mean", max_norm=1.0)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf")])
def test_embedding_max_norm_renormalises_named_rows_in_place(dev, norm_type):
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(10, 4, generator=g) * 3
    weight[7] = 0.01  # named, but already under the limit
    indices = torch.tensor([[1, 7, 1], [3, 9, 1]])
    cpu_weight = weight.clone()
    want = F.embedding(indices, cpu_weight, max_norm=1.5, norm_type=norm_type)
    device_weight = weight.to(dev)
    with accelkit.fallback_policy("deny"):
        got = F.embedding(indices.to(dev), device_weight, max_norm=1.5, norm_type=norm_type)
    torch.testing.assert_close(got.cpu(), want)
    torch.testing.assert_close(device_weight.cpu(), cpu_weight)  # rows 0, 2, 4-6, 8 untouched
    assert_native("aten.embedding_renorm_.default")


def test_embedding_renorm_functional_op(dev):
    weight, indices = torch.randn(5, 3) * 4, torch.tensor([0, 4, 4])
    want = torch.ops.aten.embedding_renorm(weight, indices, 2.0, 2.0)
    with accelkit.fallback_policy("deny"):
        got = torch.ops.aten.embedding_renorm(weight.to(dev), indices.to(dev), 2.0, 2.0)
    torch.testing.assert_close(got.cpu(), want)


EMBEDDING = ["aten.embedding.default", "aten.embedding_dense_backward.default"]
EMBEDDING_INDICES = torch.tensor([[1, 2, 1], [9, 0, 1]])


@pytest.mark.parametrize("options", [{}, {"padding_idx": 1}, {"scale_grad_by_freq": True}],
                         ids=["plain", "padding_idx", "scale_grad_by_freq"])
def test_embedding(dev, options):
    compare(dev, lambda w, i: F.embedding(i, w, **options), [sample((10, 4)), EMBEDDING_INDICES], native=EMBEDDING)


def test_embedding_bfloat16(dev):
    compare(dev, lambda w, i: F.embedding(i, w), [sample((10, 4), torch.bfloat16), EMBEDDING_INDICES], native=EMBEDDING,
            tol=BF16)
