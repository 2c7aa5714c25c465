"""``embedding_bag``'s forward on neuron (``embedding_decompositions.py``) vs CPU PyTorch,
fallback denied: the output within float rounding (sums grouped otherwise), the auxiliary
results the backward reads (offset2bag, bag_size, max_indices) exactly."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import accelkit

GEN = torch.Generator().manual_seed(0)
OPS = {"embedding_bag": torch.ops.aten._embedding_bag, "forward_only": torch.ops.aten._embedding_bag_forward_only}
INDICES = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 7, 7])
OFFSETS = {"plain": torch.tensor([0, 4, 4, 7]), "last_offset": torch.tensor([0, 4, 4, 10])}


def _on_device(fn, *tensors, dev):
    with accelkit.fallback_policy("deny"):
        out = fn(*(None if t is None else t.to(dev) for t in tensors))
    return tuple(o.cpu() for o in out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("op", OPS, ids=str)
# per-sample weights are defined for sum only
@pytest.mark.parametrize("mode,weighted", [(0, False), (0, True), (1, False), (2, False)],
                         ids=["sum", "weighted_sum", "mean", "max"])
@pytest.mark.parametrize("offsets", OFFSETS, ids=str)
@pytest.mark.parametrize("padding_idx", [-1, 4], ids=["no_padding", "padding"])
def test_embedding_bag_forward_matches_cpu(dev, dtype, op, mode, offsets, padding_idx, weighted):
    weight = torch.randn(10, 3, generator=GEN).to(dtype)
    psw = torch.rand(INDICES.numel(), generator=GEN).to(dtype) if weighted else None
    fn = lambda w, i, o, p: OPS[op](w, i, o, False, mode, False, p, offsets == "last_offset", padding_idx)  # noqa: E731
    actual = _on_device(fn, weight, INDICES, OFFSETS[offsets], psw, dev=dev)
    expected = fn(weight, INDICES, OFFSETS[offsets], psw)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(actual[0], expected[0], rtol=tol, atol=tol)
    for name, a, e in zip(("offset2bag", "bag_size", "max_indices"), actual[1:], expected[1:]):
        assert a.dtype == e.dtype and torch.equal(a, e), name


def test_functional_embedding_bag_with_2d_input(dev):
    weight = torch.randn(12, 4, generator=GEN)
    batch = torch.randint(0, 12, (5, 3), generator=GEN)
    for mode in ("sum", "mean", "max"):
        expected = F.embedding_bag(batch, weight, mode=mode)
        with accelkit.fallback_policy("deny"):
            actual = F.embedding_bag(batch.to(dev), weight.to(dev), mode=mode).cpu()
        torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6)
