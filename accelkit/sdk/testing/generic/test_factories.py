"""Every aten factory (an overload that takes ``device=`` and no tensor) works on the device as
on the CPU, or is refused cleanly.

PyTorch implements some factories once for every device, filling the result through a
per-device kernel table (a DispatchStub) that has no PrivateUse1 entry: ``kaiser_window`` on a
PrivateUse1 device used to end in an internal assert. This walks every such overload PyTorch
registers, so a new one is found by the suite, not by a user: each one the CPU runs must give a
result of the CPU's shape and dtype on the device (and the CPU's values, unless it draws random
numbers), or raise ``NotImplementedError`` (a layout the device does not have, e.g. sparse).
"""

from __future__ import annotations

import warnings

import pytest
import torch

_FLOAT_DEFAULTS = ("window", "linspace", "logspace", "normal", "rand", "scalar_tensor", "full")


def _sample(argument: torch._C.Argument) -> object:
    kind = str(argument.type)
    if kind in ("int", "SymInt"):
        return 5
    if kind == "float":
        return 0.5
    if kind in ("number", "Scalar"):
        return 2
    if kind == "bool":
        return False
    if kind in ("List[int]", "List[SymInt]"):
        return [3]
    raise LookupError(kind)


def _factories() -> list[tuple[torch._ops.OpOverload, list, dict]]:
    found = []
    for qualified in sorted(torch._C._dispatch_get_all_op_names()):
        if not qualified.startswith("aten::"):
            continue
        name, _, overload = qualified[len("aten::"):].partition(".")
        packet = getattr(torch.ops.aten, name, None)
        op = getattr(packet, overload or "default", None) if packet is not None else None
        if op is None:
            continue
        arguments = op._schema.arguments
        if not any(a.name == "device" for a in arguments):
            continue
        if any(a.alias_info is not None and a.alias_info.is_write for a in arguments):
            continue  # out= overloads write a tensor they are given: not factories
        try:
            args = [_sample(a) for a in arguments if not a.kwarg_only and a.default_value is None and a.name != "device"]
        except LookupError:
            continue  # takes a tensor (or a type no factory sample fits)
        kwargs = {}
        if any(a.name == "dtype" for a in arguments) and any(key in name for key in _FLOAT_DEFAULTS):
            kwargs["dtype"] = torch.float32
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                op(*args, device="cpu", **kwargs)
        except Exception:
            continue  # the CPU refuses these sample arguments: nothing to compare with
        found.append((op, args, kwargs))
    return found


FACTORIES = _factories()


def test_the_walk_finds_the_factories_it_is_about():
    names = {str(op) for op, _, _ in FACTORIES}
    assert {"aten.kaiser_window.beta", "aten.hann_window.default", "aten.arange.start_step", "aten.eye.m",
            "aten.randperm.default", "aten.full.default"} <= names
    assert len(FACTORIES) >= 40


@pytest.mark.parametrize("op, args, kwargs", FACTORIES, ids=[str(op) for op, _, _ in FACTORIES])
def test_a_factory_the_cpu_runs_runs_on_the_device_or_is_refused_cleanly(dev, op, args, kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = op(*args, device="cpu", **kwargs)
        try:
            got = op(*args, device=dev, **kwargs)
        except NotImplementedError:
            return  # refused cleanly, as for a layout the device does not have
    assert got.device.type == dev.type
    assert got.dtype == want.dtype and got.shape == want.shape
    random = torch.Tag.nondeterministic_seeded in op.tags
    uninitialised = "empty" in op._schema.name or op._schema.name == "aten::_make_dep_token"
    if not random and not uninitialised and want.layout == torch.strided:
        torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6, equal_nan=True)
