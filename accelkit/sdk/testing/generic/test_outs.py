"""``out=`` arguments on the device under test, each case checked against the CPU: the op's own
rule for ``out=`` dtypes, an ``out=`` tensor on the CPU refused as on PyTorch's accelerators,
factories writing through a strided ``out=``, and the resize of a too-small one.

Device-generic (``--accelkit-device tpu|neuron`` runs it on another backend). These are the
cases PyTorch's own device-generic tests (``TestCommon.test_out``) found, re-written, plus an
``op_db`` walk that holds every OpInfo with an ``out=`` variant to the host-``out=`` rule.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable

import pytest
import torch

import accelkit
from accelkit.sdk.testing import device_under_test, holds

DEVICE = device_under_test()

_HOST_OUT_MESSAGE = "Expected all tensors to be on the same device, but found at least two devices"


def outcome(fn: Callable[[], object]) -> tuple:
    """("ok",) or (exception type, message) of ``fn()``, its warnings silenced."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()
        return ("ok",)
    except Exception as error:  # the exception is the result compared
        return (type(error), str(error))


def sentinel(shape: tuple[int, ...], dtype: torch.dtype, device: object = "cpu") -> torch.Tensor:
    """A tensor of recognisable values, to show that a refused call wrote nothing."""
    return torch.full(shape, 7, dtype=dtype, device=device)


# -- the op's own rule for out= dtypes -----------------------------------------------------------

#: (case, inputs on the CPU, fn(*inputs, out=...), out shape, out dtype). Each op has its own
#: rule; the CPU kernel is the reference for all of them.
OUT_DTYPE_CASES = [
    ("exp float -> float64 casts", lambda: [torch.randn(4)], lambda x, out: torch.exp(x, out=out),
     (4,), torch.float64),
    ("add float -> float64 casts", lambda: [torch.randn(4)], lambda x, out: torch.add(x, x, out=out),
     (4,), torch.float64),
    ("add float -> int64 refused", lambda: [torch.randn(4)], lambda x, out: torch.add(x, x, out=out),
     (4,), torch.int64),
    ("neg float -> float64 refused", lambda: [torch.randn(4)], lambda x, out: torch.neg(x, out=out),
     (4,), torch.float64),
    ("mm float -> float64 refused", lambda: [torch.randn(2, 3), torch.randn(3, 2)],
     lambda a, b, out: torch.mm(a, b, out=out), (2, 2), torch.float64),
    ("tril float -> float64 refused", lambda: [torch.randn(3, 3)], lambda x, out: torch.tril(x, out=out),
     (3, 3), torch.float64),
    ("nonzero -> float refused", lambda: [torch.tensor([1.0, 0.0, 2.0])],
     lambda x, out: torch.nonzero(x, out=out), (0,), torch.float32),
    ("nonzero -> int64", lambda: [torch.tensor([1.0, 0.0, 2.0])],
     lambda x, out: torch.nonzero(x, out=out), (0,), torch.int64),
    ("nansum float -> int64 (no integer kernel)", lambda: [torch.tensor([1.5, float("nan"), 2.0])],
     lambda x, out: torch.nansum(x, out=out), (), torch.int64),
    ("nansum float -> float64", lambda: [torch.tensor([1.5, float("nan"), 2.0])],
     lambda x, out: torch.nansum(x, out=out), (), torch.float64),
    ("sum float -> int64 computes in int64", lambda: [torch.tensor([1.5, 2.5, -0.5])],
     lambda x, out: torch.sum(x, 0, out=out), (), torch.int64),
    ("mean float -> int64 refused", lambda: [torch.randn(3, 4)],
     lambda x, out: torch.mean(x, 0, out=out), (4,), torch.int64),
    ("isposinf -> float refused", lambda: [torch.tensor([1.0, float("inf")])],
     lambda x, out: torch.isposinf(x, out=out), (2,), torch.float32),
    ("bernoulli -> int64 writes its draws", lambda: [torch.tensor([0.0, 1.0, 1.0])],
     lambda p, out: torch.bernoulli(p, out=out), (3,), torch.int64),
    ("clamp_min float -> int64 refused", lambda: [torch.randn(4)],
     lambda x, out: torch.clamp_min(x, 0.0, out=out), (4,), torch.int64),
    ("sigmoid float -> float64 casts", lambda: [torch.randn(4)],
     lambda x, out: torch.sigmoid(x, out=out), (4,), torch.float64),
]


