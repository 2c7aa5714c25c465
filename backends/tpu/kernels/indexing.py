"""Indexing lowerings: advanced indexing, gather/scatter, the ``index_*`` ops, masks and lookups.

Indexing with a boolean mask reads the mask's count on the host first (:mod:`..host_steps`);
the ops whose result shape depends on the data are in :mod:`.data_dependent`.

**Out-of-range indices** are refused as on CPU — the same exception type and wording, per op —
by device-side checks (:mod:`accelkit_backends.tpu.checks`): the error is raised at the op in
debug mode and at the next synchronisation in strict mode, and a refused write writes nothing
(its scatter drops every position). Negative indices wrap where PyTorch accepts them
(``index``, ``index_put``, ``index_fill``, ``take``, ``put``). Index shapes, dtypes and value
shapes are checked on the host from shapes alone, with PyTorch's messages.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._ops import OpOverload

from accelkit_backends.tpu import checks
from accelkit_backends.tpu.buffers import value_of
from accelkit_backends.tpu.host_steps import Specialised, count_true, host_step, shape_of, torch_dtype_of, true_counter
from accelkit_backends.tpu.lowering import Lowering, lowering

aten = torch.ops.aten


# ---------------------------------------------------------------------------------------------
# Advanced indexing: index, index_put
# ---------------------------------------------------------------------------------------------


def _is_mask(index: Any) -> bool:
    return torch_dtype_of(index) in (torch.bool, torch.uint8)


def _check_masks(x: Any, indices: Sequence[Any]) -> None:
    """PyTorch's IndexError for a mask whose shape differs from the dims it covers."""
    dim, size = 0, shape_of(x)
    for position, index in enumerate(indices):
        if index is None:
            dim += 1
            continue
        if _is_mask(index):
            mask_shape = shape_of(index)
            for j, extent in enumerate(mask_shape):
                if dim + j >= len(size) or size[dim + j] != extent:
                    raise IndexError(
                        f"The shape of the mask {list(mask_shape)} at index {j} does not match the "
                        f"shape of the indexed tensor {list(size)} at index {dim + j}"
                    )
            dim += len(mask_shape)
        else:
            dim += 1


def _mask_counts(counter: Specialised, x: Any, indices: Sequence[Any], kinds: tuple | None = None) -> tuple[int, ...]:
    """The true elements of each mask among ``indices`` (a synchronisation per mask; none when
    ``kinds`` says there is no mask)."""
    if kinds is not None and not any(kind is not None and kind[0] == "mask" for kind in kinds):
        return ()
    _check_masks(x, indices)
    return tuple(count_true(counter, index) for index in indices if index is not None and _is_mask(index))


_INDEX_DTYPES = frozenset({torch.int64, torch.int32, torch.uint8, torch.bool})
_MASK_DTYPES = frozenset({torch.uint8, torch.bool})


def _index_kinds(indices: Sequence[Any]) -> tuple:
    """What :func:`_indexed_shape` needs of ``indices``, from shapes and dtypes alone: per entry
    None, ``("mask", ndim)`` or ``("index", shape)``; PyTorch's IndexError for a float index."""
    kinds = []
    for index in indices:
        if index is None:
            kinds.append(None)
            continue
        dtype = torch_dtype_of(index)
        if dtype not in _INDEX_DTYPES:
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
        shape = shape_of(index)
        kinds.append(("mask", len(shape)) if dtype in _MASK_DTYPES else ("index", shape))
    return tuple(kinds)


def _usable_indices(indices: Sequence[Any], kinds: tuple) -> list[Any]:
    """``indices`` with uint8 masks as bool ones, with PyTorch's deprecation warning (its Meta
    kernel refuses them)."""
    if not any(kind is not None and kind[0] == "mask" and torch_dtype_of(index) == torch.uint8
               for index, kind in zip(indices, kinds)):
        return list(indices)
    warnings.warn("indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool instead.",
                  UserWarning, stacklevel=2)
    return [value_of(index).astype(jnp.bool_) if index is not None and torch_dtype_of(index) == torch.uint8
            else index for index in indices]


