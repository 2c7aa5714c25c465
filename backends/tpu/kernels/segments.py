"""Segment reductions (``torch.segment_reduce``): sum, prod, max, min or mean over consecutive
runs of ``data`` along ``axis``, the runs given by ``lengths`` or ``offsets``.

Contract, as PyTorch's CPU kernel: ``lengths`` has shape ``data.shape[:axis] + (S,)`` (each
leading index has its own segmentation) and ``offsets`` one more entry per row; the result has
``S`` in place of ``axis``. ``initial``, when given, takes part in every segment's reduction
(``mean`` is ``(initial + sum) / length``) and is the value of an empty segment; without it an
empty segment is the reduction's identity (0, 1, -inf, +inf) or NaN for ``mean``. NaN propagates
through ``max``/``min``. ``unsafe=False``'s check that the lengths cover ``data`` exactly needs
their values on the host and is not made: elements past the last segment are ignored.

The segments are a (segment, position) membership mask, so every reduction is a masked
reduction along ``axis``: no data-dependent shapes.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten


def _identity(reduce: str) -> float:
    return {"sum": 0, "mean": 0, "prod": 1, "max": -jnp.inf, "min": jnp.inf}[reduce]


@lowering(aten.segment_reduce.default)
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    if lengths is None and offsets is None:
        raise RuntimeError("segment_reduce on tpu needs lengths or offsets")
    if lengths is None:
        lengths = offsets[..., 1:] - offsets[..., :-1]
    axis = axis % data.ndim
    compute = jnp.float32 if data.dtype in (jnp.bfloat16, jnp.float16) else data.dtype
    values = data.astype(compute)
    size = data.shape[axis]
    ends = jnp.cumsum(lengths, axis=-1)  # lead + (S,)
    starts = ends - lengths
    position = jnp.arange(size)
    member = (position >= starts[..., None]) & (position < ends[..., None])  # lead + (S, N)
    trailing = data.ndim - axis - 1
    member = member.reshape(member.shape + (1,) * trailing)
    expanded = jnp.expand_dims(values, axis)  # lead + (1, N) + trailing
    fill = jnp.asarray(_identity(reduce), compute)
    masked = jnp.where(member, expanded, fill)
    count = jnp.sum(member, axis=axis + 1).astype(compute)
    if reduce in ("sum", "mean"):
        out = jnp.sum(masked, axis=axis + 1)
    elif reduce == "prod":
        out = jnp.prod(masked, axis=axis + 1)
    elif reduce == "max":
        out = jnp.max(masked, axis=axis + 1)
    elif reduce == "min":
        out = jnp.min(masked, axis=axis + 1)
    else:
        raise RuntimeError(f"segment_reduce: unsupported reduction {reduce!r}")
    if initial is not None:
        init = jnp.asarray(initial, compute)
        if reduce in ("sum", "mean"):
            out = out + init
        elif reduce == "prod":
            out = out * init
        elif reduce == "max":
            out = jnp.maximum(out, init)  # NaN-propagating, like the reduction
        else:
            out = jnp.minimum(out, init)
    if reduce == "mean":
        empty = jnp.asarray(jnp.nan if initial is None else initial, compute)
        out = jnp.where(count > 0, out / jnp.where(count > 0, count, 1), empty)
    return out
