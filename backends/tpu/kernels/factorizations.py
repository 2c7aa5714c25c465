"""Matrix factorizations and solvers: LU (factor, unpack, solve, det, slogdet, inverse, solve_ex),
Cholesky, QR (with Householder products and ormqr), SVD, least squares, symmetric eigendecomposition,
triangular solves, matrix exponential.

Conventions kept from PyTorch's CPU (LAPACK) kernels:

- LU pivots are LAPACK's: int32, 1-based row swaps (``lax.linalg.lu`` gives them 0-based);
- ``info`` is LAPACK's: 0, or the 1-based index of the first zero pivot of U (LU) or of the first
  leading minor that is not positive-definite (Cholesky; found by unpivoted elimination, since
  XLA's Cholesky only turns the whole factor into NaN); ``check_errors=True`` raises PyTorch's own error after reading ``info``;
- ``_linalg_det`` and ``_linalg_slogdet`` factor ``A^T`` instead of ``A`` when ``A`` is
  contiguous and real, as PyTorch 2.13's CPU kernels do (``_linalg_solve_ex`` always factors
  ``A``): their ``LU``/``pivots`` outputs feed the backward formulas, which assume exactly that
  choice (:class:`_LinalgLowering`);
- outputs PyTorch leaves empty (``U``/``Vh`` without ``compute_uv``, ``Q`` for ``mode="r"``) are
  empty arrays of the Meta kernel's shape.

SVD, QR and eigenvectors are unique only up to signs (phases); on XLA:CPU they come from the same
LAPACK routines as PyTorch's and agree, on a TPU they may differ by those signs.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import torch

from accelkit.sdk import meta_tensor
from accelkit_backends.tpu.lowering import Lowering, kernels, lowering

aten = torch.ops.aten
lax_linalg = jax.lax.linalg


# ---------------------------------------------------------------------------------------------
# Helpers (traced)
# ---------------------------------------------------------------------------------------------


def _mT(x):
    return jnp.swapaxes(x, -1, -2)


def _mH(x):
    return jnp.conj(_mT(x)) if jnp.iscomplexobj(x) else _mT(x)


def _empty(dtype):
    return jnp.zeros((0,), dtype)


def _lu(a):
    """``(LU, 0-based pivots, permutation)`` of ``a`` with partial pivoting: ``a[perm] = L U``."""
    return lax_linalg.lu(a)


def _first_true(flags):
    """1 + the index of the first true flag along the last axis, 0 if none (LAPACK's ``info``)."""
    if flags.shape[-1] == 0:
        return jnp.zeros(flags.shape[:-1], jnp.int32)
    return jnp.where(flags.any(-1), jnp.argmax(flags, -1) + 1, 0).astype(jnp.int32)


def _lu_info(lu):
    """LAPACK getrf's info: 1 + the index of the first exact zero on U's diagonal, else 0."""
    return _first_true(jnp.diagonal(lu, axis1=-2, axis2=-1) == 0)


def _permutation(pivots, m):
    """The row permutation of 1-based LAPACK ``pivots`` (swaps) over ``m`` rows."""
    return lax_linalg.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, m)


def _broadcast_batch(*arrays_and_cores):
    """Broadcast each array's batch dimensions (all but its last ``core`` dims) to a common batch."""
    batch = jnp.broadcast_shapes(*[a.shape[: a.ndim - core] for a, core in arrays_and_cores])
    return [jnp.broadcast_to(a, batch + a.shape[a.ndim - core:]) for a, core in arrays_and_cores]


def _lu_solve(lu, perm, b, left=True, adjoint=False):
    """``X`` with ``op(A) X = b`` (``left``) or ``X op(A) = b``, where ``A[perm] = L U`` and
    ``op`` is the conjugate transpose when ``adjoint``."""
    if not left:
        return _mH(_lu_solve(lu, perm, _mH(b), True, not adjoint))
    lu, perm, b = _broadcast_batch((lu, 2), (perm, 1), (b, 2))
    if not adjoint:
        rows = jnp.take_along_axis(b, perm[..., :, None], axis=-2)
        y = lax_linalg.triangular_solve(lu, rows, left_side=True, lower=True, unit_diagonal=True)
        return lax_linalg.triangular_solve(lu, y, left_side=True, lower=False)
    # A^H = U^H L^H P^T: solve with U^H, then L^H, then undo the row permutation.
    conj = jnp.iscomplexobj(lu)
    z = lax_linalg.triangular_solve(lu, b, left_side=True, lower=False, transpose_a=True, conjugate_a=conj)
    w = lax_linalg.triangular_solve(lu, z, left_side=True, lower=True, transpose_a=True, conjugate_a=conj,
                                    unit_diagonal=True)
    return jnp.take_along_axis(w, jnp.argsort(perm, axis=-1)[..., :, None], axis=-2)


