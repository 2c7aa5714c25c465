"""tpu sorting and order statistics (kernels/sorting.py) compared with PyTorch on CPU: stable
sort and argsort (ascending and descending, ties kept in order, NaN, infinities and signed zeros
ordered like CPU's), topk (sorted and unsorted, NaN and ties), kthvalue, median and nanmedian (NaN
rows), and mode.

Every check runs the same call on CPU tensors and on their tpu copies (often non-contiguous views,
made on the device), compares values and dtypes, and asserts the op ran natively. Indices are
compared exactly where PyTorch defines them (stable sort), else through the values they point at.
"""

from __future__ import annotations

import pytest
import torch

from conftest import assert_native
from harness_reductions import ALL_DTYPES, compare, transposed


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Sorting and order statistics
# ---------------------------------------------------------------------------------------------


def special_values():
    """Ties, NaN, ±inf and a signed zero in one row (PyTorch orders -0.0 with 0.0)."""
    return torch.tensor([[2.0, float("nan"), -1.0, 2.0, -0.0, float("inf"), 0.0, -float("inf"), float("nan"), 2.0],
                         [1.0, 1.0, 1.0, 0.0, 0.0, 3.0, -2.0, 3.0, 3.0, 1.0]])


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("descending", [False, True], ids=["ascending", "descending"])
def test_stable_sort_matches_cpu(dev, dtype, descending):
    x = transposed((5, 12), dtype)  # integers and booleans: many ties, kept in order
    compare(dev, lambda t: (tuple(t.sort(dim=1, stable=True, descending=descending)),
                            t.argsort(dim=1, stable=True, descending=descending)), x)
    if dtype == torch.float32:
        compare(dev, lambda t: tuple(t.sort(dim=0, stable=True, descending=descending)), x)
    assert_native("aten.sort.stable")


@pytest.mark.parametrize("descending", [False, True], ids=["ascending", "descending"])
def test_sort_orders_nan_inf_and_signed_zero_like_cpu(dev, descending):
    x = special_values()
    result = compare(dev, lambda t: tuple(t.sort(dim=1, stable=True, descending=descending)), x)
    signs = torch.copysign(torch.ones(()), result[0].cpu())  # -0.0 keeps its sign
    expected = x.sort(dim=1, stable=True, descending=descending)[0]
    torch.testing.assert_close(signs, torch.copysign(torch.ones(()), expected))
    compare(dev, lambda t: tuple(t.sort(1)), x)  # the default overload (stable here, as on CPU)
    assert_native("aten.sort.default")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_topk_matches_cpu(dev, dtype):
    x = transposed((4, 9), dtype, seed=3) if dtype != torch.int64 else torch.randperm(36).reshape(9, 4).T
    compare(dev, lambda t: (tuple(t.topk(3)), tuple(t.topk(2, dim=0, largest=False))), x)
    if dtype == torch.float32:
        compare(dev, lambda t: (tuple(t.topk(9, dim=1)), tuple(t.topk(1, -1, largest=False, sorted=True))), x)
    # Unsorted results: the same set of values (PyTorch leaves the order open).
    values, indices = x.to(dev).topk(4, 1, sorted=False)
    torch.testing.assert_close(values.cpu().sort(1, descending=True)[0], x.topk(4, 1)[0])
    torch.testing.assert_close(x.gather(1, indices.cpu()), values.cpu())
    assert_native("aten.topk.default")


def test_topk_with_nan_and_ties_matches_cpu(dev):
    """NaN counts as the largest value; tied values' indices are unspecified on CPU, so they are
    checked by what they point at."""
    x = special_values()
    for k, largest in ((3, True), (4, False)):
        values, indices = x.to(dev).topk(k, 1, largest=largest)
        torch.testing.assert_close(values.cpu(), x.topk(k, 1, largest=largest)[0], equal_nan=True)
        torch.testing.assert_close(x.gather(1, indices.cpu()), values.cpu(), equal_nan=True)


def test_order_statistics_match_cpu(dev):
    distinct = torch.randperm(35, generator=torch.Generator().manual_seed(1)).float().reshape(5, 7)
    compare(dev, lambda t: (tuple(t.kthvalue(3, 1)), tuple(t.kthvalue(2, 0, keepdim=True)), t.median(),
                            tuple(t.median(1)), tuple(t.median(0, keepdim=True)), t.nanmedian(),
                            tuple(t.nanmedian(1))), distinct)
    nan = distinct.clone()
    nan[0, 2] = nan[0, 5] = nan[2, :] = float("nan")
    # NaN rows: median is NaN at the first NaN; nanmedian ignores NaN (NaN only if all are).
    compare(dev, lambda t: (t.median(), tuple(t.median(1)), t.nanmedian(), t.nanmedian(1)[0],
                            tuple(t.kthvalue(7, 1))), nan)
    # An all-NaN row's nanmedian index is arbitrary on CPU; the other rows' are defined.
    torch.testing.assert_close(nan.to(dev).nanmedian(1)[1].cpu()[[0, 1, 3, 4]], nan.nanmedian(1)[1][[0, 1, 3, 4]])
    assert_native("aten.kthvalue.default", "aten.median.default", "aten.median.dim",
                  "aten.nanmedian.default", "aten.nanmedian.dim")


def test_order_statistics_with_ties_pick_a_matching_index(dev):
    """With ties PyTorch's index is unspecified: the index must point at the returned value."""
    x = transposed((4, 9), torch.int64)
    for fn in (lambda t: t.kthvalue(4, 1), lambda t: t.median(1), lambda t: t.median(0)):
        values, indices = fn(x.to(dev))
        torch.testing.assert_close(values.cpu(), fn(x)[0])
        dim = 1 if indices.shape[0] == 4 else 0
        torch.testing.assert_close(x.gather(dim, indices.cpu().unsqueeze(dim)).squeeze(dim), values.cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
def test_mode_matches_cpu(dev, dtype):
    x = transposed((5, 11), dtype, seed=2)
    compare(dev, lambda t: (tuple(t.mode(1)), tuple(t.mode(0, keepdim=True)), tuple(t.mode())), x)
    compare(dev, lambda t: tuple(t.mode(0)), torch.tensor(3.0))
    assert_native("aten.mode.default")
