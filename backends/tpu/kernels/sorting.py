"""Sorting and order-statistic lowerings: sort, topk, kthvalue, median, nanmedian, mode.

Everything is built on one stable XLA sort (``lax.sort`` of a key, the int64 positions and the
values) that orders like PyTorch: NaN above every number (last ascending, first descending),
``-0.0`` equal to ``0.0``, equal keys in their original order — also when descending, which is
done by sorting the reversed slice ascending and reversing back. ``topk`` is a full sort and a
slice, which is exact for every ``k`` (``lax.top_k`` would only cover ``largest=True`` on the
last dim, with its own NaN rules); on a real TPU a sort of a long dim costs more than a top-k.

Where PyTorch leaves the index of tied elements unspecified (``kthvalue``, ``median``), the
first of the ties in sorted order is returned; ``mode`` returns the last index of the most
frequent value (the smallest such value), as CPU does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from accelkit_backends.tpu.kernels.reductions import along
from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten


def _sort_key(x):
    """A key whose XLA total order matches PyTorch's comparison order."""
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint8)
    if jnp.issubdtype(x.dtype, jnp.floating):
        canonical = jnp.where(x == 0, jnp.zeros((), x.dtype), x)  # -0.0 sorts with 0.0
        return jnp.where(jnp.isnan(x), jnp.full((), jnp.nan, x.dtype), canonical)  # one NaN, last
    return x


def stable_sort(x, axis, descending=False):
    """(values, int64 indices, sorted keys) of a stable sort of ``x`` along ``axis``."""
    index = jax.lax.broadcasted_iota(jnp.int64, x.shape, axis)
    if x.shape[axis] == 0:
        return x, index, _sort_key(x)
    if not descending:
        key, indices, values = jax.lax.sort((_sort_key(x), index, x), dimension=axis, num_keys=1)
        return values, indices, key
    flipped = jnp.flip(x, axis)
    key, positions, values = jax.lax.sort((_sort_key(flipped), index, flipped), dimension=axis, num_keys=1)
    last = x.shape[axis] - 1
    return jnp.flip(values, axis), last - jnp.flip(positions, axis), jnp.flip(key, axis)


def _take(array, position, axis, keepdim):
    """``array``'s entries at per-slice ``position`` (an array shaped like the reduced result)."""
    picked = jnp.take_along_axis(array, jnp.expand_dims(position, axis), axis=axis)
    return picked if keepdim else jnp.squeeze(picked, axis)


def _require_nonempty(name, x, axis):
    if x.ndim and x.shape[axis] == 0:
        raise IndexError(f"{name}(): Expected reduction dim {axis} to have non-zero size.")


@lowering(aten.sort.stable)
def sort_stable(x, *, stable=None, dim=-1, descending=False):
    return along(x, dim, lambda v, axis: stable_sort(v, axis, descending)[:2])


@lowering(aten.sort.default)
def sort(x, dim=-1, descending=False):
    return along(x, dim, lambda v, axis: stable_sort(v, axis, descending)[:2])


@lowering(aten.topk.default)
def topk(x, k, dim=-1, largest=True, sorted=True):
    def compute(v, axis):
        values, indices, _ = stable_sort(v, axis, descending=largest)
        return (jax.lax.slice_in_dim(values, 0, k, axis=axis),
                jax.lax.slice_in_dim(indices, 0, k, axis=axis))

    return along(x, dim, compute)


def _order_statistic(name, x, dim, keepdim, position_of):
    """(value, index) at the sorted position ``position_of(sorted_keys, axis)`` of each slice."""

    def compute(v, axis):
        _require_nonempty(name, v, axis)
        values, indices, keys = stable_sort(v, axis)
        position = position_of(keys, axis)
        return _take(values, position, axis, keepdim), _take(indices, position, axis, keepdim)

    return along(x, dim, compute)


def _nan_count(keys, axis):
    if not jnp.issubdtype(keys.dtype, jnp.floating):
        return jnp.zeros(keys.shape[:axis] + keys.shape[axis + 1:], jnp.int64)
    return jnp.sum(jnp.isnan(keys), axis=axis, dtype=jnp.int64)


def _median_position(keys, axis):
    """The lower median's sorted position, or the first NaN's when the slice has NaN."""
    n = keys.shape[axis]
    nans = _nan_count(keys, axis)
    return jnp.where(nans > 0, n - nans, (n - 1) // 2)


def _nanmedian_position(keys, axis):
    """The lower median of the non-NaN elements (position 0, a NaN, when all are NaN)."""
    valid = keys.shape[axis] - _nan_count(keys, axis)
    return jnp.maximum((valid - 1) // 2, 0)


@lowering(aten.kthvalue.default)
def kthvalue(x, k, dim=-1, keepdim=False):
    def position(keys, axis):
        return jnp.full(keys.shape[:axis] + keys.shape[axis + 1:], k - 1, jnp.int64)

    return _order_statistic("kthvalue", x, dim, keepdim, position)


@lowering(aten.median.dim)
def median_dim(x, dim, keepdim=False):
    return _order_statistic("median", x, dim, keepdim, _median_position)


@lowering(aten.nanmedian.dim)
def nanmedian_dim(x, dim, keepdim=False):
    return _order_statistic("nanmedian", x, dim, keepdim, _nanmedian_position)


def _median_of_all(x, position_of):
    if x.size == 0:
        return jnp.full((), jnp.nan, x.dtype)
    values, _, keys = stable_sort(x.reshape(-1), 0)
    return values[position_of(keys, 0)]


@lowering(aten.median.default)
def median(x):
    return _median_of_all(x, _median_position)


@lowering(aten.nanmedian.default)
def nanmedian(x):
    return _median_of_all(x, _nanmedian_position)


@lowering(aten.mode.default)
def mode(x, dim=-1, keepdim=False):
    """Most frequent value per slice (the smallest on ties) and the last index holding it."""

    def compute(v, axis):
        _require_nonempty("mode", v, axis)
        v = jnp.moveaxis(v, axis, -1)
        values, indices, keys = stable_sort(v, v.ndim - 1)
        n = v.shape[-1]
        position = jax.lax.broadcasted_iota(jnp.int64, v.shape, v.ndim - 1)
        differs = keys[..., 1:] != keys[..., :-1]
        edge = jnp.ones(v.shape[:-1] + (1,), jnp.bool_)
        run_start = jax.lax.cummax(jnp.where(jnp.concatenate([edge, differs], -1), position, 0), v.ndim - 1)
        run_end = jax.lax.cummin(jnp.where(jnp.concatenate([differs, edge], -1), position, n), v.ndim - 1,
                                 reverse=True)
        best = jnp.argmax(run_end - run_start, axis=-1)  # first longest run: the smallest value
        last = jnp.take_along_axis(run_end, best[..., None], -1)
        value = jnp.take_along_axis(values, last, -1)
        index = jnp.take_along_axis(indices, last, -1)
        if keepdim:
            return jnp.moveaxis(value, -1, axis), jnp.moveaxis(index, -1, axis)
        return value[..., 0], index[..., 0]

    return along(x, dim, compute)