def _is_vector_rhs(a, b):
    """PyTorch's rule: ``b`` is a (batch of) vector(s), not matrices."""
    return b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])


def _permutation_sign(pivots0):
    """+1 or -1: the parity of the row swaps in 0-based ``pivots0``."""
    swaps = (pivots0 != jnp.arange(pivots0.shape[-1], dtype=pivots0.dtype)).sum(-1)
    return 1 - 2 * (swaps % 2)


# ---------------------------------------------------------------------------------------------
# Lowerings whose outputs depend on the input's layout or that raise on bad input
# ---------------------------------------------------------------------------------------------


def _contiguous_real(view) -> bool:
    spec = view.spec
    return meta_tensor(spec.size, spec.dtype, spec.stride).is_contiguous() and not spec.dtype.is_complex


class _LinalgLowering(Lowering):
    """A lowering with two PyTorch behaviours the plain machinery lacks.

    - ``layout_aware``: ``fn`` takes ``factor_transpose``; PyTorch factors ``A^T`` when ``A`` is
      contiguous and real, and its backward formulas rely on which one it factored, so there are
      two programs and the input's layout picks one.
    - ``api_name``: an ``*_ex`` op whose last output is ``info``; with ``check_errors=True`` a
      nonzero ``info`` is read back and raises PyTorch's own error.
    """

    def __init__(self, op, fn, *, layout_aware=False, api_name=None):
        self._transposed = Lowering(op, functools.partial(fn, factor_transpose=True)) if layout_aware else None
        super().__init__(op, functools.partial(fn, factor_transpose=False) if layout_aware else fn)
        self._api_name = api_name

    @property
    def compiles(self) -> int:
        return self._own_compiles + (self._transposed.compiles if self._transposed else 0)

    @compiles.setter
    def compiles(self, value: int) -> None:
        self._own_compiles = value - (self._transposed.compiles if self._transposed else 0)

    def __call__(self, a, *args, **kwargs):
        if self._transposed is not None and _contiguous_real(a):
            out = self._transposed(a, *args, **kwargs)
        else:
            out = super().__call__(a, *args, **kwargs)
        if self._api_name and kwargs.get("check_errors", False):
            info = torch.from_numpy(np.asarray(out[-1]))
            aten._linalg_check_errors(info, self._api_name, is_matrix=len(a.spec.size) == 2)
        return out


def _register(op, fn, **options):
    kernels.add(op, _LinalgLowering(op, fn, **options))


# ---------------------------------------------------------------------------------------------
# LU family
# ---------------------------------------------------------------------------------------------


def lu_factor_ex(a, *, pivot=True, check_errors=False):
    """``(LU, 1-based pivots, info)``; only partial pivoting, like PyTorch's CPU kernel."""
    if not pivot:
        raise RuntimeError("linalg.lu_factor: LU without pivoting is not implemented on the tpu")
    lu, pivots, _ = _lu(a)
    return lu, pivots + 1, _lu_info(lu)


_register(aten.linalg_lu_factor_ex.default, lu_factor_ex, api_name="torch.linalg.lu_factor_ex")


def _unpack(lu, perm, m, n):
    """``(P, L, U)`` of an ``m x n`` LU: ``A = P L U``, ``L`` unit lower ``m x k``, ``U`` ``k x n``."""
    k = min(m, n)
    lower = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    upper = jnp.triu(lu[..., :k, :])
    p = (jnp.arange(m)[:, None] == perm[..., None, :]).astype(lu.dtype)
    return p, lower, upper


@lowering(aten.linalg_lu.default)
def linalg_lu(a, *, pivot=True):
    if not pivot:
        raise RuntimeError("linalg.lu: LU without pivoting is not implemented on the tpu")
    lu, _, perm = _lu(a)
    return _unpack(lu, perm, a.shape[-2], a.shape[-1])


@lowering(aten.lu_unpack.default)
def lu_unpack(lu, pivots, unpack_data=True, unpack_pivots=True):
    m, n = lu.shape[-2], lu.shape[-1]
    p, lower, upper = _unpack(lu, _permutation(pivots, m), m, n)
    if not unpack_data:
        lower, upper = _empty(lu.dtype), _empty(lu.dtype)
    if not unpack_pivots:
        p = _empty(lu.dtype)
    return p, lower, upper


@lowering(aten.linalg_lu_solve.default)
def linalg_lu_solve(lu, pivots, b, *, left=True, adjoint=False):
    return _lu_solve(lu, _permutation(pivots, lu.shape[-1]), b, left, adjoint)


