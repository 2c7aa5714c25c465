"""Shape lowerings: concatenation, padding, flips and rolls, triangles and diagonals, the
``*_scatter`` / ``*_copy`` forms of views, the backward ops of views, and range factories.

Factories (``arange``, ``linspace``, ``logspace``, ``eye``) reach the device with a ``device=``
argument and no tensor; their programs are checked against the Meta device. ``arange``'s length
depends on its (possibly float) bounds, so it is computed on the host: one program per length.
``torch.arange(n, device=...)`` arrives as ``arange.default`` (PyTorch's composite would go to
``arange.start_out``), so the three functional overloads are registered; the runtime derives
their ``out=`` overloads (``arange.start_out``, ``linspace.out``, ...), which C++ composites call.
Floating ranges are computed in float32 (TPUs have no float64) where PyTorch's CPU kernel
accumulates in double: results can differ from CPU by an ulp. Integer ``linspace`` and
``logspace`` truncate their bounds first, as CPU does; integer ``linspace`` is exact (see
:func:`_exact_ramp` for where CPU's is not).

Reflection and replication pads gather each padded dim at the input positions PyTorch's kernels
read (negative pads crop); their backward ops are the vjp of that gather.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from accelkit_backends.tpu.buffers import _is_dense_permutation, jax_dtype
from accelkit_backends.tpu.host_steps import Specialised, host_step
from accelkit_backends.tpu.lowering import Lowering, lowering

aten = torch.ops.aten
META = torch.device("meta")


# ---------------------------------------------------------------------------------------------
# cat, flip, roll, repeat, tril/triu
# ---------------------------------------------------------------------------------------------


@lowering(aten.cat.default)
def cat(tensors, dim=0):
    dtype = jnp.result_type(*tensors)
    # PyTorch skips legacy empty 1-D tensors, whatever the other tensors' rank.
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not kept:
        return jnp.zeros((0,), dtype)
    return jnp.concatenate([t.astype(dtype) for t in kept], axis=dim)


@lowering(aten.flip.default)
def flip(x, dims):
    return jnp.flip(x, axis=tuple(dims)) if dims and x.ndim else x


@lowering(aten.roll.default)
def roll(x, shifts, dims=()):
    if not dims:
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), axis=tuple(dims))


@lowering(aten.repeat.default)
def repeat(x, repeats):
    return jnp.tile(x, tuple(repeats)) if repeats else x


@lowering(aten.tril.default)
def tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@lowering(aten.triu.default)
def triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


# ---------------------------------------------------------------------------------------------
# Padding
# ---------------------------------------------------------------------------------------------


@lowering(aten.constant_pad_nd.default)
def constant_pad_nd(x, pad, value=0):
    """``pad`` lists (before, after) pairs from the last dim backwards; negative pads crop."""
    config = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        config[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1], 0)
    return jax.lax.pad(x, jnp.asarray(value).astype(x.dtype), config)


def _source_positions(extent: int, before: int, after: int, mode: str) -> np.ndarray:
    """For each output position along one padded dim, the input position PyTorch reads:
    reflected about the edges (``reflect``) or clamped to them (``edge``). Negative pads crop."""
    positions = np.arange(extent + before + after) - before
    if mode == "edge":
        return np.clip(positions, 0, extent - 1)
    positions = np.abs(positions)
    return (extent - 1) - np.abs((extent - 1) - positions)


def _pad_last_dims(x, padding, mode, dims):
    for j in range(dims):
        axis = x.ndim - dims + j
        before, after = padding[2 * (dims - 1 - j)], padding[2 * (dims - 1 - j) + 1]
        x = jnp.take(x, _source_positions(x.shape[axis], before, after, mode), axis=axis)
    return x


def _pad_lowerings(mode, dims, forward_op, backward_op):
    def forward(x, padding):
        return _pad_last_dims(x, padding, mode, dims)

    def backward(grad_output, x, padding):
        """The vjp of the pad: each input element gathers the gradients of its copies."""
        wide = jnp.float32 if grad_output.dtype in (jnp.bfloat16, jnp.float16) else grad_output.dtype
        _, pullback = jax.vjp(lambda t: _pad_last_dims(t, padding, mode, dims), x.astype(wide))
        return pullback(grad_output.astype(wide))[0]

    forward.__name__ = str(forward_op).split(".")[1]
    backward.__name__ = str(backward_op).split(".")[1]
    lowering(forward_op)(forward)
    lowering(backward_op)(backward)


for _dims in (1, 2, 3):
    _pad_lowerings("reflect", _dims, getattr(aten, f"reflection_pad{_dims}d").default,
                   getattr(aten, f"reflection_pad{_dims}d_backward").default)
    _pad_lowerings("edge", _dims, getattr(aten, f"replication_pad{_dims}d").default,
                   getattr(aten, f"replication_pad{_dims}d_backward").default)


# ---------------------------------------------------------------------------------------------
# Diagonals
# ---------------------------------------------------------------------------------------------


def _diagonal_positions(rows: int, cols: int, offset: int) -> tuple[np.ndarray, np.ndarray]:
    length = max(0, min(rows + min(offset, 0), cols - max(offset, 0)))
    return np.arange(length) - min(offset, 0), np.arange(length) + max(offset, 0)


def _diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    moved = jnp.moveaxis(x, (dim1, dim2), (-2, -1))
    rows, cols = _diagonal_positions(moved.shape[-2], moved.shape[-1], offset)
    moved = moved.at[..., rows, cols].set(src.astype(x.dtype))
    return jnp.moveaxis(moved, (-2, -1), (dim1, dim2))


@lowering(aten.diagonal_copy.default)
def diagonal_copy(x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, dim1, dim2)


@lowering(aten.diagonal_scatter.default)
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    return _diagonal_scatter(x, src, offset, dim1, dim2)


@lowering(aten.diagonal_backward.default)
def diagonal_backward(grad, input_sizes, offset, dim1, dim2):
    return _diagonal_scatter(jnp.zeros(tuple(input_sizes), grad.dtype), grad, offset, dim1, dim2)


@lowering(aten.diag_embed.default)
def diag_embed(x, offset=0, dim1=-2, dim2=-1):
    n = x.shape[-1] + abs(offset)
    out = jnp.zeros(x.shape[:-1] + (n, n), x.dtype)
    rows, cols = _diagonal_positions(n, n, offset)
    out = out.at[..., rows, cols].set(x)
    rank = x.ndim + 1
    return jnp.moveaxis(out, (-2, -1), (dim1 % rank, dim2 % rank))


# ---------------------------------------------------------------------------------------------
# Scatter forms of views, copies of views, backward ops of views
# ---------------------------------------------------------------------------------------------


def _slice_key(shape, dim, start, end, step):
    dim %= len(shape)
    start, end, step = slice(start, end, step).indices(shape[dim])
    return (slice(None),) * dim + (slice(start, end, step),)


@lowering(aten.slice_scatter.default)
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    return x.at[_slice_key(x.shape, dim, start, end, step)].set(src.astype(x.dtype))


@lowering(aten.slice_backward.default)
def slice_backward(grad, input_sizes, dim, start, end, step):
    zeros = jnp.zeros(tuple(input_sizes), grad.dtype)
    return zeros.at[_slice_key(zeros.shape, dim, start, end, step)].set(grad)


def _select_key(ndim, dim, index):
    return (slice(None),) * (dim % ndim) + (index,)


@lowering(aten.select_scatter.default)
def select_scatter(x, src, dim, index):
    return x.at[_select_key(x.ndim, dim, index)].set(src.astype(x.dtype))


@lowering(aten.select_backward.default)
def select_backward(grad, input_sizes, dim, index):
    zeros = jnp.zeros(tuple(input_sizes), grad.dtype)
    return zeros.at[_select_key(zeros.ndim, dim, index)].set(grad)


def _as_strided_scatter(x, src, size, stride, storage_offset=None, order=None):
    """Write ``src`` through ``as_strided(size, stride, offset)`` of ``x``'s clone, whose memory
    is laid out in ``order`` (outermost dim first; PyTorch's clone keeps a dense input's layout)."""
    order = tuple(order) if order is not None else tuple(range(x.ndim))
    laid_out = jnp.transpose(x, order)
    positions = np.full(tuple(size), storage_offset or 0, dtype=np.int64)
    for d, (extent, step) in enumerate(zip(size, stride)):
        positions = positions + (np.arange(extent) * step).reshape((-1,) + (1,) * (len(size) - 1 - d))
    flat = laid_out.reshape(-1).at[positions].set(src.astype(x.dtype))
    return jnp.transpose(flat.reshape(laid_out.shape), np.argsort(order))


_as_strided_scatter_program = Specialised(aten.as_strided_scatter.default, _as_strided_scatter)


@host_step(aten.as_strided_scatter.default, uses=(_as_strided_scatter_program,))
def as_strided_scatter(x, src, size, stride, storage_offset=None):
    order = _is_dense_permutation(x.spec) if hasattr(x, "spec") and x.spec.size else None
    program = _as_strided_scatter_program(order=order)
    return program(x, src, list(size), list(stride), storage_offset)


@lowering(aten.narrow_copy.default)
def narrow_copy(x, dim, start, length):
    dim %= x.ndim
    start %= max(x.shape[dim], 1)
    return jax.lax.slice_in_dim(x, start, start + length, axis=dim)


def _windows(extent, size, step):
    count = (extent - size) // step + 1
    return np.arange(count)[:, None] * step + np.arange(size)[None, :]


@lowering(aten.unfold_copy.default)
def unfold_copy(x, dimension, size, step):
    if x.ndim == 0:
        return x.reshape(1)
    dimension %= x.ndim
    windows = jnp.take(x, _windows(x.shape[dimension], size, step), axis=dimension)
    return jnp.moveaxis(windows, dimension + 1, -1)


@lowering(aten.unfold_backward.default)
def unfold_backward(grad_in, input_sizes, dim, size, step):
    if not input_sizes:
        return grad_in.reshape(())
    dim %= len(input_sizes)
    grad = jnp.moveaxis(grad_in, -1, dim + 1)
    zeros = jnp.zeros(tuple(input_sizes), grad_in.dtype)
    return zeros.at[(slice(None),) * dim + (_windows(input_sizes[dim], size, step),)].add(grad)


@lowering(aten.expand_copy.default)
def expand_copy(x, size, implicit=False):
    lead = len(size) - x.ndim
    shape = [x.shape[d - lead] if s == -1 else s for d, s in enumerate(size)]
    return jnp.broadcast_to(x, tuple(shape))


@lowering(aten.permute_copy.default)
def permute_copy(x, dims):
    return jnp.transpose(x, tuple(dims))


# ---------------------------------------------------------------------------------------------
# Range factories
# ---------------------------------------------------------------------------------------------


def _compute_dtype(dtype: torch.dtype):
    """Floating work happens in float32 (TPUs have no float64) unless float64 was asked for."""
    if dtype in (torch.float64, torch.complex128):
        return jax_dtype(dtype)
    if dtype.is_complex:
        return jnp.complex64
    return jnp.float32


def _arange_exact(start, end, step, dtype=None, device=None):
    count = len(range(start, end, step))
    return start + jnp.arange(count, dtype=jax_dtype(dtype)) * step


def _arange_ramp(start, step, length, dtype=None, device=None):
    """``start + i * step`` for ``i < length``. Registered under linspace's schema
    ``(start, end, steps)``, whose Meta kernel gives the shape from the static ``steps`` alone
    (float bounds are traced, so arange's own Meta kernel could not)."""
    integral = not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)
    compute = jnp.int64 if integral else _compute_dtype(dtype)
    positions = jnp.arange(length, dtype=compute)
    return jnp.asarray(start, compute) + positions * jnp.asarray(step, compute)


