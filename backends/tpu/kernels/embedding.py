"""Embedding lookups, their dense gradient, ``max_norm``'s renormalisation, and embedding bags.

``embedding`` is a row gather; an index outside ``[0, num_embeddings)`` fails it with CPU's
IndexError, as a device-side check (:mod:`accelkit_backends.tpu.checks`). The gradient scatters rows of ``grad_output`` into a zero table (in
float32 for low-precision gradients), skipping ``padding_idx`` and, with
``scale_grad_by_freq``, dividing each contribution by how often its index occurs in the batch.
``embedding_renorm`` is registered functional; the runtime derives the in-place
``embedding_renorm_`` that ``F.embedding(..., max_norm=...)`` calls.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from accelkit_backends.tpu import checks
from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten


@lowering(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    checks.require_in_range(indices, weight.shape[0], IndexError, "index out of range in self")
    return jnp.take(weight, indices, axis=0, mode="clip")


@lowering(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    dim = grad.shape[-1]
    dtype = jnp.float32 if jnp.dtype(grad.dtype).itemsize < 4 else grad.dtype
    rows = grad.reshape(-1, dim).astype(dtype)
    flat = indices.reshape(-1)
    if padding_idx >= 0:
        rows = jnp.where((flat == padding_idx)[:, None], jnp.zeros((), dtype), rows)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), dtype).at[flat].add(1)
        rows = rows / counts[flat][:, None]
    return jnp.zeros((num_weights, dim), dtype).at[flat].add(rows)


@lowering(aten.embedding_renorm.default, static=("norm_type",))
def embedding_renorm(weight, indices, max_norm, norm_type):
    """``weight`` with each row that ``indices`` names (once, however often it is named) scaled
    by ``max_norm / (norm + 1e-7)`` where its ``norm_type``-norm exceeds ``max_norm``, as
    PyTorch's CPU kernel does; other rows unchanged."""
    dtype = jnp.float32 if jnp.dtype(weight.dtype).itemsize < 4 else weight.dtype
    rows = weight.astype(dtype)
    a = jnp.abs(rows)
    if norm_type == 0:
        norm = jnp.sum(a != 0, axis=1).astype(dtype)
    elif math.isinf(norm_type):
        norm = jnp.max(a, axis=1, initial=0) if norm_type > 0 else jnp.min(a, axis=1, initial=jnp.inf)
    elif norm_type == 2:
        norm = jnp.sqrt(jnp.sum(a * a, axis=1))
    else:
        norm = jnp.sum(a**norm_type, axis=1) ** (1 / norm_type)
    rows_named = checks.require_in_range(
        indices, weight.shape[0], IndexError,
        f"select(): index {{}} out of range for tensor of size {list(weight.shape)} at dimension 0")
    named = jnp.zeros(weight.shape[0], bool).at[indices.reshape(-1)].set(True, mode="drop")
    scale = jnp.where(named & (norm > max_norm), max_norm / (norm + 1e-7), 1)
    return checks.unchanged_unless(rows_named, rows * scale[:, None].astype(dtype), weight)


_SUM, _MEAN, _MAX = 0, 1, 2


@lowering(aten._embedding_bag_forward_only.default)
def embedding_bag_forward_only(weight, indices, offsets, scale_grad_by_freq=False, mode=_SUM, sparse=False,
                               per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """``F.embedding_bag`` without autograd: (output, offset2bag, bag_size, max_indices).

    Bag ``j`` is ``indices[offsets[j]:offsets[j + 1]]`` (the last bag runs to the end, unless
    ``include_last_offset`` makes the last offset its end: PyTorch requires it to be
    ``len(indices)``; for other values CPU's modes disagree, here entries past it are left
    out); entries equal to ``padding_idx``
    are left out. ``output[j]`` is the sum (scaled by ``per_sample_weights``), mean or max of
    the bag's rows, 0 for an empty bag. The auxiliary outputs (read only by the backward, which
    is not lowered) have the Meta kernel's shapes, which differ from CPU's in places:
    ``offset2bag`` is each entry's bag, ``bag_size`` the entries counted per offset,
    ``max_indices`` (max mode; empty otherwise) the row that gave each maximum, first one on
    ties, 0 for an empty bag.
    """
    bags = offsets.shape[0] - (1 if include_last_offset else 0)
    count = indices.shape[0]
    ok, bad, where = checks.first_where((indices < 0) | (indices >= weight.shape[0]), indices)
    checks.require(ok, RuntimeError,
                   f"Index {{1}} of input takes value {{0}} which is not in the valid range [0, {weight.shape[0]})",
                   bad, where)
    if offsets.shape[0]:
        checks.require(offsets[0] == 0, RuntimeError,
                       "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start "
                       "from position 0. However, got {}", offsets[0])
        checks.require(offsets[-1] <= count, RuntimeError,
                       f"offsets[-1] can not be greater than input's length {count} but got offsets[-1] of {{}}",
                       offsets[-1])
    position = jnp.arange(count)
    bag = jnp.searchsorted(offsets, position, side="right") - 1
    member = (bag >= 0) & (bag < bags)
    if include_last_offset and offsets.shape[0]:
        member = member & (position < offsets[-1])
    if padding_idx is not None and padding_idx >= 0:
        member = member & (indices != padding_idx)
    target = jnp.where(member, bag, 0)
    dtype = jnp.float32 if jnp.dtype(weight.dtype).itemsize < 4 else weight.dtype
    rows = jnp.take(weight, indices, axis=0, mode="clip").astype(dtype)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.astype(dtype)[:, None]
    # Sized per offset, as PyTorch's Meta kernel has it (one more than the bags with
    # include_last_offset, that entry 0).
    sizes = jnp.zeros(offsets.shape[0], jnp.int64).at[target].add(member.astype(jnp.int64))
    empty = jnp.zeros((0,), jnp.int64)
    if mode == _MAX:
        low = jnp.asarray(-jnp.inf, dtype)
        best = jnp.full((bags, weight.shape[1]), low).at[target].max(jnp.where(member[:, None], rows, low))
        hit = member[:, None] & (rows == best[target])
        first = jnp.full(best.shape, count).at[target].min(jnp.where(hit, position[:, None], count))
        max_indices = jnp.where(first < count, indices[jnp.clip(first, 0, max(count - 1, 0))], 0)
        output = jnp.where(sizes[:bags, None] > 0, best, 0)
        return output, bag.astype(jnp.int64), sizes, max_indices.astype(jnp.int64)
    total = jnp.zeros((bags, weight.shape[1]), dtype).at[target].add(jnp.where(member[:, None], rows, 0))
    if mode == _MEAN:
        total = total / jnp.maximum(sizes[:bags], 1)[:, None].astype(dtype)
    return total, bag.astype(jnp.int64), sizes, empty
