"""Orthogonal factorisations as decompositions into neuron's native ops, the algorithms LAPACK
runs on the CPU (the rest of the linear-algebra family is ``decompositions/linalg.py``):

* Householder QR (``geqrf``, ``linalg_householder_product``, ``ormqr``, ``linalg_qr`` in its
  ``reduced``/``complete``/``r`` modes): column ``k``'s reflector ``H = I - tau v v^T`` is
  ``dlarfg``'s (``beta = -sign(alpha) * ||x||``, ``tau = (beta - alpha) / beta``,
  ``v = x / (alpha - beta)`` below a unit; ``tau = 0`` where the column below the diagonal is
  already zero), so ``R``'s signs and the packed reflectors are the CPU's, not just an
  equivalent factorisation. ``Q`` is the reflectors applied to the identity from the last
  (``orgqr``'s order); ``ormqr`` applies them to ``other`` from either side.
* ``_linalg_eigh``: cyclic Jacobi on the symmetric matrix built from the triangle ``UPLO``
  names (the other is never read), rotations ``(p, q)`` in row order until the off-diagonal
  part is below float32 rounding of the matrix's norm (one host read of that norm per sweep, at
  most ``_MAX_SWEEPS``); eigenvalues ascending as LAPACK's, eigenvectors the accumulated
  rotations' columns in the same order. An eigenvector's sign (and a repeated eigenvalue's
  basis) is not unique: LAPACK's choice is its algorithm's, Jacobi's is another.
* ``_linalg_svd``: one-sided (Hestenes) Jacobi on the columns of the tall orientation of ``A``
  (``A^T`` when it is wide): plane rotations ``(p, q)`` until every pair of columns is
  orthogonal to float32 rounding (one host read per sweep), ``S`` the column norms in
  descending order, ``V`` the accumulated rotations, ``U`` the normalised columns. ``U`` is
  completed to an orthonormal basis (``full_matrices``, or columns of zero singular values) by
  Householder QR of its columns, signs kept. Singular vectors are unique only up to sign (and
  within repeated singular values): PyTorch's tests compare ``|U|``, ``|V|`` and ``U Vh``.

Each reflector is a few device ops over the whole (batched) matrix; a Python loop runs the
``min(m, n)`` steps (``dlarfg``'s rescaling of tiny columns is not done: float32 columns whose
norm underflows lose precision here). float32 only, as in ``decompositions.linalg``: complex
inputs (conjugated reflectors, Hermitian rotations: not written) take the CPU fallback.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch._ops import OpOverload

from accelkit_backends.neuron.decompositions.linalg import _computed_here, _cpu_checks, _flat, _traced

aten = torch.ops.aten


def _geqrf(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(b, m, n)`` -> ``R`` above the diagonal with the reflectors below, and ``tau`` (b, k)."""
    b, m, n = A.shape
    rows = torch.arange(m, device=A.device).unsqueeze(0)
    columns = torch.arange(n, device=A.device)
    taus: list[torch.Tensor] = []
    for k in range(min(m, n)):
        column = A[:, :, k]
        alpha = A[:, k:k + 1, k]
        below = torch.where(rows > k, column, torch.zeros_like(column))
        tail = (below * below).sum(-1, keepdim=True)
        norm = (alpha * alpha + tail).sqrt()
        beta = torch.where(alpha >= 0, -norm, norm)
        trivial = tail == 0
        safe_beta = torch.where(trivial, torch.ones_like(beta), beta)
        tau = torch.where(trivial, torch.zeros_like(beta), (beta - alpha) / safe_beta)
        scale = torch.where(trivial, torch.zeros_like(beta), 1 / torch.where(trivial, torch.ones_like(beta),
                                                                               alpha - beta))
        v = torch.where(rows == k, torch.ones_like(column), below * scale)
        w = torch.bmm(v.unsqueeze(1), A).squeeze(1)  # v^T A
        w = torch.where(columns > k, w, torch.zeros_like(w))
        A = A - (tau * v).unsqueeze(-1) * w.unsqueeze(-2)
        packed = torch.where(rows > k, v, torch.where(trivial, alpha, beta))
        A = torch.where((rows >= k).unsqueeze(-1) & (columns == k), packed.unsqueeze(-1), A)
        taus.append(tau)
    tau = torch.cat(taus, dim=-1) if taus else A.new_zeros(b, 0)
    return A, tau


