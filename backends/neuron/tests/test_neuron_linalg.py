"""neuron's linear algebra (decompositions into native ops: decompositions/linalg.py,
decompositions/orthogonal.py) against the CPU with the fallback denied: float32 within the
rounding of LAPACK's differently ordered sums, batched and broadcast inputs, the CPU's
info/sign conventions for singular and non-positive-definite inputs, its exceptions for
invalid ones; eigenvectors and singular vectors, unique up to sign, by their invariants; what
neuron does not compute (complex) stays on the CPU fallback; the work shows in the estimate."""

from __future__ import annotations

import pytest
import torch

import accelkit
from conftest import run_python

aten = torch.ops.aten


def _random(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _positive_definite(*shape):
    a = _random(*shape, seed=3)
    return a @ a.mT + shape[-1] * torch.eye(shape[-1])


def _well_conditioned(*shape, upper=None):
    a = _random(*shape, seed=4) + 3 * shape[-1] ** 0.5 * torch.eye(shape[-1])
    return a if upper is None else (a.triu() if upper else a.tril())


def _on(device, *tensors):
    return [t.to(device) for t in tensors]


CASES = {
    "solve_triangular upper left": (
        lambda d: torch.linalg.solve_triangular(*_on(d, _well_conditioned(2, 5, 5, upper=True), _random(2, 5, 3)),
                                                upper=True), "aten.linalg_solve_triangular.default"),
    "solve_triangular lower right unit, broadcast": (
        lambda d: torch.linalg.solve_triangular(*_on(d, _random(4, 4).tril(), _random(3, 2, 4)), upper=False,
                                                left=False, unitriangular=True), "aten.linalg_solve_triangular.default"),
    "triangular_solve transpose": (
        lambda d: torch.triangular_solve(*_on(d, _random(2, 4, 3), _well_conditioned(4, 4, upper=False)),
                                         upper=False, transpose=True), "aten.triangular_solve.X"),
    "cholesky_ex lower, batched": (
        lambda d: torch.linalg.cholesky_ex(*_on(d, _positive_definite(2, 3, 5, 5))), "aten.linalg_cholesky_ex.L"),
    "cholesky upper": (
        lambda d: torch.linalg.cholesky(*_on(d, _positive_definite(4, 4)), upper=True), "aten.linalg_cholesky_ex.L"),
    "cholesky (deprecated op)": (
        lambda d: aten.cholesky(*_on(d, _positive_definite(2, 4, 4))), "aten.cholesky.default"),
    "cholesky_inverse": (
        lambda d: torch.cholesky_inverse(*_on(d, torch.linalg.cholesky(_positive_definite(2, 4, 4)))),
        "aten.cholesky_inverse.default"),
    "cholesky_solve upper": (
        lambda d: torch.cholesky_solve(*_on(d, _random(2, 4, 2), torch.linalg.cholesky(_positive_definite(4, 4)).mT),
                                       upper=True), "aten._cholesky_solve_helper.default"),
    "lu_factor_ex": (lambda d: torch.linalg.lu_factor_ex(*_on(d, _random(3, 5, 5))), "aten.linalg_lu_factor_ex.out"),
    "lu wide": (lambda d: torch.linalg.lu(*_on(d, _random(2, 3, 5))), "aten.linalg_lu.out"),
    "lu tall": (lambda d: torch.linalg.lu(*_on(d, _random(5, 3))), "aten.linalg_lu.out"),
    "lu_unpack": (lambda d: torch.lu_unpack(*_on(d, *torch.linalg.lu_factor(_random(2, 5, 4)))), "aten.lu_unpack.out"),
    "lu_solve": (lambda d: torch.linalg.lu_solve(*_on(d, *torch.linalg.lu_factor(_well_conditioned(2, 4, 4)),
                                                      _random(2, 4, 3))), "aten.linalg_lu_solve.out"),
    "lu_solve right adjoint": (
        lambda d: torch.linalg.lu_solve(*_on(d, *torch.linalg.lu_factor(_well_conditioned(4, 4)), _random(2, 3, 4)),
                                        left=False, adjoint=True), "aten.linalg_lu_solve.out"),
    "solve": (lambda d: torch.linalg.solve(*_on(d, _well_conditioned(2, 4, 4), _random(2, 4, 2))),
              "aten._linalg_solve_ex.result"),
    "solve vector rhs": (lambda d: torch.linalg.solve(*_on(d, _well_conditioned(2, 4, 4), _random(2, 4))),
                         "aten._linalg_solve_ex.result"),
    "solve right": (lambda d: torch.linalg.solve(*_on(d, _well_conditioned(4, 4), _random(3, 4)), left=False),
                    "aten._linalg_solve_ex.result"),
    "inv": (lambda d: torch.linalg.inv(*_on(d, _well_conditioned(3, 4, 4))), "aten.linalg_inv_ex.inverse"),
    "det": (lambda d: torch.linalg.det(*_on(d, _random(3, 4, 4))), "aten._linalg_det.result"),
    "slogdet": (lambda d: torch.linalg.slogdet(*_on(d, _random(3, 4, 4))), "aten._linalg_slogdet.sign"),
    "geqrf": (lambda d: torch.geqrf(*_on(d, _random(2, 5, 3))), "aten.geqrf.default"),
    "qr reduced": (lambda d: torch.linalg.qr(*_on(d, _random(2, 3, 5))), "aten.linalg_qr.out"),
    "qr complete": (lambda d: torch.linalg.qr(*_on(d, _random(5, 3)), mode="complete"), "aten.linalg_qr.out"),
    "qr r": (lambda d: torch.linalg.qr(*_on(d, _random(4, 4)), mode="r"), "aten.linalg_qr.out"),
    "householder_product": (
        lambda d: torch.linalg.householder_product(*_on(d, *torch.geqrf(_random(2, 5, 3)))),
        "aten.linalg_householder_product.default"),
    "eigvalsh upper, batched": (lambda d: torch.linalg.eigvalsh(*_on(d, _random(2, 5, 5)), UPLO="U"),
                                "aten._linalg_eigh.eigenvalues"),
    "matrix_exp small": (lambda d: torch.linalg.matrix_exp(*_on(d, _random(2, 4, 4) * 0.01)),
                         "aten.linalg_matrix_exp.default"),
    "matrix_exp scaled and squared": (lambda d: torch.linalg.matrix_exp(*_on(d, _random(3, 3) * 4)),
                                      "aten.linalg_matrix_exp.default"),
    "ormqr right transpose": (
        lambda d: torch.ormqr(*_on(d, *torch.geqrf(_random(4, 3)), _random(2, 4)), left=False, transpose=True),
        "aten.ormqr.default"),
}


@pytest.mark.parametrize("name", CASES)
def test_matches_the_cpu_on_the_device(dev, name):
    compute, op = CASES[name]
    want = compute("cpu")
    with accelkit.fallback_policy("deny"):
        got = compute(dev)
    want, got = ([want], [got]) if isinstance(want, torch.Tensor) else (list(want), list(got))
    for actual, expected in zip(got, want):
        assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape)
        # float32, summed in another order than LAPACK's blocked kernels
        torch.testing.assert_close(actual.cpu(), expected, rtol=1e-4, atol=1e-4)
    assert accelkit.stats()["ops"][op]["decomposed"] >= 1


