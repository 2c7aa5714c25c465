"""Matmul-family lowerings: mm, bmm, addmm, baddbmm, addbmm, mv, addmv, addr, dot, vdot.

``matmul``, ``linear``, ``einsum``, ``outer`` and ``tensordot`` are CompositeImplicitAutograd:
they reach the device as these ops (or as elementwise ``mul`` for ``outer``).

Precision. float32 products use ``Precision.HIGHEST`` so results match PyTorch's CPU float32
matmul to float32 rounding. The cost is on a real TPU: the MXU multiplies bfloat16, so XLA's
DEFAULT precision rounds float32 operands to bfloat16 (8 significant bits; one MXU pass), HIGH
splits them into three bfloat16 passes and HIGHEST into about six — a float32 matmul then costs
several times a bfloat16 one. (On XLA:CPU, where this backend is simulated, the precision flag
changes nothing.) Models that want MXU speed should compute in bfloat16, e.g. under autocast.
bfloat16/float16 products accumulate in float32 (``preferred_element_type``) and the bias/scale
arithmetic is done in float32 before the one rounding to the result dtype, as PyTorch's CPU
kernels do. Integer products stay in their dtype.

``beta == 0`` ignores the input entirely (NaN and inf in it do not propagate), as PyTorch
documents for the ``add*`` ops.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten

HIGHEST = jax.lax.Precision.HIGHEST


def _accumulator(dtype):
    return jnp.float32 if dtype in (jnp.bfloat16, jnp.float16) else dtype


def _einsum(spec, a, b):
    """``jnp.einsum`` at full float32 precision, accumulating low-precision inputs in float32."""
    return jnp.einsum(spec, a, b, precision=HIGHEST, preferred_element_type=_accumulator(a.dtype))


def _scaled_sum(bias, product, beta, alpha):
    """``beta * bias + alpha * product`` in ``product``'s (accumulator) dtype, skipping the bias
    when ``beta`` is 0 — a static 0 while tracing, or a run-time 0.0."""
    if not (isinstance(alpha, int) and alpha == 1):
        product = product * jnp.asarray(alpha, product.dtype)
    if isinstance(beta, bool | int) and beta == 0:
        return product
    bias = bias.astype(product.dtype)
    if isinstance(beta, bool | int):
        return product + (bias if beta == 1 else bias * jnp.asarray(beta, product.dtype))
    scaled = bias * jnp.asarray(beta, product.dtype)
    return product + jnp.where(jnp.asarray(beta) == 0, jnp.zeros((), product.dtype), scaled)


@lowering(aten.mm.default)
def mm(a, b):
    return _einsum("ij,jk->ik", a, b)


@lowering(aten.bmm.default)
def bmm(a, b):
    return _einsum("bij,bjk->bik", a, b)


@lowering(aten.addmm.default)
def addmm(bias, a, b, *, beta=1, alpha=1):
    return _scaled_sum(bias, _einsum("ij,jk->ik", a, b), beta, alpha)


@lowering(aten.baddbmm.default)
def baddbmm(bias, a, b, *, beta=1, alpha=1):
    return _scaled_sum(bias, _einsum("bij,bjk->bik", a, b), beta, alpha)


@lowering(aten.addbmm.default)
def addbmm(bias, a, b, *, beta=1, alpha=1):
    """``bias`` plus the sum over the batch of ``a[i] @ b[i]``, accumulated in one contraction."""
    return _scaled_sum(bias, _einsum("bij,bjk->ik", a, b), beta, alpha)


@lowering(aten.mv.default)
def mv(a, v):
    return _einsum("ij,j->i", a, v)


@lowering(aten.addmv.default)
def addmv(bias, a, v, *, beta=1, alpha=1):
    return _scaled_sum(bias, _einsum("ij,j->i", a, v), beta, alpha)


@lowering(aten.addr.default)
def addr(bias, v1, v2, *, beta=1, alpha=1):
    """``beta * bias + alpha * outer(v1, v2)``, for bfloat16/float16 in float32 rounded once,
    as CPU's kernel does (PyTorch's decomposition, run op by op, rounded the outer product and
    each scaled term to bfloat16: 0.156 for 0.133 on an OpInfo sample). bool is logical: the
    input where ``beta`` is true, or'd with ``v1 and v2`` where ``alpha`` is."""
    if v1.dtype == jnp.bool_:
        product = jnp.logical_and(v1[:, None], v2[None, :]) & jnp.asarray(bool(alpha))
        return product | (bias.astype(jnp.bool_) & jnp.asarray(bool(beta))) if beta else product
    wide = _accumulator(jnp.result_type(v1.dtype, v2.dtype))
    product = v1.astype(wide)[:, None] * v2.astype(wide)[None, :]
    return _scaled_sum(bias, product, beta, alpha)


@lowering(aten.dot.default)
def dot(a, b):
    return _einsum("i,i->", a, b)


@lowering(aten.vdot.default)
def vdot(a, b):
    """``sum(conj(a) * b)``."""
    return _einsum("i,i->", jnp.conj(a) if jnp.iscomplexobj(a) else a, b)
