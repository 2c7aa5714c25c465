"""torch.compile(backend="ref"): Dynamo capture and AOT graphs running on the device."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import accelkit
from accelkit._runtime.compile.compiler import compiler_for


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 3))


def test_compiled_forward_and_backward_match_eager_on_device(dev):
    eager = _model().to(dev)
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, backend="ref")
    x = torch.randn(5, 8).to(dev)

    expected = eager(x)
    got = compiled(x)
    expected.square().sum().backward()
    got.square().sum().backward()

    torch.testing.assert_close(got.cpu(), expected.cpu())
    for p_eager, p_compiled in zip(eager.parameters(), compiled_model.parameters()):
        assert p_compiled.grad.device == dev
        torch.testing.assert_close(p_compiled.grad.cpu(), p_eager.grad.cpu())


def test_compiled_graph_ops_run_through_the_device_pipeline(dev):
    compiled = torch.compile(lambda a, b: torch.relu(a @ b) + 1, backend="ref")
    a, b = torch.randn(4, 4).to(dev), torch.randn(4, 4).to(dev)
    accelkit.reset_stats()

    out = compiled(a, b)

    torch.testing.assert_close(out.cpu(), torch.relu(a.cpu() @ b.cpu()) + 1)
    assert accelkit.stats()["ops"]["aten.mm.default"]["native"] >= 1


def test_compiling_for_a_backend_that_is_not_active_names_both(dev):
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    with pytest.raises(accelkit.DeviceUnavailableError, match=r"'tpu'.*'ref' is active"):
        compiler_for("tpu")(gm, [torch.ones(1)])


def test_devices_report_compile_and_collectives_support():
    (ref,) = [r for r in accelkit.devices() if r.name == "ref"]
    assert ref.supports == {"compile": True, "collectives": True}
