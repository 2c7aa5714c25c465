"""FFT lowerings: ``_fft_r2c``, ``_fft_c2c`` and ``_fft_c2r``, the three ops every ``torch.fft``
function (fft, ifft, rfft, irfft, hfft, ihfft and their 2-d/n-d forms) reaches the device as.

PyTorch resolves ``norm=`` before these ops: their ``normalization`` is an integer scale mode
(0: none, 1: divide by sqrt(n), 2: divide by n, n the product of the signal sizes along ``dim``)
that applies whatever the direction. So every transform here is computed unscaled
(``jnp.fft``'s inverse with ``norm="forward"`` is the unscaled inverse) and then scaled once.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch

from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten

_NONE, _BY_ROOT_N, _BY_N = 0, 1, 2


def _scaled(x, signal_size: int, normalization: int):
    """``x`` divided as ``normalization`` says, for a transform over ``signal_size`` points."""
    if normalization == _NONE or signal_size == 0:
        return x
    divisor = math.sqrt(signal_size) if normalization == _BY_ROOT_N else signal_size
    return x * jnp.asarray(1.0 / divisor, dtype=x.real.dtype)


def _complex(x):
    """Real inputs as complex64 (complex128 if float64); complex inputs unchanged."""
    if jnp.iscomplexobj(x):
        return x
    return x.astype(jnp.complex128 if x.dtype == jnp.float64 else jnp.complex64)


@lowering(aten._fft_r2c.default)
def fft_r2c(x, dim, normalization, onesided):
    """The forward transform of real ``x`` over ``dim``; with ``onesided`` only the first
    ``n // 2 + 1`` frequencies of the last of ``dim`` (the rest are their conjugates)."""
    dim = list(dim)
    x = x.astype(jnp.float32) if x.dtype not in (jnp.float32, jnp.float64) else x
    out = jnp.fft.rfftn(x, axes=dim) if onesided else jnp.fft.fftn(_complex(x), axes=dim)
    return _scaled(out, math.prod(x.shape[d] for d in dim), normalization)


@lowering(aten._fft_c2c.default)
def fft_c2c(x, dim, normalization, forward):
    """The forward (``forward``) or inverse transform of complex ``x`` over ``dim``, unscaled
    before ``normalization``."""
    dim = list(dim)
    x = _complex(x)
    out = jnp.fft.fftn(x, axes=dim) if forward else jnp.fft.ifftn(x, axes=dim, norm="forward")
    return _scaled(out, math.prod(x.shape[d] for d in dim), normalization)


@lowering(aten._fft_c2r.default)
def fft_c2r(x, dim, normalization, last_dim_size):
    """The inverse of a onesided ``_fft_r2c``: real output whose last ``dim`` has
    ``last_dim_size`` points, from the first ``last_dim_size // 2 + 1`` frequencies of ``x``."""
    dim = list(dim)
    sizes = [x.shape[d] for d in dim[:-1]] + [last_dim_size]
    out = jnp.fft.irfftn(_complex(x), s=sizes, axes=dim, norm="forward")
    return _scaled(out, math.prod(sizes), normalization)
