"""Lowerings, for compiled graphs only, of the ops the accelkit runtime owns in eager mode.

Eagerly, views, factories and copies never reach a tpu kernel: the runtime handles them as
geometry over device memory (a view is a new stride over the same storage). Inside one XLA
program there is no storage, only values, so a compiled graph needs them as JAX functions:

- **views** become the values they read: the common ones as reshapes, transposes, slices and
  broadcasts; any other view op (``as_strided``, ``diagonal``, ``unfold``, ...) through the
  element indices PyTorch's own view of an index tensor gives, so every view op compiles;
- **factories** (``empty``, ``full``, ``scalar_tensor``, ``rand``/``randn``) build their value;
  ``empty`` is zeros, as eager tpu memory is;
- **copies** (``clone``, ``_to_copy`` within the device, functional ``copy``) are casts.

Each function takes the FX node first: its ``meta["val"]`` gives PyTorch's result dtype. Shapes
come from the arguments, never from ``meta["val"]``: in a graph with symbolic sizes
(``dynamic=True``) the fake value's sizes are symbols, and the program is traced once per
concrete shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from accelkit_backends.tpu.buffers import jax_dtype

aten = torch.ops.aten

GRAPH_OPS: dict[Any, Callable[..., Any]] = {}


def graph_op(*ops: Any) -> Callable:
    def register(fn: Callable) -> Callable:
        for op in ops:
            GRAPH_OPS[op] = fn
        return fn

    return register


def _dtype(node: Any) -> Any:
    return jax_dtype(node.meta["val"].dtype)


# ---------------------------------------------------------------------------------------------
# Views
# ---------------------------------------------------------------------------------------------


@graph_op(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default)
def reshaped(node, x, size):
    return x.reshape(tuple(size))


@graph_op(aten.unsqueeze.default)
def unsqueeze(node, x, dim):
    return jnp.expand_dims(x, dim % (x.ndim + 1))


@graph_op(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def squeeze(node, x, dim=None):
    if x.ndim == 0:
        return x
    dims = range(x.ndim) if dim is None else [dim] if isinstance(dim, int) else dim
    drop = tuple(sorted({d % x.ndim for d in dims if x.shape[d % x.ndim] == 1}))
    return jnp.squeeze(x, drop) if drop else x


@graph_op(aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default, aten.clone.default,
          aten.lift_fresh.default)
def same(node, x, *args, **kwargs):
    return x


@graph_op(aten.permute.default)
def permute(node, x, dims):
    return jnp.transpose(x, [d % max(x.ndim, 1) for d in dims]) if x.ndim else x


@graph_op(aten.t.default)
def t(node, x):
    return x.T if x.ndim == 2 else x


@graph_op(aten.transpose.int)
def transpose(node, x, dim0, dim1):
    if x.ndim == 0:
        return x
    return jnp.swapaxes(x, dim0 % x.ndim, dim1 % x.ndim)


@graph_op(aten.expand.default)
def expand(node, x, size, *, implicit=False):
    lead = len(size) - x.ndim
    shape = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(size))
    return jnp.broadcast_to(x, shape)


def _slice_bounds(n: int, start: Any, end: Any) -> tuple[int, int]:
    start = 0 if start is None else start
    end = n if end is None else end
    start = start + n if start < 0 else start
    end = end + n if end < 0 else end
    start = min(max(start, 0), n)
    end = min(max(end, start), n)
    return start, end


@graph_op(aten.slice.Tensor)
def slice_(node, x, dim=0, start=None, end=None, step=1):
    dim %= x.ndim
    start, end = _slice_bounds(x.shape[dim], start, end)
    return jax.lax.slice_in_dim(x, start, end, step, axis=dim)


@graph_op(aten.select.int)
def select(node, x, dim, index):
    dim %= x.ndim
    return jax.lax.index_in_dim(x, index % x.shape[dim], dim, keepdims=False)


@graph_op(aten.unbind.int)
def unbind(node, x, dim=0):
    dim %= x.ndim
    return [jax.lax.index_in_dim(x, i, dim, keepdims=False) for i in range(x.shape[dim])]


@graph_op(aten.split.Tensor, aten.split_with_sizes.default)
def split(node, x, sizes, dim=0):
    dim %= x.ndim
    n = x.shape[dim]
    if isinstance(sizes, int):
        sizes = [min(sizes, n - s) for s in range(0, n, sizes)] if n else [0]
    pieces, start = [], 0
    for size in sizes:
        pieces.append(jax.lax.slice_in_dim(x, start, start + size, axis=dim))
        start += size
    return pieces


@graph_op(aten.view_as_complex.default)
def view_as_complex(node, x):
    """Pairs of the last dimension as (real, imaginary) parts."""
    return jax.lax.complex(x[..., 0], x[..., 1])


@graph_op(aten.view_as_real.default)
def view_as_real(node, x):
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


@graph_op(aten._conj.default)
def conj(node, x):
    """The conjugate view, materialised (values in a program have no conjugate bit)."""
    return jnp.conj(x)


@graph_op(aten.view.dtype)
def view_dtype(node, x, dtype):
    """The same bytes as another dtype (``x.view(torch.int32)``): XLA's bitcast. As in PyTorch, a
    narrower dtype splits each element of the last dimension into several, a wider one joins
    several into one. (An index-tensor view would pick elements, not reinterpret them.)"""
    target = _dtype(node)
    if x.dtype == target:
        return x
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    carrier = jnp.dtype(jnp.uint8) if target == jnp.bool_ else target
    ratio = jnp.dtype(x.dtype).itemsize / jnp.dtype(carrier).itemsize
    if ratio > 1:  # narrower: XLA adds a trailing dimension of the pieces
        out = jax.lax.bitcast_convert_type(x, carrier)
        out = out.reshape(*x.shape[:-1], x.shape[-1] * int(ratio))
    elif ratio < 1:  # wider: XLA consumes a trailing dimension of the pieces
        joined = int(round(1 / ratio))
        out = jax.lax.bitcast_convert_type(x.reshape(*x.shape[:-1], x.shape[-1] // joined, joined), carrier)
    else:
        out = jax.lax.bitcast_convert_type(x, carrier)
    return out != 0 if target == jnp.bool_ else out


def indexed_view(node, x, *args, **kwargs):
    """Any view op: the elements PyTorch's own view of an index tensor picks (traced gather
    with indices fixed at trace time)."""
    index = torch.arange(int(np.prod(x.shape)) if x.shape else 1, dtype=torch.int64).reshape(x.shape)
    picked = node.target(index, *args, **kwargs)
    flat = x.reshape(-1)
    if isinstance(picked, torch.Tensor):
        return flat[jnp.asarray(picked.contiguous().numpy())]
    return [flat[jnp.asarray(p.contiguous().numpy())] for p in picked]


def is_view(op: Any) -> bool:
    """An op returning an alias of its first argument that writes nothing."""
    schema = op._schema
    if not schema.returns or not schema.arguments:
        return False
    first = schema.arguments[0].alias_info
    out = schema.returns[0].alias_info
    return first is not None and out is not None and not first.is_write and not out.is_write


# ---------------------------------------------------------------------------------------------
# Factories and copies
# ---------------------------------------------------------------------------------------------


_SIZED = frozenset({aten.empty.memory_format, aten.empty_strided.default, aten.zeros.default,
                    aten.ones.default, aten.full.default, aten.rand.default, aten.rand.generator,
                    aten.randn.default, aten.randn.generator})
_NEW = frozenset({aten.new_empty.default, aten.new_empty_strided.default, aten.new_zeros.default,
                  aten.new_ones.default, aten.new_full.default})


def _factory_shape(node: Any, args: tuple) -> tuple[int, ...]:
    """The result shape of a factory: its ``size`` argument, or its model tensor's shape."""
    if node.target in _SIZED:
        return tuple(args[0])
    if node.target in _NEW:
        return tuple(args[1])
    return tuple(args[0].shape)  # the *_like ops


