"""The linear-algebra family as decompositions into neuron's native ops (matmul, element-wise
arithmetic, ``argmax``, ``gather``, ``where``), the exact algorithms LAPACK runs on the CPU:

* triangular solves (``linalg_solve_triangular``, ``triangular_solve``): substitution one row at
  a time (forward for lower, backward for upper), each row one batched matmul against the rows
  already solved; a right-side solve ``X A = B`` is the left solve of the transposes;
* Cholesky (``linalg_cholesky_ex``, ``cholesky``, ``cholesky_inverse``, ``_cholesky_solve_helper``):
  the left-looking column algorithm, reading the lower triangle (the upper one for ``upper=True``);
  ``info`` is the order of the first leading minor whose pivot is not positive (0 when none), as
  ``potrf``'s; the columns after a failed pivot are NaN;
* LU with partial pivoting (``linalg_lu_factor_ex``, ``linalg_lu``, ``lu_unpack``,
  ``linalg_lu_solve``) and what is built on it (``_linalg_solve_ex``, ``linalg_inv_ex``,
  ``_linalg_det``, ``_linalg_slogdet``): the pivot of column ``k`` is the first largest ``|a|``
  at or below the diagonal (``argmax`` on the device, no host round trip), rows swapped by a
  gather; pivots are 1-based int32 row swaps as ``getrf``'s, ``info`` the first zero pivot's
  order; a zero pivot's column is left unscaled, as ``getf2`` leaves it;
* ``linalg_matrix_exp``: scaling and squaring as the CPU's: the matrices are scaled by ``2^-s``
  until their 1-norm is within the float32 bound of the CPU's degree-18 approximation, the
  exponential's Taylor polynomial of degree 18 is evaluated (Horner, 18 matmuls), then squared
  ``s`` times; ``s`` is each matrix's own, from its norm (one host read of the norms). The CPU
  picks a lower degree for small norms, where degree 18 is only more accurate.

Each step is a few device ops over the whole (batched) matrix, and a Python loop runs the ``n``
steps: ``O(n)`` ops per call, fine for the sizes PyTorch's tests and small solves use; a large
factorisation would want a blocked tile kernel. Leading batch dims are flattened into one and
broadcast as the CPU broadcasts them. The CPU's argument checks (shapes, dtypes, the messages)
run first on meta copies of the arguments; an invalid call runs on host copies, so it raises
the CPU's own exception.

Only float32 is computed here: the NeuronCore has no float64 engines (float64 is refused before
it gets here, or computed in float32 under ``ACCELKIT_NEURON_FLOAT64=downcast``, as every op
then is), the CPU refuses the reduced floats for most of these ops, and complex inputs
would need these algorithms in complex arithmetic built from float32 pairs, which is not
written: other dtypes return ``NotImplemented`` and take the CPU fallback (counted, and denied
under ``fallback_policy("deny")``). Empty matrices and batches give the CPU's shapes and values.
Results match the CPU's within float32 rounding (LAPACK's blocked kernels sum in another order).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch._ops import OpOverload
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _disable_current_modes

aten = torch.ops.aten


# -- shared -------------------------------------------------------------------------------------

def _on_meta(value: Any) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")


def _on_host(value: Any) -> Any:
    return value.cpu() if isinstance(value, torch.Tensor) else value


def _traced(*values: Any) -> bool:
    """Whether the arguments are a graph's fake tensors (torch.compile tracing the decomposition)."""
    return any(isinstance(v, FakeTensor) for v in values)


def _cpu_checks(op: OpOverload, *args: Any, **kwargs: Any) -> Any:
    """Run ``op``'s meta kernel (the CPU's argument checks) and return its meta results. Where
    the meta kernel refuses the arguments, ``op`` runs on host copies of them, so the CPU raises
    its own exception (the meta kernels raise AssertionError for some of its RuntimeErrors).

    The meta tensors are made afresh with any tracing mode off: inside torch.compile's tracing,
    ``op`` on the graph's tensors would be decomposed again, here."""
    with _disable_current_modes():
        try:
            return op(*[_on_meta(a) for a in args], **{k: _on_meta(v) for k, v in kwargs.items()})
        except Exception:
            if not _traced(*args, *kwargs.values()):
                op(*[_on_host(a) for a in args], **{k: _on_host(v) for k, v in kwargs.items()})
            raise