@functools.lru_cache(maxsize=1024)
def _indexed_shape(shape: tuple[int, ...], kinds: tuple, true_counts: tuple[int, ...], put: bool) -> tuple[int, ...]:
    """The shape of ``x[indices]`` for ``x`` of ``shape`` (``kinds`` from :func:`_index_kinds`,
    masks selecting ``true_counts`` elements), with PyTorch's IndexError for more indexed
    dimensions than ``x`` has or index shapes that do not broadcast."""
    counts = iter(true_counts)
    advanced: list[tuple[int, ...]] = []  # the shape each index tensor contributes
    positions: list[int] = []  # where each sits among the kept dimensions
    kept: list[int] = []
    dim = 0
    for kind in kinds:
        if kind is None:
            if dim < len(shape):
                kept.append(shape[dim])
            dim += 1
            continue
        positions.append(len(kept))
        if kind[0] == "mask":
            count = next(counts)
            advanced.extend([(count,)] * kind[1])
            dim += kind[1]
        else:
            advanced.append(kind[1])
            dim += 1
    if dim > len(shape):
        suffix = f" (got {len(kinds)})" if put else ""
        raise IndexError(f"too many indices for tensor of dimension {len(shape)}{suffix}")
    try:
        broadcast = tuple(np.broadcast_shapes(*advanced)) if advanced else ()
    except ValueError:
        raise IndexError("shape mismatch: indexing tensors could not be broadcast together with shapes "
                         + ", ".join(str(list(s)) for s in advanced)) from None
    kept.extend(shape[dim:])
    if not advanced:
        return tuple(kept)
    # Index tensors side by side (no sliced dimension between them) replace their dimensions
    # in place; separated, their broadcast shape goes first.
    at = positions[0] if len(set(positions)) == 1 else 0
    return tuple(kept[:at]) + broadcast + tuple(kept[at:])


@functools.lru_cache(maxsize=1024)
def _fits(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether ``shape`` broadcasts to exactly ``target``."""
    try:
        return tuple(np.broadcast_shapes(shape, target)) == tuple(target)
    except ValueError:
        return False


def _check_values(values: Any, indexed: tuple[int, ...]) -> None:
    """PyTorch's error when ``values`` does not broadcast to the indexed shape."""
    if not _fits(shape_of(values), indexed):
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(shape_of(values))} cannot be "
                           f"broadcast to indexing result of shape {list(indexed)}")


def _key(shape: tuple[int, ...], indices: Sequence[Any], true_counts: Sequence[int],
         for_write: bool = False) -> tuple:
    """A jnp index tuple: None is a full slice, a mask becomes its ``nonzero`` coordinates, an
    integer index must lie in ``[-size, size)`` of its dimension (a device-side check with
    PyTorch's IndexError). For a write (``for_write``, used with ``mode="drop"``) a failed
    check makes the key select nothing, so the write leaves ``x`` as it was (traced)."""
    key: list = []
    counts = iter(true_counts)
    dim, ok, first = 0, True, None
    for index in indices:
        if index is None:
            key.append(slice(None))
            dim += 1
        elif index.dtype in (jnp.bool_, jnp.uint8):
            key.extend(jnp.nonzero(index, size=next(counts)))
            dim += index.ndim
        else:
            size = shape[dim]
            # PyTorch names the index by its place among the index tensors (a mask counting
            # as one per dimension it covers), not by the dimension it indexes.
            place = len(key) - sum(1 for k in key if isinstance(k, slice))
            in_range = checks.require_in_range(
                index, size, IndexError, f"index {{}} is out of bounds for dimension {place} with size {size}",
                negative=True)
            ok = in_range if ok is True else ok & in_range
            if first is None:
                first = (len(key), size)
            key.append(index)
            dim += 1
    if for_write and first is not None:
        position, size = first
        index = key[position]
        key[position] = checks.drop_unless(ok, jnp.where(index < 0, index + size, index), size)
    return tuple(key)


def _index(x, indices, true_counts=()):
    return x[_key(x.shape, indices, true_counts)]


_index_program = Specialised(aten.index.Tensor, _index)
_index_counter = true_counter()


@host_step(aten.index.Tensor, uses=(_index_program, _index_counter))
def index(x, indices):
    kinds = _index_kinds(indices)
    indices = _usable_indices(indices, kinds)
    counts = _mask_counts(_index_counter, x, indices, kinds)
    _indexed_shape(shape_of(x), kinds, counts, False)
    return _index_program(true_counts=counts)(x, indices)