@graph_op(aten.empty.memory_format, aten.empty_strided.default, aten.new_empty.default,
          aten.new_empty_strided.default, aten.empty_like.default, aten.zeros.default,
          aten.new_zeros.default, aten.zeros_like.default)
def zeros(node, *args, **kwargs):
    return jnp.zeros(_factory_shape(node, args), _dtype(node))


@graph_op(aten.ones.default, aten.new_ones.default, aten.ones_like.default)
def ones(node, *args, **kwargs):
    return jnp.ones(_factory_shape(node, args), _dtype(node))


@graph_op(aten.full.default)
def full(node, size, fill_value, **kwargs):
    return jnp.full(tuple(size), fill_value, _dtype(node))


@graph_op(aten.new_full.default, aten.full_like.default)
def full_like(node, x, *args, **kwargs):
    fill_value = args[1] if node.target is aten.new_full.default else args[0]
    return jnp.full(_factory_shape(node, (x, *args)), fill_value, _dtype(node))


@graph_op(aten.scalar_tensor.default)
def scalar_tensor(node, value, **kwargs):
    return jnp.asarray(value, _dtype(node))


@graph_op(aten._to_copy.default)
def to_copy(node, x, **kwargs):
    return jnp.asarray(x).astype(_dtype(node))


@graph_op(aten.copy.default)
def copy(node, x, src, non_blocking=False):
    return jnp.broadcast_to(jnp.asarray(src).astype(_dtype(node)), x.shape)