@pytest.mark.parametrize("make, fn, shape, dtype", [c[1:] for c in OUT_DTYPE_CASES],
                         ids=[c[0] for c in OUT_DTYPE_CASES])
def test_an_out_of_another_dtype_follows_the_ops_own_rule_like_cpu(dev, make, fn, shape, dtype):
    if not holds(dtype):
        pytest.skip(f"{dev.type} does not hold {dtype}")
    inputs = make()
    cpu_out = sentinel(shape, dtype)
    expected = outcome(lambda: fn(*inputs, out=cpu_out))
    out = sentinel(shape, dtype, dev)
    assert outcome(lambda: fn(*[t.to(dev) for t in inputs], out=out)) == expected
    assert out.dtype == dtype
    if expected == ("ok",):
        torch.testing.assert_close(out.cpu(), cpu_out, rtol=1e-6, atol=1e-6)
    else:  # unchanged (the CPU's mean has written into its out by the time it raises)
        assert torch.equal(out.cpu(), sentinel(shape, dtype))


def test_the_out_dtype_rule_asks_the_cpu_once_per_signature(dev, monkeypatch):
    from accelkit._runtime.dispatch import out_rules

    runs = []
    real = out_rules._quietly
    monkeypatch.setattr(out_rules, "_quietly", lambda *a: (runs.append(a[0]), real(*a)))
    x = torch.randn(5, 3).to(dev)
    torch.neg(x)
    if accelkit.stats()["ops"].get("aten.neg.default", {}).get("native", 0) == 0:
        pytest.skip(f"{dev.type} has no native neg kernel: its out= runs on the CPU fallback, where no rule is asked")
    for _ in range(3):
        with pytest.raises(RuntimeError):
            torch.neg(x, out=torch.empty(5, 3, dtype=torch.int32, device=dev))
    assert len(runs) == 2, "the out= overload, then the functional one, once"
    assert runs[0] is torch.ops.aten.neg.out and runs[1] is torch.ops.aten.neg.default
    runs.clear()
    x = torch.randn(7).to(dev)  # another shape: asked again
    with pytest.raises(RuntimeError):
        torch.neg(x, out=torch.empty(7, dtype=torch.int32, device=dev))
    assert len(runs) == 2


def test_the_out_dtype_rule_leaves_the_cpu_generator_as_it_was(dev):
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    p = torch.tensor([0.5, 0.5]).to(dev)
    torch.bernoulli(p, out=torch.empty(2, dtype=torch.int32, device=dev))
    assert torch.equal(torch.rand(4), expected)


# -- an out= tensor on the CPU ---------------------------------------------------------------

#: (case, fn(x, out=...) on device inputs x, out shapes, the argument named). One op per path on
#: ref (native add, decomposed clamp_min, fallback sigmoid, addr: a composite routed into the
#: pipeline) and the shapes PyTorch's accelerators refuse (0-dim too: outputs are never CPU
#: scalars).
HOST_OUT_CASES = [
    ("add", lambda x, out: torch.add(x, x, out=out), [(3,)], "out"),
    ("add into a 0-dim out", lambda x, out: torch.add(x[0], 1, out=out), [()], "out"),
    ("cos", lambda x, out: torch.cos(x, out=out), [(3,)], "out"),
    ("logaddexp2", lambda x, out: torch.logaddexp2(x, x, out=out), [(3,)], "out"),
    ("clamp_min", lambda x, out: torch.clamp_min(x, 0.0, out=out), [(3,)], "out"),
    ("sigmoid", lambda x, out: torch.sigmoid(x, out=out), [(3,)], "out"),
    ("sum into a 0-dim out", lambda x, out: torch.sum(x, 0, out=out), [()], "out"),
    ("linalg.cross", lambda x, out: torch.linalg.cross(x.expand(2, 3), x.expand(2, 3), out=out), [(2, 3)], "out"),
    ("addr", lambda x, out: torch.addr(x.expand(3, 3), x, x, out=out), [(3, 3)], "out"),
    ("max.dim, two outs", lambda x, out: torch.max(x, 0, out=out), [(), ()], "max"),
]


