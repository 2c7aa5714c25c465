"""The dispatch pipeline on ref: native kernels, decompositions and the CPU fallback, their
counters and policies, and the PyTorch semantics every path must keep (``out=``, dtype casts,
Python scalars, CPU 0-d operands, convolution, factories) — each checked against the CPU.
"""

from __future__ import annotations

import json
import textwrap
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import run_python

import accelkit
from accelkit import _runtime
from accelkit._runtime.dispatch.pipeline import Pipeline

aten = torch.ops.aten


def counts(op: str) -> dict[str, int]:
    return accelkit.stats()["ops"].get(op, {"native": 0, "decomposed": 0, "fallback": 0})


def on_device(dev: torch.device, *tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.to(dev) for t in tensors]


def assert_same(device_result: torch.Tensor, cpu_result: torch.Tensor, *, exact: bool = True) -> None:
    """Same device type ``ref``, dtype, shape and values (bit-exact unless ``exact=False``)."""
    assert device_result.device.type == "ref"
    assert device_result.dtype == cpu_result.dtype
    if exact:
        torch.testing.assert_close(device_result.cpu(), cpu_result, rtol=0, atol=0)
    else:
        torch.testing.assert_close(device_result.cpu(), cpu_result)


def error_of(fn) -> str:
    with pytest.raises(RuntimeError) as err:
        fn()
    return str(err.value)


def caught_warnings(fn) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return caught