@pytest.mark.parametrize("UPLO", ["L", "U"])
def test_eigh_gives_the_cpus_eigenvalues_and_an_eigenbasis_of_the_named_triangle(dev, UPLO):
    a = _random(2, 6, 6, seed=5)
    a[..., 0, 1] = a[..., 1, 0] = 0  # an already zero rotation pair
    want_values, want_vectors = torch.linalg.eigh(a, UPLO=UPLO)
    with accelkit.fallback_policy("deny"):
        values, vectors = (t.cpu() for t in torch.linalg.eigh(a.to(dev), UPLO=UPLO))
    torch.testing.assert_close(values, want_values, rtol=1e-4, atol=1e-4)
    symmetric = a.tril() + a.tril(-1).mT if UPLO == "L" else a.triu() + a.triu(1).mT
    torch.testing.assert_close(vectors @ torch.diag_embed(values) @ vectors.mT, symmetric, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(vectors.mT @ vectors, torch.eye(6).expand(2, 6, 6), rtol=1e-4, atol=1e-4)
    # distinct eigenvalues: each eigenvector is the CPU's up to its sign
    torch.testing.assert_close(vectors.abs(), want_vectors.abs(), rtol=1e-3, atol=1e-3)


def test_matrix_exp_scales_each_matrix_of_a_batch_by_its_own_norm(dev):
    a = torch.stack([_random(4, 4, seed=6) * 0.01, _random(4, 4, seed=7) * 6])  # 0 and several squarings
    with accelkit.fallback_policy("deny"):
        got = torch.linalg.matrix_exp(a.to(dev)).cpu().double()
    exact = torch.linalg.matrix_exp(a.double())
    cpu = torch.linalg.matrix_exp(a).double()
    # float32 rounding of each matrix's largest entries, as the CPU's own distance from float64
    scale = exact.abs().amax((-2, -1), keepdim=True)
    error, cpu_error = ((got - exact).abs() / scale).amax(), ((cpu - exact).abs() / scale).amax()
    assert error < max(4 * cpu_error, 1e-6), (error, cpu_error)


@pytest.mark.parametrize("shape", [(5, 3), (2, 3, 5), (4, 4), (2, 0, 3)])
@pytest.mark.parametrize("full_matrices", [True, False])
def test_svd_gives_the_cpus_singular_values_and_orthonormal_vectors(dev, shape, full_matrices):
    a = _random(*shape, seed=8)
    want_u, want_s, want_vh = torch.linalg.svd(a, full_matrices=full_matrices)
    with accelkit.fallback_policy("deny"):
        u, s, vh = (t.cpu() for t in torch.linalg.svd(a.to(dev), full_matrices=full_matrices))
    assert (u.shape, s.shape, vh.shape) == (want_u.shape, want_s.shape, want_vh.shape)
    k = s.shape[-1]
    torch.testing.assert_close(s, want_s, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(u.mT @ u, torch.eye(u.shape[-1]).expand(*shape[:-2], -1, -1), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(vh @ vh.mT, torch.eye(vh.shape[-2]).expand(*shape[:-2], -1, -1), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(u[..., :k] @ torch.diag_embed(s) @ vh[..., :k, :], a, rtol=1e-4, atol=1e-4)
    # distinct singular values: each singular vector is the CPU's up to its sign
    torch.testing.assert_close(u[..., :k].abs(), want_u[..., :k].abs(), rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(vh[..., :k, :].abs(), want_vh[..., :k, :].abs(), rtol=1e-3, atol=1e-3)


def test_svd_of_a_rank_deficient_matrix_completes_u_orthonormally(dev):
    a = _random(4, 3, seed=9)
    a[:, 2] = 0
    with accelkit.fallback_policy("deny"):
        u, s, vh = (t.cpu() for t in torch.linalg.svd(a.to(dev), full_matrices=False))
    torch.testing.assert_close(s, torch.linalg.svdvals(a), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(u.mT @ u, torch.eye(3), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(u @ torch.diag(s) @ vh, a, rtol=1e-4, atol=1e-4)


SINGULAR = torch.tensor([[[1.0, 2.0], [2.0, 4.0]], [[0.0, 0.0], [0.0, 0.0]], [[2.0, 1.0], [1.0, 3.0]]])


@pytest.mark.parametrize("compute", [
    lambda A: torch.linalg.lu_factor_ex(A),
    lambda A: torch.linalg.det(A),
    lambda A: torch.linalg.slogdet(A),
    lambda A: torch.linalg.inv_ex(A)[1],  # the inverse of a singular matrix is LAPACK's garbage
    lambda A: torch.linalg.cholesky_ex(A)[1],
], ids=["lu_factor_ex", "det", "slogdet", "inv_ex info", "cholesky_ex info"])
def test_singular_and_indefinite_inputs_give_the_cpus_info_and_signs(dev, compute):
    want = compute(SINGULAR)
    with accelkit.fallback_policy("deny"):
        got = compute(SINGULAR.to(dev))
    want, got = ([want], [got]) if isinstance(want, torch.Tensor) else (list(want), list(got))
    for actual, expected in zip(got, want):
        torch.testing.assert_close(actual.cpu(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("compute", [
    lambda A: torch.linalg.inv(A),
    lambda A: torch.linalg.solve(A, A[..., 0]),
    lambda A: torch.linalg.cholesky(A),
    lambda A: torch.linalg.lu_factor(A),
    lambda A: torch.linalg.solve_triangular(A, A, upper=True),
], ids=["inv", "solve", "cholesky", "lu_factor", "solve_triangular"])
@pytest.mark.parametrize("A", [SINGULAR, torch.ones(2, 3), torch.ones(3)], ids=["singular", "non-square", "vector"])
def test_errors_are_the_cpus(dev, compute, A):
    try:
        compute(A)
    except Exception as cpu_error:  # noqa: BLE001 - the CPU's type is the expectation
        with accelkit.fallback_policy("deny"), pytest.raises(type(cpu_error)) as device_error:
            compute(A.to(dev))
        assert str(device_error.value) == str(cpu_error)
    else:
        with accelkit.fallback_policy("deny"):
            compute(A.to(dev))  # the CPU accepts it (a triangular solve of a singular matrix): so does neuron


@pytest.mark.parametrize("shape", [(0, 0), (2, 0, 0), (0, 3, 3)], ids=["0x0", "batch of 0x0", "empty batch"])
@pytest.mark.parametrize("compute", [
    torch.linalg.det, torch.linalg.slogdet, torch.linalg.inv_ex, torch.linalg.lu_factor_ex, torch.linalg.lu,
    torch.linalg.cholesky_ex, torch.linalg.qr, torch.geqrf, torch.linalg.eigh, torch.linalg.matrix_exp,
    lambda A: torch.linalg.solve(A, A), lambda A: torch.linalg.solve_triangular(A, A, upper=False),
], ids=["det", "slogdet", "inv_ex", "lu_factor_ex", "lu", "cholesky_ex", "qr", "geqrf", "eigh", "matrix_exp",
        "solve", "solve_triangular"])
def test_empty_matrices_and_batches_give_the_cpus_results(dev, shape, compute):
    A = torch.zeros(shape)
    want = compute(A)
    with accelkit.fallback_policy("deny"):
        got = compute(A.to(dev))
    want, got = ([want], [got]) if isinstance(want, torch.Tensor) else (list(want), list(got))
    for actual, expected in zip(got, want):
        assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape)
        torch.testing.assert_close(actual.cpu(), expected)


def test_complex_inputs_take_the_cpu_fallback(dev):
    a = torch.complex(_random(3, 3), _random(3, 3, seed=1)) + 3 * torch.eye(3)
    with accelkit.fallback_policy("deny"), pytest.raises(Exception):
        torch.linalg.inv(a.to(dev))
    torch.testing.assert_close(torch.linalg.inv(a.to(dev)).cpu(), torch.linalg.inv(a), rtol=1e-5, atol=1e-5)


def test_the_decomposed_work_shows_in_the_estimate(dev):
    with accelkit.fallback_policy("deny"):
        torch.linalg.solve(_well_conditioned(3, 3).to(dev), _random(3, 2).to(dev)).cpu()
    estimate = accelkit.stats()["neuron"]["estimate"]
    assert estimate["device_seconds"] > 0 and estimate["flops"] > 0
    assert {"bmm.default", "argmax.default", "gather.default"} <= set(estimate["per_op"])  # substitution, pivots, swaps


def test_compiled_factorisations_lower_into_the_graph_and_host_read_ones_stay_whole(dev):
    """torch.compile traces the decompositions on fake tensors: their meta checks must not
    re-enter them, and the ones that read values on the host (Jacobi's sweeps) stay ops."""
    torch._dynamo.reset()
    a = _positive_definite(4, 4)
    with accelkit.fallback_policy("deny"):
        # cholesky_ex: linalg.cholesky's own error check is an effectful graph node neuron does not lower
        factor = torch.compile(lambda x: torch.linalg.cholesky_ex(x).L + 1, backend="neuron")(a.to(dev)).cpu()
    torch.testing.assert_close(factor, torch.linalg.cholesky(a) + 1, rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()
    with accelkit.fallback_policy("allow"):
        values = torch.compile(lambda x: torch.linalg.eigvalsh(x) * 2, backend="neuron")(a.to(dev)).cpu()
    torch.testing.assert_close(values, torch.linalg.eigvalsh(a) * 2, rtol=1e-4, atol=1e-4)


def test_float64_downcast_runs_the_decompositions_in_float32():
    result = run_python("""
        import torch, accelkit
        dev = accelkit.select_device("neuron")
        a = torch.randn(2, 4, 4, dtype=torch.float64) + 4 * torch.eye(4, dtype=torch.float64)
        with accelkit.fallback_policy("deny"):
            inverse = torch.linalg.inv(a.to(dev)).cpu()
        assert inverse.dtype == torch.float64
        error = (inverse - torch.linalg.inv(a)).abs().max().item()
        assert 0 < error < 1e-5, error  # float32's rounding, not float64's
        print("ok")
    """, env={"ACCELKIT_NEURON_FLOAT64": "downcast"})
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("op", ["det", "slogdet"])
def test_det_and_slogdet_gradients_match_the_cpu(dev, layout, op):
    """``_linalg_det``/``_linalg_slogdet`` return the LU of ``A``'s transpose when ``A`` is
    contiguous and real, as the CPU's kernel does: their backward solves with those factors
    (with the factors of ``A`` itself, the gradient was wrong where the pivots differ)."""
    x = torch.randn(3, 5, 5, generator=torch.Generator().manual_seed(11))
    if layout == "transposed":
        x = x.mT
    fn = torch.linalg.det if op == "det" else (lambda a: torch.linalg.slogdet(a).logabsdet)

    def value_and_grad(a):
        a = a.detach().clone().requires_grad_() if layout == "contiguous" else a.detach().mT.clone().mT.requires_grad_()
        fn(a).sum().backward()
        return fn(a).detach().cpu(), a.grad.cpu()

    expected, got = value_and_grad(x), value_and_grad(x.to(dev))
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-4)
    aten_op = torch.ops.aten._linalg_det if op == "det" else torch.ops.aten._linalg_slogdet
    *_, lu, pivots = aten_op(x)
    *_, device_lu, device_pivots = aten_op(x.to(dev))
    assert torch.equal(device_pivots.cpu(), pivots)
    torch.testing.assert_close(device_lu.cpu(), lu, atol=1e-5, rtol=1e-5)
