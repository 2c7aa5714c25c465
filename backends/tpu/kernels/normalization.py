"""Normalization lowerings: batch, layer and group norm, forward and backward.

Statistics are computed in float32 for low-precision inputs (PyTorch's CPU kernels accumulate
in float32 too); the machinery casts results to PyTorch's dtypes. Backward passes use the saved
statistics PyTorch hands them (``save_mean``/``save_invstd``, ``mean``/``rstd``) with the
closed-form gradients, so they agree with the forward the autograd graph recorded.

**Batch norm's running statistics.** ``native_batch_norm`` updates ``running_mean`` and
``running_var`` in place although its schema declares them plain ``Tensor?`` (see
``UNDECLARED_WRITES`` in ``accelkit/_runtime/dispatch/schema.py``). A tpu kernel is functional, so the
runtime's contract for such ops applies: the kernel returns the op's three results followed by
the new running statistics, and the runtime writes those into the arguments. The kernel below
runs the functional op ``_native_batch_norm_legit_functional`` (whose five results are exactly
these) — one XLA program, and PyTorch's Meta kernel still checks its shapes and dtypes.

Which batch-norm ops reach the device in eager mode: ``F.batch_norm`` (training or eval, with or
without running statistics) and ``native_layer_norm``'s CPU-less composite both call
``native_batch_norm``; autograd calls ``native_batch_norm_backward``. The ``_native_batch_norm_legit*``
variants only appear in traced graphs (``torch.export``, AOT autograd); their functional forms
are registered too, since they share this code.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from accelkit_backends.tpu.lowering import kernels, lowering

aten = torch.ops.aten


def _f32(x):
    """``x`` in a dtype at least as precise as float32 (None passes)."""
    if x is None:
        return None
    return x.astype(jnp.float32) if jnp.dtype(x.dtype).itemsize < 4 else x


def _channel_shape(x) -> tuple[int, ...]:
    """Shape that broadcasts a per-channel (dim 1) vector against ``x``."""
    return (1, x.shape[1]) + (1,) * (x.ndim - 2)


def _batch_axes(x) -> tuple[int, ...]:
    return (0,) + tuple(range(2, x.ndim))


# -- batch norm -------------------------------------------------------------------------------


def _affine(xhat, weight, bias, shape):
    if weight is not None:
        xhat = xhat * _f32(weight).reshape(shape)
    if bias is not None:
        xhat = xhat + _f32(bias).reshape(shape)
    return xhat


def _batch_norm_train(x, weight, bias, eps):
    """(output, batch mean, inverse std, biased variance) over all axes but the channel one."""
    xf = _f32(x)
    axes, shape = _batch_axes(x), _channel_shape(x)
    mean = jnp.mean(xf, axis=axes)
    var = jnp.mean(jnp.square(xf - mean.reshape(shape)), axis=axes)
    invstd = jax.lax.rsqrt(var + eps)
    out = _affine((xf - mean.reshape(shape)) * invstd.reshape(shape), weight, bias, shape)
    return out, mean, invstd, var


def _batch_norm_eval(x, weight, bias, running_mean, running_var, eps):
    """(output, running mean, inverse running std): PyTorch's Meta kernels give evaluation
    mode's saved statistics the channel shape (CPU returns empty tensors; nothing reads them)."""
    shape = _channel_shape(x)
    mean = _f32(running_mean)
    invstd = jax.lax.rsqrt(_f32(running_var) + eps)
    out = (_f32(x) - mean.reshape(shape)) * invstd.reshape(shape)
    return _affine(out, weight, bias, shape), mean, invstd


@lowering(aten._native_batch_norm_legit_functional.default)
def batch_norm_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """(output, save_mean, save_invstd, new running_mean, new running_var)."""
    if not training:
        out, mean, invstd = _batch_norm_eval(x, weight, bias, running_mean, running_var, eps)
        return out, mean, invstd, running_mean, running_var
    out, mean, invstd, var = _batch_norm_train(x, weight, bias, eps)
    count = x.size // x.shape[1]
    unbiased = var * (count / max(count - 1, 1)) if count > 1 else jnp.full_like(var, jnp.nan)
    new_mean = _f32(running_mean) * (1 - momentum) + mean * momentum
    new_var = _f32(running_var) * (1 - momentum) + unbiased * momentum
    return out, mean, invstd, new_mean, new_var


