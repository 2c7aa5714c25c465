"""Embedding lookups and their dense gradient.

``embedding`` is a row gather. XLA cannot raise from inside a program, so an index outside
``[0, num_embeddings)`` is not reported as on CPU (XLA clamps it) — validate indices on the host
if they are untrusted. The gradient scatters rows of ``grad_output`` into a zero table (in
float32 for low-precision gradients), skipping ``padding_idx`` and, with
``scale_grad_by_freq``, dividing each contribution by how often its index occurs in the batch.
"""

from __future__ import annotations

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
