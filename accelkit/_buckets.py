"""Bounded dynamism: pad a varying length up to a few declared bucket sizes, so a compiled
model builds one program per bucket instead of one per length.

XLA programs have static shapes (as on TPUs and Trainium), so a run over many sequence lengths
or batch sizes would compile once per length. :func:`bucketed` wraps a callable (typically a
``torch.compile``-d model): it pads every tensor argument whose size along ``dim`` is the call's
length to the smallest bucket that holds it, runs the callable, and cuts every output that has
the bucket's size along ``dim`` back to the length.

It is correct exactly when the padded positions cannot change the real positions' results:

- **sequence buckets** (``dim=1`` for ``(batch, seq, ...)`` inputs) with an attention mask in the
  Hugging Face convention (``attention_mask``: 1 = attend, 0 = padding): padded keys get mask 0,
  so no real position attends to them; position-wise layers (embeddings, MLPs, norms over the
  hidden size) never mix positions. Encoders and decoder-only models with a causal mask
  (right-padded positions are later than every real one) qualify. If the call has no
  ``attention_mask``, ``mask="attention_mask"`` makes one (ones for the real positions).
- **batch buckets** (``dim=0``): rows are independent in inference and per-sample layers;
  padded rows are zeros and are cut off.

It is *not* correct for graphs that reduce over the padded dimension without the mask
(mean/max pooling over the sequence, a loss over all positions, BatchNorm in training, a
convolution along the sequence whose window reaches the padding): their results include the
padding. Those must pass the mask into the reduction, or not be bucketed.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch


def bucketed(
    fn: Callable[..., Any],
    buckets: Sequence[int],
    *,
    dim: int = 1,
    pad_values: Mapping[str, float] | None = None,
    mask: str | None = "attention_mask",
) -> Callable[..., Any]:
    """``fn`` with its inputs padded along ``dim`` to the next of ``buckets`` (see the module
    docstring for which graphs this is correct for).

    :param buckets: the sizes to compile for, e.g. ``(32, 64, 128)``.
    :param dim: the dimension that varies (1: sequence of ``(batch, seq)`` inputs; 0: batch).
    :param pad_values: per keyword argument, the value padded positions get (default 0; e.g.
        ``{"input_ids": tokenizer.pad_token_id}``). An argument named ``mask`` is padded with 0.
    :param mask: the keyword of the attention mask, made when the call has none (ones for real
        positions, zeros for padding); ``None`` never adds one.
    :raises ValueError: at a call whose length exceeds the largest bucket (the message names the
        length and the buckets).
    """
    sizes = sorted(set(int(b) for b in buckets))
    if not sizes or sizes[0] <= 0:
        raise ValueError(f"bucketed: buckets must be positive sizes, got {list(buckets)!r}")
    values = dict(pad_values or {})

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        length = _length(args, kwargs, dim)
        if length is None:
            return fn(*args, **kwargs)
        index = bisect.bisect_left(sizes, length)
        if index == len(sizes):
            raise ValueError(
                f"bucketed: length {length} along dim {dim} exceeds the largest bucket "
                f"{sizes[-1]} (buckets {sizes}); add a bucket of at least {length}"
            )
        bucket = sizes[index]
        if mask is not None and mask not in kwargs and dim == 1 and bucket != length:
            like = _first_tensor(args, kwargs)
            kwargs[mask] = torch.ones(like.shape[:2], dtype=torch.long, device=like.device)
        padded_args = [_pad(a, length, bucket, dim, 0) for a in args]
        padded_kwargs = {k: _pad(v, length, bucket, dim, 0 if k == mask else values.get(k, 0)) for k, v in kwargs.items()}
        return _cut(fn(*padded_args, **padded_kwargs), length, bucket, dim)

    run.buckets = tuple(sizes)  # type: ignore[attr-defined]
    return run


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    return [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]


def _first_tensor(args: tuple, kwargs: dict) -> torch.Tensor:
    return next(t for t in _tensors(args, kwargs) if t.dim() >= 2)


def _length(args: tuple, kwargs: dict, dim: int) -> int | None:
    """The call's length: the size along ``dim`` of its first tensor that has that dimension."""
    for tensor in _tensors(args, kwargs):
        if tensor.dim() > dim:
            return tensor.shape[dim]
    return None


def _pad(value: Any, length: int, bucket: int, dim: int, fill: float) -> Any:
    if not isinstance(value, torch.Tensor) or value.dim() <= dim or value.shape[dim] != length or bucket == length:
        return value
    shape = list(value.shape)
    shape[dim] = bucket - length
    return torch.cat([value, torch.full(shape, fill, dtype=value.dtype, device=value.device)], dim=dim)


def _cut(value: Any, length: int, bucket: int, dim: int) -> Any:
    if bucket == length:
        return value
    if isinstance(value, torch.Tensor):
        return value.narrow(dim, 0, length) if value.dim() > dim and value.shape[dim] == bucket else value
    if isinstance(value, Mapping):  # includes Hugging Face ModelOutput
        cut = {k: _cut(v, length, bucket, dim) for k, v in value.items()}
        try:
            return type(value)(**cut)
        except TypeError:
            return cut
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_cut(v, length, bucket, dim) for v in value))
    if isinstance(value, list | tuple):
        return type(value)(_cut(v, length, bucket, dim) for v in value)
    return value