def _computed_here(*tensors: torch.Tensor) -> bool:
    """float32 (and float64, which reaches a decomposition only as ``ACCELKIT_NEURON_FLOAT64=downcast``
    allows it: computed in float32 as every op is then): what these decompositions compute (the
    rest goes to the CPU)."""
    return all(t.dtype in (torch.float32, torch.float64) for t in tensors)


def _flat(t: torch.Tensor, trailing: int) -> torch.Tensor:
    """``t`` with its leading (batch) dims flattened into one, before its ``trailing`` dims (an
    explicit count: ``-1`` cannot be inferred for an empty tensor)."""
    split = t.dim() - trailing
    return t.reshape(math.prod(t.shape[:split]), *t.shape[split:])


def _batched(t: torch.Tensor, batch: torch.Size) -> torch.Tensor:
    """``t`` broadcast to the batch dims ``batch`` and flattened to ``(b, rows, cols)``."""
    return _flat(t.expand(*batch, *t.shape[-2:]), 2)


def _first_failure(failed: torch.Tensor) -> torch.Tensor:
    """``(b, n)`` bool -> int32 ``(b,)``: 1 + the first failed step's index, 0 where none failed."""
    as_float = failed.to(torch.float32)
    first = as_float.argmax(-1).to(torch.int32) + 1
    return torch.where(as_float.amax(-1) > 0, first, torch.zeros_like(first))


