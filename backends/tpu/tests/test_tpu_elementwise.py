"""tpu elementwise ops (kernels/elementwise.py), compared with PyTorch on CPU: unary math, binary
arithmetic with broadcasting and Python scalars, ternary ops, clamping and selection, elementwise
comparisons, logical and bitwise ops, derived in-place and ``out=`` variants, fill, copy and dtype
conversion, the sign of complex values (and polar's gradient, which uses it), and the float-bit
ops ``frexp`` and ``nextafter`` (subnormals, signed zeros, infinities, NaN). Activations are in
``test_tpu_activations.py``.

Deterministic ops run the same call on CPU tensors and on tpu copies — often non-contiguous
views made on the device, and broadcasting operands — under the ``deny`` fallback policy, and
must match in value and dtype (bfloat16 with bfloat16 tolerances); each asserts that the op it
is about ran natively. Random ops are in ``test_tpu_random.py``.

Run with ``pytest backends/tpu/tests`` (its own process: see ``conftest.py`` there).
"""

from __future__ import annotations

import pytest
import torch

import accelkit
from conftest import assert_native, on_device
from harness_elementwise import assert_same, compare, sample, transposed

aten = torch.ops.aten

FLOAT_DTYPES = [torch.float32, torch.bfloat16]
#: bfloat16 keeps 8 bits of mantissa: one rounding is up to 2**-8 relative.


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def sliced(shape, dtype, seed=0, **kw):
    """A non-contiguous 2-D input of ``shape``: every other column of a wider tensor."""
    rows, cols = shape
    return sample((rows, 2 * cols), dtype, seed, **kw)[:, ::2]


# ---------------------------------------------------------------------------------------------
# Unary math
# ---------------------------------------------------------------------------------------------


def _positive(x):
    return x.abs() + 0.25


def _open_unit(x):
    return x.tanh() * 0.95


#: name -> (function, the aten op it reaches, input transform into the op's domain)
UNARY = {
    "neg": (torch.neg, "aten.neg.default", None),
    "abs": (torch.abs, "aten.abs.default", None),
    "sign": (torch.sign, "aten.sign.default", None),
    "sgn": (torch.sgn, "aten.sgn.default", None),
    "reciprocal": (torch.reciprocal, "aten.reciprocal.default", _positive),
    "sqrt": (torch.sqrt, "aten.sqrt.default", _positive),
    "rsqrt": (torch.rsqrt, "aten.rsqrt.default", _positive),
    "exp": (torch.exp, "aten.exp.default", None),
    "exp2": (torch.exp2, "aten.exp2.default", None),
    "expm1": (torch.expm1, "aten.expm1.default", None),
    "log": (torch.log, "aten.log.default", _positive),
    "log2": (torch.log2, "aten.log2.default", _positive),
    "log10": (torch.log10, "aten.log10.default", _positive),
    "log1p": (torch.log1p, "aten.log1p.default", _positive),
    "sin": (torch.sin, "aten.sin.default", None),
    "cos": (torch.cos, "aten.cos.default", None),
    "tan": (torch.tan, "aten.tan.default", _open_unit),
    "asin": (torch.asin, "aten.asin.default", _open_unit),
    "acos": (torch.acos, "aten.acos.default", _open_unit),
    "atan": (torch.atan, "aten.atan.default", None),
    "sinh": (torch.sinh, "aten.sinh.default", None),
    "cosh": (torch.cosh, "aten.cosh.default", None),
    "tanh": (torch.tanh, "aten.tanh.default", None),
    "asinh": (torch.asinh, "aten.asinh.default", None),
    "acosh": (torch.acosh, "aten.acosh.default", lambda x: x.abs() + 1.25),
    "atanh": (torch.atanh, "aten.atanh.default", _open_unit),
    "erf": (torch.erf, "aten.erf.default", None),
    "erfc": (torch.erfc, "aten.erfc.default", None),
    "erfinv": (torch.erfinv, "aten.erfinv.default", _open_unit),
    "floor": (torch.floor, "aten.floor.default", lambda x: x * 3),
    "ceil": (torch.ceil, "aten.ceil.default", lambda x: x * 3),
    "trunc": (torch.trunc, "aten.trunc.default", lambda x: x * 3),
    "round": (torch.round, "aten.round.default", lambda x: x * 3),
    "frac": (torch.frac, "aten.frac.default", lambda x: x * 3),
    "signbit": (torch.signbit, "aten.signbit.default", None),
    "isnan": (torch.isnan, "aten.isnan.default", None),
    "isinf": (torch.isinf, "aten.isinf.default", None),
    "isposinf": (torch.isposinf, "aten.isposinf.default", None),
    "isneginf": (torch.isneginf, "aten.isneginf.default", None),
    "logical_not": (torch.logical_not, "aten.logical_not.default", None),
}
#: ops that are defined on integer inputs too (float math turns them into float32 results)
INTEGER_UNARY = {"neg", "abs", "sign", "sqrt", "exp", "sin", "floor", "round", "signbit", "isinf"}


