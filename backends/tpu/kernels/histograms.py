"""Histogram lowerings: ``histc``, ``histogram`` and ``histogramdd`` (bin counts or bin edges,
weights, density)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch

from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten


@lowering(aten.histc.default)
def histc(x, bins=100, min=0, max=0):
    """Counts of ``x`` in ``bins`` equal bins over ``[min, max]``; elements outside are ignored,
    ``max`` falls in the last bin. ``min == max`` means the data's range (widened by 1 each way
    if that is a single value too), as PyTorch does."""
    x = x.reshape(-1)
    compute = x.dtype if x.dtype in (jnp.float32, jnp.float64) else jnp.float32
    x = x.astype(compute)
    lo, hi = jnp.asarray(min, compute), jnp.asarray(max, compute)
    use_data = lo == hi
    if x.size:
        lo, hi = jnp.where(use_data, x.min(), lo), jnp.where(use_data, x.max(), hi)
    widen = lo == hi
    lo, hi = jnp.where(widen, lo - 1, lo), jnp.where(widen, hi + 1, hi)
    position = ((x - lo) * bins / (hi - lo)).astype(jnp.int32)
    position = jnp.where(position == bins, bins - 1, position)
    inside = (x >= lo) & (x <= hi)
    return jnp.zeros(bins, compute).at[jnp.where(inside, position, 0)].add(inside.astype(compute))


def _linspace(lo, hi, steps: int):
    """PyTorch's ``linspace`` arithmetic (each half counted from its own end), so the bin edges
    match CPU's to an ulp (XLA may fuse the multiply-add)."""
    i = jnp.arange(steps, dtype=lo.dtype)
    if steps == 1:
        return lo[None]
    step = (hi - lo) / (steps - 1)
    return jnp.where(i < steps // 2, lo + i * step, hi - (steps - 1 - i) * step)


def _histogram(x, edges, weight, density):
    """Counts (or summed ``weight``) of ``x`` per bin ``[edges[i], edges[i + 1])``, the last
    bin closed; elements outside the edges (and NaN) are ignored. ``density`` divides by the
    total and the bin widths."""
    bins = edges.shape[0] - 1
    x = x.reshape(-1)
    position = jnp.searchsorted(edges, x, side="right") - 1
    position = jnp.where(x == edges[-1], bins - 1, position)
    inside = (x >= edges[0]) & (x <= edges[-1])
    amount = inside.astype(x.dtype) if weight is None else jnp.where(inside, weight.reshape(-1).astype(x.dtype), 0)
    hist = jnp.zeros(bins, x.dtype).at[jnp.clip(position, 0, max(bins - 1, 0))].add(amount)
    if density:
        hist = hist / (jnp.sum(hist) * (edges[1:] - edges[:-1]))
    return hist, edges


@lowering(aten.histogram.bin_ct)
def histogram_bin_count(x, bins=100, range=None, weight=None, density=False):
    """``bins`` equal bins over ``range``, or over the data's ``[min, max]`` (widened by 0.5 each
    way if that is one value; ``[0, 1]`` for empty input), as PyTorch does. Unlike CPU, a
    non-finite data range (NaN or inf in ``x``) is not an error: it cannot be checked without
    synchronising; the result is then meaningless."""
    compute = x.dtype if x.dtype in (jnp.float32, jnp.float64) else jnp.float32
    flat = x.reshape(-1).astype(compute)
    if range is not None:
        lo, hi = jnp.asarray(range[0], compute), jnp.asarray(range[1], compute)
    elif flat.size:
        lo, hi = flat.min(), flat.max()
    else:
        lo, hi = jnp.asarray(0, compute), jnp.asarray(1, compute)
    same = lo == hi
    lo, hi = jnp.where(same, lo - 0.5, lo), jnp.where(same, hi + 0.5, hi)
    return _histogram(flat, _linspace(lo, hi, bins + 1), weight, density)


@lowering(aten.histogram.bins_tensor)
def histogram_bin_edges(x, bins, weight=None, density=False):
    """Bins between consecutive given ``bins`` edges (increasing)."""
    return _histogram(x.reshape(-1), bins.astype(x.dtype), weight, density)


# -- histogramdd ----------------------------------------------------------------------------


def _outer_edges(columns, bins, range):
    """Each dimension's bin edges: ``bins[d] + 1`` equal steps over ``range[2d:2d+2]`` or over
    the column's data range (widened by 0.5 each way if one value; ``[0, 1]`` when empty)."""
    edges = []
    for d, count in enumerate(bins):
        column = columns[:, d]
        if range is not None:
            lo, hi = jnp.asarray(range[2 * d], columns.dtype), jnp.asarray(range[2 * d + 1], columns.dtype)
        elif column.size:
            lo, hi = column.min(), column.max()
        else:
            lo, hi = jnp.asarray(0, columns.dtype), jnp.asarray(1, columns.dtype)
        same = lo == hi
        edges.append(_linspace(jnp.where(same, lo - 0.5, lo), jnp.where(same, hi + 0.5, hi), count + 1))
    return edges


def _columns(x):
    compute = x.dtype if x.dtype in (jnp.float32, jnp.float64) else jnp.float32
    return x.reshape(-1, x.shape[-1]).astype(compute)


def _histogramdd(columns, edges, weight, density):
    """Counts (or summed ``weight``) per cell of the grid the per-dimension ``edges`` make; each
    dimension's last bin is closed, points outside any dimension's edges are ignored."""
    shape = tuple(e.shape[0] - 1 for e in edges)
    flat = jnp.zeros(columns.shape[0], jnp.int64)
    inside = jnp.ones(columns.shape[0], bool)
    for d, e in enumerate(edges):
        value, bins = columns[:, d], e.shape[0] - 1
        position = jnp.searchsorted(e, value, side="right") - 1
        position = jnp.clip(jnp.where(value == e[-1], bins - 1, position), 0, max(bins - 1, 0))
        inside = inside & (value >= e[0]) & (value <= e[-1])
        flat = flat * bins + position
    amount = inside.astype(columns.dtype) if weight is None else jnp.where(
        inside, weight.reshape(-1).astype(columns.dtype), 0)
    hist = jnp.zeros(math.prod(shape), columns.dtype).at[flat].add(amount).reshape(shape)
    if density:
        volume = jnp.ones((), columns.dtype)
        for d, e in enumerate(edges):
            view = [1] * len(edges)
            view[d] = -1
            volume = volume * (e[1:] - e[:-1]).reshape(view)
        hist = hist / (jnp.sum(hist) * volume)
    return hist


@lowering(aten._histogramdd_bin_edges.default)
def histogramdd_bin_edges(x, bins, *, range=None, weight=None, density=False):
    """``torch.histogramdd``'s edges for per-dimension bin counts (see :func:`_outer_edges`)."""
    return _outer_edges(_columns(x), bins, range)


@lowering(aten._histogramdd_from_bin_cts.default)
def histogramdd_from_bin_counts(x, bins, *, range=None, weight=None, density=False):
    columns = _columns(x)
    return _histogramdd(columns, _outer_edges(columns, bins, range), weight, density)


@lowering(aten._histogramdd_from_bin_tensors.default)
def histogramdd_from_bin_tensors(x, bins, *, weight=None, density=False):
    columns = _columns(x)
    return _histogramdd(columns, [b.astype(columns.dtype) for b in bins], weight, density)
