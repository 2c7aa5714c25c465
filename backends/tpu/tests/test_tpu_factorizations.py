"""tpu matrix factorizations and solvers (kernels/factorizations.py), against CPU torch: LU (factor,
unpack, solve), ``linalg.solve`` and its gradient, inverse, determinant and log-determinant,
Cholesky (solve, inverse), triangular solves, QR, ``geqrf`` with ``householder_product`` and
``ormqr`` (Q or its conjugate transpose from either side, real and complex), SVD, eigh, the matrix
exponential, least squares (``linalg.lstsq``: every driver's result set, rank-deficient
minimum-norm solutions, vector right-hand sides, broadcast batches, complex input) and empty
matrices.

Results unique only up to signs (SVD, eigh, QR vectors) are checked through what is unique:
singular values, reconstructions, absolute values. LU factors, pivots, ``info`` and solutions
are compared directly with LAPACK's (CPU) ones.
"""

from __future__ import annotations

import pytest
import torch

import accelkit
from conftest import assert_native, on_device

TOL = {"atol": 1e-4, "rtol": 1e-4}


def matrix(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def spd(n, batch=(), seed=0):
    a = matrix(*batch, n, n, seed=seed)
    return a @ a.mT + n * torch.eye(n)


def same(got, want, tol=TOL):
    assert got.device.type == "tpu" and got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, **tol)


def test_lu_factor_matches_lapack_including_pivots_and_info(dev):
    a = matrix(2, 5, 5)
    lu, piv, info = torch.linalg.lu_factor_ex(a)
    dlu, dpiv, dinfo = torch.linalg.lu_factor_ex(a.to(dev))
    same(dlu, lu)
    assert torch.equal(dpiv.cpu(), piv) and dpiv.dtype == torch.int32
    assert torch.equal(dinfo.cpu(), info)
    assert_native("aten.linalg_lu_factor_ex.default")


def test_lu_factor_info_names_the_zero_pivot(dev):
    a = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 0.0, 1.0]])
    want = torch.linalg.lu_factor_ex(a).info
    got = torch.linalg.lu_factor_ex(a.to(dev)).info.cpu()
    assert want.item() != 0 and torch.equal(got, want)


def test_linalg_lu_of_wide_and_tall_matrices(dev):
    for shape in [(4, 6), (6, 4)]:
        a = matrix(*shape)
        for got, want in zip(torch.linalg.lu(a.to(dev)), torch.linalg.lu(a)):
            same(got, want)
    assert_native("aten.linalg_lu.default")


def test_lu_unpack_and_lu_solve(dev):
    a, b = matrix(3, 4, 4), matrix(3, 4, 2, seed=1)
    lu, piv = torch.linalg.lu_factor(a)
    for got, want in zip(torch.lu_unpack(lu.to(dev), piv.to(dev)), torch.lu_unpack(lu, piv)):
        same(got, want)
    for left, adjoint in [(True, False), (True, True), (False, False)]:
        rhs = b if left else b.mT
        want = torch.linalg.lu_solve(lu, piv, rhs, left=left, adjoint=adjoint)
        same(torch.linalg.lu_solve(lu.to(dev), piv.to(dev), rhs.to(dev), left=left, adjoint=adjoint), want)
    assert_native("aten.lu_unpack.default", "aten.linalg_lu_solve.default")


@pytest.mark.parametrize("contiguous", [True, False])
def test_solve_matrix_and_vector_rhs_both_layouts(dev, contiguous):
    a = matrix(2, 4, 4)
    a = a if contiguous else a.mT
    b, v = matrix(2, 4, 3, seed=1), matrix(2, 4, seed=2)
    da = on_device(a, dev)
    same(torch.linalg.solve(da, b.to(dev)), torch.linalg.solve(a, b))
    same(torch.linalg.solve(da, v.to(dev)), torch.linalg.solve(a, v))
    same(torch.linalg.solve(da, b.mT.to(dev), left=False), torch.linalg.solve(a, b.mT, left=False))
    assert_native("aten._linalg_solve_ex.default")