def _reflector(reflectors: torch.Tensor, i: int) -> torch.Tensor:
    """``v_i`` (b, m): column ``i`` below the diagonal, a unit on it, zeros above."""
    rows = torch.arange(reflectors.shape[1], device=reflectors.device).unsqueeze(0)
    column = reflectors[:, :, i]
    return torch.where(rows > i, column, torch.where(rows == i, torch.ones_like(column), torch.zeros_like(column)))


def _apply_reflectors(reflectors: torch.Tensor, tau: torch.Tensor, C: torch.Tensor, left: bool,
                      transpose: bool) -> torch.Tensor:
    """``Q C``, ``Q^T C`` (``left``) or ``C Q``, ``C Q^T`` with ``Q = H_0 H_1 … H_{k-1}``; all ``(b, …)``."""
    k = tau.shape[-1]
    forward = left == transpose  # Q^T C and C Q take H_0 first
    for i in (range(k) if forward else range(k - 1, -1, -1)):
        v = _reflector(reflectors, i)
        t = tau[:, i:i + 1]
        if left:  # H C = C - tau v (v^T C)
            C = C - (t * v).unsqueeze(-1) * torch.bmm(v.unsqueeze(1), C)
        else:  # C H = C - tau (C v) v^T
            C = C - torch.bmm(C, v.unsqueeze(-1)) * (t * v).unsqueeze(1)
    return C


def _geqrf_op(self):
    if self.dim() < 2:
        aten.geqrf.default(self.cpu())  # the CPU's own error for a vector
    if not _computed_here(self):
        return NotImplemented
    R, tau = _geqrf(_flat(self, 2))
    return R.reshape(self.shape), tau.reshape(*self.shape[:-2], tau.shape[-1])


def _householder_product(input, tau):
    _cpu_checks(aten.linalg_householder_product.default, input, tau)
    if not _computed_here(input, tau):
        return NotImplemented
    m, n = input.shape[-2:]
    reflectors, taus = _flat(input, 2), _flat(tau, 1)
    identity = torch.eye(m, n, dtype=input.dtype, device=input.device).expand(reflectors.shape[0], m, n)
    return _apply_reflectors(reflectors, taus, identity, True, False).reshape(input.shape)


def _ormqr(input, tau, other, left=True, transpose=False):
    _cpu_checks(aten.ormqr.default, input, tau, other, left, transpose)
    if not _computed_here(input, tau, other):
        return NotImplemented
    result = _apply_reflectors(_flat(input, 2), _flat(tau, 1), _flat(other, 2), left, transpose)
    return result.reshape(other.shape)


def _linalg_qr(A, mode="reduced"):
    Q_meta, R_meta = _cpu_checks(aten.linalg_qr.default, A, mode)
    if not _computed_here(A):
        return NotImplemented
    m, n = A.shape[-2:]
    k = min(m, n)
    packed, tau = _geqrf(_flat(A, 2))
    R = packed[:, :R_meta.shape[-2], :].triu().reshape(R_meta.shape)
    if mode == "r":
        return A.new_empty(0), R
    columns = Q_meta.shape[-1]  # k, or m for "complete" (the reflectors padded with zero columns)
    reflectors = packed[:, :, :k]
    identity = torch.eye(m, columns, dtype=A.dtype, device=A.device).expand(packed.shape[0], m, columns)
    return _apply_reflectors(reflectors, tau, identity, True, False).reshape(Q_meta.shape), R


#: Jacobi sweeps before giving up on convergence (it is quadratic: float32 needs a handful).
_MAX_SWEEPS = 30
#: The engines' rounding (float64 is computed in float32 too, under downcast).
_EPS = torch.finfo(torch.float32).eps