def _put(x, indices, values, accumulate=False, unsafe=False, true_counts=()):
    key = _key(x.shape, indices, true_counts, for_write=True)
    if not accumulate:
        return x.at[key].set(values.astype(x.dtype), mode="drop")
    if x.dtype == jnp.bool_:
        return x.at[key].max(values.astype(x.dtype), mode="drop")
    wide = _accumulator(x.dtype)
    return x.astype(wide).at[key].add(values.astype(wide), mode="drop").astype(x.dtype)


def _put_through_mask(x, indices, values, accumulate=False, unsafe=False):
    """``x[..., mask] = values`` where ``values`` has no extent along the selected positions."""
    position = next(p for p, index in enumerate(indices) if index is not None)
    mask = indices[position].astype(jnp.bool_)
    rest = x.shape[position + mask.ndim:]
    wanted = position + 1 + len(rest)  # PyTorch's indexed shape: leading dims, count, rest
    if values.ndim > wanted:
        values = values.reshape(values.shape[values.ndim - wanted:])
    values = values.reshape((1,) * (wanted - values.ndim) + values.shape)
    fill = values.reshape(values.shape[:position] + (1,) * mask.ndim + values.shape[position + 1:])
    selected = mask.reshape((1,) * position + mask.shape + (1,) * len(rest))
    fill = fill.astype(x.dtype)
    if not accumulate:
        return jnp.where(selected, fill, x)
    if x.dtype == jnp.bool_:
        return x | (selected & fill)
    return x + jnp.where(selected, fill, jnp.zeros((), x.dtype))


class _PutPrograms:
    """One op's index_put programs: by mask counts, through a mask, and the counting."""

    def __init__(self, op: OpOverload):
        self.by_counts = Specialised(op, _put)
        self.through_mask = Lowering(aten.index_put.default, _put_through_mask)
        self.counter = true_counter()
        self.all = (self.by_counts, self.through_mask, self.counter)


_index_put_programs = _PutPrograms(aten.index_put.default)
_index_put_impl_programs = _PutPrograms(aten._index_put_impl.default)


def _mask_write_needs_no_count(x: Any, indices: Sequence[Any], values: Any) -> bool:
    """One mask, the other entries None, and values that do not vary along the selection."""
    present = [p for p, index in enumerate(indices) if index is not None]
    if len(present) != 1 or not _is_mask(indices[present[0]]):
        return False
    position = present[0]
    rest = len(shape_of(x)) - position - len(shape_of(indices[position]))
    vshape = shape_of(values)
    along_selection = len(vshape) - rest - 1
    return along_selection < 0 or vshape[along_selection] == 1


def _index_put(programs: _PutPrograms, x, indices, values, accumulate=False, unsafe=None):
    extra = () if unsafe is None else (unsafe,)
    kinds = _index_kinds(indices)
    present = [index for index in indices if index is not None]
    if (len(present) == 1 and torch_dtype_of(present[0]) == torch.uint8
            and math.prod(shape_of(values)) == 1):
        # PyTorch's kernel takes this case as a masked_fill_, which refuses a uint8 mask.
        raise RuntimeError("masked_fill_ only supports boolean masks, but got mask with dtype unsigned char")
    indices = _usable_indices(indices, kinds)
    shape = shape_of(x)
    if _mask_write_needs_no_count(x, indices, values):
        _check_masks(x, indices)
        # Values with no extent along the selection fit any number of selected elements when
        # they fit one; only a misfit needs the count, for the error message.
        if not _fits(shape_of(values), _indexed_shape(shape, kinds, (1,), True)):
            _check_values(values, _indexed_shape(shape, kinds, _mask_counts(programs.counter, x, indices), True))
        return programs.through_mask(x, indices, values, accumulate)
    counts = _mask_counts(programs.counter, x, indices, kinds)
    _check_values(values, _indexed_shape(shape, kinds, counts, True))
    return programs.by_counts(true_counts=counts)(x, indices, values, accumulate, *extra)


@host_step(aten.index_put.default, uses=_index_put_programs.all)
def index_put(x, indices, values, accumulate=False):
    return _index_put(_index_put_programs, x, indices, values, accumulate)