@pytest.mark.parametrize("contiguous", [True, False])
def test_solve_gradient_uses_the_factorization_it_saved(dev, contiguous):
    """PyTorch's backward reuses LU/pivots, assuming A^T was factored iff A is contiguous."""
    a, b = matrix(4, 4), matrix(4, 2, seed=1)
    grads = []
    for device in ["cpu", dev]:
        leaf = a.clone().to(device).requires_grad_()
        used = leaf if contiguous else leaf.mT
        torch.linalg.solve(used, b.to(device)).sum().backward()
        grads.append(leaf.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0], **TOL)


@pytest.mark.parametrize("contiguous", [True, False])
def test_det_and_slogdet_gradients_use_the_factorization_they_saved(dev, contiguous):
    """det/slogdet factor A^T when A is contiguous and real; their backward relies on it."""
    a = matrix(4, 4)
    for fn in [torch.linalg.det, lambda t: torch.linalg.slogdet(t).logabsdet]:
        grads = []
        for device in ["cpu", dev]:
            leaf = a.clone().to(device).requires_grad_()
            fn(leaf if contiguous else leaf.mT).backward()
            grads.append(leaf.grad.cpu())
        torch.testing.assert_close(grads[1], grads[0], **TOL)


def test_solve_of_singular_matrix_raises_like_cpu(dev):
    a = torch.zeros(3, 3)
    with pytest.raises(RuntimeError, match="singular"):
        torch.linalg.solve(a, torch.ones(3))
    with pytest.raises(RuntimeError, match="singular"):
        torch.linalg.solve(a.to(dev), torch.ones(3).to(dev))


def test_inv_and_info(dev):
    a = matrix(3, 5, 5)
    inv, info = torch.linalg.inv_ex(a)
    dinv, dinfo = torch.linalg.inv_ex(a.to(dev))
    same(dinv, inv, {"atol": 1e-3, "rtol": 1e-3})
    assert torch.equal(dinfo.cpu(), info)
    assert_native("aten.linalg_inv_ex.default")


@pytest.mark.parametrize("contiguous", [True, False])
def test_det_and_slogdet(dev, contiguous):
    a = matrix(3, 4, 4)
    a = a if contiguous else a.mT
    da = on_device(a, dev)
    same(torch.linalg.det(da), torch.linalg.det(a))
    sign, logdet = torch.linalg.slogdet(a)
    dsign, dlogdet = torch.linalg.slogdet(da)
    same(dsign, sign)
    same(dlogdet, logdet)
    assert_native("aten._linalg_det.default", "aten._linalg_slogdet.default")


def test_det_of_singular_matrix_is_zero_and_slogdet_minus_inf(dev):
    a = torch.tensor([[1.0, 2.0], [2.0, 4.0]]).to(dev)
    assert torch.linalg.det(a).item() == 0
    sign, logdet = torch.linalg.slogdet(a)
    assert sign.item() == 0 and logdet.item() == float("-inf")


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_reads_one_triangle(dev, upper):
    a = spd(4, (2,))
    junk = a + torch.triu(torch.full_like(a, 7.0), 1) if not upper else a + torch.tril(torch.full_like(a, 7.0), -1)
    want, info = torch.linalg.cholesky_ex(junk, upper=upper)
    got, dinfo = torch.linalg.cholesky_ex(junk.to(dev), upper=upper)
    same(got, want)
    assert torch.equal(dinfo.cpu(), info)
    assert_native("aten.linalg_cholesky_ex.default")


def test_cholesky_of_indefinite_matrix_reports_info_and_raises(dev):
    a = torch.diag(torch.tensor([1.0, -1.0, 2.0]))
    assert torch.linalg.cholesky_ex(a.to(dev)).info.item() == torch.linalg.cholesky_ex(a).info.item() == 2
    with pytest.raises(RuntimeError, match="not positive-definite"):
        torch.linalg.cholesky(a.to(dev))


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_solve_and_inverse(dev, upper):
    factor = torch.linalg.cholesky(spd(4), upper=upper)
    b = matrix(4, 3, seed=1)
    same(torch.cholesky_solve(b.to(dev), factor.to(dev), upper=upper), torch.cholesky_solve(b, factor, upper=upper))
    same(torch.cholesky_inverse(factor.to(dev), upper=upper), torch.cholesky_inverse(factor, upper=upper))
    assert_native("aten._cholesky_solve_helper.default", "aten.cholesky_inverse.default")