@pytest.mark.parametrize(("name", "dtype"), [
    (name, dtype) for name in sorted(UNARY)
    for dtype in FLOAT_DTYPES + ([torch.int64] if name in INTEGER_UNARY else [])
], ids=str)
def test_unary_ops_match_cpu_on_views(dev, name, dtype):
    fn, op, domain = UNARY[name]
    x = transposed((5, 7), dtype, low=0 if name in ("sqrt", "log1p") else -5)
    if domain is not None and dtype.is_floating_point:
        x = domain(x.float()).to(dtype).T.contiguous().T  # keep it a transposed view
    compare(dev, fn, x)
    assert_native(op)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_special_values_follow_pytorch(dev, dtype):
    """NaN, infinities and signed zeros: sign(NaN) = 0, nan_to_num's dtype-wide defaults, ..."""
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.5, -2.5, 0.5], dtype=dtype)
    if dtype == torch.float32:
        for fn in (torch.sign, torch.signbit, torch.isnan, torch.isinf, torch.isposinf,
                   torch.isneginf, torch.round, torch.frac, torch.sqrt):
            compare(dev, fn, x)
    compare(dev, torch.nan_to_num, x)
    compare(dev, lambda t: torch.nan_to_num(t, nan=7.0, posinf=100.0, neginf=-50.0), x)
    compare(dev, lambda t: torch.nan_to_num(t, posinf=1e30), x)  # bf16 holds 1e30, rounded
    assert_native("aten.nan_to_num.default")


def test_isfinite_decomposes_into_native_ops(dev):
    """isfinite is CompositeImplicitAutograd: it never reaches the device, its parts do."""
    x = torch.tensor([float("nan"), float("inf"), 1.0, -float("inf")])
    compare(dev, torch.isfinite, x)
    assert "aten.isfinite.default" not in accelkit.stats()["ops"]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("decimals", [0, 2, -1])
def test_round_with_decimals(dev, dtype, decimals):
    x = sliced((4, 6), dtype) * 123.456
    compare(dev, lambda t: torch.round(t, decimals=decimals), x)
    assert_native("aten.round.decimals")


# ---------------------------------------------------------------------------------------------
# Binary arithmetic, with broadcasting and Python scalars
# ---------------------------------------------------------------------------------------------