def solve_ex(a, b, *, left=True, check_errors=False):
    """``(X, LU, pivots, info)`` for ``A X = B`` (``left``) or ``X A = B``, ``LU`` of ``A``."""
    lu, pivots, perm = _lu(a)
    vector = _is_vector_rhs(a, b)
    rhs = b[..., None] if vector else b
    x = _lu_solve(lu, perm, rhs, left)
    return (x[..., 0] if vector else x), lu, pivots + 1, _lu_info(lu)


_register(aten._linalg_solve_ex.default, solve_ex, api_name="torch.linalg.solve_ex")


def inv_ex(a, *, check_errors=False):
    """``(A^-1, info)`` through LU."""
    lu, _, perm = _lu(a)
    eye = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    return _lu_solve(lu, perm, eye), _lu_info(lu)


_register(aten.linalg_inv_ex.default, inv_ex, api_name="torch.linalg.inv_ex")


def det(a, *, factor_transpose=False):
    """``(det A, LU, pivots)``: the product of U's diagonal, signed by the permutation."""
    lu, pivots, _ = _lu(_mH(a) if factor_transpose else a)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    return _permutation_sign(pivots).astype(lu.dtype) * jnp.prod(diag, -1), lu, pivots + 1


_register(aten._linalg_det.default, det, layout_aware=True)


def slogdet(a, *, factor_transpose=False):
    """``(sign, log|det A|, LU, pivots)``; sign 0 and -inf for a singular matrix."""
    lu, pivots, _ = _lu(_mH(a) if factor_transpose else a)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    magnitude = jnp.abs(diag)
    unit = diag / jnp.where(magnitude == 0, 1, magnitude).astype(diag.dtype)
    sign = _permutation_sign(pivots).astype(lu.dtype) * jnp.prod(unit, -1)
    sign = jnp.where((magnitude == 0).any(-1), jnp.zeros_like(sign), sign)
    return sign, jnp.sum(jnp.log(magnitude), -1), lu, pivots + 1


_register(aten._linalg_slogdet.default, slogdet, layout_aware=True)


# ---------------------------------------------------------------------------------------------
# Cholesky
# ---------------------------------------------------------------------------------------------


def _cholesky_lower(a, upper):
    """The lower Cholesky factor of the Hermitian matrix stored in ``a``'s lower triangle (or, with
    ``upper``, in its upper triangle, read as the conjugate transpose)."""
    return lax_linalg.cholesky(_mH(a) if upper else a, symmetrize_input=False)


def _hermitian_pivots(a, upper):
    """The pivots of unpivoted Gaussian elimination on the Hermitian matrix stored in ``a``'s
    lower (``upper``: upper) triangle; the matrix is positive-definite up to order ``k`` exactly
    when the first ``k`` pivots are positive."""
    stored = _mH(a) if upper else a
    full = jnp.tril(stored) + _mH(jnp.tril(stored, -1))
    n = a.shape[-1]
    index = jnp.arange(n)

    def step(k, carry):
        m, pivots = carry
        pivot = m[..., k, k]
        pivots = pivots.at[..., k].set(jnp.real(pivot))
        column = jnp.where(index > k, m[..., :, k], 0)
        row = jnp.where(index > k, m[..., k, :], 0)
        m = m - column[..., :, None] * row[..., None, :] / pivot[..., None, None]
        return m, pivots

    real_dtype = jnp.real(full).dtype
    if n == 0:  # the loop body is traced even when it never runs
        return jnp.zeros(a.shape[:-1], real_dtype)
    _, pivots = jax.lax.fori_loop(0, n, step, (full, jnp.zeros(a.shape[:-1], real_dtype)))
    return pivots


def cholesky_ex(a, *, upper=False, check_errors=False):
    """``(L, info)`` (``U = L^H`` with ``upper``); see the module docstring for ``info``."""
    lower = _cholesky_lower(a, upper)
    failed = jnp.isnan(jnp.diagonal(lower, axis1=-2, axis2=-1)).any(-1)
    pivots = _hermitian_pivots(a, upper)
    info = jnp.where(failed, jnp.maximum(_first_true(~(pivots > 0)), 1), 0).astype(jnp.int32)
    return (_mH(lower) if upper else lower), info


_register(aten.linalg_cholesky_ex.default, cholesky_ex, api_name="torch.linalg.cholesky_ex")


@lowering(aten.cholesky.default)
def cholesky(a, upper=False):
    lower = _cholesky_lower(a, upper)
    return _mH(lower) if upper else lower