@host_step(aten._index_put_impl.default, uses=_index_put_impl_programs.all)
def index_put_impl(x, indices, values, accumulate=False, unsafe=False):
    return _index_put(_index_put_impl_programs, x, indices, values, accumulate, unsafe)


# ---------------------------------------------------------------------------------------------
# index_select, gather and the scatter family
# ---------------------------------------------------------------------------------------------


def _out_of_bounds(dim: int, size: int) -> str:
    return f"index {{}} is out of bounds for dimension {dim} with size {size}"


_OUT_OF_RANGE_IN_SELF = "index out of range in self"


@lowering(aten.index_select.default)
def index_select(x, dim, index):
    if x.ndim == 0:
        checks.require_in_range(index, 1, IndexError, _OUT_OF_RANGE_IN_SELF)
        return x
    dim %= x.ndim
    size = x.shape[dim]
    if x.ndim > 1 and dim == 1:  # CPU's kernel takes another path here, with its own message
        checks.require_in_range(index, size, RuntimeError,
                                f"INDICES element is out of DATA bounds, id={{}} axis_dim={size}")
    else:
        checks.require_in_range(index, size, IndexError, _OUT_OF_RANGE_IN_SELF)
    return jnp.take(x, index.reshape(-1), axis=dim)


@lowering(aten.gather.default)
def gather(x, dim, index, sparse_grad=False):
    if index.size == 0:
        return jnp.zeros(index.shape, x.dtype)
    if index.ndim == 0 or x.ndim == 0:
        return gather(x.reshape(-1), 0, index.reshape(-1)).reshape(index.shape)
    dim %= x.ndim
    checks.require_in_range(index, x.shape[dim], RuntimeError, _out_of_bounds(dim, x.shape[dim]))
    # PyTorch lets index be smaller than x in the other dims: read only that corner.
    corner = tuple(slice(None) if d == dim else slice(0, index.shape[d]) for d in range(x.ndim))
    return jnp.take_along_axis(x[corner], index, axis=dim)


def _coordinates(index, dim):
    """Full coordinates of every element of ``index`` with ``dim`` replaced by its values."""
    coords = [jax.lax.broadcasted_iota(jnp.int64, index.shape, d) for d in range(index.ndim)]
    coords[dim] = index
    return tuple(coords)


def _accumulator(dtype) -> Any:
    """Where sums of 16-bit floats accumulate: float32, rounded once at the end."""
    return jnp.float32 if dtype in (jnp.bfloat16, jnp.float16) else dtype