@graph_op(aten.rand.default, aten.rand.generator, aten.rand_like.default)
def rand(node, *args, generator=None, **kwargs):
    """Eagerly ``rand`` is ``empty`` then ``uniform_``: the same uniform lowering here."""
    from accelkit_backends.tpu.kernels.random import uniform

    return uniform(jnp.zeros(_factory_shape(node, args), _dtype(node)), generator=generator).astype(_dtype(node))


@graph_op(aten.randn.default, aten.randn.generator, aten.randn_like.default)
def randn(node, *args, generator=None, **kwargs):
    """Eagerly ``randn`` is ``empty`` then ``normal_``: the same normal lowering here."""
    from accelkit_backends.tpu.kernels.random import normal

    return normal(jnp.zeros(_factory_shape(node, args), _dtype(node)), generator=generator).astype(_dtype(node))


#: Graph ops that draw random numbers: they receive the node's key as ``generator``.
RANDOM = frozenset({aten.rand.default, aten.rand.generator, aten.rand_like.default,
                    aten.randn.default, aten.randn.generator, aten.randn_like.default})


# ---------------------------------------------------------------------------------------------
# Ops eager code reaches through a PrivateUse1 routing overload
# ---------------------------------------------------------------------------------------------


@graph_op(aten.convolution.default)
def convolution(node, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """Eagerly ``convolution`` reaches tpu as ``convolution_overrideable``; same lowering."""
    from accelkit_backends.tpu.kernels.conv import convolution as lowered

    return lowered(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups)


@graph_op(aten.convolution_backward.default)
def convolution_backward(node, grad, x, weight, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    from accelkit_backends.tpu.kernels.conv import convolution_backward as lowered

    return lowered(grad, x, weight, stride, padding, dilation, transposed, output_padding, groups, output_mask)


@graph_op(aten.index.Tensor)
def index(node, x, indices):
    """Integer indexing: the eager kernel's own program. (A boolean index has a data-dependent
    shape, which Dynamo does not capture into a graph by default.)"""
    from accelkit_backends.tpu.kernels.indexing import _index

    if any(i is not None and i.dtype in (jnp.bool_, jnp.uint8) for i in indices):
        raise NotImplementedError("tpu graphs: a boolean index has a data-dependent shape")
    return _index(x, indices)


@graph_op(aten.arange.default, aten.arange.start, aten.arange.start_step, aten.linspace.default,
          aten.logspace.default, aten.eye.default, aten.eye.m)
def constant_factory(node, *args, **kwargs):
    """A factory of Python numbers only: its values are fixed when the program is traced, so
    they are computed there by PyTorch's CPU kernel (exactly CPU's values) and become a
    constant of the program."""
    kwargs = {**kwargs, "device": "cpu"}
    kwargs.pop("pin_memory", None)
    values = node.target(*args, **kwargs)
    if values.dtype == torch.bfloat16:
        return jnp.asarray(values.float().numpy()).astype(jnp.bfloat16)
    return jnp.asarray(values.numpy())
