"""Ops with data-dependent result shapes.

An XLA program has static shapes, but ``nonzero``, ``masked_select``, ``unique`` (also
``unique_consecutive``, ``unique_dim``) and ``repeat_interleave`` with a tensor of repeats return
as many elements as the data says, as does indexing with a boolean mask (``x[mask]``, in
:mod:`.indexing`). They run in two steps: a small program counts (true elements, distinct values,
the total of the repeats), the count is read on the host — one synchronisation, as PyTorch's CUDA
kernels do — and a second program, compiled once per count, computes the result at that static
size (``jnp.nonzero(..., size=n)``). Writes need no count: ``x[mask] = v`` with ``v``
broadcasting over the selected positions (the usual case) is one ``where``; ``masked_scatter``
places its source by a running count.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from accelkit_backends.tpu import checks
from accelkit_backends.tpu.host_steps import Specialised, count_true, host_step, host_value, shape_of, true_counter
from accelkit_backends.tpu.lowering import Lowering, lowering

aten = torch.ops.aten


def _nonzero(x, size):
    if x.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    return jnp.stack(jnp.nonzero(x, size=size), axis=1).astype(jnp.int64)


_nonzero_program = Specialised(aten.nonzero.default, _nonzero)
_nonzero_counter = true_counter()


@host_step(aten.nonzero.default, uses=(_nonzero_program, _nonzero_counter))
def nonzero(x):
    return _nonzero_program(size=count_true(_nonzero_counter, x))(x)


@lowering(aten.nonzero_static.default)
def nonzero_static(x, size, fill_value=-1):
    """Static by contract: the first ``size`` coordinates, padded with ``fill_value``."""
    if x.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    if x.size == 0:
        return jnp.full((size, x.ndim), fill_value, jnp.int64)
    return jnp.stack(jnp.nonzero(x, size=size, fill_value=fill_value), axis=1).astype(jnp.int64)


def _masked_select(x, mask, shape, size):
    mask = jnp.broadcast_to(mask.astype(jnp.bool_), shape).reshape(-1)
    return jnp.broadcast_to(x, shape).reshape(-1)[jnp.nonzero(mask, size=size)]


_masked_select_program = Specialised(aten.masked_select.default, _masked_select)
_masked_select_counter = true_counter()


@host_step(aten.masked_select.default, uses=(_masked_select_program, _masked_select_counter))
def masked_select(x, mask):
    shape = tuple(np.broadcast_shapes(shape_of(x), shape_of(mask)))
    size = count_true(_masked_select_counter, mask, shape)
    return _masked_select_program(shape=shape, size=size)(x, mask)


def _distinct_count(x, sorted=True, return_inverse=False, return_counts=False):
    flat = jnp.sort(x.reshape(-1))
    if flat.size == 0:
        return jnp.zeros((), jnp.int64)
    return 1 + jnp.sum(flat[1:] != flat[:-1])  # NaNs are distinct, as on CPU


def _unique(x, sorted=True, return_inverse=False, return_counts=False, size=0):
    empty = jnp.zeros((0,), jnp.int64)
    if size == 0:
        inverse = jnp.zeros(x.shape, jnp.int64) if return_inverse else empty
        return jnp.zeros((0,), x.dtype), inverse, empty
    values, inverse, counts = jnp.unique(
        x.reshape(-1), size=size, return_inverse=True, return_counts=True, equal_nan=False
    )
    return (values, inverse.reshape(x.shape).astype(jnp.int64) if return_inverse else empty,
            counts.astype(jnp.int64) if return_counts else empty)


_distinct_program = Lowering(aten._unique2.default, _distinct_count)
_unique_program = Specialised(aten._unique2.default, _unique)


@host_step(aten._unique2.default, uses=(_unique_program, _distinct_program))
def unique(x, sorted=True, return_inverse=False, return_counts=False):
    """Always sorted, as PyTorch's CPU and CUDA kernels are whatever ``sorted`` says."""
    size = int(_distinct_program(x))
    return _unique_program(size=size)(x, sorted, return_inverse, return_counts)


def _as_rows(x, dim):
    """``x`` as one row per position along ``dim`` (all of ``x`` flattened when dim is None)."""
    if dim is None:
        return x.reshape(-1, 1)
    moved = jnp.moveaxis(x, dim, 0)
    return moved.reshape(x.shape[dim], math.prod(moved.shape[1:]))  # explicit: -1 is ambiguous with a 0 size


def _run_starts(rows):
    """True where a row differs from the one before it (the first row always starts a run)."""
    if rows.shape[0] == 0:
        return jnp.zeros((0,), jnp.bool_)
    changed = jnp.any(rows[1:] != rows[:-1], axis=1)
    return jnp.concatenate([jnp.ones((1,), jnp.bool_), changed])


def _lexicographic_order(rows):
    """A stable permutation sorting ``rows`` lexicographically (first column most significant)."""
    if rows.shape[1] == 0:
        return jnp.arange(rows.shape[0])
    return jnp.lexsort(tuple(rows[:, j] for j in reversed(range(rows.shape[1]))))


