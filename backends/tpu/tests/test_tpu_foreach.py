"""tpu foreach ops (``torch._foreach_add_`` and the like): one program per call for the whole
list, results matching the CPU's, in-place overloads that write nothing when one result cannot
be stored, and the optimizers that call them.

Run with ``pytest backends/tpu/tests`` (its own process: see ``conftest.py`` there).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import accelkit
from accelkit._runtime.dispatch.schema import variants_of
from accelkit_backends.tpu.kernels.foreach import _FOREACH
from accelkit_backends.tpu.lowering import kernels
from conftest import assert_native, on_device

aten = torch.ops.aten

SHAPES = [(3, 4), (5,)]


def _sample(seed: int) -> list[torch.Tensor]:
    """One tensor per shape, positive (so sqrt, log and division stay real)."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.rand(s, generator=generator) + 0.5 for s in SHAPES]


def _arguments(op) -> tuple[list, dict]:
    """Arguments after ``self`` for ``op``, built from its schema."""
    args, kwargs = [], {}
    for i, argument in enumerate(op._schema.arguments[1:]):
        kind = str(argument.type)
        if kind == "List[Tensor]":
            value = _sample(i + 1)
        elif kind in ("List[Scalar]", "List[number]"):
            value = [0.25, -0.75]
        elif kind == "Tensor":
            value = torch.tensor(0.5)
        elif kind in ("Scalar", "number"):
            value = {"alpha": 0.5, "ord": 3.0}.get(argument.name, 0.3)
        elif argument.name == "dtype":
            value = None
        else:
            raise AssertionError(f"{op}: no sample for {argument.name}: {kind}")
        if argument.kwarg_only:
            kwargs[argument.name] = value
        else:
            args.append(value)
    return args, kwargs


def _lowered_foreach_ops() -> list:
    return [entry.op for entry in kernels if entry.op._schema.name.startswith("aten::_foreach_")]


def test_every_foreach_op_in_the_table_is_lowered():
    names = {op._schema.name.removeprefix("aten::_foreach_") for op in _lowered_foreach_ops()}
    assert names == set(_FOREACH) | {"norm", "zero"}


@pytest.mark.parametrize("op", _lowered_foreach_ops(), ids=str)
def test_a_foreach_op_and_its_inplace_variant_match_the_cpu_in_one_program(dev, op):
    args, kwargs = _arguments(op)
    expected = op(_sample(0), *args, **kwargs)
    with accelkit.fallback_policy("deny"):
        actual = op(on_device(_sample(0), dev), *on_device(args, dev), **kwargs)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a.cpu(), e)
    ran = {str(op)}
    inplace = variants_of(op)[0]
    if inplace is not None:  # _foreach_norm has none
        selves = on_device(_sample(0), dev)
        with accelkit.fallback_policy("deny"):
            inplace(selves, *on_device(args, dev), **kwargs)
        for a, e in zip(selves, expected, strict=True):
            torch.testing.assert_close(a.cpu(), e)
        ran.add(str(inplace))
    # One native call each: the list never went element by element.
    ops = accelkit.stats()["ops"]
    assert set(ops) == ran and all(ops[name]["native"] == 1 for name in ran)


def test_an_inplace_foreach_op_that_cannot_store_one_result_raises_like_cpu_and_writes_none(dev):
    def make():
        return [torch.zeros(3), torch.arange(3)]

    with pytest.raises(RuntimeError) as on_cpu:
        torch._foreach_add_(make(), 1.5)
    selves = on_device(make(), dev)
    with pytest.raises(RuntimeError) as on_tpu:
        torch._foreach_add_(selves, 1.5)
    assert str(on_tpu.value) == str(on_cpu.value)
    for t, before in zip(selves, make()):  # the CPU's loop wrote the float tensor first
        assert torch.equal(t.cpu(), before)


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd momentum, weight decay, nesterov": lambda p: torch.optim.SGD(
        p, lr=0.1, momentum=0.9, weight_decay=1e-2, nesterov=True),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adam amsgrad": lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
}


def test_gradient_clipping_and_zeroing_run_foreach_ops_natively_and_match_the_cpu(dev):
    grads = [torch.randn(s) * 10 for s in SHAPES]
    on_tpu = [nn.Parameter(torch.zeros(s, device=dev)) for s in SHAPES]
    on_cpu = [nn.Parameter(torch.zeros(s)) for s in SHAPES]
    for params in (on_tpu, on_cpu):
        for p, g in zip(params, grads):
            p.grad = g.to(p.device)
    with accelkit.fallback_policy("deny"):
        total = nn.utils.clip_grad_norm_(on_tpu, max_norm=1.0, foreach=True)
    torch.testing.assert_close(total.cpu(), nn.utils.clip_grad_norm_(on_cpu, max_norm=1.0, foreach=True))
    for p, q in zip(on_tpu, on_cpu):
        torch.testing.assert_close(p.grad.cpu(), q.grad)
    optimizer = torch.optim.SGD(on_tpu, lr=0.1, foreach=True)
    with accelkit.fallback_policy("deny"):
        optimizer.zero_grad(set_to_none=False)
    assert all(torch.equal(p.grad.cpu(), torch.zeros(p.shape)) for p in on_tpu)
    assert_native("aten._foreach_norm.Scalar", "aten._foreach_mul_.Tensor", "aten._foreach_zero_.default")


@pytest.mark.parametrize("make", OPTIMIZERS.values(), ids=list(OPTIMIZERS))
def test_optimizer_steps_run_foreach_ops_natively_and_match_the_cpu(dev, make):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    x, y = torch.randn(10, 6), torch.randint(0, 3, (10,))
    runs = {}
    for device in ("cpu", dev):
        net = copy.deepcopy(model).to(device)
        optimizer = make(net.parameters())
        for _ in range(3):
            optimizer.zero_grad()
            nn.functional.cross_entropy(net(x.to(device)), y.to(device)).backward()
            with accelkit.fallback_policy("deny"):
                optimizer.step()
        runs[str(device)] = [p.detach().cpu() for p in net.parameters()]
    for on_tpu, on_cpu in zip(runs[str(dev)], runs["cpu"], strict=True):
        torch.testing.assert_close(on_tpu, on_cpu, rtol=1e-5, atol=1e-6)
    stepped = [name for name in accelkit.stats()["ops"] if name.startswith("aten._foreach_")]
    assert stepped, "the optimizer took its per-tensor path"
    assert_native(*stepped)
