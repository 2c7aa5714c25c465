"""``embedding_bag``'s forward on neuron (``decompositions/embedding.py``) vs CPU PyTorch,
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


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 4], ids=["no_padding", "padding"])
@pytest.mark.parametrize("include_last_offset", [False, True], ids=["offsets", "last_offset"])
def test_embedding_bag_gradients_match_cpu(dev, mode, padding_idx, include_last_offset):
    scale_grad_by_freq = False
    weight = torch.randn(10, 3, generator=GEN)
    offsets = OFFSETS["last_offset" if include_last_offset else "plain"]
    upstream = torch.randn(offsets.numel() - include_last_offset, 3, generator=GEN)
    psw = torch.rand(INDICES.numel(), generator=GEN) if mode == "sum" else None

    def run(device):
        w = weight.to(device).requires_grad_()
        p = psw.to(device).requires_grad_() if psw is not None else None
        out = F.embedding_bag(INDICES.to(device), w, offsets.to(device), mode=mode, padding_idx=padding_idx,
                              scale_grad_by_freq=scale_grad_by_freq, include_last_offset=include_last_offset,
                              per_sample_weights=p)
        out.backward(upstream.to(device))
        return w.grad.cpu(), (p.grad.cpu() if p is not None else None)

    with accelkit.fallback_policy("deny"):
        actual = run(dev)
    expected = run("cpu")
    torch.testing.assert_close(actual[0], expected[0], rtol=1e-6, atol=1e-6)
    if psw is not None:
        torch.testing.assert_close(actual[1], expected[1], rtol=1e-6, atol=1e-6)


def test_scale_grad_by_freq_is_left_to_the_cpu(dev):
    weight = torch.randn(10, 3, generator=GEN)
    offsets = OFFSETS["plain"]

    def run(device):
        w = weight.to(device).requires_grad_()
        F.embedding_bag(INDICES.to(device), w, offsets.to(device), scale_grad_by_freq=True).sum().backward()
        return w.grad.cpu()

    with accelkit.fallback_policy("allow"):
        actual = run(dev)
    torch.testing.assert_close(actual, run("cpu"))
    assert accelkit.stats()["ops"]["aten._embedding_bag_backward.default"]["fallback"] == 1


def _within_one_bf16_step(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """At most one bfloat16 step (ulp) apart: where the float32 sum lies exactly between two
    bfloat16 values, the CPU's fast path (fbgemm) rounds away from zero, neuron to even."""
    _, exponent = torch.frexp(expected.float())
    step = torch.ldexp(torch.ones(()), exponent - 8)  # bfloat16 keeps 8 significant bits
    gap = (actual.float() - expected.float()).abs()
    assert bool((gap <= step).all()), f"{int((gap > step).sum())} elements more than a step apart: {gap.max()}"


def test_bfloat16_weighted_sums_are_float32_rounded_once(dev):
    """The CPU scales and sums bfloat16 rows in float32 and rounds each sum once; scaling in
    bfloat16 first rounds every product, which a cancelling bag magnifies (the full profile's
    0.039 at 1.46)."""
    weight = (torch.randn(10, 16, generator=GEN) * 4).bfloat16()
    indices = torch.randint(0, 10, (64,), generator=GEN)
    offsets = torch.arange(0, 64, 4)
    psw = (torch.randn(64, generator=GEN) * 3).bfloat16()
    psw[1::4] = -psw[0::4]  # half of each bag's weight cancels the other half
    indices[1::4] = indices[0::4]

    def run(device):
        w = weight.to(device).requires_grad_()
        p = psw.to(device).requires_grad_()
        out = F.embedding_bag(indices.to(device), w, offsets.to(device), mode="sum", per_sample_weights=p)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).bfloat16().to(device))
        return out.detach().cpu(), p.grad.cpu()

    with accelkit.fallback_policy("deny"):
        actual = run(dev)
    expected = run("cpu")
    _within_one_bf16_step(actual[0], expected[0])
    _within_one_bf16_step(actual[1], expected[1])  # each a float32 dot product, rounded once
