"""Scaled dot-product attention on tpu: what PyTorch sends, and the one op it needs from here.

``F.scaled_dot_product_attention`` is CompositeImplicitAutograd. On a PrivateUse1 device it asks
the C++ ``_fused_sdp_choice_stub`` for a fused backend; that stub can only be filled from C++
(a Python kernel for the ``aten::_fused_sdp_choice`` op is never consulted), so in PyTorch 2.13
the choice is always the math path, ``_scaled_dot_product_attention_math`` — itself
CompositeImplicitAutograd. What reaches the device is therefore::

    mul.Scalar (q and k each scaled by sqrt(scale)), bmm (q k^T, then p v) through matmul's
    views, add.Tensor (float mask) / masked fill (boolean mask or is_causal),
    _safe_softmax (forward), _softmax_backward_data and bmm (backward)

— all lowered natively, so attention runs without fallbacks forward and backward, as XLA
programs per op. ``_safe_softmax`` is attention's softmax: a row whose scores are all ``-inf``
(every key masked) gives zeros instead of NaN. Its gradient is ``_softmax_backward_data`` of
its result, as for ``_softmax``.

The fused ``_scaled_dot_product_fused_attention_overrideable`` hook is not registered: PyTorch
never selects it for a device whose choice stub is empty.

``nn.TransformerEncoderLayer`` in inference (eval mode without autograd, batch_first, an even
head count) skips all of the above and calls its fast path, ``_transformer_encoder_layer_fwd``,
a whole encoder layer in one op; it is lowered here as one program.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from accelkit_backends.tpu.buffers import jax_dtype
from accelkit_backends.tpu.lowering import kernels, lowering

aten = torch.ops.aten


def safe_softmax(x, dim, dtype=None):
    """Softmax over ``dim`` (in float32 for low-precision input); rows entirely ``-inf`` give 0."""
    if dtype is not None:
        x = x.astype(jax_dtype(dtype))
    compute = jnp.float32 if jnp.dtype(x.dtype).itemsize < 4 else x.dtype
    scores = x.astype(compute)
    probabilities = jax.nn.softmax(scores, axis=dim)
    fully_masked = jnp.all(scores == -jnp.inf, axis=dim, keepdims=True)
    return jnp.where(fully_masked, jnp.zeros((), compute), probabilities)


# Registered only if the softmax family has not claimed it (this module is imported after it).
if aten._safe_softmax.default not in kernels:
    lowering(aten._safe_softmax.default)(safe_softmax)


_PRECISION = jax.lax.Precision.HIGHEST  # full float32 matmuls (a TPU's MXU defaults to bf16 passes)


def _linear(x, weight, bias):
    return jnp.matmul(x, weight.T, precision=_PRECISION) + bias


def _layer_norm(x, weight, bias, eps):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * weight + bias


def _self_attention(x, heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type):
    """Multi-head self-attention of ``x`` (B, L, E); ``mask`` as ``MultiheadAttention.merge_masks``
    gives it: type 0 (L, L), 1 (B, L) key padding, 2 (B, H, L, L); boolean True or -inf masks."""
    batch, length, embed = x.shape
    qkv = _linear(x, qkv_weight, qkv_bias).reshape(batch, length, 3, heads, embed // heads)
    q, k, v = (jnp.moveaxis(qkv[:, :, i], 2, 1) for i in range(3))  # (B, H, L, D)
    scores = jnp.matmul(q, jnp.swapaxes(k, -1, -2), precision=_PRECISION) / jnp.sqrt(
        jnp.asarray(embed // heads, x.dtype))
    if mask is not None:
        if mask_type == 1:
            mask = mask[:, None, None, :]
        scores = jnp.where(mask, -jnp.inf, scores) if mask.dtype == jnp.bool_ else scores + mask
    weights = safe_softmax(scores, -1)
    attended = jnp.matmul(weights.astype(v.dtype), v, precision=_PRECISION)
    return _linear(jnp.moveaxis(attended, 1, 2).reshape(batch, length, embed), proj_weight, proj_bias)


@lowering(aten._transformer_encoder_layer_fwd.default)
def transformer_encoder_layer(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                              use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2,
                              norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None,
                              mask_type=None):
    unbatched = src.ndim == 2
    x = src[None] if unbatched else src

    def attention(v):
        return _self_attention(v, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type)

    def feed_forward(v):
        hidden = _linear(v, ffn_weight_1, ffn_bias_1)
        hidden = jax.nn.gelu(hidden, approximate=False) if use_gelu else jax.nn.relu(hidden)
        return _linear(hidden, ffn_weight_2, ffn_bias_2)

    if norm_first:
        x = x + attention(_layer_norm(x, norm_weight_1, norm_bias_1, eps))
        x = x + feed_forward(_layer_norm(x, norm_weight_2, norm_bias_2, eps))
    else:
        x = _layer_norm(x + attention(x), norm_weight_1, norm_bias_1, eps)
        x = _layer_norm(x + feed_forward(x), norm_weight_2, norm_bias_2, eps)
    return x[0] if unbatched else x
