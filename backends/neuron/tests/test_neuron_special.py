"""neuron's special functions (``torch.special``, kernels/special.py) vs CPU PyTorch, fallback denied.

Tolerance: neuron evaluates the CPU's own approximations (the same Cephes coefficients, branch
points and recurrences) in fp32, but its activation tables are not the CPU's libm, the CPU
fuses some multiply-adds, and a recurrence or a cancelling sum amplifies a last-bit difference
by the function's condition number. That amplification is measured, per element, by the CPU's
own float32 error against its float64 result: neuron may be off from the CPU's float32 result
by four times that, plus a few float32 ulps of the result (and of the function's scale, for
values near a zero of an O(1) function), plus what a few ulps of the argument move the result
by (``|x f'(x)| eps``, from the CPU's float64 function): the Scalar engine's square root is not
the CPU's correctly rounded one, and where a function oscillates fast (Airy's and Bessel's
phases at large |x|) one ulp of an intermediate that carries x shows in the result. Special
values (NaN, infinities, the exact values at the ends of an interval, a negative degree) must
be exactly the CPU's.
"""

from __future__ import annotations

import pytest
import torch

import accelkit
from conftest import assert_native

S = torch.special

UNARY = ["bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "spherical_bessel_j0",
         "modified_bessel_i0", "modified_bessel_i1", "modified_bessel_k0", "modified_bessel_k1",
         "scaled_modified_bessel_k0", "scaled_modified_bessel_k1", "i0e", "i1", "i1e", "ndtri",
         "airy_ai", "erfcx"]
#: Functions whose CPU kernel also computes bfloat16/float16 (in float32, rounded once).
NARROW = ["i0e", "i1", "i1e"]
POLYNOMIALS = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
               "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t",
               "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
               "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he",
               "laguerre_polynomial_l", "legendre_polynomial_p"]
#: Zeros, tiny arguments, the branch points (Bessel 5 and 8, Airy +-2.09 and 8.32), large ones.
SPECIAL_VALUES = [0.0, -0.0, 1e-6, -1e-6, 2.0, 5.0, -5.0, 8.0, -8.0, 30.0, -30.0, 100.0, 2.09,
                  -2.09, 8.33, 103.9, -50.0, float("nan"), float("inf"), -float("inf")]
PROBABILITIES = [0.0, 1.0, -0.1, 1.1, 1e-20, 1e-10, 0.5, 0.13533528, 0.8646647, float("nan")]
#: A few float32 ulps (of the result, or of an O(1) function's scale near its zeros).
ULPS = 8 * torch.finfo(torch.float32).eps