BINARY = {
    "add": (torch.add, "aten.add.Tensor"),
    "add_alpha": (lambda a, b: torch.add(a, b, alpha=2), "aten.add.Tensor"),
    "sub": (torch.sub, "aten.sub.Tensor"),
    "sub_alpha": (lambda a, b: torch.sub(a, b, alpha=3), "aten.sub.Tensor"),
    "mul": (torch.mul, "aten.mul.Tensor"),
    "div": (torch.div, "aten.div.Tensor"),
    "true_divide": (torch.true_divide, "aten.div.Tensor"),
    "div_trunc": (lambda a, b: torch.div(a, b, rounding_mode="trunc"), "aten.div.Tensor_mode"),
    "div_floor": (lambda a, b: torch.div(a, b, rounding_mode="floor"), "aten.div.Tensor_mode"),
    "remainder": (torch.remainder, "aten.remainder.Tensor"),
    "fmod": (torch.fmod, "aten.fmod.Tensor"),
    "pow": (lambda a, b: torch.pow(a.abs() + 0.5 if a.is_floating_point() else a.abs(), b.abs()),
            "aten.pow.Tensor_Tensor"),
    "atan2": (torch.atan2, "aten.atan2.default"),
    "hypot": (torch.hypot, "aten.hypot.default"),
    "copysign": (torch.copysign, "aten.copysign.Tensor"),
    "minimum": (torch.minimum, "aten.minimum.default"),
    "maximum": (torch.maximum, "aten.maximum.default"),
    "fmin": (torch.fmin, "aten.fmin.default"),
    "fmax": (torch.fmax, "aten.fmax.default"),
}
FLOAT_ONLY_BINARY = {"hypot"}


@pytest.mark.parametrize(("name", "dtype"), [
    (name, dtype) for name in sorted(BINARY)
    for dtype in FLOAT_DTYPES + ([] if name in FLOAT_ONLY_BINARY else [torch.int64])
], ids=str)
def test_binary_ops_broadcast_over_views(dev, name, dtype):
    fn, op = BINARY[name]
    x = transposed((5, 7), dtype, seed=1)
    # Divisors without zeros (integer division by zero raises on CPU), of both signs.
    y = sample((7,), dtype, seed=2, low=1, high=5)
    if dtype == torch.int64:
        y = y * torch.tensor([1, -1, 1, -1, 1, -1, 1])
    compare(dev, fn, x, y)
    assert_native(op)


def test_mixed_dtypes_promote_like_pytorch(dev):
    """int64 with float32, bfloat16 with float32, bool with int64: the result dtype is PyTorch's."""
    i, f, b, h = (sample((3, 4), torch.int64), sample((3, 4), torch.float32),
                  sample((3, 4), torch.bool), sample((3, 4), torch.bfloat16))
    for x, y in [(i, f), (h, f), (b, i), (i, h)]:
        for fn in (torch.add, torch.div, torch.maximum):
            compare(dev, fn, x, y)
    compare(dev, torch.mul, b, h[:1])  # broadcast on the left too
    compare(dev, torch.atan2, i, h)
    assert_native("aten.add.Tensor", "aten.mul.Tensor", "aten.div.Tensor", "aten.maximum.default")


SCALAR_OPS = {
    "add": (lambda t, s: t + s, "aten.add.Tensor"),
    "radd_alpha": (lambda t, s: torch.add(t, s, alpha=2), "aten.add.Tensor"),
    "rsub": (lambda t, s: s - t, "aten.rsub.Scalar"),
    "sub": (lambda t, s: t - s, "aten.sub.Tensor"),
    "mul": (lambda t, s: t * s, "aten.mul.Tensor"),
    "div": (lambda t, s: t / s, "aten.div.Tensor"),
    "div_floor": (lambda t, s: torch.div(t, s, rounding_mode="floor"), "aten.div.Tensor_mode"),
    "div_trunc": (lambda t, s: torch.div(t, s, rounding_mode="trunc"), "aten.div.Tensor_mode"),
    "remainder": (lambda t, s: t % s, "aten.remainder.Scalar"),
    "rremainder": (lambda t, s: torch.remainder(s, t.abs() + 1), "aten.remainder.Scalar_Tensor"),
    "fmod": (torch.fmod, "aten.fmod.Scalar"),
    "pow": (lambda t, s: t ** s, "aten.pow.Tensor_Scalar"),
    "rpow": (lambda t, s: s ** t, "aten.pow.Scalar"),
    "copysign": (torch.copysign, "aten.copysign.Scalar"),
}
#: ops also checked as int64 tensor with a Python float (the result is float32)
INT_TENSOR_FLOAT_SCALAR = {"add", "mul", "div", "div_floor", "remainder", "pow", "rpow"}