def _transposed(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(-2, -1)


# -- triangular solves ----------------------------------------------------------------------------

def _substitute(A: torch.Tensor, B: torch.Tensor, upper: bool, unitriangular: bool) -> torch.Tensor:
    """Solve ``A X = B`` for ``(b, n, n)`` triangular ``A`` and ``(b, n, k)`` ``B``, a row at a time
    (the other triangle of ``A`` is never read)."""
    n = A.shape[-1]
    if n == 0:
        return B.clone()
    order = range(n - 1, -1, -1) if upper else range(n)
    solved: list[torch.Tensor] = []  # rows in solving order
    for i in order:
        row = B[:, i:i + 1, :]
        if solved:
            known = torch.cat(solved[::-1] if upper else solved, dim=1)  # rows i+1.. or ..i-1, in order
            coefficients = A[:, i:i + 1, i + 1:] if upper else A[:, i:i + 1, :i]
            row = row - torch.bmm(coefficients, known)
        if not unitriangular:
            row = row / A[:, i:i + 1, i:i + 1]
        solved.append(row)
    return torch.cat(solved[::-1] if upper else solved, dim=1)


def _solve_triangular(A, B, upper: bool, left: bool, unitriangular: bool, batch: torch.Size) -> torch.Tensor:
    """``A X = B`` (``left``) or ``X A = B`` for broadcast batch dims ``batch``; the result is
    ``(*batch, rows, cols)`` of ``B``."""
    a, b = _batched(A, batch), _batched(B, batch)
    if left:
        x = _substitute(a, b, upper, unitriangular)
    else:  # X A = B  <=>  A^T X^T = B^T, and A^T has the other triangle
        x = _transposed(_substitute(_transposed(a), _transposed(b), not upper, unitriangular))
    return x.reshape(*batch, *x.shape[-2:])


def _linalg_solve_triangular(A, B, *, upper, left=True, unitriangular=False):
    result = _cpu_checks(aten.linalg_solve_triangular.default, A, B, upper=upper, left=left,
                         unitriangular=unitriangular)
    if not _computed_here(A, B):
        return NotImplemented
    return _solve_triangular(A, B, upper, left, unitriangular, result.shape[:-2])


def _triangular_solve(self, A, upper=True, transpose=False, unitriangular=False):
    solution, coefficient = _cpu_checks(aten.triangular_solve.default, self, A, upper, transpose, unitriangular)
    if not _computed_here(self, A):
        return NotImplemented
    batch = solution.shape[:-2]
    coefficients = A if not transpose else _transposed(A)
    x = _solve_triangular(coefficients, self, upper != transpose, True, unitriangular, batch)
    return x, A.expand(coefficient.shape).clone()


# -- Cholesky -------------------------------------------------------------------------------------

def _cholesky_lower(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(b, n, n)`` -> the lower factor ``L`` (``L L^T = A``, from ``A``'s lower triangle) and
    int32 ``info`` (b,)."""
    b, n, _ = A.shape
    if n == 0:
        return A.clone(), torch.zeros(b, dtype=torch.int32, device=A.device)
    rows = torch.arange(n, device=A.device).unsqueeze(0)
    columns: list[torch.Tensor] = []
    failed: list[torch.Tensor] = []
    for j in range(n):
        v = A[:, :, j]
        if columns:
            left = torch.stack(columns, dim=-1)  # (b, n, j)
            v = v - torch.bmm(left, left[:, j, :].unsqueeze(-1)).squeeze(-1)
        pivot = v[:, j:j + 1]
        failed.append(~(pivot > 0))  # NaN fails too, as potrf's check
        root = pivot.sqrt()
        column = torch.where(rows > j, v / root, torch.where(rows == j, root, torch.zeros_like(v)))
        columns.append(column)
    return torch.stack(columns, dim=-1), _first_failure(torch.cat(failed, dim=-1))


def _cholesky_ex(A: torch.Tensor, upper: bool) -> tuple[torch.Tensor, torch.Tensor]:
    a = _flat(A, 2)
    L, info = _cholesky_lower(_transposed(a) if upper else a)
    factor = _transposed(L) if upper else L
    return factor.reshape(A.shape), info.reshape(A.shape[:-2])


def _linalg_cholesky_ex(A, *, upper=False, check_errors=False):
    _cpu_checks(aten.linalg_cholesky_ex.default, A, upper=upper)
    if not _computed_here(A):
        return NotImplemented
    L, info = _cholesky_ex(A, upper)
    if check_errors:
        aten._linalg_check_errors(info, "torch.linalg.cholesky_ex", is_matrix=A.dim() == 2)
    return L, info


def _cholesky(self, upper=False):
    _cpu_checks(aten.cholesky.default, self, upper)
    if not _computed_here(self):
        return NotImplemented
    L, info = _cholesky_ex(self, upper)
    aten._linalg_check_errors(info, "cholesky", is_matrix=self.dim() == 2)
    return L


def _identity_like(a: torch.Tensor) -> torch.Tensor:
    """The identity of ``a``'s ``(…, n, n)`` shape."""
    return torch.eye(a.shape[-1], dtype=a.dtype, device=a.device).expand(a.shape)


def _cholesky_inverse(self, upper=False):
    _cpu_checks(aten.cholesky_inverse.default, self, upper)
    if not _computed_here(self):
        return NotImplemented
    # A = L L^T (or U^T U): A^-1 = L^-T L^-1 (or U^-1 U^-T), with L^-1 (U^-1) a triangular solve
    inverse = _solve_triangular(self, _identity_like(self), upper, True, False, self.shape[:-2])
    return torch.matmul(inverse, _transposed(inverse)) if upper else torch.matmul(_transposed(inverse), inverse)


def _cholesky_solve_helper(self, A, upper):
    _cpu_checks(aten._cholesky_solve_helper.default, self, A, upper)
    if not _computed_here(self, A):
        return NotImplemented
    batch = self.shape[:-2]
    lower = _transposed(A) if upper else A  # A L L^T = B: L Y = B, then L^T X = Y
    y = _solve_triangular(lower, self, False, True, False, batch)
    return _solve_triangular(_transposed(lower), y, True, True, False, batch)


# -- LU -------------------------------------------------------------------------------------------

def _swap_index(rows: torch.Tensor, k: int, p: torch.Tensor) -> torch.Tensor:
    """``(b, m)`` row index that swaps row ``k`` with row ``p`` (b,) of each matrix."""
    p = p.unsqueeze(-1)
    return torch.where(rows == k, p, torch.where(rows == p, torch.full_like(rows, k), rows))


def _lu_factor(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(b, m, n)`` -> packed ``LU``, 1-based int32 ``pivots`` (b, min(m, n)), int32 ``info`` (b,)
    and the row permutation ``perm`` (b, m): ``A[perm] = L U``."""
    b, m, n = A.shape
    rows = torch.arange(m, device=A.device).expand(b, m)
    columns = torch.arange(n, device=A.device)
    perm = rows
    pivots: list[torch.Tensor] = []
    zero_pivots: list[torch.Tensor] = []
    for k in range(min(m, n)):
        candidates = torch.where(rows >= k, A[:, :, k].abs(), torch.full_like(A[:, :, k], -1.0))
        p = candidates.argmax(-1)
        swap = _swap_index(rows, k, p)
        A = A.gather(1, swap.unsqueeze(-1).expand(b, m, n))
        perm = perm.gather(1, swap)
        pivots.append(p.unsqueeze(-1))
        pivot = A[:, k:k + 1, k]
        zero = pivot == 0
        zero_pivots.append(zero)
        column = A[:, :, k]
        multipliers = torch.where(zero, column, column / torch.where(zero, torch.ones_like(pivot), pivot))
        below = rows > k
        multipliers = torch.where(below, multipliers, torch.zeros_like(multipliers))
        pivot_row = torch.where(columns > k, A[:, k, :], torch.zeros_like(A[:, k, :]))
        A = A - multipliers.unsqueeze(-1) * pivot_row.unsqueeze(-2)
        A = torch.where(below.unsqueeze(-1) & (columns == k), multipliers.unsqueeze(-1), A)
    if not pivots:
        return A, torch.zeros(b, 0, dtype=torch.int32, device=A.device), torch.zeros(b, dtype=torch.int32,
                                                                                       device=A.device), perm
    pivot_rows = (torch.cat(pivots, dim=-1) + 1).to(torch.int32)
    return A, pivot_rows, _first_failure(torch.cat(zero_pivots, dim=-1)), perm


def _lu_factor_batched(A: torch.Tensor):
    """``_lu_factor`` over any leading batch dims (reshaped back)."""
    batch = A.shape[:-2]
    LU, pivots, info, perm = _lu_factor(_flat(A, 2))
    return (LU.reshape(A.shape), pivots.reshape(*batch, pivots.shape[-1]), info.reshape(batch),
            perm.reshape(*batch, perm.shape[-1]))


def _permutation(pivots: torch.Tensor, m: int) -> torch.Tensor:
    """1-based row swaps ``(b, k)`` applied in order to ``0..m-1`` -> ``perm`` (b, m)."""
    b = pivots.shape[0]
    rows = torch.arange(m, device=pivots.device).expand(b, m)
    perm = rows
    swaps = pivots.to(torch.int64) - 1
    for k in range(pivots.shape[-1]):
        perm = perm.gather(1, _swap_index(rows, k, swaps[:, k]))
    return perm


def _permutation_matrix(perm: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``P`` with ``A = P (A[perm])``: column ``i`` is the unit vector ``e_perm[i]``."""
    m = perm.shape[-1]
    rows = torch.arange(m, device=perm.device).unsqueeze(-1)
    return (perm.unsqueeze(-2) == rows).to(dtype)


def _unpack(LU: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The unit lower ``L`` (…, m, k) and upper ``U`` (…, k, n) packed in ``LU``."""
    m, n = LU.shape[-2:]
    k = min(m, n)
    L = LU[..., :, :k].tril(-1) + torch.eye(m, k, dtype=LU.dtype, device=LU.device)
    return L, LU[..., :k, :].triu()


def _linalg_lu_factor_ex(A, *, pivot=True, check_errors=False):
    _cpu_checks(aten.linalg_lu_factor_ex.default, A, pivot=pivot)
    if not pivot or not _computed_here(A):
        return NotImplemented  # the CPU has no LU without pivoting: its error is the CPU's
    LU, pivots, info, _ = _lu_factor_batched(A)
    if check_errors:
        aten._linalg_check_errors(info, "torch.linalg.lu_factor_ex", is_matrix=A.dim() == 2)
    return LU, pivots, info


def _linalg_lu(A, *, pivot=True):
    _cpu_checks(aten.linalg_lu.default, A, pivot=pivot)
    if not pivot or not _computed_here(A):
        return NotImplemented
    LU, _, _, perm = _lu_factor_batched(A)
    L, U = _unpack(LU)
    return _permutation_matrix(perm, A.dtype), L, U


def _lu_unpack(LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
    P, L, U = _cpu_checks(aten.lu_unpack.default, LU_data, LU_pivots, unpack_data, unpack_pivots)
    if not _computed_here(LU_data):
        return NotImplemented
    if unpack_data:
        L, U = _unpack(LU_data)
    else:
        L, U = LU_data.new_empty(0), LU_data.new_empty(0)
    if unpack_pivots:
        m = LU_data.shape[-2]
        batch = LU_data.shape[:-2]
        perm = _permutation(_flat(LU_pivots, 1), m)
        P = _permutation_matrix(perm, LU_data.dtype).reshape(*batch, m, m)
    else:
        P = LU_data.new_empty(0)
    return P, L, U


def _lu_solve(LU: torch.Tensor, perm: torch.Tensor, B: torch.Tensor, left: bool, adjoint: bool,
              batch: torch.Size) -> torch.Tensor:
    """Solve with ``A[perm] = L U`` (A's batch broadcast to ``batch``): ``A X = B``, ``A^T X = B``
    (``adjoint``), or on the right ``X A = B`` / ``X A^T = B``."""
    if not left:  # X A = B  <=>  A^T X^T = B^T
        return _transposed(_lu_solve(LU, perm, _transposed(B), True, not adjoint, batch))
    n = LU.shape[-1]
    lu = _batched(LU, batch)
    order = _flat(perm.expand(*batch, n), 1)
    b = _batched(B, batch)
    if not adjoint:  # L U X = B[perm]
        rows = order.unsqueeze(-1).expand(b.shape)
        y = _substitute(lu, b.gather(1, rows), False, True)
        x = _substitute(lu, y, True, False)
    else:  # U^T L^T (X[perm]) = B
        lu_t = _transposed(lu)
        y = _substitute(lu_t, b, False, False)
        permuted = _substitute(lu_t, y, True, True)
        inverse = torch.zeros_like(order).scatter(1, order, torch.arange(n, device=order.device).expand_as(order))
        x = permuted.gather(1, inverse.unsqueeze(-1).expand(b.shape))
    return x.reshape(*batch, *x.shape[-2:])


def _linalg_lu_solve(LU, pivots, B, *, left=True, adjoint=False):
    result = _cpu_checks(aten.linalg_lu_solve.default, LU, pivots, B, left=left, adjoint=adjoint)
    if not _computed_here(LU, B):
        return NotImplemented
    n = LU.shape[-1]
    perm = _permutation(_flat(pivots, 1), n).reshape(*pivots.shape[:-1], n)
    return _lu_solve(LU, perm, B, left, adjoint, result.shape[:-2])


def _linalg_solve_ex(A, B, *, left=True, check_errors=False):
    result, _, _, _ = _cpu_checks(aten._linalg_solve_ex.default, A, B, left=left)
    if not _computed_here(A, B):
        return NotImplemented
    vector_case = B.dim() == 1 or (B.dim() == A.dim() - 1 and B.shape == A.shape[:-1])  # as the CPU's
    LU, pivots, info, perm = _lu_factor_batched(A)
    if check_errors:
        aten._linalg_check_errors(info, "torch.linalg.solve_ex", is_matrix=A.dim() == 2)
    rhs = B.unsqueeze(-1) if vector_case else B
    batch = result.shape[:-1] if vector_case else result.shape[:-2]
    x = _lu_solve(LU, perm, rhs, left, False, batch)
    return (x.squeeze(-1) if vector_case else x), LU, pivots, info


def _linalg_inv_ex(A, *, check_errors=False):
    _cpu_checks(aten.linalg_inv_ex.default, A)
    if not _computed_here(A):
        return NotImplemented
    LU, _, info, perm = _lu_factor_batched(A)
    if check_errors:
        aten._linalg_check_errors(info, "torch.linalg.inv_ex", is_matrix=A.dim() == 2)
    return _lu_solve(LU, perm, _identity_like(A), True, False, A.shape[:-2]), info


def _swap_parity_sign(pivots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """+1 or -1 per matrix: the sign of the permutation the row swaps ``pivots`` make."""
    steps = torch.arange(1, pivots.shape[-1] + 1, device=pivots.device, dtype=torch.int32)
    swaps = (pivots != steps).to(dtype).sum(-1)
    return 1 - 2 * torch.remainder(swaps, 2)


def _factored_for_det(A: torch.Tensor) -> torch.Tensor:
    """The matrix whose LU ``_linalg_det``/``_linalg_slogdet`` return: ``A``'s transpose when
    ``A`` is contiguous and real, as the CPU's kernel factors it (det(Aᵀ) = det(A)); their
    backward solves with these factors knowing which one they are."""
    return A.mH if A.is_contiguous() and not A.is_complex() else A


def _linalg_det(A):
    _cpu_checks(aten._linalg_det.default, A)
    if not _computed_here(A):
        return NotImplemented
    LU, pivots, _, _ = _lu_factor_batched(_factored_for_det(A))
    det = LU.diagonal(dim1=-2, dim2=-1).prod(-1) * _swap_parity_sign(pivots, A.dtype)
    return det, LU, pivots


def _linalg_slogdet(A):
    _cpu_checks(aten._linalg_slogdet.default, A)
    if not _computed_here(A):
        return NotImplemented
    LU, pivots, _, _ = _lu_factor_batched(_factored_for_det(A))
    diagonal = LU.diagonal(dim1=-2, dim2=-1)
    sign = diagonal.sign().prod(-1) * _swap_parity_sign(pivots, A.dtype)
    return sign, diagonal.abs().log().sum(-1), LU, pivots


#: The 1-norm up to which the CPU's degree-18 approximation is accurate in float32 (its thetas).
_TAYLOR_18_BOUND = 3.010066362817634
_TAYLOR_DEGREE = 18


def _linalg_matrix_exp(self):
    _cpu_checks(aten.linalg_matrix_exp.default, self)
    if not _computed_here(self) or _traced(self):
        return NotImplemented  # (in a graph: the squarings depend on the values, read on the host)
    a = _flat(self, 2)
    if a.numel() == 0:
        return self.clone()
    norms = a.abs().sum(-2).amax(-1).cpu().tolist()  # each matrix's 1-norm (largest column sum)
    squarings = [max(0, math.ceil(math.log2(norm / _TAYLOR_18_BOUND))) if norm > _TAYLOR_18_BOUND else 0
                 for norm in norms]
    scale = torch.tensor([2.0 ** -s for s in squarings], dtype=a.dtype).to(a.device)
    a = a * scale.view(-1, 1, 1)
    identity = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device).expand(a.shape)
    result = identity
    for k in range(_TAYLOR_DEGREE, 0, -1):
        result = identity + torch.bmm(a, result) / k
    remaining = torch.tensor(squarings, dtype=torch.int32).to(a.device).view(-1, 1, 1)
    for step in range(max(squarings)):  # each matrix squared as often as it was halved
        result = torch.where(remaining > step, torch.bmm(result, result), result)
    return result.reshape(self.shape)


def decompositions() -> Mapping[OpOverload, Callable]:
    """The decompositions above, keyed by aten overload (their ``out=`` forms follow)."""
    return {
        aten.linalg_solve_triangular.default: _linalg_solve_triangular,
        aten.triangular_solve.default: _triangular_solve,
        aten.linalg_cholesky_ex.default: _linalg_cholesky_ex,
        aten.cholesky.default: _cholesky,
        aten.cholesky_inverse.default: _cholesky_inverse,
        aten._cholesky_solve_helper.default: _cholesky_solve_helper,
        aten.linalg_lu_factor_ex.default: _linalg_lu_factor_ex,
        aten.linalg_lu.default: _linalg_lu,
        aten.lu_unpack.default: _lu_unpack,
        aten.linalg_lu_solve.default: _linalg_lu_solve,
        aten._linalg_solve_ex.default: _linalg_solve_ex,
        aten.linalg_inv_ex.default: _linalg_inv_ex,
        aten._linalg_det.default: _linalg_det,
        aten._linalg_slogdet.default: _linalg_slogdet,
        aten.linalg_matrix_exp.default: _linalg_matrix_exp,
    }
