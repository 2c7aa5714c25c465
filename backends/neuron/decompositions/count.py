"""Histograms as decompositions into neuron's native ops: each element's bin is computed as
the CPU's kernel finds it (``HistogramKernel.cpp``), then the bins are counted with one
``scatter_add``.

* ``histc``: the CPU's linear interpolation, ``trunc((x - min) * bins / (max - min))`` in the
  input's type (each operation rounded as there), an element at ``max`` in the last bin,
  elements outside ``[min, max]`` (and NaN) left out.
* ``histogram`` with a bin count: edges ``linspace(min, max, bins + 1)`` in the input's type
  (bins + 1 numbers from two host numbers, made on the host as the CPU makes them and uploaded);
  with a tensor of edges, those. The CPU places an element by the last edge not above it (its
  interpolation's local search lands there too), so here that is the sequence search of
  ``decompositions.arith`` (``right=True``), an element at the last edge in the last bin.
  ``weight`` adds weights instead of ones; ``density`` divides by the total, then by the bin
  widths, as the CPU does.

A range left to the data (``min == max`` for ``histc``, no ``range`` for ``histogram``) is read
back from the device (two numbers: a host sync, as the CPU's own reads them to check that they
are finite and to widen an empty range: ±1 for ``histc``, ±0.5 for ``histogram``).
Counts are accumulated in float32 and rounded once to the input's type: exact to 2**24 per bin
(the CPU adds bfloat16 counts in bfloat16, which stop growing at 256; here they go on).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch._ops import OpOverload

from accelkit_backends.neuron.decompositions.arith import _search

aten = torch.ops.aten


def _in_dtype(value: float, dtype: torch.dtype) -> float:
    """``value`` rounded to ``dtype``, as the CPU holds its edges."""
    return torch.tensor(value, dtype=dtype).item()


def _outer_edges(x: torch.Tensor, low: float, high: float, widen: float, name: str) -> tuple[float, float]:
    if low == high and x.numel() > 0:
        low, high = x.min().item(), x.max().item()  # the host sync the module docstring names
    if not (math.isfinite(low) and math.isfinite(high)):
        raise RuntimeError(f"{name}: range of [{low}, {high}] is not finite")
    if low > high:
        raise RuntimeError(f"{name}: min should not exceed max, but got min {low} max {high}")
    if low == high:
        low, high = low - widen, high + widen
    return low, high


def _count(bins: int, position: torch.Tensor, counted: torch.Tensor, weight: torch.Tensor | None,
           dtype: torch.dtype) -> torch.Tensor:
    """Add one (or the element's weight) per counted element at its bin."""
    one = torch.ones((), dtype=torch.float32, device=position.device) if weight is None else weight.float()
    amounts = torch.where(counted, one, 0.0).flatten()
    index = torch.where(counted, position, 0).flatten()
    hist = torch.zeros(bins, dtype=torch.float32, device=position.device).scatter_add(0, index, amounts)
    return hist.to(dtype)


def _histc(self, bins=100, min=0, max=0):  # noqa: A002 - the op's own argument names
    dtype = self.dtype
    low, high = _outer_edges(self, float(min), float(max), 1.0, "torch.histc")
    low, high = _in_dtype(low, dtype), _in_dtype(high, dtype)
    width = (torch.tensor(high, dtype=dtype) - torch.tensor(low, dtype=dtype)).item()
    position = ((self - low) * bins / width).to(torch.int64).clamp(max=bins - 1)
    counted = (self >= low) & (self <= high)
    return _count(bins, position, counted, None, dtype)


def _binned(self, edges, weight, density):
    values = self.reshape(-1)
    bins = edges.numel() - 1
    position = (_search(edges, values, True, None) - 1).clamp(0, bins - 1)
    counted = (values >= edges[0]) & (values <= edges[-1])
    hist = _count(bins, position, counted, None if weight is None else weight.reshape(-1), self.dtype)
    if density:
        hist = hist / hist.sum()
        hist = hist / (edges[1:] - edges[:-1])
    return hist, edges


def _histogram_bin_count(self, bins=100, *, range=None, weight=None, density=False):  # noqa: A002
    if range is None and self.numel() == 0:
        low, high = 0.0, 1.0  # the CPU's edges for no data and no range
    else:
        low, high = (0.0, 0.0) if range is None else (float(range[0]), float(range[1]))
        low, high = _outer_edges(self, low, high, 0.5, "torch.histogram")
    # bins + 1 numbers from two host numbers: made by the CPU's own linspace and uploaded (the
    # device's linspace rounds some steps otherwise, and the edges are part of the result)
    edges = torch.linspace(low, high, bins + 1, dtype=self.dtype).to(self.device)
    return _binned(self, edges, weight, density)


def _histogram_edges(self, bins, *, weight=None, density=False):
    return _binned(self, bins.to(self.dtype).clone(), weight, density)


def decompositions() -> Mapping[OpOverload, Callable]:
    """The decompositions above, keyed by aten overload (their ``out=`` forms follow)."""
    return {
        aten.histc.default: _histc,
        aten.histogram.bin_ct: _histogram_bin_count,
        aten.histogram.bins_tensor: _histogram_edges,
    }