def _cholesky_factor_solve(factor, b, upper):
    """``X`` with ``A X = b`` for ``A = L L^H`` (``L = factor``) or ``A = U^H U`` (``upper``)."""
    factor, b = _broadcast_batch((factor, 2), (b, 2))
    conj = jnp.iscomplexobj(factor)
    if upper:
        y = lax_linalg.triangular_solve(factor, b, left_side=True, lower=False, transpose_a=True, conjugate_a=conj)
        return lax_linalg.triangular_solve(factor, y, left_side=True, lower=False)
    y = lax_linalg.triangular_solve(factor, b, left_side=True, lower=True)
    return lax_linalg.triangular_solve(factor, y, left_side=True, lower=True, transpose_a=True, conjugate_a=conj)


@lowering(aten._cholesky_solve_helper.default)
def cholesky_solve_helper(b, factor, upper):
    return _cholesky_factor_solve(factor, b, upper)


@lowering(aten.cholesky_inverse.default)
def cholesky_inverse(factor, upper=False):
    eye = jnp.broadcast_to(jnp.eye(factor.shape[-1], dtype=factor.dtype), factor.shape)
    return _cholesky_factor_solve(factor, eye, upper)


# ---------------------------------------------------------------------------------------------
# Triangular solves
# ---------------------------------------------------------------------------------------------


@lowering(aten.linalg_solve_triangular.default)
def solve_triangular(a, b, *, upper, left=True, unitriangular=False):
    """``X`` with ``A X = B`` (``left``) or ``X A = B``; only ``A``'s ``upper``/lower triangle is read."""
    a, b = _broadcast_batch((a, 2), (b, 2))
    return lax_linalg.triangular_solve(a, b, left_side=left, lower=not upper, unit_diagonal=unitriangular)


@lowering(aten.triangular_solve.default)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    """The deprecated form: ``(X, A)`` with ``op(A) X = b``, ``op`` the transpose if ``transpose``."""
    a, b = _broadcast_batch((a, 2), (b, 2))
    x = lax_linalg.triangular_solve(a, b, left_side=True, lower=not upper, transpose_a=transpose,
                                    unit_diagonal=unitriangular)
    return x, a


# ---------------------------------------------------------------------------------------------
# QR, SVD, eigh, matrix exponential
# ---------------------------------------------------------------------------------------------


@lowering(aten.linalg_qr.default)
def linalg_qr(a, mode="reduced"):
    if mode == "r":
        return _empty(a.dtype), jnp.linalg.qr(a, mode="r")
    return tuple(jnp.linalg.qr(a, mode=mode))


@lowering(aten.geqrf.default)
def geqrf(a):
    """LAPACK geqrf's compact QR: ``R`` above the diagonal, Householder vectors below, and taus
    (``jnp.linalg.qr``'s ``"raw"`` mode gives the compact matrix transposed, as NumPy does)."""
    compact, taus = jnp.linalg.qr(a, mode="raw")
    return _mT(compact), taus


@lowering(aten.linalg_householder_product.default)
def householder_product(v, tau):
    """The first ``n`` columns of ``H_1 ... H_k``, ``H_i = I - tau_i v_i v_i^H`` with ``v_i`` the
    ``i``-th column of ``v`` below the diagonal and 1 on it (LAPACK orgqr)."""
    m, n = v.shape[-2], v.shape[-1]
    q = jnp.broadcast_to(jnp.eye(m, n, dtype=v.dtype), v.shape[:-2] + (m, n))
    rows = jnp.arange(m)
    for i in reversed(range(tau.shape[-1])):  # apply H_i on the left, last first
        col = jnp.where(rows > i, v[..., :, i], jnp.where(rows == i, 1, 0).astype(v.dtype))
        projection = jnp.einsum("...m,...mn->...n", jnp.conj(col), q, precision=jax.lax.Precision.HIGHEST)
        q = q - tau[..., i, None, None] * col[..., :, None] * projection[..., None, :]
    return q