def _rotate(S: torch.Tensor, V: torch.Tensor, p: int, q: int, eye: torch.Tensor, rows: torch.Tensor,
            columns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The Jacobi rotation ``J`` zeroing ``S[p, q]``: ``S <- J^T S J``, ``V <- V J`` (all ``(b, n, n)``)."""
    spp, sqq, spq = S[:, p:p + 1, p:p + 1], S[:, q:q + 1, q:q + 1], S[:, p:p + 1, q:q + 1]
    zero = spq == 0
    theta = (sqq - spp) / (2 * torch.where(zero, torch.ones_like(spq), spq))
    t = torch.where(theta >= 0, torch.ones_like(theta), -torch.ones_like(theta)) / (
        theta.abs() + (theta * theta + 1).sqrt())
    t = torch.where(zero, torch.zeros_like(t), t)
    c = 1 / (t * t + 1).sqrt()
    s = t * c
    at_p, at_q = rows == p, rows == q
    on_p, on_q = columns == p, columns == q
    J = torch.where((at_p & on_p) | (at_q & on_q), c, eye)
    J = torch.where(at_p & on_q, s, torch.where(at_q & on_p, -s, J))
    return torch.bmm(torch.bmm(J.transpose(1, 2), S), J), torch.bmm(V, J)


def _ascending(values: torch.Tensor) -> torch.Tensor:
    """The index order (b, n) that sorts each row of ``values`` ascending (ties by position)."""
    n = values.shape[-1]
    position = torch.arange(n, device=values.device)
    before = (values.unsqueeze(-1) < values.unsqueeze(-2)) | (
        (values.unsqueeze(-1) == values.unsqueeze(-2)) & (position.unsqueeze(-1) < position))
    rank = before.to(torch.int32).sum(-2).to(torch.int64)  # how many come before each value
    return torch.zeros_like(rank).scatter(1, rank, position.expand_as(rank))


def _jacobi_eigh(S: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(b, n, n)`` symmetric -> ascending eigenvalues (b, n) and eigenvectors (columns)."""
    b, n, _ = S.shape
    eye = torch.eye(n, dtype=S.dtype, device=S.device).expand(b, n, n)
    rows = torch.arange(n, device=S.device).unsqueeze(-1)
    columns = torch.arange(n, device=S.device)
    off_diagonal = rows != columns
    V = eye
    tolerance = float((S * S).sum()) * _EPS ** 2
    for _ in range(_MAX_SWEEPS):
        if float(torch.where(off_diagonal, S * S, torch.zeros_like(S)).sum()) <= tolerance:
            break
        for p in range(n - 1):
            for q in range(p + 1, n):
                S, V = _rotate(S, V, p, q, eye, rows, columns)
    values = S.diagonal(dim1=-2, dim2=-1)
    order = _ascending(values)
    return values.gather(1, order), V.gather(2, order.unsqueeze(1).expand(b, n, n))


def _linalg_eigh(A, UPLO="L", compute_v=True):
    _cpu_checks(aten._linalg_eigh.default, A, UPLO, compute_v)
    if not _computed_here(A) or _traced(A):
        return NotImplemented  # (in a graph: the sweeps stop on a value read on the host)
    a = _flat(A, 2)
    triangle = a.tril() if UPLO.upper() == "L" else a.triu()
    symmetric = triangle + triangle.transpose(1, 2) - triangle * torch.eye(a.shape[-1], dtype=a.dtype,
                                                                             device=a.device)
    values, vectors = _jacobi_eigh(symmetric)
    values = values.reshape(A.shape[:-1])
    return values, (vectors.reshape(A.shape) if compute_v else A.new_empty(0))


def _orthogonalise_columns(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Hestenes: ``(b, m, n)`` -> ``A V`` with mutually orthogonal columns, and ``V`` (b, n, n)."""
    b, m, n = A.shape
    V = torch.eye(n, dtype=A.dtype, device=A.device).expand(b, n, n)
    columns = torch.arange(n, device=A.device)
    off_diagonal = columns.unsqueeze(-1) != columns
    tolerance = n * _EPS
    for _ in range(_MAX_SWEEPS):
        gram = torch.bmm(A.transpose(1, 2), A)
        norms = gram.diagonal(dim1=-2, dim2=-1).sqrt()
        scale = norms.unsqueeze(-1) * norms.unsqueeze(-2)
        cosines = torch.where(off_diagonal & (scale > 0), gram.abs() / torch.where(scale > 0, scale, 1), 0)
        if float(cosines.amax()) <= tolerance:
            break
        for p in range(n - 1):
            for q in range(p + 1, n):
                a_p, a_q = A[:, :, p:p + 1], A[:, :, q:q + 1]
                alpha, beta = (a_p * a_p).sum(1, keepdim=True), (a_q * a_q).sum(1, keepdim=True)
                gamma = (a_p * a_q).sum(1, keepdim=True)
                zero = gamma == 0
                zeta = (beta - alpha) / (2 * torch.where(zero, torch.ones_like(gamma), gamma))
                t = torch.where(zeta >= 0, 1.0, -1.0) / (zeta.abs() + (zeta * zeta + 1).sqrt())
                t = torch.where(zero, torch.zeros_like(t), t)
                c = 1 / (t * t + 1).sqrt()
                sn = t * c
                on_p, on_q = columns == p, columns == q
                v_p, v_q = V[:, :, p:p + 1], V[:, :, q:q + 1]
                A = torch.where(on_p, c * a_p - sn * a_q, torch.where(on_q, sn * a_p + c * a_q, A))
                V = torch.where(on_p, c * v_p - sn * v_q, torch.where(on_q, sn * v_p + c * v_q, V))
    return A, V


def _completed(U: torch.Tensor, columns: int) -> torch.Tensor:
    """``(b, m, k)`` with orthonormal (or zero, trailing) columns -> ``columns`` orthonormal
    columns whose first ones are ``U``'s nonzero columns: Householder QR, R's signs undone."""
    b, m, k = U.shape
    packed, tau = _geqrf(U)
    identity = torch.eye(m, columns, dtype=U.dtype, device=U.device).expand(b, m, columns)
    Q = _apply_reflectors(packed, tau, identity, True, False)
    signs = packed.diagonal(dim1=-2, dim2=-1).sign()
    signs = torch.cat([torch.where(signs == 0, 1.0, signs), signs.new_ones(b, columns - k)], dim=-1)
    return Q * signs.unsqueeze(1)


def _tall_svd(A: torch.Tensor, full: bool, compute_uv: bool):
    """``(b, m, n)``, ``m >= n`` -> ``U`` (b, m, m or n), ``S`` (b, n) descending, ``V`` (b, n, n)."""
    rotated, V = _orthogonalise_columns(A)
    S = (rotated * rotated).sum(1).sqrt()
    order = _ascending(-S)
    S = S.gather(1, order)
    if not compute_uv:
        return None, S, None
    b, m, n = A.shape
    rotated = rotated.gather(2, order.unsqueeze(1).expand(b, m, n))
    V = V.gather(2, order.unsqueeze(1).expand(b, n, n))
    nonzero = S.unsqueeze(1) > 0
    U = torch.where(nonzero, rotated / torch.where(nonzero, S.unsqueeze(1), 1), 0)
    if full or not bool(nonzero.all()):
        U = _completed(U, m if full else n)
    return U, S, V


def _linalg_svd(A, full_matrices=False, compute_uv=True, *, driver=None):
    U_meta, S_meta, Vh_meta = _cpu_checks(aten._linalg_svd.default, A, full_matrices, compute_uv, driver=driver)
    if not _computed_here(A) or _traced(A):
        return NotImplemented  # (in a graph: the sweeps stop on a value read on the host)
    if A.numel() == 0:  # no rotations: the identity's columns complete the bases
        def eye(shape):
            return torch.eye(shape[-2], shape[-1], dtype=A.dtype, device=A.device).expand(shape)
        S = A.new_zeros(S_meta.shape)
        return (eye(U_meta.shape), S, eye(Vh_meta.shape)) if compute_uv else (A.new_empty(0), S, A.new_empty(0))
    m, n = A.shape[-2:]
    wide = m < n
    a = _flat(A.transpose(-2, -1) if wide else A, 2)
    U, S, V = _tall_svd(a, full_matrices, compute_uv)
    S = S.reshape(S_meta.shape)
    if not compute_uv:
        return A.new_empty(0), S, A.new_empty(0)
    if wide:  # A^T = U S V^T: A = V S U^T
        U, Vh = V, U.transpose(1, 2)
    else:
        Vh = V.transpose(1, 2)
    return U.reshape(U_meta.shape), S, Vh.reshape(Vh_meta.shape)


def decompositions() -> Mapping[OpOverload, Callable]:
    """The decompositions above, keyed by aten overload (their ``out=`` forms follow)."""
    return {
        aten.geqrf.default: _geqrf_op,
        aten.linalg_householder_product.default: _householder_product,
        aten.ormqr.default: _ormqr,
        aten.linalg_qr.default: _linalg_qr,
        aten._linalg_eigh.default: _linalg_eigh,
        aten._linalg_svd.default: _linalg_svd,
    }