@pytest.mark.parametrize(("name", "dtype", "scalar"), [
    (name, dtype, scalar) for name in sorted(SCALAR_OPS)
    for dtype, scalar in [(torch.float32, -2.5), (torch.bfloat16, 3), (torch.int64, 3)]
    + ([(torch.int64, -2.5)] if name in INT_TENSOR_FLOAT_SCALAR else [])
], ids=str)
def test_python_scalars_never_widen_the_tensor(dev, name, dtype, scalar):
    """A Python number beside a tensor: ``int_tensor * 2.5`` is float32, ``bf16 * 3`` bfloat16."""
    fn, op = SCALAR_OPS[name]
    x = transposed((4, 6), dtype, low=0 if name in ("pow", "rpow") else -5, high=4)
    if name == "pow" and dtype.is_floating_point:
        x = x.abs() + 0.5
    if name == "rpow" and isinstance(scalar, float):
        scalar = abs(scalar)
    compare(dev, lambda t: fn(t, scalar), x)
    assert_native(op)


def test_float_floor_division_follows_python_including_zero_divisors(dev):
    x = torch.tensor([7.0, -7.0, 7.0, -7.0, 1.0, -1.0, 0.0, 5.5, -0.0])
    y = torch.tensor([2.0, 2.0, -2.0, -2.0, 0.0, 0.0, 3.0, 0.5, 2.0])
    for mode in ("floor", "trunc", None):
        compare(dev, lambda a, b, mode=mode: torch.div(a, b, rounding_mode=mode), x, y)
    compare(dev, torch.remainder, x, y)
    compare(dev, torch.fmod, x, y)
    ints = torch.tensor([7, -7, 7, -7, 0, 9])
    divisors = torch.tensor([2, 2, -2, -2, 3, -4])
    for mode in ("floor", "trunc"):
        compare(dev, lambda a, b, mode=mode: torch.div(a, b, rounding_mode=mode), ints, divisors)
    compare(dev, torch.remainder, ints, divisors)
    compare(dev, torch.fmod, ints, divisors)
    assert_native("aten.div.Tensor_mode", "aten.remainder.Tensor", "aten.fmod.Tensor")


def test_division_by_a_broadcast_divisor_is_ieee_division_as_on_cpu(dev):
    # XLA turns x / broadcast(y) into x * (1 / y): an ulp off in 4.5% of quotients by a
    # scalar and 26% by a per-row divisor, and x / x[0] was 0.99999994.
    torch.manual_seed(0)
    x = torch.randn(200, 100) * 9
    for divisor in (0.7311, torch.tensor(0.7311), torch.tensor([0.7311]), torch.randn(200, 1), torch.randn(100)):
        on_dev = divisor.to(dev) if isinstance(divisor, torch.Tensor) else divisor
        assert torch.equal((x.to(dev) / on_dev).cpu(), x / divisor)
    first = torch.tensor([-2.69921875, 5.0], device=dev)
    assert (first / first[:1]).cpu()[0].item() == 1.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_a_reduced_precision_quotient_is_rounded_to_its_dtype_before_truncating(dev, dtype):
    # CPU truncates the bfloat16 quotient: 17.99 rounds to 18 first (in float32 it would be 17);
    # by a single-element divisor, it divides and truncates in float32.
    torch.manual_seed(0)
    a, b = (torch.randn(4000) * 9).to(dtype), (torch.randn(4000) * 3).to(dtype)
    one = torch.tensor([2.7], dtype=dtype)
    for numerator, divisor in ((a, b), (a, 2.7), (a, one), (a, one[0]), (torch.tensor(9.7, dtype=dtype), b)):
        want = torch.div(numerator, divisor, rounding_mode="trunc")
        got = torch.div(numerator.to(dev), divisor.to(dev) if isinstance(divisor, torch.Tensor) else divisor,
                        rounding_mode="trunc")
        assert torch.equal(got.cpu(), want)