def run_json(code: str, env: dict[str, str] | None = None) -> dict:
    proc = run_python(textwrap.dedent(code), env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- counters: which path ran ---------------------------------------------------------------------


def test_a_native_kernel_counts_native(dev):
    assert aten.add.Tensor in _runtime.active().kernels
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    x, y = on_device(dev, a, b)
    accelkit.reset_stats()
    assert_same(x + y, a + b)
    assert accelkit.stats()["ops"] == {"aten.add.Tensor": {"native": 1, "decomposed": 0, "fallback": 0}}


def test_inplace_and_out_variants_derived_from_a_native_kernel_count_native(dev):
    a, b = torch.randn(5), torch.randn(5)
    x, y = on_device(dev, a, b)
    out = torch.empty(5, device=dev)
    accelkit.reset_stats()
    x.add_(1)
    torch.add(x, y, out=out)
    assert counts("aten.add_.Tensor") == {"native": 1, "decomposed": 0, "fallback": 0}
    assert counts("aten.add.out") == {"native": 1, "decomposed": 0, "fallback": 0}
    assert_same(x, a + 1)
    assert_same(out, a + 1 + b)


def test_an_op_with_a_core_aten_decomposition_counts_decomposed_and_its_parts_dispatch_again(dev):
    ctx = _runtime.active()
    assert aten.rsub.Tensor in ctx.decompositions and aten.rsub.Tensor not in ctx.kernels
    a, b = torch.randn(6), torch.randn(6)
    x, y = on_device(dev, a, b)
    accelkit.reset_stats()
    assert_same(torch.rsub(x, y), torch.rsub(a, b))
    assert accelkit.stats()["ops"] == {
        "aten.rsub.Tensor": {"native": 0, "decomposed": 1, "fallback": 0},
        "aten.sub.Tensor": {"native": 1, "decomposed": 0, "fallback": 0},
    }


def test_an_op_with_neither_kernel_nor_decomposition_counts_fallback(dev):
    ctx = _runtime.active()
    assert aten.flip.default not in ctx.kernels and aten.flip.default not in ctx.decompositions
    a = torch.randn(3, 4)
    (x,) = on_device(dev, a)
    accelkit.reset_stats()
    assert_same(torch.flip(x, [0, 1]), torch.flip(a, [0, 1]))
    assert accelkit.stats()["ops"] == {"aten.flip.default": {"native": 0, "decomposed": 0, "fallback": 1}}


def test_totals_add_up_and_reset_stats_clears_the_counters(dev):
    x, y = on_device(dev, torch.randn(4), torch.randn(4))
    accelkit.reset_stats()
    x + y
    x * y
    torch.rsub(x, y)
    torch.flip(x, [0])
    stats = accelkit.stats()
    assert stats["backend"] == "ref"
    assert stats["totals"] == {"native": 3, "decomposed": 1, "fallback": 1}
    accelkit.reset_stats()
    assert accelkit.stats()["ops"] == {}
    assert accelkit.stats()["totals"] == {"native": 0, "decomposed": 0, "fallback": 0}


# -- fallback policy -----------------------------------------------------------------------------


def test_deny_raises_naming_the_op_the_backend_and_how_to_allow_it(dev):
    (x,) = on_device(dev, torch.randn(4))
    with accelkit.fallback_policy("deny"), pytest.raises(accelkit.FallbackDeniedError) as err:
        torch.flip(x, [0])
    assert str(err.value) == (
        "aten.flip.default has no kernel or decomposition on ref and the CPU fallback is denied "
        "(policy 'deny'). Allow it with ACCELKIT_FALLBACK=warn or accelkit.fallback_policy('allow'), "
        "or give the ref backend a kernel for this op."
    )
    assert isinstance(err.value, NotImplementedError)
    assert counts("aten.flip.default")["fallback"] == 0, "a denied fallback did not run"


def test_deny_still_runs_native_and_decomposed_ops_and_prints_tensors(dev):
    a, b = torch.randn(4), torch.randn(4)
    x, y = on_device(dev, a, b)
    with accelkit.fallback_policy("deny"):
        assert_same(x * y, a * b)
        assert_same(torch.rsub(x, y), torch.rsub(a, b))
        printed = repr(x)
    assert printed == repr(a).replace(")", ", device='ref:0')")


def test_policy_context_manager_restores_the_previous_policy_even_after_an_error(dev):
    (x,) = on_device(dev, torch.randn(4))
    before = accelkit.stats()["fallback_policy"]
    with accelkit.fallback_policy("warn"):
        assert accelkit.stats()["fallback_policy"] == "warn"
        with pytest.raises(accelkit.FallbackDeniedError), accelkit.fallback_policy("deny"):
            assert accelkit.stats()["fallback_policy"] == "deny"
            torch.flip(x, [0])
        assert accelkit.stats()["fallback_policy"] == "warn"
    assert accelkit.stats()["fallback_policy"] == before


def test_policy_called_without_with_takes_effect_at_once(dev):
    before = accelkit.stats()["fallback_policy"]
    try:
        accelkit.fallback_policy("deny")
        assert accelkit.stats()["fallback_policy"] == "deny"
    finally:
        accelkit.fallback_policy(before)


def test_an_unknown_policy_is_rejected_with_the_valid_ones():
    with pytest.raises(accelkit.AccelkitError) as err:
        accelkit.fallback_policy("never")
    assert str(err.value) == "fallback policy must be one of ('deny', 'warn', 'allow'), not 'never'"


def test_allow_runs_the_fallback_silently(dev):
    a = torch.randn(5)
    (x,) = on_device(dev, a)
    with accelkit.fallback_policy("allow"):
        caught = caught_warnings(lambda: assert_same(torch.cumprod(x, 0), torch.cumprod(a, 0)))
    assert [str(w.message) for w in caught] == []
    assert counts("aten.cumprod.out")["fallback"] == 1


def test_warn_warns_once_per_op():
    out = run_json(
        """
        import json, warnings, torch, accelkit
        dev = accelkit.select_device("ref")
        x = torch.arange(4.0).to(dev)

        def caught(fn):
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                fn()
            return [f"{m.category.__name__}: {m.message}" for m in w]

        default = accelkit.stats()["fallback_policy"]
        with accelkit.fallback_policy("warn"):
            first = caught(lambda: torch.flip(x, [0]))
            second = caught(lambda: torch.flip(x, [0]))
            other = caught(lambda: torch.cumprod(x, 0))
            native = caught(lambda: x + x)
        after = caught(lambda: torch.roll(x, 1, 0))
        print(json.dumps({"default": default, "first": first, "second": second, "other": other,
                          "native": native, "after": after,
                          "flips": accelkit.stats()["ops"]["aten.flip.default"]["fallback"]}))
        """
    )
    assert out["default"] == "allow", "ref's own default"
    assert out["first"] == [
        "UserWarning: aten.flip.default is not supported natively on ref; running it on the CPU "
        "(set ACCELKIT_FALLBACK=allow to silence, =deny to forbid)"
    ]
    assert out["second"] == [] and out["flips"] == 2, "the second run is silent but still counted"
    assert len(out["other"]) == 1 and out["other"][0].startswith("UserWarning: aten.cumprod.out is not supported")
    assert out["native"] == [] and out["after"] == []


def test_env_sets_the_default_policy():
    code = """
        import json, torch, accelkit
        dev = accelkit.select_device("ref")
        x = torch.ones(3).to(dev)
        try:
            torch.flip(x, [0])
            error = None
        except accelkit.FallbackDeniedError as exc:
            error = str(exc)
        print(json.dumps({"policy": accelkit.stats()["fallback_policy"], "error": error,
                          "native": (x + x).cpu().tolist()}))
        """
    deny = run_json(code, env={"ACCELKIT_FALLBACK": "deny"})
    assert deny["policy"] == "deny"
    assert deny["error"].startswith("aten.flip.default has no kernel or decomposition on ref")
    assert deny["native"] == [2.0, 2.0, 2.0]
    assert run_json(code, env={"ACCELKIT_FALLBACK": " Warn "})["policy"] == "warn"


def test_a_bad_env_policy_is_a_clear_error_that_does_not_mark_the_backend_broken():
    out = run_json(
        """
        import json, os, accelkit
        try:
            accelkit.select_device("ref")
        except accelkit.AccelkitError as exc:
            error = f"{type(exc).__name__}: {exc}"
        ref = {r.name: r for r in accelkit.devices()}["ref"]
        os.environ["ACCELKIT_FALLBACK"] = "deny"
        accelkit.select_device("ref")
        print(json.dumps({"error": error, "available": ref.available,
                          "policy": accelkit.stats()["fallback_policy"]}))
        """,
        env={"ACCELKIT_FALLBACK": "sometimes"},
    )
    assert out["error"] == (
        "AccelkitError: ACCELKIT_FALLBACK='sometimes' is not a fallback policy; use one of deny, warn, allow"
    )
    assert out["available"] is True
    assert out["policy"] == "deny", "fixing the setting is enough; no restart needed"


# -- out= arguments ------------------------------------------------------------------------------

#: One op per path, each with an ``out=`` overload: (name, fn(x, out)).
OUT_PATHS = [
    ("native", lambda x, out: torch.add(x, x, out=out)),
    ("decomposed", lambda x, out: torch.clamp_min(x, 0.0, out=out)),
    ("fallback", lambda x, out: torch.sigmoid(x, out=out)),
]
OUT_PATH_OPS = {"native": "aten.add.out", "decomposed": "aten.clamp_min.out", "fallback": "aten.sigmoid.out"}


@pytest.mark.parametrize("path, fn", OUT_PATHS, ids=[p for p, _ in OUT_PATHS])
def test_an_empty_out_is_resized_without_a_warning(dev, path, fn):
    a = torch.randn(3, 4)
    expected = fn(a, torch.empty(0))
    (x,) = on_device(dev, a)
    out = torch.empty(0, device=dev)
    caught = caught_warnings(lambda: fn(x, out))
    assert [str(w.message) for w in caught] == []
    assert_same(out, expected)
    assert sum(counts(OUT_PATH_OPS[path]).values()) == 1 and counts(OUT_PATH_OPS[path])[path] == 1


@pytest.mark.parametrize("path, fn", OUT_PATHS, ids=[p for p, _ in OUT_PATHS])
def test_a_wrong_shape_out_is_resized_with_the_deprecation_warning(dev, path, fn):
    a = torch.randn(3, 4)
    cpu_out = torch.zeros(2)
    cpu_warnings = caught_warnings(lambda: fn(a, cpu_out))
    (x,) = on_device(dev, a)
    out = torch.zeros(2, device=dev)
    device_warnings = caught_warnings(lambda: fn(x, out))
    assert_same(out, cpu_out)
    assert [w.category for w in device_warnings] == [UserWarning] == [w.category for w in cpu_warnings]
    message = str(device_warnings[0].message)
    if path == "decomposed":  # worded by PyTorch's Python reference implementation, not by CPU
        assert message.startswith("An output with one or more elements was resized")
    else:
        first_sentence = str(cpu_warnings[0].message).split(". ")[0]
        assert first_sentence == (
            "An output with one or more elements was resized since it had shape [2], which does "
            "not match the required output shape [3, 4]"
        )
        assert message.startswith(first_sentence + ". This behavior is deprecated")


@pytest.mark.parametrize("path, fn", [OUT_PATHS[0], OUT_PATHS[2]], ids=["native", "fallback"])
def test_out_of_a_wider_dtype_receives_the_cast_result(dev, path, fn):
    a = torch.randn(6)
    expected = fn(a, torch.empty(6, dtype=torch.float64))
    (x,) = on_device(dev, a)
    out = torch.empty(6, dtype=torch.float64, device=dev)
    fn(x, out)
    assert_same(out, expected)


@pytest.mark.parametrize(
    "fn",
    [lambda x, out: torch.add(x, x, out=out), lambda x, out: torch.sigmoid(x, out=out)],
    ids=["native", "fallback"],
)
@pytest.mark.parametrize("out_dtype", [torch.int64, torch.bool])
def test_out_that_cannot_hold_the_result_dtype_raises_like_cpu_and_stays_unchanged(dev, fn, out_dtype):
    a = torch.randn(4)
    expected = error_of(lambda: fn(a, torch.zeros(4, dtype=out_dtype)))
    (x,) = on_device(dev, a)
    out = torch.zeros(4, dtype=out_dtype, device=dev)
    assert error_of(lambda: fn(x, out)) == expected
    assert_same(out, torch.zeros(4, dtype=out_dtype))


def test_decomposed_out_that_cannot_hold_the_result_dtype_raises_like_cpu_and_stays_unchanged(dev):
    a = torch.randn(4)
    expected = error_of(lambda: torch.clamp_min(a, 0.0, out=torch.zeros(4, dtype=torch.int64)))
    (x,) = on_device(dev, a)
    out = torch.zeros(4, dtype=torch.int64, device=dev)
    assert error_of(lambda: torch.clamp_min(x, 0.0, out=out)) == expected
    assert_same(out, torch.zeros(4, dtype=torch.int64))


def test_out_may_be_a_strided_view_or_an_input(dev):
    a, b = torch.randn(3, 3), torch.randn(3, 3)
    results = {}
    for d in ("cpu", dev):
        x, y, base = a.to(d, copy=True), b.to(d), torch.zeros(3, 3, device=d)
        torch.add(x, y, out=base.t())
        torch.sigmoid(x[:, 0], out=base[:, 2])
        torch.mul(x, y, out=x)
        results[d] = (base, x)
    for got, expected in zip(results[dev], results["cpu"]):
        assert_same(got, expected)


# -- in-place dtype and shape rules ----------------------------------------------------------------

INPLACE_CASES = [
    ("int.add_(1.5)", lambda: torch.arange(4), lambda t: t.add_(1.5)),
    ("int.mul_(1.5)", lambda: torch.arange(4), lambda t: t.mul_(1.5)),
    ("int.div_(2)", lambda: torch.arange(4), lambda t: t.div_(2)),
    ("bool.add_(1)", lambda: torch.tensor([True, False]), lambda t: t.add_(1)),
    ("int.add_(float tensor)", lambda: torch.arange(4), lambda t: t.add_(torch.ones(4, device=t.device))),
    ("int.clamp_min_(1.5) [fallback]", lambda: torch.arange(4), lambda t: t.clamp_min_(1.5)),
    ("int.sigmoid_() [fallback]", lambda: torch.arange(4), lambda t: t.sigmoid_()),
    ("float.add_(broadcast to a bigger shape)", lambda: torch.ones(3),
     lambda t: t.add_(torch.ones(2, 3, device=t.device))),
]


@pytest.mark.parametrize("make, op", [c[1:] for c in INPLACE_CASES], ids=[c[0] for c in INPLACE_CASES])
def test_an_inplace_result_that_cannot_be_stored_raises_like_cpu_and_leaves_the_tensor_unchanged(dev, make, op):
    expected = error_of(lambda: op(make()))
    t = make().to(dev)
    assert error_of(lambda: op(t)) == expected
    assert_same(t, make())


def test_an_inplace_result_of_a_narrower_kind_is_cast_into_self(dev):
    a = torch.zeros(4)
    expected = a.clone().add_(torch.arange(4))
    t = a.to(dev)
    t.add_(torch.arange(4, device=dev))
    assert_same(t, expected)


# -- in-place ops on lists of tensors (foreach) -------------------------------------------------


def foreach_add(selves, others, alpha=1):
    """A functional ``_foreach_add.List`` on ref arrays (CPU tensors)."""
    return [torch.add(x, y, alpha=alpha) for x, y in zip(selves, others)]


def test_an_inplace_list_op_is_derived_and_writes_every_tensor(dev):
    from accelkit._runtime.dispatch.schema import variants_of

    assert variants_of(aten._foreach_add.List) == (aten._foreach_add_.List, None)  # no list outs
    run = Pipeline(_runtime.active()).native_inplace(aten._foreach_add_.List, foreach_add)
    xs, ys = [torch.randn(3), torch.randn(2, 2)], [torch.randn(3), torch.randn(2, 2)]
    selves = on_device(dev, *xs)
    view = selves[1].t()  # a view of one of them sees the write
    accelkit.reset_stats()
    assert run(selves, on_device(dev, *ys), alpha=2) is None
    for t, x, y in zip(selves, xs, ys):
        assert_same(t, x + 2 * y)
    assert_same(view, (xs[1] + 2 * ys[1]).t())
    assert counts("aten._foreach_add_.List") == {"native": 1, "decomposed": 0, "fallback": 0}


def test_an_inplace_list_op_writes_nothing_when_one_result_cannot_be_stored(dev):
    run = Pipeline(_runtime.active()).native_inplace(aten._foreach_add_.List, foreach_add)
    xs = [torch.randn(3), torch.arange(3)]  # the float sum cannot go back into int64
    selves = on_device(dev, *xs)
    message = error_of(lambda: run(selves, on_device(dev, torch.randn(3), torch.randn(3))))
    assert "can't be cast to the desired output type Long" in message
    for t, x in zip(selves, xs):
        assert_same(t, x)


# -- Python scalars where the schema wants a Tensor ---------------------------------------------

SCALAR_CASES = [
    ("copysign(float32, 2.0)", lambda x: torch.copysign(x, 2.0), torch.float32),
    ("copysign(float16, -2.0)", lambda x: torch.copysign(x, -2.0), torch.float16),
    ("copysign(bfloat16, 2.0)", lambda x: torch.copysign(x, 2.0), torch.bfloat16),
    ("copysign(float64, -1)", lambda x: torch.copysign(x, -1), torch.float64),
    ("copysign(int64, -1.5)", lambda x: torch.copysign(x, -1.5), torch.int64),
    ("remainder(float32, 3)", lambda x: torch.remainder(x, 3), torch.float32),
    ("remainder(int64, 3)", lambda x: torch.remainder(x, 3), torch.int64),
    ("remainder(int8, 3)", lambda x: torch.remainder(x, 3), torch.int8),
    ("remainder(int8, 300) wraps like CPU", lambda x: torch.remainder(x, 300), torch.int8),
    ("remainder(int64, 2.5)", lambda x: torch.remainder(x, 2.5), torch.int64),
    ("pow(2, float32)", lambda x: torch.pow(2, x), torch.float32),
    ("pow(2, float16)", lambda x: torch.pow(2, x), torch.float16),
    ("pow(2, int64)", lambda x: torch.pow(2, x), torch.int64),
    ("pow(2.5, int64)", lambda x: torch.pow(2.5, x), torch.int64),
    ("where(cond, float16, 2)", lambda x: torch.where(x > 0, x, 2), torch.float16),
]


def _scalar_input(dtype: torch.dtype) -> torch.Tensor:
    torch.manual_seed(0)
    if dtype.is_floating_point:
        return (torch.randn(8) * 4).to(dtype)
    return torch.randint(-100, 100, (8,), dtype=dtype)


@pytest.mark.parametrize("fn, dtype", [c[1:] for c in SCALAR_CASES], ids=[c[0] for c in SCALAR_CASES])
def test_python_scalar_operands_match_cpu_including_dtype(dev, fn, dtype):
    a = _scalar_input(dtype)
    assert_same(fn(a.to(dev)), fn(a))


# -- CPU 0-d tensor operands --------------------------------------------------------------------

CPU_SCALAR_CASES = [
    ("native add", lambda x: x + torch.tensor(2.5)),
    ("native add, CPU scalar first", lambda x: torch.tensor(2.5) + x),
    ("native mul, float64 scalar does not widen", lambda x: x * torch.tensor(1.5, dtype=torch.float64)),
    ("native where", lambda x: torch.where(x > 0, x, torch.tensor(0.0))),
    ("decomposed rsub", lambda x: torch.rsub(x, torch.tensor(3.0))),
    ("fallback copysign", lambda x: torch.copysign(x, torch.tensor(-1.0))),
    ("fallback maximum", lambda x: torch.maximum(x, torch.tensor(0.25))),
]


@pytest.mark.parametrize("fn", [c[1] for c in CPU_SCALAR_CASES], ids=[c[0] for c in CPU_SCALAR_CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cpu_zero_dim_tensor_operands_match_cpu(dev, fn, dtype):
    a = torch.randn(2, 3).to(dtype)
    assert_same(fn(a.to(dev)), fn(a))


def test_a_float_cpu_scalar_tensor_promotes_an_integer_device_tensor_like_cpu(dev):
    a = torch.arange(5)
    s = torch.tensor(2.5)
    assert_same(a.to(dev) + s, a + s)
    assert_same(a.to(dev) * torch.tensor(3), a * torch.tensor(3))


# -- host operands of more than one element --------------------------------------------------

HOST_OPERAND_CASES = [
    ("native", lambda x, h: x + h, "other"),
    ("native, host first", lambda x, h: h * x, "self"),
    ("native in a list", lambda x, h: torch.cat([x, h]), "tensors"),
    ("out=", lambda x, h: torch.add(x, h, out=torch.empty_like(x)), "other"),
    ("decomposed", lambda x, h: torch.rsub(x, h), "other"),
    ("fallback", lambda x, h: torch.bucketize(x, h), "boundaries"),
]


@pytest.mark.parametrize("fn, name", [c[1:] for c in HOST_OPERAND_CASES],
                         ids=[c[0] for c in HOST_OPERAND_CASES])
def test_a_host_operand_of_more_than_one_element_raises_like_pytorchs_accelerators(dev, fn, name):
    x = torch.randn(3).to(dev)
    for policy in ("allow", "deny"):  # the device error, not the fallback policy's
        accelkit.reset_stats()
        with accelkit.fallback_policy(policy):
            message = error_of(lambda: fn(x, torch.ones(3)))
        assert message.startswith("Expected all tensors to be on the same device")
        assert f"argument '{name}'" in message and f".to('{x.device}')" in message
        assert accelkit.stats()["ops"] == {}


def test_a_failed_inplace_op_with_a_host_operand_leaves_self_unchanged(dev):
    x = torch.randn(3).to(dev)
    before = x.cpu()
    assert "argument 'other'" in error_of(lambda: x.add_(torch.ones(3)))
    assert torch.equal(x.cpu(), before)


def test_host_indices_are_taken_as_on_pytorchs_accelerators(dev):
    x = torch.arange(6.0)
    index, mask = torch.tensor([4, 0]), torch.tensor([True, False] * 3)
    assert_same(x.to(dev)[index], x[index])
    assert_same(x.to(dev)[mask], x[mask])
    y = x.to(dev)
    y[index] = torch.tensor([-1.0, -2.0]).to(dev)
    x[index] = torch.tensor([-1.0, -2.0])
    assert_same(y, x)


# -- convolution ---------------------------------------------------------------------------------

CONV_CASES = [
    ("conv1d padding", F.conv1d, (2, 3, 10), (5, 3, 4), 5, dict(padding=2)),
    ("conv2d stride dilation", F.conv2d, (2, 3, 9, 9), (4, 3, 3, 3), 4, dict(stride=2, dilation=2)),
    ("conv2d groups no bias", F.conv2d, (2, 4, 6, 6), (6, 2, 3, 3), None, dict(groups=2, padding=1)),
    ("conv_transpose2d", F.conv_transpose2d, (2, 4, 5, 5), (4, 3, 3, 3), 6, dict(stride=2, groups=2)),
    ("conv3d", F.conv3d, (1, 2, 4, 4, 4), (3, 2, 2, 2, 2), 3, dict()),
]


@pytest.mark.parametrize(
    "conv, x_shape, w_shape, bias, kwargs", [c[1:] for c in CONV_CASES], ids=[c[0] for c in CONV_CASES]
)
def test_convolution_forward_and_backward_match_cpu(dev, conv, x_shape, w_shape, bias, kwargs):
    torch.manual_seed(0)
    inputs = [torch.randn(x_shape), torch.randn(w_shape)] + ([torch.randn(bias)] if bias else [])
    cpu = [t.clone().requires_grad_() for t in inputs]
    device = [t.to(dev).requires_grad_() for t in inputs]
    accelkit.reset_stats()

    expected, got = conv(*cpu, **kwargs), conv(*device, **kwargs)
    assert_same(got, expected.detach(), exact=False)
    assert counts("aten.convolution_overrideable.default")["fallback"] == 1

    grad = torch.randn(expected.shape)
    expected.backward(grad)
    got.backward(grad.to(dev))
    assert counts("aten.convolution_backward_overrideable.default")["fallback"] == 1
    for d, c in zip(device, cpu):
        assert_same(d.grad, c.grad, exact=False)


def test_convolution_backward_for_the_weight_only_matches_cpu(dev):
    torch.manual_seed(0)
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    w_cpu, w_dev = w.clone().requires_grad_(), w.to(dev).requires_grad_()
    F.conv2d(x, w_cpu, padding=1).square().sum().backward()
    F.conv2d(x.to(dev), w_dev, padding=1).square().sum().backward()
    assert_same(w_dev.grad, w_cpu.grad, exact=False)


# -- factory functions ---------------------------------------------------------------------------

FACTORY_CASES = [
    ("arange(10)", lambda d: torch.arange(10, device=d), True),
    ("arange(2, 9, 3)", lambda d: torch.arange(2, 9, 3, device=d), True),
    ("arange(0, 1, 0.1)", lambda d: torch.arange(0, 1, 0.1, device=d), True),
    ("arange float64", lambda d: torch.arange(-3, 3, 0.5, dtype=torch.float64, device=d), True),
    ("eye(4)", lambda d: torch.eye(4, device=d), True),
    ("eye(3, 5, int32)", lambda d: torch.eye(3, 5, dtype=torch.int32, device=d), True),
    ("full int", lambda d: torch.full((2, 3), 7, device=d), True),
    ("full float", lambda d: torch.full((2, 3), 1.5, device=d), True),
    ("full bool", lambda d: torch.full((4,), True, device=d), True),
    ("full float16", lambda d: torch.full((3,), 0.1, dtype=torch.float16, device=d), True),
    ("linspace", lambda d: torch.linspace(-1, 1, 7, device=d), False),
    ("linspace int64", lambda d: torch.linspace(0, 10, 5, dtype=torch.int64, device=d), True),
    ("linspace one step", lambda d: torch.linspace(3, 5, 1, device=d), True),
]


@pytest.mark.parametrize("make, exact", [c[1:] for c in FACTORY_CASES], ids=[c[0] for c in FACTORY_CASES])
def test_factory_functions_with_device_match_cpu(dev, make, exact):
    assert_same(make(dev), make("cpu"), exact=exact)
    assert_same(make("ref"), make("cpu"), exact=exact)


def test_autograd_zero_tensors_cross_to_the_device(dev):
    # sgn's gradient is a symbolic ZeroTensor (no memory): the fallback and the kernels both
    # receive it, and it must arrive as real zeros.
    x = torch.randn(4, requires_grad=True)
    torch.sgn(x.to(dev)).sum().backward()
    assert torch.equal(x.grad, torch.zeros(4))