def _identity(reduce: str, dtype) -> Any:
    if reduce in ("sum", "add", "mean"):
        return jnp.zeros((), dtype)
    if reduce in ("prod", "multiply"):
        return jnp.ones((), dtype)
    big = reduce == "amin"
    if dtype == jnp.bool_:
        return jnp.asarray(big, dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.asarray(jnp.inf if big else -jnp.inf, dtype)
    info = jnp.iinfo(dtype)
    return jnp.asarray(info.max if big else info.min, dtype)


def _combine(target, values, reduce: str | None):
    """Write ``values`` through ``target`` (an ``x.at[...]``); positions out of range (a failed
    check's, see :func:`checks.drop_unless`) are dropped."""
    if reduce is None:
        return target.set(values, mode="drop")
    if values.dtype == jnp.bool_ and reduce in ("sum", "add", "mean"):
        return target.max(values, mode="drop")
    if values.dtype == jnp.bool_ and reduce in ("prod", "multiply"):
        return target.min(values, mode="drop")
    if reduce in ("sum", "add", "mean"):
        return target.add(values, mode="drop")
    if reduce in ("prod", "multiply"):
        return target.multiply(values, mode="drop")
    return target.max(values, mode="drop") if reduce == "amax" else target.min(values, mode="drop")


def _scatter(x, dim, index, src, reduce=None, include_self=True, message=None, error=RuntimeError):
    """``x`` with ``src`` (an array the size of ``index`` or larger, or a scalar) scattered along
    ``dim``; an index outside ``[0, size)`` fails the op with ``error(message)`` (scatter's own
    by default) and writes nothing."""
    if x.ndim == 0 or index.ndim == 0:
        src = src.reshape(-1) if hasattr(src, "ndim") and src.ndim == 0 else src
        return _scatter(x.reshape(-1), 0, index.reshape(-1), src, reduce, include_self, message,
                        error).reshape(x.shape)
    dim %= x.ndim
    if index.size == 0:
        return x
    size = x.shape[dim]
    ok = checks.require_in_range(index, size, error, message or _out_of_bounds(dim, size))
    index = checks.drop_unless(ok, index, size)
    if hasattr(src, "ndim") and src.ndim:
        src = src[tuple(slice(0, n) for n in index.shape)]
    narrow = x.dtype
    if reduce in ("sum", "add", "mean", "prod", "multiply"):
        x = x.astype(_accumulator(x.dtype))
    values = jnp.broadcast_to(jnp.asarray(src).astype(x.dtype), index.shape)
    coords = _coordinates(index, dim)
    base = x if include_self else x.at[coords].set(_identity(reduce, x.dtype), mode="drop")
    out = _combine(base.at[coords], values, reduce)
    if reduce != "mean":
        return out.astype(narrow)
    counts = jnp.ones(x.shape, jnp.int64)
    if not include_self:
        counts = counts.at[coords].set(0, mode="drop")
    counts = counts.at[coords].add(1, mode="drop")
    if jnp.issubdtype(x.dtype, jnp.integer):
        return jnp.floor_divide(out, counts.astype(x.dtype))
    return (out / counts).astype(narrow)


@lowering(aten.scatter.src, aten.scatter.value)
def scatter(x, dim, index, src):
    return _scatter(x, dim, index, src)


@lowering(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_with_reduce(x, dim, index, src, reduce):
    return _scatter(x, dim, index, src, reduce)


@lowering(aten.scatter_add.default)
def scatter_add(x, dim, index, src):
    return _scatter(x, dim, index, src, "sum")


@lowering(aten.scatter_reduce.two)
def scatter_reduce(x, dim, index, src, reduce, include_self=True):
    return _scatter(x, dim, index, src, reduce, include_self)


# ---------------------------------------------------------------------------------------------
# index_add, index_copy, index_fill
# ---------------------------------------------------------------------------------------------


def _along(x, dim, index, error, message, negative=False):
    """``x.at[...]`` selecting ``index`` (a vector) along ``dim``, for a write with
    ``mode="drop"``: an index outside the dimension (``[-size, size)`` when ``negative``) fails
    the op with ``error(message)`` and the write selects nothing."""
    dim %= x.ndim
    size = x.shape[dim]
    index = index.reshape(-1)
    ok = checks.require_in_range(index, size, error, message, negative=negative)
    if negative:
        index = jnp.where(index < 0, index + size, index)
    return x.at[(slice(None),) * dim + (checks.drop_unless(ok, index, size),)]


def _on_vector(fn):
    """Run an index op on a 0-d tensor as on its one-element vector."""

    @functools.wraps(fn)
    def run(x, dim, index, *rest, **kwargs):
        if x.ndim:
            return fn(x, dim, index, *rest, **kwargs)
        rest = [r.reshape(-1) if isinstance(r, jax.Array) and r.ndim == 0 else r for r in rest]
        return fn(x.reshape(1), 0, index, *rest, **kwargs).reshape(())

    return run


@lowering(aten.index_add.default)
@_on_vector
def index_add(x, dim, index, source, alpha=1):
    dim %= x.ndim
    # CPU's kernel reports a bad index in two wordings, by the path it takes for this layout.
    if x.ndim == 1 or 0 < dim < x.ndim - 1:
        error, message = IndexError, _OUT_OF_RANGE_IN_SELF
    else:
        error, message = RuntimeError, _out_of_bounds(dim, x.shape[dim])
    if not (isinstance(alpha, int) and alpha == 1):
        source = source * alpha
    if x.dtype == jnp.bool_:
        return _along(x, dim, index, error, message).max(source.astype(x.dtype), mode="drop")
    wide = _accumulator(x.dtype)
    return _along(x.astype(wide), dim, index, error, message).add(source.astype(wide), mode="drop").astype(x.dtype)


@lowering(aten.index_copy.default)
@_on_vector
def index_copy(x, dim, index, source):
    dim %= x.ndim
    message = "index_copy_(): " + _out_of_bounds(dim, x.shape[dim])
    return _along(x, dim, index, IndexError, message).set(source.astype(x.dtype), mode="drop")


@lowering(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
@_on_vector
def index_fill(x, dim, index, value):
    dim %= x.ndim
    target = _along(x, dim, index, IndexError, _out_of_bounds(dim, x.shape[dim]), negative=True)
    return target.set(jnp.asarray(value).astype(x.dtype), mode="drop")


@lowering(aten.index_reduce.default)
def index_reduce(x, dim, index, source, reduce, include_self=True):
    """scatter_reduce along ``dim`` with ``index`` applied to every slice of ``source``."""
    if x.ndim == 0:
        return index_reduce(x.reshape(1), 0, index, source.reshape(1), reduce, include_self).reshape(())
    dim %= x.ndim
    moved_source = jnp.moveaxis(source, dim, 0)
    positions = jnp.broadcast_to(index.reshape((-1,) + (1,) * (x.ndim - 1)), moved_source.shape)
    out = _scatter(jnp.moveaxis(x, dim, 0), 0, positions, moved_source, reduce, include_self,
                   _OUT_OF_RANGE_IN_SELF, IndexError)
    return jnp.moveaxis(out, 0, dim)


@lowering(aten.put.default)
def put(x, index, source, accumulate=False):
    """Writes through ``x``'s row-major flattening; negative positions count from the end."""
    flat, index = x.reshape(-1), index.reshape(-1)
    size = flat.shape[0]
    ok = checks.require_in_range(index, size, IndexError, _taken(size), negative=True)
    index = checks.drop_unless(ok, jnp.where(index < 0, index + size, index), size)
    target, values = flat.at[index], source.reshape(-1).astype(x.dtype)
    if not accumulate:
        return target.set(values, mode="drop").reshape(x.shape)
    if x.dtype == jnp.bool_:
        return target.max(values, mode="drop").reshape(x.shape)
    wide = _accumulator(x.dtype)
    return flat.astype(wide).at[index].add(values.astype(wide), mode="drop").astype(x.dtype).reshape(x.shape)


def _taken(numel: int) -> str:
    """CPU's message for a flat position outside a tensor (``take``, ``put``)."""
    return f"out of range: tried to access index {{}} on a tensor of {numel} elements."


@lowering(aten.take.default)
def take(x, index):
    """Reads through ``x``'s row-major flattening; negative positions count from the end."""
    flat = x.reshape(-1)
    size = flat.shape[0]
    checks.require_in_range(index, size, IndexError, _taken(size), negative=True)
    if size == 0:
        return jnp.zeros(index.shape, x.dtype)
    return jnp.take(flat, jnp.where(index < 0, index + size, index), mode="clip")


# ---------------------------------------------------------------------------------------------
# Sorted lookups: searchsorted, bucketize
# ---------------------------------------------------------------------------------------------


def _search(boundaries, values, side):
    values = jnp.asarray(values)
    common = jnp.promote_types(boundaries.dtype, values.dtype)
    boundaries, values = boundaries.astype(common), values.astype(common)
    if boundaries.ndim <= 1:
        return jnp.searchsorted(boundaries, values, side=side)
    rows = boundaries.reshape(math.prod(boundaries.shape[:-1]), boundaries.shape[-1])  # -1: ambiguous with a 0 size
    found = jax.vmap(lambda row, v: jnp.searchsorted(row, v, side=side))(rows, values.reshape(rows.shape[0], values.shape[-1]))
    return found.reshape(values.shape)


def _side(right, side):
    return side if side is not None else ("right" if right else "left")


@lowering(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(sorted_sequence, values, out_int32=False, right=False, side=None, sorter=None):
    if sorter is not None:
        checks.require_in_range(sorter, sorted_sequence.shape[-1], RuntimeError,
                                "torch.searchsorted(): sorter index out of range")
        sorted_sequence = jnp.take_along_axis(sorted_sequence, sorter, axis=-1)
    return _search(sorted_sequence, values, _side(right, side))


@lowering(aten.bucketize.Tensor, aten.bucketize.Scalar)
def bucketize(values, boundaries, out_int32=False, right=False):
    """``right=False``: boundaries[i-1] < v <= boundaries[i], i.e. a left-side search."""
    return _search(boundaries, values, _side(right, None))
