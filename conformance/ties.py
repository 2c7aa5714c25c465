"""Selection ops whose indices PyTorch leaves open among equal values.

``sort`` and ``argsort`` (unless ``stable=True``), ``msort``, ``topk``, ``kthvalue`` and ``mode``
pick elements by value; where several elements of a slice are equal, PyTorch does not say
which of them an index names, and CPU's choice is an accident of its algorithm (its unstable
sort of 8,000 bfloat16 values agrees with a stable sort on a fifth of the positions). A backend
that breaks ties another way is right, and comparing its indices with CPU's would report it
wrong.

For these ops the suite checks what PyTorch does promise, and nothing less:

- the values are CPU's, exactly as any output;
- every index is in range, names an element equal to the one CPU's index names, and, for a sort,
  the indices of a slice are a permutation of it;
- a gradient of the input matches CPU's summed over each set of equal elements of a slice (the
  gradient an output sends to one of several equal elements may land on any of them). A
  gradient of another input, and every element without an equal, is compared as usual.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from accelkit_conformance.compare import assert_same, map_tensors


@dataclass(frozen=True)
class _Selection:
    """Where a selection op's arguments and outputs are."""

    dim_at: int | None  # position of ``dim`` in the sample's args (None: the op has a fixed dim)
    default_dim: int
    index_output: int | None  # position of the indices among the outputs; None: the output is them
    permutation: bool  # the indices of a slice are a permutation of it (a sort)
    stable_at: int | None = None  # position of ``stable`` in the args, when it may be positional


_SELECTIONS: dict[str, _Selection] = {
    "sort": _Selection(dim_at=0, default_dim=-1, index_output=1, permutation=True),
    "argsort": _Selection(dim_at=0, default_dim=-1, index_output=None, permutation=True, stable_at=2),
    "msort": _Selection(dim_at=None, default_dim=0, index_output=None, permutation=True),
    "topk": _Selection(dim_at=1, default_dim=-1, index_output=1, permutation=False),
    "kthvalue": _Selection(dim_at=1, default_dim=-1, index_output=1, permutation=False),
    "mode": _Selection(dim_at=0, default_dim=-1, index_output=1, permutation=False),
}


@dataclass(frozen=True)
class OpenTies:
    """One sample of a selection op whose indices are open among equal values."""

    op: str
    dim: int
    selection: _Selection

    def assert_same_outputs(self, actual: Any, expected: Any, source: torch.Tensor, *, where: str,
                            tolerance: Any = None) -> None:
        """``actual`` (the device's outputs) against CPU's ``expected`` for input ``source``
        (on the CPU): values exactly as CPU's, indices up to which of equal elements they name."""
        actual = map_tensors(actual, lambda t: t.detach().cpu())
        if self.op == "msort":  # values only: a sort's values do not depend on its ties
            assert_same(actual, expected, where=f"{where}: output", tolerance=tolerance)
            return
        at = self.selection.index_output
        if at is None:
            got, want = actual, expected
        else:
            if not isinstance(actual, tuple) or len(actual) != len(expected):
                assert_same(actual, expected, where=f"{where}: output", tolerance=tolerance)
            for k, (a, e) in enumerate(zip(actual, expected)):
                if k != at:
                    assert_same(a, e, where=f"{where}: output[{k}]", tolerance=tolerance)
            got, want = actual[at], expected[at]
            where = f"{where}: output[{at}]"
        self._assert_indices(got, want, source.detach(), where)

    def _assert_indices(self, got: torch.Tensor, want: torch.Tensor, source: torch.Tensor, where: str) -> None:
        if got.shape != want.shape or got.dtype != want.dtype:
            raise AssertionError(f"{where}: indices {got.dtype}{list(got.shape)} on the device, "
                                 f"{want.dtype}{list(want.shape)} on CPU")
        if source.dim() == 0 or got.numel() == 0:
            assert_same(got, want, where=where)
            return
        dim, size = self.dim, source.shape[self.dim]
        if got.dim() < source.dim():  # keepdim=False
            got, want = got.unsqueeze(dim), want.unsqueeze(dim)
        outside = (got < 0) | (got >= size)
        if outside.any():
            raise AssertionError(f"{where}: index {got[outside][0].item()} is outside dimension {dim} of size {size}")
        mismatched = int((~_same_or_both_nan(source.gather(dim, got), source.gather(dim, want))).sum())
        if mismatched:
            raise AssertionError(
                f"{where}: {mismatched} of {got.numel()} indices name an element whose value differs from "
                f"the element CPU's index names (equal elements may be named in any order; these are not equal)"
            )
        if self.selection.permutation:
            ordered = got.sort(dim).values
            expected_order = torch.arange(size).view([-1 if d == dim else 1 for d in range(got.dim())])
            if not (ordered == expected_order).all():
                raise AssertionError(f"{where}: the indices of a slice along dimension {dim} are not a permutation of it")

    def assert_same_input_gradient(self, got: torch.Tensor, want: torch.Tensor, source: torch.Tensor, *,
                                   where: str, tolerance: Any = None) -> None:
        """The gradient of ``source`` (the op's input) against CPU's, summed over each set of
        equal elements of a slice along the op's dimension."""
        got = got.detach().cpu()
        if got.shape != want.shape or source.dim() == 0 or source.numel() == 0:
            assert_same(got, want, where=where, tolerance=tolerance)
            return
        assert_same(_sums_over_equal(got, source.detach(), self.dim), _sums_over_equal(want, source.detach(), self.dim),
                    where=f"{where} (summed over equal elements)", tolerance=tolerance)


def open_ties(op_name: str, sample: Any) -> OpenTies | None:
    """How ``sample`` of OpInfo ``op_name`` selects, when its indices are open among equal values;
    None for any other op, and for a stable sort (whose order among equals is CPU's)."""
    selection = _SELECTIONS.get(op_name)
    if selection is None:
        return None
    args, kwargs = sample.args, sample.kwargs
    stable = kwargs.get("stable")
    if selection.stable_at is not None and len(args) > selection.stable_at:
        stable = args[selection.stable_at]
    if stable:
        return None
    dim = kwargs.get("dim", selection.default_dim)
    if selection.dim_at is not None and len(args) > selection.dim_at:
        dim = args[selection.dim_at]
    ndim = max(sample.input.dim(), 1)
    return OpenTies(op_name, dim % ndim, selection)


def _same_or_both_nan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    same = a == b
    if a.is_floating_point() or a.is_complex():
        same |= torch.isnan(a) & torch.isnan(b)
    return same


def _sums_over_equal(gradient: torch.Tensor, source: torch.Tensor, dim: int) -> torch.Tensor:
    """``gradient`` with each element replaced by the sum over the elements of its slice along
    ``dim`` whose ``source`` values equal its own (NaNs are each their own set)."""
    values = source.movedim(dim, -1).reshape(-1, source.shape[dim])
    grads = gradient.movedim(dim, -1).reshape(values.shape).to(torch.float64 if gradient.is_floating_point() else gradient.dtype)
    sums = torch.empty_like(grads)
    for row, (v, g) in enumerate(zip(values, grads)):
        _, sets = torch.unique(v, return_inverse=True)
        per_set = torch.zeros(int(sets.max()) + 1, dtype=g.dtype).index_add_(0, sets, g)
        sums[row] = per_set[sets]
    return sums.reshape(gradient.movedim(dim, -1).shape).movedim(-1, dim).to(gradient.dtype)
