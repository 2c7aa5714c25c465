"""Orthogonal factorisations as decompositions into neuron's native ops, the algorithms LAPACK
runs on the CPU (the rest of the linear-algebra family is ``linalg_decompositions.py``):

* Householder QR (``geqrf``, ``linalg_householder_product``, ``ormqr``, ``linalg_qr`` in its
  ``reduced``/``complete``/``r`` modes): column ``k``'s reflector ``H = I - tau v v^T`` is
  ``dlarfg``'s (``beta = -sign(alpha) * ||x||``, ``tau = (beta - alpha) / beta``,
  ``v = x / (alpha - beta)`` below a unit; ``tau = 0`` where the column below the diagonal is
  already zero), so ``R``'s signs and the packed reflectors are the CPU's, not just an
  equivalent factorisation. ``Q`` is the reflectors applied to the identity from the last
  (``orgqr``'s order); ``ormqr`` applies them to ``other`` from either side.

Each reflector is a few device ops over the whole (batched) matrix; a Python loop runs the
``min(m, n)`` steps (``dlarfg``'s rescaling of tiny columns is not done: float32 columns whose
norm underflows lose precision here). float32 only, as in ``linalg_decompositions``; complex
inputs (the reflectors' conjugates) and empty ones take the CPU fallback.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch._ops import OpOverload

from accelkit_backends.neuron.linalg_decompositions import _computed_here, _cpu_checks

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


def _flat(t: torch.Tensor, trailing: int) -> torch.Tensor:
    return t.reshape(-1, *t.shape[t.dim() - trailing:])


def _geqrf_op(self):
    if self.dim() < 2:
        aten.geqrf.default(self.cpu())  # the CPU's own error for a vector
    if not _computed_here(self):
        return NotImplemented
    R, tau = _geqrf(_flat(self, 2))
    return R.reshape(self.shape), tau.reshape(*self.shape[:-2], -1)


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


def decompositions() -> Mapping[OpOverload, Callable]:
    """The decompositions above, keyed by aten overload (their ``out=`` forms follow)."""
    return {
        aten.geqrf.default: _geqrf_op,
        aten.linalg_householder_product.default: _householder_product,
        aten.ormqr.default: _ormqr,
        aten.linalg_qr.default: _linalg_qr,
    }