@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_ternary_ops(dev, dtype):
    x, a, b = transposed((4, 6), dtype, 1), sample((6,), dtype, 2), sliced((4, 6), dtype, 3)
    compare(dev, lambda s, t1, t2: torch.addcmul(s, t1, t2, value=0.5), x, a, b)
    compare(dev, lambda s, t1, t2: torch.addcdiv(s, t1, t2.abs() + 1, value=-2), x, a, b)
    compare(dev, lambda s, e: torch.lerp(s, e, 0.3), x, a)
    compare(dev, lambda s, e: torch.lerp(s, e, 0.8), x, a)  # the other branch of the formula
    compare(dev, lambda s, e, w: torch.lerp(s, e, w.sigmoid()), x, a, b)
    assert_native("aten.addcmul.default", "aten.addcdiv.default", "aten.lerp.Scalar", "aten.lerp.Tensor")


def test_integer_addcmul(dev):
    x, a, b = (sample((3, 4), torch.int64, s) for s in range(3))
    compare(dev, lambda s, t1, t2: torch.addcmul(s, t1, t2, value=3), x, a, b)
    assert_native("aten.addcmul.default")


# ---------------------------------------------------------------------------------------------
# Clamping and selection
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [torch.int64], ids=str)
def test_clamp_family(dev, dtype):
    x = transposed((5, 6), dtype)
    lo, hi = sample((6,), dtype, 1) - 1, sample((5, 1), dtype, 2) + 1
    compare(dev, lambda t: t.clamp(-1, 2), x)
    compare(dev, lambda t: t.clamp(min=0.5), x)  # a float bound on an int tensor is float32
    compare(dev, lambda t: t.clamp(2, -1), x)  # min > max: everything is max, as on CPU
    compare(dev, lambda t, a, b: t.clamp(a, b), x, lo, hi)
    compare(dev, lambda t: torch.clamp_min(t, 1), x)
    compare(dev, lambda t: torch.clamp_max(t, 1), x)
    compare(dev, torch.clamp_min, x, lo)
    compare(dev, torch.clamp_max, x, hi)
    assert_native("aten.clamp.default", "aten.clamp.Tensor", "aten.clamp_min.default",
                  "aten.clamp_max.default", "aten.clamp_min.Tensor", "aten.clamp_max.Tensor")


def test_extrema_propagate_or_ignore_nan_like_pytorch(dev):
    x = torch.tensor([float("nan"), 1.0, float("nan"), -2.0])
    y = torch.tensor([0.0, float("nan"), float("nan"), 3.0])
    for fn in (torch.minimum, torch.maximum, torch.fmin, torch.fmax):
        compare(dev, fn, x, y)
    compare(dev, lambda t: t.clamp(0, 1), x)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [torch.int64, torch.bool], ids=str)
def test_where_and_masked_fill(dev, dtype):
    x, y = transposed((4, 6), dtype, 1), sample((6,), dtype, 2)
    cond = sample((4, 1), torch.bool, 3)
    compare(dev, torch.where, cond, x, y)
    compare(dev, lambda c, a: torch.where(c, a, 0), cond, x)
    compare(dev, lambda a, m: a.masked_fill(m, 1), x, cond)
    compare(dev, lambda a, m, v: a.masked_fill(m, v), x, cond, sample((), dtype, 5))
    compare(dev, lambda a, m: a.masked_fill_(m, 1), x, cond)
    if dtype.is_floating_point:
        compare(dev, lambda a, m: a.masked_fill(m, -2.75), x, cond)
    assert_native("aten.where.self", "aten.masked_fill.Scalar", "aten.masked_fill.Tensor")


def test_where_promotes_mixed_operands(dev):
    cond = sample((3, 4), torch.bool)
    compare(dev, torch.where, cond, sample((3, 4), torch.bfloat16), sample((3, 4), torch.float32))
    compare(dev, torch.where, cond, sample((3, 4), torch.int64), sample((4,), torch.float32))
    compare(dev, lambda c, a: torch.where(c, a, 0.1), cond, sample((3, 4), torch.bfloat16))
    assert_native("aten.where.self")


# ---------------------------------------------------------------------------------------------
# Comparisons, logical and bitwise
# ---------------------------------------------------------------------------------------------