@pytest.mark.parametrize("upper, left, unit", [(True, True, False), (False, False, True), (False, True, False)])
def test_solve_triangular(dev, upper, left, unit):
    a = matrix(4, 4) + 4 * torch.eye(4)
    b = matrix(4, 2, seed=1) if left else matrix(2, 4, seed=1)
    want = torch.linalg.solve_triangular(a, b, upper=upper, left=left, unitriangular=unit)
    same(torch.linalg.solve_triangular(a.to(dev), b.to(dev), upper=upper, left=left, unitriangular=unit), want)
    assert_native("aten.linalg_solve_triangular.default")


def test_deprecated_triangular_solve_with_transpose(dev):
    a, b = matrix(2, 3, 3) + 3 * torch.eye(3), matrix(2, 3, 2, seed=1)
    want = torch.triangular_solve(b, a, upper=False, transpose=True)
    got = torch.triangular_solve(b.to(dev), a.to(dev), upper=False, transpose=True)
    same(got.solution, want.solution)
    same(got.cloned_coefficient, want.cloned_coefficient)
    assert_native("aten.triangular_solve.default")


@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_qr_reconstructs_and_r_matches_up_to_row_signs(dev, mode):
    a = matrix(5, 3)
    q, r = torch.linalg.qr(a.to(dev), mode=mode)
    _, want_r = torch.linalg.qr(a, mode=mode)
    torch.testing.assert_close(r.cpu().abs(), want_r.abs(), **TOL)
    if mode != "r":
        torch.testing.assert_close((q @ r).cpu(), a, **TOL)
    else:
        assert q.numel() == 0
    assert_native("aten.linalg_qr.default")


def test_geqrf_and_householder_product_rebuild_q(dev):
    a = matrix(5, 3)
    h, tau = torch.geqrf(a)
    dh, dtau = torch.geqrf(a.to(dev))
    same(dh, h)
    same(dtau, tau)
    same(torch.linalg.householder_product(dh, dtau), torch.linalg.householder_product(h, tau))
    assert_native("aten.geqrf.default", "aten.linalg_householder_product.default")


@pytest.mark.parametrize("shape, full", [((4, 6), False), ((6, 4), True), ((2, 3, 3), False)])
def test_svd_values_and_reconstruction(dev, shape, full):
    a = matrix(*shape)
    u, s, vh = torch.linalg.svd(a.to(dev), full_matrices=full)
    same(s, torch.linalg.svdvals(a))
    k = s.shape[-1]
    rebuilt = (u[..., :k] * s.unsqueeze(-2)) @ vh[..., :k, :]
    torch.testing.assert_close(rebuilt.cpu(), a, **TOL)
    same(torch.linalg.svdvals(a.to(dev)), torch.linalg.svdvals(a))
    assert_native("aten._linalg_svd.default")


@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigh_reads_one_triangle(dev, uplo):
    a = matrix(5, 5)  # not symmetric: only the UPLO triangle counts
    w, v = torch.linalg.eigh(a, UPLO=uplo)
    dw, dv = torch.linalg.eigh(a.to(dev), UPLO=uplo)
    same(dw, w)
    torch.testing.assert_close(dv.cpu().abs(), v.abs(), **TOL)
    same(torch.linalg.eigvalsh(a.to(dev), UPLO=uplo), w)
    assert_native("aten._linalg_eigh.default")


def test_matrix_exp(dev):
    a = matrix(2, 4, 4) / 3
    same(torch.linalg.matrix_exp(a.to(dev)), torch.linalg.matrix_exp(a))
    assert_native("aten.linalg_matrix_exp.default")


def test_matrix_exp_of_bfloat16_is_the_float32_result_rounded(dev):
    # jax's expm refuses bfloat16; CPU takes it (and, in torch 2.13, returns inf or NaN for
    # most 4x4 bfloat16 inputs, so CPU's float32 result is the reference here).
    a = (matrix(2, 4, 4) / 3).bfloat16()
    got = torch.linalg.matrix_exp(a.to(dev))
    assert got.dtype == torch.bfloat16
    assert torch.equal(got.cpu(), torch.linalg.matrix_exp(a.float()).bfloat16())