@pytest.mark.parametrize("fn, shapes, name", [c[1:] for c in HOST_OUT_CASES], ids=[c[0] for c in HOST_OUT_CASES])
@pytest.mark.parametrize("policy", ["allow", "deny"])
def test_a_cpu_out_for_device_inputs_is_refused_before_anything_runs(dev, fn, shapes, name, policy):
    x = torch.randn(3).to(dev)
    dtypes = [torch.float32] * len(shapes) if len(shapes) == 1 else [torch.float32, torch.int64]
    outs = [sentinel(s, d) for s, d in zip(shapes, dtypes)]
    accelkit.reset_stats()
    with accelkit.fallback_policy(policy), pytest.raises(RuntimeError) as error:
        fn(x, outs[0] if len(outs) == 1 else tuple(outs))
    message = str(error.value)
    assert message.startswith(_HOST_OUT_MESSAGE), message
    assert f"argument '{name}'" in message
    assert f"pass a {x.device} tensor" in message
    for out, s, d in zip(outs, shapes, dtypes):
        assert torch.equal(out, sentinel(s, d))
    assert accelkit.stats()["ops"] == {}, "nothing ran"


def test_an_inplace_op_on_a_cpu_tensor_with_a_device_operand_is_refused(dev):
    cpu_scalar = torch.tensor(1.0)
    with pytest.raises(RuntimeError, match=_HOST_OUT_MESSAGE) as error:
        cpu_scalar.add_(torch.ones((), device=dev))
    assert "argument 'self'" in str(error.value)
    assert cpu_scalar.item() == 1.0


def _op_db_out_cases():
    from torch.testing._internal.common_methods_invocations import op_db

    for op in op_db:
        if op.supports_out and torch.float32 in op.supported_dtypes(DEVICE.type):
            yield pytest.param(op, id=op.full_name)


#: OpInfos whose Python wrapper copies into ``out=`` itself, on every device (CUDA too).
_PYTHON_LEVEL_OUT = {"lu"}


@pytest.mark.parametrize("op", list(_op_db_out_cases()))
def test_every_opinfo_refuses_a_cpu_out_for_device_inputs(dev, op):
    """PyTorch's ``TestCommon.test_out`` case 3 (an ``out=`` on another device raises), for the
    first sample of every OpInfo with an ``out=`` variant, on every path."""
    if op.full_name in _PYTHON_LEVEL_OUT:
        pytest.skip(f"{op.full_name}'s Python wrapper writes out= on any device, as on CUDA")
    torch.manual_seed(0)
    try:
        samples = list(itertools.islice(op.sample_inputs(dev, torch.float32), 1))
    except Exception as error:
        pytest.skip(f"no sample on {dev.type}: {type(error).__name__}")
    for sample in samples:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                expected = op(sample.input, *sample.args, **sample.kwargs)
        except Exception as error:
            pytest.skip(f"the sample does not run on {dev.type}: {type(error).__name__}")
        results = [expected] if isinstance(expected, torch.Tensor) else expected
        if not isinstance(results, (list, tuple)) or not all(isinstance(r, torch.Tensor) and r.layout == torch.strided for r in results):
            pytest.skip("results are not strided tensors")
        outs = [sentinel(r.shape, r.dtype) if r.dtype != torch.bool else torch.ones(r.shape, dtype=torch.bool)
                for r in results]
        before = [o.clone() for o in outs]
        out = outs[0] if isinstance(expected, torch.Tensor) else type(expected)(outs)
        with pytest.raises(RuntimeError) as error:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                op(sample.input, *sample.args, **sample.kwargs, out=out)
        assert "without device memory" not in str(error.value)
        assert all(torch.equal(o, b) for o, b in zip(outs, before)), "a refused out= was written"


# -- factories write through a strided out= --------------------------------------------------

FACTORY_CASES = [
    ("full", lambda out: torch.full((4, 3), 2.5, out=out), (3, 4)),
    ("ones", lambda out: torch.ones((4, 3), out=out), (3, 4)),
    ("zeros", lambda out: torch.zeros((4, 3), out=out), (3, 4)),
    ("eye", lambda out: torch.eye(4, 3, out=out), (3, 4)),
    ("arange", lambda out: torch.arange(6.0, out=out), (12,)),
    ("linspace", lambda out: torch.linspace(0, 1, 6, out=out), (12,)),
]


def _strided_out(base_shape: tuple[int, ...], device: object) -> tuple[torch.Tensor, torch.Tensor]:
    base = torch.full(base_shape, -1.0, device=device)
    return base, (base.t() if base.dim() == 2 else base[::2])


