"""Sorting and its relatives as decompositions into neuron's native ops: ``sort`` (stable),
``topk``, ``kthvalue``, ``median``/``nanmedian``, ``mode``, ``cummax``/``cummin``
(``_cummax_helper``/``_cummin_helper``) and ``logcumsumexp``.

A sort is a ranking: element ``i`` of a row goes to position ``rank[i]``, the number of elements
that precede it in the order plus the number of equal ones before it in the row (so the sort is
stable, as the CPU's is, ascending and descending). The comparisons are the CPU's: NaN after
every number ascending and before every number descending, NaNs equal to each other, -0.0 equal
to 0.0. The ranks come from comparing the row with itself in blocks (``[rows, n, block]`` booleans,
summed; O(n^2) comparisons, which the Vector engine does 128 partitions at a time), then one
``scatter`` moves values and indices to their positions. Rows longer than :data:`MAX_RANKED`
are left to the CPU. Exact: nothing is computed, only
compared and moved.

``topk``, ``kthvalue`` and the medians read positions of that sorted order; among equal values
the CPU's selection algorithms return an unspecified one of the indices, here the first in the
row (values always equal the CPU's). ``median`` is NaN when its row holds a NaN (the first NaN's
index); ``nanmedian`` ranks the numbers only. ``mode`` finds the longest run of equal values in
the sorted row (the first, so the smallest value, of equal runs).

``cummax``/``cummin`` are an inclusive scan (Hillis–Steele: log2(n) shifted ``where`` steps)
over (value, index) pairs, a later element winning ties and NaN winning over numbers, as the CPU's
loop keeps them. ``logcumsumexp`` is the same scan with ``logaddexp`` (its additions grouped
otherwise than the CPU's left-to-right loop: equal within float rounding), in float32 for
bfloat16 and float16 as the CPU's is, each result rounded once.

``_unique``/``_unique2`` (``torch.unique`` of a whole tensor) sort the flattened tensor (stably),
keep each element that differs from the one before it (``!=``: every NaN is its own value, last,
as on the CPU; here in the input's order, on the CPU as its unstable sort leaves them, so a NaN's
inverse may point at another NaN), and number the runs: the inverse is that number
scattered back to each element's place, the counts the runs' lengths. The output's size depends
on the values, so it is read once (a synchronisation). The CPU sorts whether or not ``sorted``
asks it to; so does this.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch._ops import OpOverload

from accelkit_backends.neuron.decompositions import _accumulation_dtype

aten = torch.ops.aten

#: Booleans per comparison block: bounds the ``[rows, n, block]`` intermediate of a ranking.
_BLOCK_ELEMENTS = 1 << 22
#: The longest row ranked here: its n^2 comparisons take the simulator ~13 s at 8192 (3.4 s at
#: 4096); longer rows are left to the CPU (an O(n log^2 n) sorting network is what they need).
MAX_RANKED = 8192


def _too_long(x: torch.Tensor, dim: int) -> bool:
    return x.dim() > 0 and x.shape[dim] > MAX_RANKED


def _keys(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.int32) if x.dtype == torch.bool else x


def _precedes(a: torch.Tensor, b: torch.Tensor, descending: bool) -> torch.Tensor:
    """``a`` strictly before ``b`` in the CPU's order (NaN last ascending, first descending)."""
    strictly = a > b if descending else a < b
    if not a.is_floating_point():
        return strictly
    a_nan, b_nan = torch.isnan(a), torch.isnan(b)
    return strictly | (a_nan & ~b_nan) if descending else strictly | (~a_nan & b_nan)


def _equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    same = a == b
    return same | (torch.isnan(a) & torch.isnan(b)) if a.is_floating_point() else same