def test_factorizations_of_empty_matrices(dev):
    empty = torch.empty(2, 0, 0)
    assert torch.linalg.cholesky_ex(empty.to(dev)).L.shape == (2, 0, 0)
    assert torch.linalg.cholesky_ex(empty.to(dev)).info.cpu().tolist() == [0, 0]
    assert torch.linalg.inv(empty.to(dev)).shape == (2, 0, 0)
    same(torch.linalg.det(empty.to(dev)), torch.linalg.det(empty))


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("shape, other", [((5, 3), 4), ((2, 6, 6), 2), ((4, 4), 1)])
def test_ormqr_matches_cpu(dev, dtype, left, transpose, shape, other):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(shape, generator=g, dtype=dtype)
    factor, tau = torch.geqrf(a)
    m = shape[-2]
    c = torch.randn(shape[:-2] + ((m, other) if left else (other, m)), generator=g, dtype=dtype)
    want = torch.ormqr(factor, tau, c, left=left, transpose=transpose)
    with accelkit.fallback_policy("deny"):
        got = torch.ormqr(factor.to(dev), tau.to(dev), c.to(dev), left=left, transpose=transpose)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    assert_native("aten.ormqr.default")


def test_ormqr_empty(dev):
    factor, tau, c = torch.empty(0, 0), torch.empty(0), torch.empty(0, 3)
    with accelkit.fallback_policy("deny"):
        got = torch.ormqr(factor.to(dev), tau.to(dev), c.to(dev))
    assert got.shape == (0, 3)


def check_lstsq(dev, a, b, **kwargs):
    want = torch.linalg.lstsq(a, b, **kwargs)
    with accelkit.fallback_policy("deny"):
        got = torch.linalg.lstsq(a.to(dev), b.to(dev), **kwargs)
    for name, g, w in zip(("solution", "residuals", "rank", "singular_values"), got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        torch.testing.assert_close(g.cpu(), w, msg=name, **TOL)


@pytest.mark.parametrize("driver", [None, "gelsy", "gelsd", "gelss", "gels"])
@pytest.mark.parametrize("shape", [(6, 3), (3, 3), (2, 4)])
def test_every_driver_and_shape(dev, driver, shape):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, *shape, generator=g), torch.randn(2, shape[0], 2, generator=g)
    check_lstsq(dev, a, b, driver=driver)
    assert_native("aten.linalg_lstsq.default")


@pytest.mark.parametrize("driver", ["gelsy", "gelsd"])
@pytest.mark.parametrize("seed", range(4))
def test_rank_deficient_minimum_norm_solution(dev, driver, seed):
    # The reference is the minimum-norm solution computed in float64 (the pseudo-inverse), not
    # the CPU's float32 LAPACK: whether its rank-revealing QR keeps the zero singular value's
    # rounding (about 1e-7, at the float32 threshold) depends on the host CPU's kernels: on one
    # CI machine the CPU's gelsy gave 1.2e-4 for seed 1's x[1, 0], where the solution is 1.45.
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(5, 3, generator=g)
    a[:, 2] = 2 * a[:, 0]
    b = torch.randn(5, 2, generator=g)
    want = (torch.linalg.pinv(a.double()) @ b.double()).float()
    with accelkit.fallback_policy("deny"):
        got = torch.linalg.lstsq(a.to(dev), b.to(dev), driver=driver)
    torch.testing.assert_close(got.solution.cpu(), want, **TOL)
    assert int(got.rank) == 2


def test_vector_rhs_broadcast_batch_and_complex(dev):
    check_lstsq(dev, torch.randn(5, 3), torch.randn(5), driver="gelsd")
    check_lstsq(dev, torch.randn(2, 4, 3), torch.randn(1, 4, 2), driver="gelss")
    check_lstsq(dev, torch.randn(5, 3, dtype=torch.complex64), torch.randn(5, 2, dtype=torch.complex64),
                driver="gelsd")