@pytest.mark.parametrize("fn, base_shape", [c[1:] for c in FACTORY_CASES], ids=[c[0] for c in FACTORY_CASES])
def test_a_factory_writes_through_a_strided_out_of_the_right_shape(dev, fn, base_shape):
    cpu_base, cpu_out = _strided_out(base_shape, "cpu")
    fn(cpu_out)
    base, out = _strided_out(base_shape, dev)
    fn(out)
    assert out.stride() == cpu_out.stride()
    assert out.untyped_storage()._cdata == base.untyped_storage()._cdata
    torch.testing.assert_close(out.cpu(), cpu_out)
    torch.testing.assert_close(base.cpu(), cpu_base)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32])
@pytest.mark.parametrize("call", [
    lambda out: torch.arange(3.1, out=out),                  # an integer count stops at 3
    lambda out: torch.arange(-2.5, 3.7, 1.5, out=out),
    lambda out: torch.full((2, 3), 2.7, out=out),
    lambda out: torch.linspace(0.5, 9.7, 5, out=out),
], ids=["arange", "arange_start_step", "full", "linspace"])
def test_a_factory_computes_in_its_outs_dtype_like_cpu(dev, call, dtype):
    # out= overloads of factories have no dtype argument: CPU computes in the out's dtype
    # (arange(3.1) into int64 is [0, 1, 2]; computed in float and cast it was [0, 1, 2, 3]).
    want = torch.empty(0, dtype=dtype)
    expected = outcome(lambda: call(want))
    got = torch.empty(0, dtype=dtype, device=dev)
    assert outcome(lambda: call(got)) == expected
    if expected == ("ok",):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("factory", [torch.randn, torch.rand])
def test_a_random_factory_keeps_the_strides_of_its_out(dev, factory):
    base, out = _strided_out((3, 4), dev)
    factory((4, 3), out=out)
    assert out.stride() == (1, 4)
    assert not torch.equal(base.cpu(), torch.full((3, 4), -1.0)), "written through the view"


def test_resize_keeps_strides_for_the_same_shape_and_restrides_otherwise(dev):
    for device in ("cpu", dev):
        t = torch.zeros(3, 4, device=device).t()
        assert t.resize_((4, 3)).stride() == (1, 4)
        assert t.resize_((4, 3), memory_format=torch.contiguous_format).stride() == (3, 1)
        assert torch.zeros(3, 4, device=device).t().resize_((2, 6)).stride() == (6, 1)


# -- resizing an out= that is too small -----------------------------------------------------


def _warnings_of(fn: Callable[[], object]) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message).split(". ")[0] for w in caught]


@pytest.mark.parametrize("out_shape", [(), (1,), (0,)])
def test_nonzero_resizes_a_too_small_out_like_cpu(dev, out_shape):
    x = torch.tensor([[1.0, 0.0], [2.0, 3.0]])
    cpu_out = torch.zeros(out_shape, dtype=torch.int64)
    expected = _warnings_of(lambda: torch.nonzero(x, out=cpu_out))
    out = torch.zeros(out_shape, dtype=torch.int64, device=dev)
    assert _warnings_of(lambda: torch.nonzero(x.to(dev), out=out)) == expected
    assert out.shape == cpu_out.shape
    assert torch.equal(out.cpu(), cpu_out)


# -- ops whose out= PyTorch implements for every device --------------------------------------


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", [0, -1])
def test_mode_with_out_matches_cpu(dev, dim, keepdim):
    x = torch.tensor([[1.0, 2.0, 2.0], [3.0, 3.0, 1.0], [0.0, 5.0, 5.0]])
    values, indices = torch.empty(0), torch.empty(0, dtype=torch.int64)
    torch.mode(x, dim, keepdim, out=(values, indices))
    got = (torch.empty(0, device=dev), torch.empty(0, dtype=torch.int64, device=dev))
    torch.mode(x.to(dev), dim, keepdim, out=got)
    assert torch.equal(got[0].cpu(), values) and torch.equal(got[1].cpu(), indices)
    functional = torch.mode(x.to(dev), dim, keepdim)
    assert torch.equal(functional.values.cpu(), values) and torch.equal(functional.indices.cpu(), indices)


def test_the_routed_composites_have_a_reason_and_a_device_kernel(dev):
    from accelkit._runtime.dispatch.fallback import ROUTED_COMPOSITES

    for op, reason in ROUTED_COMPOSITES.items():
        assert reason
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "PrivateUse1"), op