COMPARISONS = ["eq", "ne", "lt", "le", "gt", "ge"]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [torch.int64, torch.bool], ids=str)
@pytest.mark.parametrize("name", COMPARISONS)
def test_comparisons_of_tensors(dev, name, dtype):
    fn = getattr(torch, name)
    x, y = transposed((5, 6), dtype, 1, low=-2, high=3), sample((6,), dtype, 2, low=-2, high=3)
    compare(dev, fn, x, y)
    assert_native(f"aten.{name}.Tensor")


@pytest.mark.parametrize(("dtype", "scalar"), [(torch.bfloat16, 0.1), (torch.int64, 1), (torch.int64, 0.5)],
                         ids=str)
@pytest.mark.parametrize("name", COMPARISONS)
def test_comparisons_with_python_scalars(dev, name, dtype, scalar):
    """bfloat16 compares with 0.1 rounded to bfloat16 and int64 with 0.5 in float32, as on CPU."""
    fn = getattr(torch, name)
    compare(dev, lambda t: fn(t, scalar), transposed((5, 6), dtype, 1, low=-2, high=3))
    assert_native(f"aten.{name}.Scalar")


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool], ids=str)
def test_logical_ops(dev, dtype):
    x, y = transposed((4, 5), dtype, 1, low=-1, high=2), sample((5,), dtype, 2, low=-1, high=2)
    for name in ("logical_and", "logical_or", "logical_xor"):
        compare(dev, getattr(torch, name), x, y)
        assert_native(f"aten.{name}.default")
    compare(dev, torch.logical_not, x)
    compare(dev, torch.logical_and, x, sample((4, 5), torch.bool, 3))  # mixed dtypes
    assert_native("aten.logical_not.default")


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8, torch.bool], ids=str)
def test_bitwise_ops(dev, dtype):
    low, high = (0, 2) if dtype == torch.bool else (0, 200) if dtype == torch.uint8 else (-1000, 1000)
    x, y = transposed((4, 5), dtype, 1, low=low, high=high), sample((5,), dtype, 2, low=low, high=high)
    scalar = True if dtype == torch.bool else 0x55
    for name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
        fn = getattr(torch, name)
        compare(dev, fn, x, y)
        compare(dev, lambda t, fn=fn: fn(t, scalar), x)
        assert_native(f"aten.{name}.Tensor", f"aten.{name}.Scalar")
    compare(dev, lambda t: torch.bitwise_xor(scalar, t), x)
    compare(dev, torch.bitwise_not, x)
    assert_native("aten.bitwise_not.default")


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8], ids=str)
def test_shifts(dev, dtype):
    low = 0 if dtype == torch.uint8 else -1000
    x = transposed((4, 5), dtype, 1, low=low, high=1000 if dtype != torch.uint8 else 255)
    amounts = sample((5,), dtype, 2, low=0, high=8)
    compare(dev, torch.bitwise_left_shift, x, amounts)
    compare(dev, torch.bitwise_right_shift, x, amounts)
    compare(dev, lambda t: t << 3, x)
    compare(dev, lambda t: t >> 2, x)
    compare(dev, lambda t: torch.bitwise_left_shift(5, t.abs() % 7), x)
    compare(dev, lambda t: torch.bitwise_right_shift(1000, t.abs() % 7), x)
    assert_native("aten.bitwise_left_shift.Tensor", "aten.bitwise_right_shift.Tensor",
                  "aten.__lshift__.Scalar", "aten.__rshift__.Scalar",
                  "aten.bitwise_left_shift.Scalar_Tensor", "aten.bitwise_right_shift.Scalar_Tensor")


# ---------------------------------------------------------------------------------------------
# Derived variants, fill, copy, conversion
# ---------------------------------------------------------------------------------------------