def _ranks(rows: torch.Tensor, descending: bool) -> torch.Tensor:
    """Each element's position in its row's stable sort (``rows`` is ``[m, n]``, int64)."""
    m, n = rows.shape
    keys = _keys(rows)
    position = torch.arange(n, device=rows.device)
    block = max(1, min(n, _BLOCK_ELEMENTS // max(1, m * n)))
    mine = keys.unsqueeze(2)
    rank = torch.zeros((m, n), dtype=torch.int64, device=rows.device)
    for start in range(0, n, block):
        theirs = keys[:, start:start + block].unsqueeze(1)
        earlier = (position[start:start + block].unsqueeze(0) < position.unsqueeze(1)).unsqueeze(0)
        before = _precedes(theirs, mine, descending) | (_equal(theirs, mine) & earlier)
        rank = rank + before.to(torch.int64).sum(dim=2)
    return rank


def _as_rows(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """``x`` with ``dim`` last, flattened to ``[rows, n]``, and the map back to ``x``'s layout."""
    moved = x.movedim(dim, -1)
    shape = moved.shape

    def back(rows: torch.Tensor) -> torch.Tensor:
        return rows.reshape(shape[:-1] + rows.shape[-1:]).movedim(-1, dim)

    return moved.reshape(-1, shape[-1]), back


def _sorted_rows(rows: torch.Tensor, descending: bool) -> tuple[torch.Tensor, torch.Tensor]:
    rank = _ranks(rows, descending)
    index = torch.arange(rows.shape[1], device=rows.device).expand_as(rows)
    return torch.zeros_like(rows).scatter(1, rank, rows), torch.zeros_like(rank).scatter(1, rank, index)


def _sort(self, *, stable=None, dim=-1, descending=False):
    if _too_long(self, dim):
        return NotImplemented
    if self.dim() == 0:
        return self.clone(), torch.zeros((), dtype=torch.int64, device=self.device)
    dim = dim % self.dim()
    if self.shape[dim] == 0 or self.numel() == 0:
        return self.clone(), torch.zeros(self.shape, dtype=torch.int64, device=self.device)
    rows, back = _as_rows(self, dim)
    values, indices = _sorted_rows(rows, descending)
    return back(values), back(indices)


def _topk(self, k, dim=-1, largest=True, sorted=True):  # noqa: A002 - the op's own argument name
    size = self.shape[dim] if self.dim() else 1
    if not 0 <= k <= size:
        raise RuntimeError("selected index k out of range")
    if self.dim() == 0:
        return self.clone(), torch.zeros((), dtype=torch.int64, device=self.device)
    if _too_long(self, dim):
        return NotImplemented
    values, indices = _sort(self, dim=dim, descending=largest)
    return values.narrow(dim, 0, k).clone(), indices.narrow(dim, 0, k).clone()


def _kthvalue(self, k, dim=-1, keepdim=False):
    size = self.shape[dim] if self.dim() else 1
    if not 1 <= k <= size:
        raise IndexError(f"kthvalue(): selected number k out of range for dimension {dim}")
    if self.dim() == 0:
        return self.clone(), torch.zeros((), dtype=torch.int64, device=self.device)
    if _too_long(self, dim):
        return NotImplemented
    values, indices = _sort(self, dim=dim)
    value, index = values.narrow(dim, k - 1, 1), indices.narrow(dim, k - 1, 1)
    return (value, index) if keepdim else (value.squeeze(dim), index.squeeze(dim))


def _median_rows(rows: torch.Tensor, ignore_nan: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The lower median of each row of ``[m, n]`` and its index."""
    values, indices = _sorted_rows(rows, False)
    n = rows.shape[1]
    if ignore_nan and rows.is_floating_point():
        numbers = (~torch.isnan(rows)).sum(dim=1, keepdim=True)
        middle = torch.where(numbers > 0, torch.div(numbers - 1, 2, rounding_mode="floor"), 0)
    else:
        middle = torch.full((rows.shape[0], 1), (n - 1) // 2, dtype=torch.int64, device=rows.device)
        if rows.is_floating_point():  # a row with a NaN: its first NaN, which sorts first of the NaNs
            has_nan = torch.isnan(values[:, -1:])
            first_nan = n - torch.isnan(rows).sum(dim=1, keepdim=True)
            middle = torch.where(has_nan, first_nan, middle)
    return values.gather(1, middle).squeeze(1), indices.gather(1, middle).squeeze(1)


def _median_all(ignore_nan: bool) -> Callable:
    def median(self):
        if self.numel() == 0 or self.numel() > MAX_RANKED:
            return NotImplemented  # the CPU's NaN for an empty tensor
        value, _ = _median_rows(self.reshape(1, -1), ignore_nan)
        return value.reshape(())

    return median


def _median_dim(ignore_nan: bool) -> Callable:
    def median(self, dim, keepdim=False):
        if self.dim() == 0:
            return self.clone(), torch.zeros((), dtype=torch.int64, device=self.device)
        dim = dim % self.dim()
        if self.shape[dim] == 0 or _too_long(self, dim):
            return NotImplemented  # the CPU's error; a row too long to rank
        rows, back = _as_rows(self, dim)
        value, index = _median_rows(rows, ignore_nan)
        value, index = back(value.unsqueeze(1)), back(index.unsqueeze(1))
        return (value, index) if keepdim else (value.squeeze(dim), index.squeeze(dim))

    return median


def _mode(self, dim=-1, keepdim=False):
    """The most frequent value of each row (of equal counts the smallest; each NaN counts
    alone, as NaN != NaN) and the index of its last occurrence in the stable sort: the CPU's
    for rows its sort keeps stable (small ones); for longer rows the CPU's index is any of the
    value's occurrences. With a NaN in the row the CPU's result is its sort's accident (it sorts
    with ``<``, which NaN leaves unordered: ``[4, nan, -1, 4]`` gives -1)."""
    if self.dim() == 0:
        return self.clone(), torch.zeros((), dtype=torch.int64, device=self.device)
    dim = dim % self.dim()
    if self.shape[dim] == 0 or _too_long(self, dim):
        return NotImplemented  # the CPU's error; a row too long to rank
    rows, back = _as_rows(self, dim)
    values, indices = _sorted_rows(rows, False)
    m, n = rows.shape
    position = torch.arange(n, device=rows.device).expand(m, n)
    yes = torch.ones((m, 1), dtype=torch.bool, device=rows.device)
    differs = values[:, 1:] != values[:, :-1]
    starts = torch.cat([yes, differs], dim=1)
    ends = torch.cat([differs, yes], dim=1)
    run_start = torch.cummax(torch.where(starts, position, 0), dim=1).values
    length = torch.where(ends, position - run_start + 1, 0)
    longest = length.amax(dim=1, keepdim=True)
    best = torch.where(ends & (length == longest), position, n).amin(dim=1, keepdim=True)
    value, index = back(values.gather(1, best)), back(indices.gather(1, best))
    return (value, index) if keepdim else (value.squeeze(dim), index.squeeze(dim))


def _shifted(x: torch.Tensor, step: int, fill) -> torch.Tensor:
    """``x`` moved ``step`` places along its last dim, the first ``step`` places ``fill``."""
    head = torch.full(x.shape[:-1] + (step,), fill, dtype=x.dtype, device=x.device)
    return torch.cat([head, x[..., :-step]], dim=-1)


def _scan_extreme(self, dim: int, greater: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Inclusive running max (``greater``) or min along ``dim`` with the index of the element
    kept: the CPU's loop keeps a new element when it is NaN, or when neither is NaN and it is
    ``>=`` (``<=``) the kept one."""
    x = _keys(self).movedim(dim, -1)
    n = x.shape[-1]
    values = x
    indices = torch.arange(n, device=x.device).expand(x.shape).contiguous()
    step = 1
    while step < n:
        earlier_values = _shifted(values, step, 0)
        earlier_indices = _shifted(indices, step, -1)
        later_wins = values >= earlier_values if greater else values <= earlier_values
        if x.is_floating_point():
            later_wins = torch.isnan(values) | (~torch.isnan(earlier_values) & later_wins)
        later_wins = later_wins | (earlier_indices < 0)
        values = torch.where(later_wins, values, earlier_values)
        indices = torch.where(later_wins, indices, earlier_indices)
        step *= 2
    return values.to(self.dtype).movedim(-1, dim), indices.movedim(-1, dim)


def _cum_helper(greater: bool) -> Callable:
    def helper(self, values, indices, dim):
        if self.numel() == 0:
            return None
        found_values, found_indices = _scan_extreme(self, dim, greater)
        values.copy_(found_values)
        indices.copy_(found_indices)
        return None

    return helper


def _logcumsumexp(self, dim):
    if self.dim() == 0:
        return self.clone()
    if self.numel() == 0:
        return torch.empty_like(self)
    x = self.movedim(dim, -1)
    x = x.to(_accumulation_dtype(x.dtype))  # as on the CPU: float32 for bf16/f16, rounded once
    n, step = x.shape[-1], 1
    while step < n:
        x = torch.logaddexp(x, _shifted(x, step, float("-inf")))
        step *= 2
    return x.to(self.dtype).movedim(-1, dim).contiguous()


def _unique2(self, sorted=True, return_inverse=False, return_counts=False):
    if self.is_complex() or self.numel() > MAX_RANKED:
        return NotImplemented  # the CPU's error for complex; long tensors: see MAX_RANKED
    flat = self.reshape(-1)
    none = torch.empty(0, dtype=torch.int64, device=self.device)
    if flat.numel() == 0:
        return flat.clone(), self.new_empty(self.shape, dtype=torch.int64) if return_inverse else none, none
    values, order = torch.sort(flat, stable=True)
    starts_run = torch.ones_like(values, dtype=torch.bool)
    starts_run[1:] = values[1:] != values[:-1]
    output = values[starts_run]
    inverse = none
    if return_inverse:
        run = torch.cumsum(starts_run.to(torch.int64), 0) - 1
        inverse = torch.empty_like(run).scatter(0, order, run).reshape(self.shape)
    counts = none
    if return_counts:
        starts = torch.nonzero(starts_run).reshape(-1)
        ends = torch.cat([starts[1:], torch.full((1,), flat.numel(), dtype=torch.int64, device=self.device)])
        counts = ends - starts
    return output, inverse, counts


def _unique(self, sorted=True, return_inverse=False):
    result = _unique2(self, sorted, return_inverse, False)
    return result if result is NotImplemented else result[:2]


def decompositions() -> Mapping[OpOverload, Callable]:
    """The decompositions above, keyed by aten overload (their ``out=`` forms follow)."""
    return {
        aten._unique.default: _unique,
        aten._unique2.default: _unique2,
        aten.sort.stable: _sort,
        aten.topk.default: _topk,
        aten.kthvalue.default: _kthvalue,
        aten.median.default: _median_all(False),
        aten.nanmedian.default: _median_all(True),
        aten.median.dim: _median_dim(False),
        aten.nanmedian.dim: _median_dim(True),
        aten.mode.default: _mode,
        aten._cummax_helper.default: _cum_helper(True),
        aten._cummin_helper.default: _cum_helper(False),
        aten._logcumsumexp.default: _logcumsumexp,
    }
