"""The transformer encoder layer's inference fast path as one neuron tile program.

Training and ``scaled_dot_product_attention`` reach the device as ordinary ops (mm/bmm,
``_safe_softmax``, ``native_layer_norm`` ...), each with its own tile program. In inference
(eval mode, no autograd, batch_first, an even head count) ``nn.TransformerEncoderLayer`` instead
calls ``_transformer_encoder_layer_fwd``, a whole layer in one op. Here it is one kernel that
chains the same building blocks on the same ``k``: Tensor-engine matmuls (``matmul_2d``) with a
bias epilogue, per-head attention (scores, ``_safe_softmax`` rows, weighted values), residual
adds, GELU/ReLU on the Scalar engine and layer norm rows. Intermediates live in HBM scratch
arrays, as a compiled Neuron graph spills what does not stay in SBUF.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from accelkit_backends.neuron.launch import OutSpec, hbm_empty, tile_kernel
from accelkit_backends.neuron.kernels.elementwise import binary, unary, where
from accelkit_backends.neuron.kernels.matmul import matmul_2d
from accelkit_backends.neuron.kernels.normalization import layer_norm_into, load_broadcast
from accelkit_backends.neuron.kernels.softmax import softmax_rows
from accelkit_backends.neuron.sim import numerics as nx
from accelkit_backends.neuron.sim.isa import Kernel
from accelkit_backends.neuron.sim.memory import Tile

aten = torch.ops.aten


def _scratch(shape: tuple[int, ...], like: np.ndarray) -> np.ndarray:
    return np.empty(shape, dtype=like.dtype)


def _epilogue(bias: np.ndarray | None, divisor: float = 1.0):
    """A ``matmul_2d`` epilogue: divide the fp32 accumulator, then add a row-broadcast bias."""

    def epilogue(k: Kernel, acc: Tile, result: Tile, m0: int, m1: int, n0: int, n1: int) -> None:
        term = load_broadcast(k, bias, m1 - m0, n0, n1, "bias")
        if divisor != 1.0:
            if term is None:
                k.tensor_scalar(result, acc, "divide", divisor)
                return
            divided = k.sbuf(acc.shape, np.float32, "divided")
            k.tensor_scalar(divided, acc, "divide", divisor)
            acc = divided
        if term is None:
            k.tensor_copy(result, acc)
        else:
            k.tensor_tensor(result, acc, term, "add")

    return epilogue


def linear(k: Kernel, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """``x @ weight.T + bias`` for a 2-d ``x``, into a new HBM array."""
    out = _scratch((x.shape[0], weight.shape[0]), x)
    return matmul_2d(k, x, weight.T, out, _epilogue(bias))


def _spec(array: np.ndarray) -> OutSpec:
    return OutSpec(array.shape, nx.torch_dtype(array.dtype))


def _masked_scores(k: Kernel, scores: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """Scores with the mask applied: ``-inf`` where a boolean mask is True, or a float mask added."""
    if mask is None:
        return scores
    mask = np.broadcast_to(mask, scores.shape)
    if mask.dtype == np.bool_:
        return where(k, [_spec(scores)], mask, -math.inf, scores)
    return binary(k, _spec(scores), scores, mask, "add")


def _head_mask(mask: np.ndarray | None, mask_type: int | None, b: int, h: int) -> np.ndarray | None:
    """The [L, L] (or broadcastable) mask of batch ``b``, head ``h`` (``merge_masks`` types:
    0 = [L, L], 1 = [B, L] key padding, 2 = [B, H, L, L])."""
    if mask is None:
        return None
    if mask.ndim == 2 and mask_type == 1:
        return mask[b][None, :]
    if mask.ndim == 2:
        return mask
    if mask.ndim == 4:
        return mask[b % mask.shape[0], h % mask.shape[1]]
    return mask[b % mask.shape[0]]


def self_attention(k: Kernel, x: np.ndarray, heads: int, qkv_weight: np.ndarray, qkv_bias: np.ndarray,
                   proj_weight: np.ndarray, proj_bias: np.ndarray, mask: np.ndarray | None,
                   mask_type: int | None) -> np.ndarray:
    """Multi-head self-attention of ``x`` [B, L, E] into a new [B, L, E] array."""
    batch, length, embed = x.shape
    head_dim = embed // heads
    qkv = linear(k, x.reshape(batch * length, embed), qkv_weight, qkv_bias)
    qkv = qkv.reshape(batch, length, 3, heads, head_dim)
    attended = _scratch((batch, length, embed), x)
    for b in range(batch):
        for h in range(heads):
            q, key, value = (qkv[b, :, i, h, :] for i in range(3))
            scores = matmul_2d(k, q, key.T, _scratch((length, length), x),
                               _epilogue(None, math.sqrt(head_dim)))
            scores = _masked_scores(k, scores, _head_mask(mask, mask_type, b, h))
            weights = softmax_rows(k, scores, 1, _scratch(scores.shape, x), log=False, safe=True)
            matmul_2d(k, weights, value, attended[b, :, h * head_dim : (h + 1) * head_dim])
    projected = linear(k, attended.reshape(batch * length, embed), proj_weight, proj_bias)
    return projected.reshape(batch, length, embed)


def _add(k: Kernel, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return binary(k, _spec(a), a, b, "add")


def _layer_norm(k: Kernel, x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    out = _scratch(x.shape, x)
    layer_norm_into(k, x, (x.ndim - 1,), weight, bias, eps, out)
    return out


@tile_kernel(aten._transformer_encoder_layer_fwd.default)
def transformer_encoder_layer(k: Kernel, out: list[OutSpec], src: np.ndarray, embed_dim: int, num_heads: int,
                              qkv_weight: np.ndarray, qkv_bias: np.ndarray, proj_weight: np.ndarray,
                              proj_bias: np.ndarray, use_gelu: bool, norm_first: bool, eps: float,
                              norm_weight_1: np.ndarray, norm_bias_1: np.ndarray, norm_weight_2: np.ndarray,
                              norm_bias_2: np.ndarray, ffn_weight_1: np.ndarray, ffn_bias_1: np.ndarray,
                              ffn_weight_2: np.ndarray, ffn_bias_2: np.ndarray, mask: Any = None,
                              mask_type: Any = None) -> np.ndarray:
    x = src[None] if src.ndim == 2 else src
    batch, length, embed = x.shape

    def attention(v: np.ndarray) -> np.ndarray:
        return self_attention(k, v, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type)

    def feed_forward(v: np.ndarray) -> np.ndarray:
        hidden = linear(k, v.reshape(batch * length, embed), ffn_weight_1, ffn_bias_1)
        hidden = unary(k, _spec(hidden), hidden, "gelu" if use_gelu else "relu")
        return linear(k, hidden, ffn_weight_2, ffn_bias_2).reshape(x.shape)

    result = hbm_empty(out[0])
    if norm_first:
        x = _add(k, x, attention(_layer_norm(k, x, norm_weight_1, norm_bias_1, eps)))
        return _add(k, x, feed_forward(_layer_norm(k, x, norm_weight_2, norm_bias_2, eps))).reshape(result.shape)
    x = _layer_norm(k, _add(k, x, attention(x)), norm_weight_1, norm_bias_1, eps)
    layer_norm_into(k, _add(k, x, feed_forward(x)), (2,), norm_weight_2, norm_bias_2, eps,
                    result.reshape(x.shape))
    return result
