"""Embedding lookups, their dense gradient, and ``max_norm``'s renormalisation.

``embedding`` is a row gather. XLA cannot raise from inside a program, so an index outside
``[0, num_embeddings)`` is not reported as on CPU (XLA clamps it) — validate indices on the host
if they are untrusted. The gradient scatters rows of ``grad_output`` into a zero table (in
float32 for low-precision gradients), skipping ``padding_idx`` and, with
``scale_grad_by_freq``, dividing each contribution by how often its index occurs in the batch.
``embedding_renorm`` is registered functional; the runtime derives the in-place
``embedding_renorm_`` that ``F.embedding(..., max_norm=...)`` calls.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten


@lowering(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
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
    named = jnp.zeros(weight.shape[0], bool).at[indices.reshape(-1)].set(True)
    scale = jnp.where(named & (norm > max_norm), max_norm / (norm + 1e-7), 1)
    return rows * scale[:, None].astype(dtype)