@lowering(aten._native_batch_norm_legit.no_stats)
def batch_norm_without_running_stats(x, weight, bias, training, momentum, eps):
    out, mean, invstd, _ = _batch_norm_train(x, weight, bias, eps)
    return out, mean, invstd


@lowering(aten._native_batch_norm_legit_no_training.default)
def batch_norm_inference(x, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm_eval(x, weight, bias, running_mean, running_var, eps)


class _BatchNormUpdatingRunningStats:
    """``native_batch_norm``'s kernel: its three results, then the new running statistics
    (None when there are none), which the runtime stores (``UNDECLARED_WRITES``)."""

    compiles = 0  # its programs are those of the two lowerings it calls, counted there
    fusable = True  # in fused mode the lowerings it calls are recorded

    def __call__(self, x, weight, bias, running_mean, running_var, training, momentum, eps):
        if running_mean is None and running_var is None:
            if not training:
                raise RuntimeError("running_mean and running_var must be defined in evaluation mode")
            return (*batch_norm_without_running_stats_kernel(x, weight, bias, training, momentum, eps),
                    None, None)
        out, mean, invstd, new_mean, new_var = batch_norm_functional_kernel(
            x, weight, bias, running_mean, running_var, training, momentum, eps
        )
        if not training:
            # Eval mode leaves the running statistics alone, and saves no statistics: PyTorch's
            # CPU kernel returns empty ones here (its Meta kernel says channel-shaped).
            new_mean = new_var = None
            mean, invstd = jnp.zeros((0,), mean.dtype), jnp.zeros((0,), invstd.dtype)
        return out, mean, invstd, new_mean, new_var


batch_norm_functional_kernel = kernels.get(aten._native_batch_norm_legit_functional.default).fn
batch_norm_without_running_stats_kernel = kernels.get(aten._native_batch_norm_legit.no_stats).fn
kernels.add(aten.native_batch_norm.default, _BatchNormUpdatingRunningStats())


@lowering(aten.native_batch_norm_backward.default)
def batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
                        output_mask):
    gf, xf = _f32(grad), _f32(x)
    axes, shape = _batch_axes(x), _channel_shape(x)
    if train:
        mean, invstd = _f32(save_mean), _f32(save_invstd)
    else:
        mean, invstd = _f32(running_mean), jax.lax.rsqrt(_f32(running_var) + eps)
    xhat = (xf - mean.reshape(shape)) * invstd.reshape(shape)
    grad_bias = jnp.sum(gf, axis=axes)
    grad_weight = jnp.sum(gf * xhat, axis=axes)
    scale = invstd if weight is None else invstd * _f32(weight)
    grad_input = None
    if output_mask[0]:
        if train:
            count = x.size // x.shape[1]
            grad_input = (gf - (grad_bias.reshape(shape) + xhat * grad_weight.reshape(shape)) / count)
            grad_input = grad_input * scale.reshape(shape)
        else:
            grad_input = gf * scale.reshape(shape)
    return (
        grad_input,
        grad_weight if output_mask[1] else None,
        grad_bias if output_mask[2] else None,
    )


# -- layer norm -------------------------------------------------------------------------------


def _layer_axes(x, normalized_shape) -> tuple[int, ...]:
    return tuple(range(x.ndim - len(normalized_shape), x.ndim))