def _runs(x, dim, order, return_inverse, return_counts, size):
    """The first row of each run of equal rows of ``x`` (taken in ``order``), with the inverse
    (run number of every original row) and the run lengths."""
    rows = _as_rows(x, dim)
    ordered = rows if order is None else rows[order]
    starts = _run_starts(ordered)
    first = jnp.nonzero(starts, size=size)[0]
    if dim is None:
        values = ordered[first, 0]
    else:
        source = x if order is None else jnp.take(x, order, axis=dim)
        values = jnp.take(source, first, axis=dim)
    empty = jnp.zeros((0,), jnp.int64)
    run = jnp.cumsum(starts) - 1
    if order is not None:
        run = jnp.zeros_like(run).at[order].set(run)
    inverse_shape = x.shape if dim is None else (x.shape[dim],)
    inverse = run.reshape(inverse_shape).astype(jnp.int64) if return_inverse else empty
    ends = jnp.concatenate([first[1:], jnp.full((1,), rows.shape[0], first.dtype)])
    counts = (ends - first).astype(jnp.int64) if return_counts else empty
    return values, inverse, counts


def _run_count(x, dim, order_rows):
    rows = _as_rows(x, dim)
    if order_rows:
        rows = rows[_lexicographic_order(rows)]
    return jnp.sum(_run_starts(rows))


_consecutive_count = Lowering(aten.unique_consecutive.default, lambda x, dim=None: _run_count(x, dim, False))
_consecutive_program = Specialised(
    aten.unique_consecutive.default,
    lambda x, return_inverse=False, return_counts=False, dim=None, size=0:
        _runs(x, dim, None, return_inverse, return_counts, size))


@host_step(aten.unique_consecutive.default, uses=(_consecutive_program, _consecutive_count))
def unique_consecutive(x, return_inverse=False, return_counts=False, dim=None):
    size = int(_consecutive_count(x, dim=dim))
    return _consecutive_program(size=size)(x, return_inverse, return_counts, dim)


def _unique_rows(x, dim, sorted=True, return_inverse=False, return_counts=False, size=0):
    return _runs(x, dim, _lexicographic_order(_as_rows(x, dim)), return_inverse, return_counts, size)


_unique_dim_count = Lowering(aten.unique_dim.default, lambda x, dim: _run_count(x, dim, True))
_unique_dim_program = Specialised(aten.unique_dim.default, _unique_rows)


@host_step(aten.unique_dim.default, uses=(_unique_dim_program, _unique_dim_count))
def unique_dim(x, dim, sorted=True, return_inverse=False, return_counts=False):
    """Unique slices along ``dim``, in lexicographic order (as on CPU)."""
    dim %= max(len(shape_of(x)), 1)
    size = int(_unique_dim_count(x, dim))
    return _unique_dim_program(size=size)(x, dim, sorted, return_inverse, return_counts)


_NEGATIVE_REPEATS = "repeats can not be negative"
# (least, total) of the repeats, one program and one read; aminmax's Meta kernel gives the
# shapes and dtype of such a pair.
_least_and_total = Lowering(aten.aminmax.default, lambda x: (jnp.min(x, initial=0), jnp.sum(x)))


def _repeated_positions(repeats, output_size=None):
    ok, _, _ = checks.first_where(repeats < 0, repeats)
    checks.require(ok, RuntimeError, _NEGATIVE_REPEATS)
    return jnp.repeat(jnp.arange(repeats.shape[0]), jnp.maximum(repeats, 0), total_repeat_length=output_size)


_repeat_interleave_program = Lowering(aten.repeat_interleave.Tensor, _repeated_positions)


@host_step(aten.repeat_interleave.Tensor, uses=(_repeat_interleave_program, _least_and_total))
def repeat_interleave(repeats, output_size=None):
    """Each position ``i`` repeated ``repeats[i]`` times; the total is read on the host unless
    given (then negative repeats are refused on the host, else by a device-side check)."""
    if output_size is None:
        least, output_size = (int(v) for v in host_value(_least_and_total(repeats)))
        if least < 0:
            raise RuntimeError(_NEGATIVE_REPEATS)
    return _repeat_interleave_program(repeats, output_size=output_size)


@lowering(aten.masked_scatter.default)
def masked_scatter(x, mask, source):
    """Each selected position takes the next source element: its rank among the selected."""
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    selected = jnp.broadcast_to(mask.astype(jnp.bool_), shape).reshape(-1)
    base = jnp.broadcast_to(x, shape).reshape(-1)
    flat_source = source.reshape(-1).astype(x.dtype)
    count = jnp.sum(selected)
    checks.require(count <= flat_source.size, RuntimeError,
                   "Number of elements of source < number of ones in mask")
    if flat_source.size == 0:
        return base.reshape(shape)
    rank = jnp.clip(jnp.cumsum(selected) - 1, 0, flat_source.size - 1)
    out = jnp.where(selected, flat_source[rank], base).reshape(shape)
    return checks.unchanged_unless(count <= flat_source.size, out, x)