def test_inplace_and_out_variants_are_derived_natively(dev):
    x, y = transposed((4, 5), torch.float32, 1), sample((5,), torch.float32, 2)
    compare(dev, lambda a, b: a.clone().mul_(b).add_(b, alpha=2).clamp_(-1, 1), x, y)
    compare(dev, lambda a, b: torch.atan2(a, b, out=torch.empty(0, device=a.device)), x, y)
    compare(dev, lambda a: torch.exp(a, out=torch.empty(4, 5, dtype=torch.bfloat16, device=a.device)), x)
    compare(dev, lambda a: a.sigmoid_(), x)
    compare(dev, lambda t: (t[:, ::2].add_(1), t)[1], torch.zeros(4, 6))  # in place on a strided view
    assert_native("aten.mul_.Tensor", "aten.add_.Tensor", "aten.clamp_.default", "aten.atan2.out",
                  "aten.exp.out", "aten.sigmoid_.default")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [torch.int64, torch.bool], ids=str)
def test_fill_and_zero(dev, dtype):
    x = transposed((3, 4), dtype)
    compare(dev, lambda t: t.fill_(2.75), x)  # truncated to 2 for int64, True for bool
    compare(dev, lambda t, v: t.fill_(v), x, sample((), dtype, 4))
    compare(dev, lambda t: t.zero_(), x)
    compare(dev, lambda t: aten.fill.Scalar(t, 5), x)
    base = sample((4, 6), dtype)
    compare(dev, lambda t: (t[:, 1::2].fill_(1), t[1].zero_(), t)[2], base)  # views write through
    assert_native("aten.fill_.Scalar", "aten.fill_.Tensor", "aten.zero_.default", "aten.fill.Scalar")


def test_clone_preserves_layout_and_stays_on_device(dev, monkeypatch):
    x = transposed((4, 6), torch.float32)
    expected = x.clone()
    device_x = on_device(x, dev)
    host_reads = _count_host_reads(monkeypatch)
    with accelkit.fallback_policy("deny"):
        actual = device_x.clone()
        contiguous = device_x.clone(memory_format=torch.contiguous_format)
    assert host_reads() == 0
    assert actual.stride() == expected.stride() and contiguous.is_contiguous()
    assert_same(actual, expected)
    assert_same(contiguous, x.contiguous())


def _count_host_reads(monkeypatch):
    """Count device-to-host copies (the allocator's real ``to_host``/``read_bytes`` still run)."""
    from accelkit import _runtime

    allocator = _runtime.active().allocator
    calls = []
    for name in ("to_host", "read_bytes"):
        real = getattr(allocator, name)

        def counting(*args, _real=real, **kwargs):
            calls.append(1)
            return _real(*args, **kwargs)

        monkeypatch.setattr(allocator, name, counting)
    return lambda: len(calls)


