"""tpu shape ops (kernels/shape.py) compared with PyTorch on CPU: cat and stack, constant,
reflection and replication padding (negative pads crop), flip, roll, repeat and tile, triangles
and diagonals (tril, triu, diag, diag_embed, diagonal_copy), the scatter and copy forms of views
(slice, select, diagonal and as_strided scatters; narrow, unfold, expand and permute copies), and
the backward ops of views — forward, and backward where they have one.

Each check runs the same call on CPU tensors and on tpu copies (non-contiguous views are re-made
on the device with the same geometry) under the ``deny`` fallback policy, so any CPU fallback
fails the test; in-place calls compare the mutated inputs too. Backward passes compare the
gradients.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness_indexing import assert_native, compare, compare_grad, sample, transposed

aten = torch.ops.aten


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# cat, padding, flips, repeats, triangles, diagonals
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool], ids=str)
def test_cat_and_stack(dev, dtype):
    a, b = transposed((3, 2), dtype), sample((3, 4), dtype, seed=1)
    compare(dev, lambda x, y: torch.cat([x, y], dim=-1), a, b)
    compare(dev, lambda x, y: torch.cat([x, torch.empty(0, dtype=dtype, device=x.device), x]), a, b)
    compare(dev, lambda x, y: torch.stack([x, y[:, :2]], dim=1), a, b)
    compare(dev, lambda x, y: torch.cat([x, y.float()], 1), a, b)  # promotes like CPU
    assert_native("aten.cat.default")


def test_cat_and_stack_backward(dev):
    compare_grad(dev, lambda x, y: torch.cat([x, y, x], 1), transposed((2, 3)), sample((2, 1)))
    compare_grad(dev, lambda x, y: torch.stack([x, y]), sample((2, 3)), sample((2, 3), seed=1))
    assert_native("aten.cat.default")


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
def test_constant_pad(dev, dtype):
    x = transposed((3, 4), dtype)
    compare(dev, lambda t: F.pad(t, (1, 2)), x)
    compare(dev, lambda t: F.pad(t, (2, -1, -1, 1), value=1), x)  # negative pads crop
    assert_native("aten.constant_pad_nd.default")
    compare_grad(dev, lambda t: F.pad(t, (1, -1, 0, 2), value=0.5), transposed((3, 4)))


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_reflection_and_replication_pads_and_backward(dev, mode, dims):
    x = sample((2, 3, 4, 5, 6)[: dims + 2], seed=dims)
    pad = (1, 2, -1, 2, 1, -1)[: 2 * dims]  # negative pads crop
    compare(dev, lambda t: F.pad(t, pad, mode=mode), x)
    if dims == 2:
        compare(dev, lambda t: F.pad(t, pad, mode=mode), x.bfloat16())
    compare_grad(dev, lambda t: F.pad(t, pad, mode=mode), x)
    name = {"reflect": "reflection", "replicate": "replication"}[mode]
    assert_native(f"aten.{name}_pad{dims}d.default", f"aten.{name}_pad{dims}d_backward.default")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool], ids=str)
def test_flip_roll_repeat_tile(dev, dtype):
    x = transposed((3, 4), dtype)
    compare(dev, lambda t: t.flip(0, 1), x)
    compare(dev, lambda t: t.flip(-1), x)
    compare(dev, lambda t: t.roll(2), x)  # flattened
    compare(dev, lambda t: t.roll((1, -3), (0, 1)), x)
    compare(dev, lambda t: t.repeat(2, 1, 3), x)
    compare(dev, lambda t: t.tile((2,)), x)
    assert_native("aten.flip.default", "aten.roll.default", "aten.repeat.default")


def test_flip_roll_repeat_backward(dev):
    compare_grad(dev, lambda t: t.flip(1), transposed((2, 3)))
    compare_grad(dev, lambda t: t.roll(1, 0), transposed((2, 3)))
    compare_grad(dev, lambda t: t.repeat(2, 2), transposed((2, 3)))
    assert_native("aten.flip.default", "aten.roll.default", "aten.repeat.default")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool], ids=str)
def test_triangles_and_diagonals(dev, dtype):
    x = transposed((4, 5), dtype)
    for k in (-2, 1):
        compare(dev, lambda t, k=k: t.tril(k), x)
        compare(dev, lambda t, k=k: t.triu(k), x)
        compare(dev, lambda t, k=k: torch.diag(t, k), x)
        compare(dev, lambda t, k=k: torch.diag(t[0], k), x)
        compare(dev, lambda t, k=k: torch.diagonal(t, k).clone(), x)
    batch = sample((2, 3, 4), dtype)
    compare(dev, lambda t: t.tril(), batch)
    compare(dev, lambda t: torch.diag_embed(t, offset=-1, dim1=0, dim2=2), batch)
    compare(dev, lambda t: aten.diagonal_copy(t, 1, 2, 0), batch)
    assert_native("aten.tril.default", "aten.triu.default", "aten.diag_embed.default",
                  "aten.diagonal_copy.default")


def test_triangles_and_diagonals_backward(dev):
    x = transposed((3, 4))
    compare_grad(dev, lambda t: t.triu(1), x)
    compare_grad(dev, lambda t: torch.diag(t, -1), x)
    compare_grad(dev, lambda t: torch.diag_embed(t, 1), x)
    compare_grad(dev, lambda t: torch.diagonal(t, 1) * 2, x)
    assert_native("aten.triu.default")


# ---------------------------------------------------------------------------------------------
# Scatter and copy forms of views; the backward ops of views
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
def test_view_scatters(dev, dtype):
    x = transposed((4, 5), dtype)
    compare(dev, lambda t, s: torch.slice_scatter(t, s[:, :2], 1, 1, 5, 2), x, sample((4, 2), dtype))
    compare(dev, lambda t, s: torch.slice_scatter(t, s[:1], 0, -1), x, sample((1, 5), dtype))
    compare(dev, lambda t, s: torch.select_scatter(t, s, 1, -2), x, sample((4,), dtype))
    compare(dev, lambda t, s: torch.diagonal_scatter(t, s, -1), x, sample((3,), dtype))
    compare(dev, lambda t, s: torch.diagonal_scatter(t, s, 2, 1, 0), x, sample((2,), dtype))
    compare(dev, lambda t, s: torch.as_strided_scatter(t, s, (2, 2), (1, 5), 3), x, sample((2, 2), dtype))
    compare(dev, lambda t, s: torch.as_strided_scatter(t.contiguous(), s, (2, 2), (1, 5), 3), x,
            sample((2, 2), dtype))
    assert_native("aten.slice_scatter.default", "aten.select_scatter.default",
                  "aten.diagonal_scatter.default", "aten.as_strided_scatter.default")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool], ids=str)
def test_view_copies(dev, dtype):
    x = transposed((4, 6), dtype)
    compare(dev, lambda t: torch.narrow_copy(t, 1, -3, 2), x)
    compare(dev, lambda t: aten.unfold_copy(t, 1, 3, 2), x)
    compare(dev, lambda t: t.unfold(0, 2, 1).contiguous(), x)
    compare(dev, lambda t: aten.expand_copy(t[:1], [2, -1, 6]), x)
    compare(dev, lambda t: aten.permute_copy(t, [1, 0]), x)
    assert_native("aten.narrow_copy.default", "aten.unfold_copy.default", "aten.expand_copy.default",
                  "aten.permute_copy.default")


def test_view_backward_ops(dev):
    x = transposed((4, 6))
    compare_grad(dev, lambda t: t[1] * 2, x)
    compare_grad(dev, lambda t: t[:, 1:5:2], x)
    compare_grad(dev, lambda t: t.unfold(1, 3, 2), x)
    compare_grad(dev, lambda t: torch.diagonal(t, -1), x)
    grad = sample((4,))
    compare(dev, lambda g: aten.select_backward(g, [3, 4], 0, -1), grad)
    compare(dev, lambda g: aten.slice_backward(g, [4, 7], 1, 2, 100, 2), sample((4, 3)))
    compare(dev, lambda g: aten.diagonal_backward(g, [4, 5], 1, 0, 1), grad)
    compare(dev, lambda g: aten.unfold_backward(g, [4, 6], 1, 3, 2), sample((4, 2, 3)))
    assert_native("aten.select_backward.default", "aten.slice_backward.default",
                  "aten.diagonal_backward.default", "aten.unfold_backward.default")