@lowering(aten.native_layer_norm.default, own_dtypes=True)
def layer_norm(x, normalized_shape, weight, bias, eps):
    """(output, mean, rstd); the statistics keep the normalized dimensions as size 1.

    The output has ``x``'s dtype. CPU keeps the statistics of a bfloat16/float16 ``x`` in its
    dtype, or in float32 when the weight or bias is float32; the Meta kernel says float32
    always, so this lowering decides (``own_dtypes``). All of it is computed in float32.
    """
    mixed = any(p is not None and p.dtype == jnp.float32 for p in (weight, bias))
    statistics = jnp.float32 if mixed and jnp.dtype(x.dtype).itemsize < 4 else x.dtype
    xf = _f32(x)
    axes = _layer_axes(x, normalized_shape)
    mean = jnp.mean(xf, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=axes, keepdims=True)
    rstd = jax.lax.rsqrt(var + eps)
    out = (xf - mean) * rstd
    if weight is not None:
        out = out * _f32(weight)
    if bias is not None:
        out = out + _f32(bias)
    return out.astype(x.dtype), mean.astype(statistics), rstd.astype(statistics)


@lowering(aten.native_layer_norm_backward.default)
def layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    gf, xf = _f32(grad), _f32(x)
    axes = _layer_axes(x, normalized_shape)
    batch = tuple(range(x.ndim - len(normalized_shape)))
    xhat = (xf - _f32(mean)) * _f32(rstd)
    grad_xhat = gf if weight is None else gf * _f32(weight)
    grad_input = None
    if output_mask[0]:
        size = math.prod(normalized_shape)
        grad_input = _f32(rstd) * (
            grad_xhat
            - jnp.sum(grad_xhat, axis=axes, keepdims=True) / size
            - xhat * jnp.sum(grad_xhat * xhat, axis=axes, keepdims=True) / size
        )
    grad_weight = jnp.sum(gf * xhat, axis=batch) if output_mask[1] and weight is not None else None
    grad_bias = jnp.sum(gf, axis=batch) if output_mask[2] and bias is not None else None
    return grad_input, grad_weight, grad_bias


# -- group norm -------------------------------------------------------------------------------


@lowering(aten.native_group_norm.default)
def group_norm(x, weight, bias, N, C, HxW, group, eps):
    """(output, mean (N, group), rstd (N, group))."""
    # Explicit sizes: with N == 0 a -1 in the reshape would be ambiguous.
    grouped = _f32(x).reshape(N, group, (C // group) * HxW)
    mean = jnp.mean(grouped, axis=2, keepdims=True)
    if not grouped.shape[2]:
        mean = jnp.zeros_like(mean)  # PyTorch's mean of an empty group is 0 (its rstd is NaN)
    var = jnp.mean(jnp.square(grouped - mean), axis=2, keepdims=True)
    rstd = jax.lax.rsqrt(var + eps)
    out = ((grouped - mean) * rstd).reshape(N, C, HxW)
    if weight is not None:
        out = out * _f32(weight)[:, None]
    if bias is not None:
        out = out + _f32(bias)[:, None]
    return out.reshape(x.shape), mean[:, :, 0], rstd[:, :, 0]


@lowering(aten.native_group_norm_backward.default)
def group_norm_backward(grad, x, mean, rstd, weight, N, C, HxW, group, output_mask):
    gf = _f32(grad).reshape(N, group, C // group, HxW)
    xf = _f32(x).reshape(N, group, C // group, HxW)
    mean4 = _f32(mean)[:, :, None, None]
    rstd4 = _f32(rstd)[:, :, None, None]
    xhat = (xf - mean4) * rstd4
    grad_xhat = gf if weight is None else gf * _f32(weight).reshape(1, group, C // group, 1)
    grad_input = None
    if output_mask[0]:
        size = (C // group) * gf.shape[-1]
        grad_input = rstd4 * (
            grad_xhat
            - jnp.sum(grad_xhat, axis=(2, 3), keepdims=True) / size
            - xhat * jnp.sum(grad_xhat * xhat, axis=(2, 3), keepdims=True) / size
        )
        grad_input = grad_input.reshape(x.shape)
    grad_weight = jnp.sum(gf * xhat, axis=(0, 3)).reshape(C) if output_mask[1] else None
    grad_bias = jnp.sum(gf, axis=(0, 3)).reshape(C) if output_mask[2] else None
    return grad_input, grad_weight, grad_bias