_arange_exact_program = Lowering(aten.arange.start_step, _arange_exact)
_arange_ramp_program = Lowering(aten.linspace.default, _arange_ramp)


@host_step(aten.arange.start_step, uses=(_arange_exact_program, _arange_ramp_program))
def arange(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    expected = aten.arange.start_step(start, end, step, dtype=dtype, device=META)
    integral = not (expected.dtype.is_floating_point or expected.dtype.is_complex)
    if integral and all(type(v) is int for v in (start, end, step)):
        return _arange_exact_program(start, end, step, dtype=expected.dtype, device=META)
    if integral and expected.dtype != torch.bool:
        # As the CPU kernel: start and step become integers first (2.1 by -1.0: 2, 1, 0, -1),
        # and the length is what the bounds as given make it.
        start, step = int(start), int(step)
    return _arange_ramp_program(start, step, expected.numel(), dtype=expected.dtype, device=META)


@host_step(aten.arange.default, uses=())  # its programs are counted under arange.start_step
def arange_to(end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return arange(0, end, 1, dtype=dtype)


@host_step(aten.arange.start, uses=())
def arange_from(start, end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return arange(start, end, 1, dtype=dtype)


def _symmetric_ramp(start, end, steps, compute):
    """PyTorch's linspace: the first half counts up from ``start``, the second down from ``end``."""
    start, end = jnp.asarray(start, compute), jnp.asarray(end, compute)
    if steps == 1:
        return start.reshape(1)
    step = (end - start) / (steps - 1)
    i = jnp.arange(steps, dtype=compute)
    return jnp.where(i < steps // 2, start + step * i, end - step * (steps - 1 - i))


def _integral(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def _exact_ramp(start: int, end: int, steps: int):
    """``start + (end - start) * i / (steps - 1)`` truncated toward zero, computed exactly in
    integers. The CPU kernel computes it in double with a vectorised loop that can land just
    off an exact integer and truncate to its neighbour: in 30 of 600 random calls (bounds in
    +-50, up to 120 steps) one element of CPU's differed by one from this exact value. The
    op_db samples all agree."""
    if steps == 1:
        return jnp.full((1,), start, jnp.int64)
    span, d = end - start, steps - 1
    i = jnp.arange(steps, dtype=jnp.int64)
    return jax.lax.div(start * d + span * i, jnp.int64(d))  # integer division rounds toward zero


def _linspace(start, end, steps, dtype=None, layout=None, device=None, pin_memory=None):
    if steps == 0:
        return jnp.zeros((0,), jax_dtype(dtype))
    if _integral(dtype):
        return _exact_ramp(start, end, steps)
    return _symmetric_ramp(start, end, steps, _compute_dtype(dtype))


def _logspace(start, end, steps, base=10.0, dtype=None, layout=None, device=None, pin_memory=None):
    if steps == 0:
        return jnp.zeros((0,), jax_dtype(dtype))
    compute = _compute_dtype(dtype)
    exponents = _symmetric_ramp(start, end, steps, compute)
    if _integral(dtype):
        # The CPU kernel raises a float32 base to the power, in double, and truncates.
        return jnp.trunc(jnp.power(jnp.asarray(jnp.float32(base), compute), exponents))
    return jnp.power(jnp.asarray(base, compute), exponents)


_linspace_program = Lowering(aten.linspace.default, _linspace)
_logspace_program = Lowering(aten.logspace.default, _logspace)


def _factory_dtype(dtype):
    return dtype if dtype is not None else torch.get_default_dtype()


@host_step(aten.linspace.default, uses=(_linspace_program,))
def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = _factory_dtype(dtype)
    if _integral(dtype):
        start, end = _as_integers(start, end)
    return _linspace_program(start, end, steps, dtype=dtype, device=META)


@host_step(aten.logspace.default, uses=(_logspace_program,))
def logspace(start, end, steps, base=10.0, *, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = _factory_dtype(dtype)
    if _integral(dtype):
        start, end = _as_integers(start, end)
    return _logspace_program(start, end, steps, base, dtype=dtype, device=META)


def _as_integers(start, end):
    """As the CPU kernel of an integer dtype: the bounds become integers first (toward zero)."""
    return int(start), int(end)


def _eye(n, m=None, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, n if m is None else m, dtype=jax_dtype(dtype))


_eye_program = Lowering(aten.eye.m, _eye)
_eye_square_program = Lowering(aten.eye.default, _eye)


@host_step(aten.eye.default, uses=(_eye_square_program,))
def eye(n, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _eye_square_program(n, dtype=_factory_dtype(dtype), device=META)


@host_step(aten.eye.m, uses=(_eye_program,))
def eye_rectangular(n, m, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _eye_program(n, m, dtype=_factory_dtype(dtype), device=META)