@pytest.mark.parametrize("source", [torch.float32, torch.bfloat16, torch.int64, torch.bool], ids=str)
def test_dtype_conversion_runs_on_the_device(dev, monkeypatch, source):
    """``.to(dtype)`` (``_to_copy`` → ``copy_`` between dtypes) converts on the device: no
    host round trip, PyTorch's conversion rules (truncation toward zero, nonzero → True)."""
    x = transposed((4, 5), source, low=-300, high=300)
    if source.is_floating_point:
        x = x * 50
    device_x = on_device(x, dev)
    host_reads = _count_host_reads(monkeypatch)
    results = {}
    with accelkit.fallback_policy("deny"):
        for target in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
            results[target] = device_x.to(target)
    assert host_reads() == 0
    monkeypatch.undo()
    for target, actual in results.items():
        assert actual.stride() == x.to(target).stride()
        assert_same(actual, x.to(target), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# Complex sign, and the gradient that uses it
# ---------------------------------------------------------------------------------------------


def test_sgn_of_complex_values_is_z_over_abs_z(dev):
    host = torch.tensor([1.2 + 0.9j, 3 - 4j, 0j, -2j, 1e-30 + 1e-30j, complex(float("nan"), 0)],
                        dtype=torch.complex64)
    torch.testing.assert_close(torch.sgn(host.to(dev)).cpu(), torch.sgn(host), equal_nan=True)
    assert_native("aten.sgn.default")


def test_polar_gradient_matches_cpu(dev):
    """polar's backward takes the magnitude's gradient through sgn of the complex result."""
    g = torch.Generator().manual_seed(3)
    magnitude, angle = torch.rand(6, generator=g) * 3, torch.randn(6, generator=g) * 3
    upstream = torch.randn(6, dtype=torch.complex64, generator=g)

    def gradients(device):
        m, a = magnitude.to(device).requires_grad_(), angle.to(device).requires_grad_()
        return [t.cpu() for t in torch.autograd.grad(torch.polar(m, a), (m, a), upstream.to(device))]

    with accelkit.fallback_policy("deny"):
        on_tpu = gradients(dev)
    for got, want in zip(on_tpu, gradients("cpu")):
        torch.testing.assert_close(got, want)


# ---------------------------------------------------------------------------------------------
# Float bits: frexp and nextafter (subnormals, signed zeros, infinities, NaN)
# ---------------------------------------------------------------------------------------------

SPECIAL_FLOATS = [0.0, -0.0, 1.0, -3.5, 7e-3, float("inf"), -float("inf"), float("nan")]


@pytest.mark.parametrize("dtype, subnormals", [
    (torch.float32, [1e-40, -1e-45, 1.1754942e-38]),
    (torch.float16, [1e-6, -6e-8]),
    (torch.bfloat16, [1e-40]),
])
def test_frexp_including_subnormals(dev, dtype, subnormals):
    x = torch.tensor(SPECIAL_FLOATS + subnormals + [3e38 if dtype != torch.float16 else 6e4]).to(dtype)
    want = torch.frexp(x)
    with accelkit.fallback_policy("deny"):
        got = torch.frexp(x.to(dev))
    assert got.mantissa.dtype == dtype and got.exponent.dtype == torch.int32
    torch.testing.assert_close(got.mantissa.cpu(), want.mantissa, equal_nan=True, atol=0, rtol=0)
    torch.testing.assert_close(got.exponent.cpu(), want.exponent)
    assert_native("aten.frexp.Tensor")


def test_frexp_out_variant(dev):
    x = torch.randn(4, 5) * 100
    mantissa, exponent = torch.empty(4, 5, device=dev), torch.empty(4, 5, dtype=torch.int32, device=dev)
    with accelkit.fallback_policy("deny"):
        torch.frexp(x.to(dev), out=(mantissa, exponent))
    want = torch.frexp(x)
    torch.testing.assert_close(mantissa.cpu(), want.mantissa)
    torch.testing.assert_close(exponent.cpu(), want.exponent)


def test_nextafter_towards_every_direction(dev):
    x = torch.tensor([0.0, -0.0, 1.0, 1.0, float("nan"), 1.0, 2.0, 3e38, float("inf"), 1e-45])
    y = torch.tensor([1.0, -1.0, 0.0, float("nan"), 1.0, 2.0, 2.0, float("inf"), 0.0, 0.0])
    want = torch.nextafter(x, y)
    with accelkit.fallback_policy("deny"):
        got = torch.nextafter(x.to(dev), y.to(dev))
    torch.testing.assert_close(got.cpu(), want, equal_nan=True, atol=0, rtol=0)
    assert_native("aten.nextafter.default")


def test_nextafter_broadcasts_bfloat16(dev):
    x, y = torch.randn(3, 1).bfloat16(), torch.randn(4).bfloat16()
    with accelkit.fallback_policy("deny"):
        got = torch.nextafter(x.to(dev), y.to(dev))
    torch.testing.assert_close(got.cpu(), torch.nextafter(x, y), atol=0, rtol=0)


def test_integer_powers_with_negative_exponents_are_zero_unless_the_base_is_one_or_minus_one(dev):
    # XLA's integer power is undefined below 0 (it gave large garbage); PyTorch's is
    # 1 / base**-e in integers.
    base = torch.tensor([[-8], [6], [1], [-1], [0], [2]])
    exponent = torch.tensor([-3, -2, -1, 0, 3])
    for dtype in (torch.int64, torch.int32, torch.int8):
        compare(dev, torch.pow, base.to(dtype), exponent.to(dtype))
        compare(dev, lambda e: 3 ** e, exponent.to(dtype))
        compare(dev, lambda e: (-1) ** e, exponent.to(dtype))
    assert_native("aten.pow.Tensor_Tensor", "aten.pow.Scalar")