@lowering(aten.ormqr.default)
def ormqr(v, tau, c, left=True, transpose=False):
    """``op(Q) C`` (``left``) or ``C op(Q)``, ``Q = H_1 ... H_k`` from geqrf's Householder
    vectors (columns of ``v`` below the diagonal, 1 on it) and ``op`` the conjugate transpose
    if ``transpose`` (LAPACK ormqr): the reflections are applied to ``C`` one at a time, never
    forming ``Q``."""
    rows = jnp.arange(v.shape[-2])
    steps = list(range(tau.shape[-1]))
    # Q C applies H_k first; Q^H C applies H_1^H first; C Q applies H_1 first; C Q^H, H_k^H first.
    if left != transpose:
        steps.reverse()
    hp = jax.lax.Precision.HIGHEST
    for i in steps:
        col = jnp.where(rows > i, v[..., :, i], jnp.where(rows == i, 1, 0).astype(v.dtype))
        t = tau[..., i, None, None]
        if transpose:
            t = jnp.conj(t)
        if left:  # H C = C - tau v (v^H C)
            projection = jnp.einsum("...m,...mn->...n", jnp.conj(col), c, precision=hp)
            c = c - t * col[..., :, None] * projection[..., None, :]
        else:  # C H = C - tau (C v) v^H
            projection = jnp.einsum("...mn,...n->...m", c, col, precision=hp)
            c = c - t * projection[..., :, None] * jnp.conj(col)[..., None, :]
    return c


@lowering(aten._linalg_svd.default)
def linalg_svd(a, full_matrices=False, compute_uv=True, *, driver=None):
    if not compute_uv:
        return _empty(a.dtype), jnp.linalg.svd(a, compute_uv=False), _empty(a.dtype)
    return tuple(jnp.linalg.svd(a, full_matrices=full_matrices))


@lowering(aten.linalg_lstsq.default)
def linalg_lstsq(a, b, rcond=None, *, driver=None):
    """(solution, residuals, rank, singular_values) of ``min |a x - b|``, shaped and typed as
    PyTorch's CPU kernel returns them for ``driver`` (default ``gelsy``).

    The solution is the minimum-norm one from the SVD, singular values at or below
    ``rcond * s_max`` (default ``rcond``: eps * max(m, n)) treated as zero — what ``gelsd`` and
    ``gelss`` compute, and for full-rank ``a`` what ``gelsy`` and ``gels`` compute too (``gels``
    assumes full rank: no cutoff). ``rank`` counts the kept singular values (empty for
    ``gels``); ``singular_values`` are returned for ``gelsd``/``gelss``; ``residuals`` (the
    squared residual norms) for ``m > n`` except with ``gelsy``. One difference from CPU:
    ``gelsd``/``gelss`` return no residuals when some matrix is rank-deficient, a
    data-dependent shape a compiled program cannot have; here they are always returned.
    """
    driver = driver or "gelsy"
    vector = b.ndim == a.ndim - 1
    if vector:
        b = b[..., None]
    m, n = a.shape[-2:]
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = jnp.broadcast_to(a, batch + a.shape[-2:])
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    real = jnp.finfo(a.dtype).dtype
    hp = jax.lax.Precision.HIGHEST
    u, s, vh = jnp.linalg.svd(a, full_matrices=False)
    if driver == "gels":
        keep = jnp.ones(s.shape, bool)
    else:
        cutoff = (jnp.finfo(real).eps * max(m, n) if rcond is None else rcond) * s.max(axis=-1, initial=0,
                                                                                      keepdims=True)
        keep = s > cutoff
    inverse = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0).astype(a.dtype)
    projected = jnp.einsum("...mk,...mj->...kj", jnp.conj(u), b, precision=hp) * inverse[..., :, None]
    solution = jnp.einsum("...kn,...kj->...nj", jnp.conj(vh), projected, precision=hp)
    if m > n and driver != "gelsy":
        error = jnp.einsum("...mn,...nj->...mj", a, solution, precision=hp) - b
        residuals = jnp.sum(jnp.abs(error) ** 2, axis=-2).astype(real)
    else:
        residuals = jnp.zeros((0,), real)
    rank = jnp.zeros((0,), jnp.int64) if driver == "gels" else jnp.sum(keep, axis=-1).astype(jnp.int64)
    values = s.astype(real) if driver in ("gelsd", "gelss") else jnp.zeros((0,), real)
    if vector:
        solution = solution[..., 0]
    return solution, residuals, rank, values


@lowering(aten._linalg_eigh.default)
def linalg_eigh(a, UPLO="L", compute_v=True):
    """Eigenvalues (ascending) and eigenvectors of the Hermitian matrix in ``a``'s ``UPLO`` triangle."""
    vectors, values = lax_linalg.eigh(a, lower=UPLO.upper() == "L", symmetrize_input=False)
    return values, (vectors if compute_v else _empty(a.dtype))


@lowering(aten.linalg_matrix_exp.default)
def matrix_exp(a):
    """``exp(a)``; a bfloat16/float16 ``a`` (which jax's ``expm`` refuses) in float32, rounded once."""
    if jnp.dtype(a.dtype).itemsize == 2 and jnp.issubdtype(a.dtype, jnp.floating):
        return jsl.expm(a.astype(jnp.float32)).astype(a.dtype)
    return jsl.expm(a)
