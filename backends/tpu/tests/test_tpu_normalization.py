"""tpu normalization (kernels/normalization.py) compared with PyTorch on CPU, forward and
backward: batch norm (training and evaluation, running statistics updated in place, the module
across modes, no running statistics, bfloat16, the ``out=`` form and the traced-graph
``_native_batch_norm_legit`` forms), layer norm and group norm (with and without affine
parameters), and, under ``fallback_policy("deny")``, their edge cases (empty batches for group
norm, forward and backward; evaluation-mode batch norm's saved statistics, which leaves the
running statistics alone).

The forward-and-backward checks are ``harness_nn.compare``; float32 is compared at 1e-5
(XLA sums in another order than PyTorch's CPU kernels: a few ulps), bfloat16 at its resolution.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import accelkit
from conftest import assert_native
from harness_nn import BF16, F32, compare, sample

aten = torch.ops.aten


BATCH_NORM = ["aten.native_batch_norm.default", "aten.native_batch_norm_backward.default"]


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_updates_running_statistics_in_place(dev, training):
    cpu_stats = [sample((4,), seed=5), sample((4,), seed=6).abs() + 0.5]
    tpu_stats = [s.to(dev) for s in cpu_stats]

    def batch_norm(x, w, b):
        mean, var = cpu_stats if x.device.type == "cpu" else tpu_stats
        return F.batch_norm(x, mean, var, w, b, training=training, momentum=0.3, eps=1e-3)

    compare(dev, batch_norm, [sample((3, 4, 5, 6)), sample((4,), seed=2), sample((4,), seed=3)],
            native=BATCH_NORM)
    for device_stat, cpu_stat in zip(tpu_stats, cpu_stats):
        torch.testing.assert_close(device_stat.cpu(), cpu_stat, **F32)
    if training:
        assert not torch.equal(cpu_stats[0], sample((4,), seed=5))  # the update happened


def test_batch_norm_module_training_then_eval(dev):
    torch.manual_seed(0)
    cpu_norm = nn.BatchNorm1d(5)
    tpu_norm = nn.BatchNorm1d(5).to(dev)
    for seed in range(3):
        x = sample((8, 5, 3), seed=seed)
        compare(dev, lambda x: (cpu_norm if x.device.type == "cpu" else tpu_norm)(x), [x], native=BATCH_NORM)
    cpu_norm.eval()
    tpu_norm.eval()
    compare(dev, lambda x: (cpu_norm if x.device.type == "cpu" else tpu_norm)(x), [sample((4, 5, 3), seed=9)])
    for name, value in cpu_norm.state_dict().items():
        torch.testing.assert_close(tpu_norm.state_dict()[name].cpu(), value, **F32, msg=name)


def test_batch_norm_without_running_statistics_and_bfloat16(dev):
    compare(dev, lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
            [sample((3, 4, 5)), sample((4,), seed=2), sample((4,), seed=3)], native=BATCH_NORM)
    compare(dev, lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
            [sample((3, 4, 5), torch.bfloat16), sample((4,), torch.bfloat16, 2), sample((4,), torch.bfloat16, 3)],
            tol=BF16)


def test_native_batch_norm_out_variant_updates_running_statistics(dev):
    x = sample((3, 4, 5))
    cpu_stats = [sample((4,), seed=5), sample((4,), seed=6).abs()]
    tpu_stats = [s.to(dev) for s in cpu_stats]
    cpu_outs = [torch.empty(0) for _ in range(3)]
    tpu_outs = [o.to(dev) for o in cpu_outs]
    with accelkit.fallback_policy("deny"):
        for x_, stats, outs in ((x, cpu_stats, cpu_outs), (x.to(dev), tpu_stats, tpu_outs)):
            aten.native_batch_norm.out(x_, None, None, *stats, True, 0.1, 1e-5, out=outs[0], save_mean=outs[1],
                                       save_invstd=outs[2])
    for actual, expected in zip(tpu_outs + tpu_stats, cpu_outs + cpu_stats):
        torch.testing.assert_close(actual.cpu(), expected, **F32)


def test_batch_norm_legit_functional_variants(dev):
    """The traced-graph forms return the running statistics instead of writing them."""
    x, mean, var = sample((3, 4, 5)), sample((4,), seed=5), sample((4,), seed=6).abs()
    args = (None, None, mean, var)
    expected = aten._native_batch_norm_legit_functional(x, *args, True, 0.1, 1e-5)
    actual = aten._native_batch_norm_legit_functional(x.to(dev), None, None, mean.to(dev), var.to(dev), True,
                                                      0.1, 1e-5)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.cpu(), e, **F32)
    expected = aten._native_batch_norm_legit.no_stats(x, None, None, True, 0.1, 1e-5)
    actual = aten._native_batch_norm_legit.no_stats(x.to(dev), None, None, True, 0.1, 1e-5)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.cpu(), e, **F32)
    expected = aten._native_batch_norm_legit_no_training(x, *args, 0.1, 1e-5)[0]
    actual = aten._native_batch_norm_legit_no_training(x.to(dev), None, None, mean.to(dev), var.to(dev), 0.1,
                                                       1e-5)[0]
    torch.testing.assert_close(actual.cpu(), expected, **F32)


LAYER_NORM = ["aten.native_layer_norm.default", "aten.native_layer_norm_backward.default"]


def test_layer_norm(dev):
    compare(dev, lambda x, w, b: F.layer_norm(x, (5, 6), w, b, 1e-5),
            [sample((3, 4, 5, 6)), sample((5, 6), seed=2), sample((5, 6), seed=3)], native=LAYER_NORM)
    compare(dev, lambda x: F.layer_norm(x, (6,)), [sample((3, 4, 6))], native=LAYER_NORM)
    compare(dev, lambda x, w, b: F.layer_norm(x, (8,), w, b),
            [sample((3, 8), torch.bfloat16), sample((8,), torch.bfloat16, 2), sample((8,), torch.bfloat16, 3)],
            tol=BF16)


@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32, None])
def test_layer_norm_statistics_have_cpus_dtype(dev, weight_dtype):
    # CPU keeps a bfloat16 input's mean and rstd in bfloat16 (float32 beside a float32 weight);
    # PyTorch's Meta kernel says float32 always, and tpu used to follow it.
    x = sample((4, 6), torch.bfloat16)
    w = None if weight_dtype is None else sample((6,), weight_dtype, 2)
    want = torch.native_layer_norm(x, (6,), w, w, 1e-5)
    got = torch.native_layer_norm(x.to(dev), (6,), None if w is None else w.to(dev), None if w is None else w.to(dev), 1e-5)
    assert [t.dtype for t in got] == [t.dtype for t in want]
    for g, e in zip(got, want):
        torch.testing.assert_close(g.cpu(), e, **BF16)


GROUP_NORM = ["aten.native_group_norm.default", "aten.native_group_norm_backward.default"]


@pytest.mark.parametrize("shape,groups", [((3, 4, 5, 6), 2), ((3, 6, 4), 3), ((2, 4, 7), 4)])
def test_group_norm(dev, shape, groups):
    channels = shape[1]
    compare(dev, lambda x, w, b: F.group_norm(x, groups, w, b),
            [sample(shape), sample((channels,), seed=2), sample((channels,), seed=3)], native=GROUP_NORM)


def test_group_norm_without_affine(dev):
    compare(dev, lambda x: F.group_norm(x, 2), [sample((3, 4, 5))], native=GROUP_NORM)


@pytest.mark.parametrize("shape, groups", [((0, 2), 1), ((0, 6, 3), 3), ((2, 6, 0), 2), ((3, 6, 2, 2), 3)])
def test_group_norm_including_empty_inputs(dev, shape, groups):
    x, w, b = torch.randn(shape), torch.randn(shape[1]), torch.randn(shape[1])
    n, c = shape[0], shape[1]
    hxw = x[0, 0].numel() if n else int(torch.tensor(shape[2:]).prod())
    want = aten.native_group_norm(x, w, b, n, c, hxw, groups, 1e-5)
    with accelkit.fallback_policy("deny"):
        got = aten.native_group_norm(x.to(dev), w.to(dev), b.to(dev), n, c, hxw, groups, 1e-5)
        functional = torch.nn.functional.group_norm(x.to(dev), groups, w.to(dev), b.to(dev))
    for g, e in zip(got, want):  # an empty group's rstd is NaN on CPU too
        torch.testing.assert_close(g.cpu(), e, atol=1e-5, rtol=1e-5, equal_nan=True)
    torch.testing.assert_close(functional.cpu(), torch.nn.functional.group_norm(x, groups, w, b),
                               atol=1e-5, rtol=1e-5)
    assert_native("aten.native_group_norm.default")


def test_group_norm_backward_of_empty_batch(dev):
    x = torch.randn(0, 4, 3, requires_grad=True)
    xd = x.detach().to(dev).requires_grad_()
    with accelkit.fallback_policy("deny"):
        torch.nn.functional.group_norm(xd, 2).sum().backward()
    assert xd.grad.shape == (0, 4, 3)


def test_native_batch_norm_eval_saves_no_statistics(dev):
    x, w, b = torch.randn(3, 2, 4), torch.randn(2), torch.randn(2)
    mean, var = torch.randn(2), torch.rand(2) + 0.5
    want = aten.native_batch_norm(x, w, b, mean.clone(), var.clone(), False, 0.1, 1e-5)
    dmean, dvar = mean.to(dev), var.to(dev)
    with accelkit.fallback_policy("deny"):
        got = aten.native_batch_norm(x.to(dev), w.to(dev), b.to(dev), dmean, dvar, False, 0.1, 1e-5)
    for g, e in zip(got, want):
        assert g.shape == e.shape
        torch.testing.assert_close(g.cpu(), e, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dmean.cpu(), mean)  # evaluation leaves the running statistics alone
    torch.testing.assert_close(dvar.cpu(), var)