def _arguments(name: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if name == "ndtri":
        return torch.cat([torch.rand(500, generator=g), torch.tensor(PROBABILITIES)])
    # 500 random arguments over several branches, then each branch point and special value
    return torch.cat([torch.randn(500, generator=g) * 6, torch.tensor(SPECIAL_VALUES)])


def _on_device(fn, dev, *args):
    with accelkit.fallback_policy("deny"):
        moved = [a.to(dev) if isinstance(a, torch.Tensor) else a for a in args]
        return fn(*moved).cpu()


def _assert_as_accurate_as_cpu(actual: torch.Tensor, fn, *args, scale=0.0) -> None:
    expected = fn(*args)
    reference = fn(*(a.double() if isinstance(a, torch.Tensor) else a for a in args))
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    finite = torch.isfinite(expected)
    # Special values: exactly the CPU's (NaN where it is NaN, the same infinities).
    assert torch.equal(torch.isnan(actual), torch.isnan(expected))
    assert torch.equal(actual[torch.isinf(expected)], expected[torch.isinf(expected)])
    cpu_error = (expected.double() - reference).abs()
    allowed = 4 * cpu_error + ULPS * (expected.double().abs() + scale) + _argument_sensitivity(fn, args)
    error = (actual.double() - expected.double()).abs()
    worst = torch.argmax(torch.where(finite, error - allowed, -torch.inf))
    assert bool((error[finite] <= allowed[finite]).all()), (
        f"worst at argument index {int(worst)}: expected {expected[worst].item()!r}, "
        f"got {actual[worst].item()!r}, CPU float32 error {cpu_error[worst].item():.3g}")


def _argument_sensitivity(fn, args) -> torch.Tensor | float:
    """``|f(x (1 + 4 eps)) - f(x (1 - 4 eps))| / 2`` in float64: the result's change for four
    float32 ulps of the argument ``x`` (the first argument, when it is a tensor)."""
    if not isinstance(args[0], torch.Tensor):
        return 0.0
    x, rest = args[0].double(), [a.double() if isinstance(a, torch.Tensor) else a for a in args[1:]]
    step = x * 4 * torch.finfo(torch.float32).eps
    change = (fn(x + step, *rest) - fn(x - step, *rest)).abs() / 2
    return change.nan_to_num(0.0, posinf=0.0)


@pytest.mark.parametrize("name", UNARY)
def test_unary_matches_cpu(dev, name):
    fn = getattr(S, name)
    x = _arguments(name)
    actual = _on_device(fn, dev, x)
    assert_native(f"aten.special_{name}.default")
    assert accelkit.stats()["neuron"]["estimate"]["per_op"][f"special_{name}.default"]["seconds"] > 0
    # Bessel J and Y are O(1) and cross zero: near a zero the error is absolute.
    _assert_as_accurate_as_cpu(actual, fn, x, scale=1.0 if name.startswith("bessel") else 0.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", NARROW)
def test_narrow_dtypes_compute_in_float32_and_round_once(dev, name, dtype):
    fn = getattr(S, name)
    x = _arguments(name).to(dtype)
    actual = _on_device(fn, dev, x)
    assert_native(f"aten.special_{name}.default")
    expected = fn(x)
    assert actual.dtype == dtype
    assert torch.equal(torch.isnan(actual), torch.isnan(expected))
    # Both round an fp32 value a few fp32 ulps apart: equal, or one step of the narrow type.
    torch.testing.assert_close(actual, expected, rtol=torch.finfo(dtype).eps, atol=0, equal_nan=True)


def test_log_ndtr_decomposes_into_native_ops(dev):
    """``log_ndtr`` is a decomposition whose lower tail is ``erfcx``: all of it on the device."""
    x = _arguments("log_ndtr")
    actual = _on_device(S.log_ndtr, dev, x)
    assert_native("aten.special_erfcx.default")
    _assert_as_accurate_as_cpu(actual, S.log_ndtr, x)


def test_out_form_runs_natively(dev):
    x = _arguments("bessel_j0")
    out = torch.empty_like(x).to(dev)
    with accelkit.fallback_policy("deny"):
        S.bessel_j0(x.to(dev), out=out)
    _assert_as_accurate_as_cpu(out.cpu(), S.bessel_j0, x, scale=1.0)


def _points(name: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    x = torch.rand(400, generator=g) * 2.4 - 1.2  # inside [-1, 1] and a little beyond
    if name.startswith("shifted"):
        x = x * 0.5 + 0.5
    return torch.cat([x, torch.tensor([1.0, -1.0, 0.0, 0.5, 2.0, -3.0])])


def _degrees(like: torch.Tensor) -> torch.Tensor:
    return torch.randint(-2, 15, like.shape, generator=torch.Generator().manual_seed(2))


#: How the degree is given: an integer tensor, a float tensor (truncated), a number; or the
#: argument as a number.
FORMS = {
    "int_n": lambda x, n: (x, n),
    "float_n": lambda x, n: (x, n.float() + 0.6),
    "n_scalar": lambda x, n: (x, 9),
    "x_scalar": lambda x, n: (0.3, n),
}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomial_matches_cpu(dev, name, form):
    fn = getattr(S, name)
    x = _points(name)
    args = FORMS[form](x, _degrees(x))
    actual = _on_device(fn, dev, *args)
    assert accelkit.stats()["ops"].get(f"aten.special_{name}.default", {}).get("fallback", 0) == 0
    # A last-bit difference (in acos for the closed forms, in each step of a recurrence) grows
    # at most linearly with the degree: a few ulps per degree of the value's magnitude.
    degree = torch.as_tensor(args[1]).double().nan_to_num(0).abs().clamp(min=1)
    _assert_as_accurate_as_cpu(actual, fn, *args, scale=degree * (1 + fn(*args).double().abs()))


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomial_edge_cases_are_the_cpus(dev, name):
    """A negative, NaN or infinite degree gives 0; the points the CPU treats apart their exact
    values (x = +-1 and 0; 1 and 0 shifted; Laguerre's and Hermite's x = 0, where the recurrence
    is exact in integers); Hermite degrees above 128 NaN (the CPU's float limit)."""
    fn = getattr(S, name)
    if name.startswith("shifted"):
        ends = [0.0, 1.0]
    elif name.startswith(("laguerre", "hermite")):
        ends = [0.0]
    else:
        ends = [-1.0, 1.0, 0.0]
    x = torch.tensor(ends * 7)
    n = torch.tensor([-3.0, -1.0, 0.0, 1.0, 2.0, 7.0, 10.0] * len(ends)).reshape(len(ends), 7).t().reshape(-1)
    for degrees in (n, torch.tensor([float("nan"), float("inf"), -float("inf")] * 7)[: len(x)]):
        actual = _on_device(fn, dev, x, degrees)
        torch.testing.assert_close(actual, fn(x, degrees), rtol=0, atol=0, equal_nan=True)
    if name.startswith("hermite"):
        high = torch.tensor([128, 129, 300])
        actual = _on_device(fn, dev, torch.tensor([0.01, 0.01, 0.01]), high)
        assert torch.equal(torch.isnan(actual), torch.isnan(fn(torch.tensor([0.01] * 3), high)))


def test_degree_above_the_unrolled_limit_takes_the_cpu(dev):
    from accelkit_backends.neuron.kernels.special import MAX_DEGREE

    x, n = torch.tensor([0.3, 1.5]), torch.tensor([3, MAX_DEGREE + 1])
    with pytest.raises(RuntimeError, match="neuron kernel declined these arguments and the CPU fallback is denied"):
        _on_device(S.legendre_polynomial_p, dev, x, n)
    with accelkit.fallback_policy("allow"):
        actual = S.legendre_polynomial_p(x.to(dev), n.to(dev)).cpu()
    torch.testing.assert_close(actual, S.legendre_polynomial_p(x, n), equal_nan=True)


def test_a_dtype_the_cpu_lacks_gets_the_cpus_error(dev):
    x = torch.tensor([0.5, 2.0], dtype=torch.bfloat16)
    with accelkit.fallback_policy("allow"), pytest.raises(RuntimeError, match="not implemented for 'BFloat16'"):
        S.bessel_j0(x.to(dev))


@pytest.mark.parametrize("name", ["bessel_y1", "i1e", "airy_ai", "erfcx"])
def test_a_replayed_program_computes_the_new_values(dev, name):
    """The unary programs are static: a second call of the same shape replays the recorded
    program on new values, which must still be the function's."""
    fn = getattr(S, name)
    for seed in range(3):
        x = torch.rand(700, generator=torch.Generator().manual_seed(seed)) * 12 - 3
        _assert_as_accurate_as_cpu(_on_device(fn, dev, x), fn, x)
    assert accelkit.stats()["ops"][f"aten.special_{name}.default"]["native"] == 3


def test_compiled_graph_with_special_functions_matches_cpu(dev):
    def f(x, n):
        return S.bessel_j0(x) * 2 + S.i1e(x).exp() + S.chebyshev_polynomial_t(x.clamp(-1, 1), n)

    x = torch.randn(300, generator=torch.Generator().manual_seed(3)) * 4
    n = torch.randint(0, 9, (300,), generator=torch.Generator().manual_seed(4))
    compiled = torch.compile(f, backend="neuron")
    with accelkit.fallback_policy("deny"):
        actual = compiled(x.to(dev), n.to(dev)).cpu()
    # three terms of magnitude <= 2.5, each a few float32 ulps off the CPU's (as above), summed
    torch.testing.assert_close(actual, f(x, n), rtol=1e-5, atol=1e-5)


def _zeta_arguments() -> tuple[torch.Tensor, torch.Tensor]:
    """x over [1.01, 60] against q over (0, 100], and integer x against a negative q (the only
    negative q the CPU sums) whose fractional part stays away from 1/2, where an odd x's terms
    of -|q + j| and |q + j| cancel (see the xfail below)."""
    g = torch.Generator().manual_seed(5)
    x = torch.rand(600, generator=g) * 58.99 + 1.01
    q = torch.cat([torch.rand(300, generator=g) * 100, torch.rand(300, generator=g) * 3])
    whole_x = torch.randint(2, 40, (200,), generator=g).float()
    negative_q = -torch.randint(0, 10, (200,), generator=g) - torch.rand(200, generator=g) * 0.3 - 0.05
    return torch.cat([x, whole_x]), torch.cat([q, negative_q])


#: How zeta's arguments are given: two tensors, or either one as a number.
ZETA_FORMS = {
    "tensors": lambda x, q: (x, q),
    "self_scalar": lambda x, q: (3.0, q),
    "other_scalar": lambda x, q: (x, 2.5),
}


@pytest.mark.parametrize("form", ZETA_FORMS)
def test_zeta_matches_cpu(dev, form):
    args = ZETA_FORMS[form](*_zeta_arguments())
    actual = _on_device(S.zeta, dev, *args)
    overload = {"tensors": "default"}.get(form, form)
    assert_native(f"aten.special_zeta.{overload}")
    assert accelkit.stats()["neuron"]["estimate"]["per_op"][f"special_zeta.{overload}"]["seconds"] > 0
    _assert_as_accurate_as_cpu(actual, S.zeta, *args)


def test_zeta_special_values_are_the_cpus(dev):
    """The CPU's domain (x = 1 a pole, x < 1 NaN, a non-positive integer q a pole, a negative
    q NaN unless x is an integer), infinities and NaN in either argument, underflow for a
    large x, overflow near q = 0: exactly the CPU's, and the values beside them as accurate."""
    inf, nan = float("inf"), float("nan")
    xs = [1.0, 0.5, -1.0, 2.0, 3.0, 2.5, 1.0000001, 19.0, 60.0, 200.0, inf, -inf, nan]
    qs = [1.0, 0.5, 0.0, -0.0, -1.0, -3.0, -2.3, 1e-30, 1e-5, 100.0, 2.5e3, 1e30, inf, -inf, nan]
    x = torch.tensor(xs).repeat_interleave(len(qs))
    q = torch.tensor(qs).repeat(len(xs))
    actual = _on_device(S.zeta, dev, x, q)
    assert_native("aten.special_zeta.default")
    expected = S.zeta(x, q)
    assert torch.equal(actual.isnan(), expected.isnan())
    assert torch.equal(actual[expected.isinf()], expected[expected.isinf()])
    # one subnormal step: zeta(2.5, 1e30) is 6.7e-46, just below the rounding point to 1.4e-45
    torch.testing.assert_close(actual, expected, rtol=ULPS, atol=1.5e-45, equal_nan=True)


def test_zeta_out_forms_run_natively(dev):
    x, q = _zeta_arguments()
    for overload, args in [("out", (x, q)), ("self_scalar_out", (4.0, q)), ("other_scalar_out", (x, 0.75))]:
        out = torch.empty(600 + 200).to(dev)
        with accelkit.fallback_policy("deny"):
            S.zeta(*[a.to(dev) if isinstance(a, torch.Tensor) else a for a in args], out=out)
        _assert_as_accurate_as_cpu(out.cpu(), S.zeta, *args)
        assert accelkit.stats()["ops"].get(f"aten.special_zeta.{overload}", {}).get("fallback", 0) == 0


def test_zeta_far_below_zero_takes_the_cpu(dev):
    """A negative q needs one direct term per unit of -q: past the unrolled limit, the CPU."""
    from accelkit_backends.neuron.kernels.special import MAX_ZETA_TERMS

    x, q = torch.tensor([3.0, 3.0]), torch.tensor([0.5, -MAX_ZETA_TERMS - 0.5])
    with pytest.raises(RuntimeError, match="neuron kernel declined these arguments and the CPU fallback is denied"):
        _on_device(S.zeta, dev, x, q)
    with accelkit.fallback_policy("allow"):
        actual = S.zeta(x.to(dev), q.to(dev)).cpu()
    torch.testing.assert_close(actual, S.zeta(x, q))


def test_zeta_has_no_narrow_form(dev):
    x = torch.tensor([2.0, 3.0], dtype=torch.bfloat16)
    with accelkit.fallback_policy("allow"), pytest.raises(RuntimeError, match="not implemented for 'BFloat16'"):
        S.zeta(x.to(dev), x.to(dev))


def test_zeta_cancelling_negative_q_keeps_what_is_left(dev):
    """For an odd x and a negative half-integer q the terms of ``q + j < 0`` cancel those of
    ``-(q + j)`` exactly, leaving zeta(x, q + 2m) (m = -floor(q)): neuron adds each such pair
    first and gets it. The CPU adds them in turn, so the terms' last bits survive (in double
    precision: zeta(19, -2.5) is 9.2e-11 there, zeta(19, 3.5) is 4.6e-11)."""
    x, q = torch.tensor([19.0, 7.0, 31.0, 3.0]), torch.tensor([-2.5, -4.5, -1.5, -7.5])
    actual = _on_device(S.zeta, dev, x, q)
    left = S.zeta(x.double(), q.double() - 2 * torch.floor(q.double())).float()
    torch.testing.assert_close(actual, left, rtol=ULPS, atol=0)
