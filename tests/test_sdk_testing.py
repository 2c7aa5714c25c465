"""accelkit.sdk.testing: the parity harness against a device made to diverge on purpose, and the
pytest plugin in fresh pytest processes (it activates the device it is asked for, and nothing
happens in a run that did not load it)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from accelkit.sdk.testing import device_under_test
from accelkit.sdk.testing.parity import ParityError, assert_training_parity, train_steps

#: ref computes with CPU kernels; optimizers take their foreach path on it (see test_training).
RTOL, ATOL = 1e-5, 1e-6


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _batches(steps: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(12, 8, generator=g), torch.randint(0, 4, (12,), generator=g)) for _ in range(steps)]


def _sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


class SkewedFrom(nn.Module):
    """The MLP, whose output off the CPU is scaled by 1.01 from its ``step``-th forward on: a
    stand-in for a kernel that goes wrong once the weights reach some values."""

    def __init__(self, step: int):
        super().__init__()
        self.body, self.step, self.calls = _mlp(), step, 0

    def forward(self, x):
        self.calls += 1
        out = self.body(x)
        return out * 1.01 if self.calls >= self.step and x.device.type != "cpu" else out


class WithIdle(nn.Module):
    """The MLP plus a parameter of which only element 0 reaches the output: elements 1 and 2
    have a zero gradient."""

    def __init__(self):
        super().__init__()
        self.body, self.idle = _mlp(), nn.Parameter(torch.zeros(3))

    def forward(self, x):
        return self.body(x) + self.idle[0]


def _nudging_on_device(nudge):
    """An SGD factory whose optimizer, off the CPU, calls ``nudge(optimizer)`` after each step."""

    def make(params):
        optimizer = _sgd(params)
        if optimizer.param_groups[0]["params"][0].device.type != "cpu":
            step = optimizer.step

            def nudged_step(*args, **kwargs):
                result = step(*args, **kwargs)
                with torch.no_grad():
                    nudge(optimizer)
                return result

            optimizer.step = nudged_step
        return optimizer

    return make


def test_matching_training_returns_both_runs(dev):
    model = _mlp()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = assert_training_parity(model, _batches(), dev, _sgd, rtol=RTOL, atol=ATOL,
                                    compare_optimizer_state=True)
    assert result.device.device == dev and result.reference.device == torch.device("cpu")
    assert result.device.losses.shape == (4,)
    assert result.reference.losses[-1] < result.reference.losses[0]  # it trained
    assert not torch.equal(result.device.state["0.weight"], before["0.weight"])
    assert set(result.device.optimizer_state) == {f"{n}.momentum_buffer" for n in before}
    assert result.device.outputs.shape == (12, 4)
    assert next(result.device.model.parameters()).device == dev
    assert not result.device.model.training
    for name, value in model.state_dict().items():  # the caller's model is left untouched
        assert torch.equal(value, before[name])


def test_the_first_diverging_step_is_named(dev):
    with pytest.raises(ParityError) as caught:
        assert_training_parity(SkewedFrom(step=3), _batches(), dev, _sgd, rtol=RTOL, atol=ATOL)
    error = caught.value
    assert error.step == 3
    assert "first diverging step: 3 of 4" in str(error)
    assert f"on {dev}" in str(error)
    assert torch.allclose(error.result.device.losses[:2], error.result.reference.losses[:2], rtol=RTOL, atol=ATOL)


def test_a_diverging_parameter_is_named_when_the_losses_agree(dev):
    def nudge(optimizer):
        optimizer.param_groups[0]["params"][-1].add_(1e-3)  # the last layer's bias

    with pytest.raises(ParityError) as caught:
        assert_training_parity(_mlp(), _batches(1), dev, _nudging_on_device(nudge), rtol=RTOL, atol=ATOL)
    error = caught.value
    assert error.step is None  # a step's loss is taken before its update
    assert error.entry == "2.bias"
    assert error.outputs  # and the eval forward sees the moved bias
    assert "first diverging state_dict entry: '2.bias'" in str(error)
    assert "inference outputs diverge" in str(error)


def test_ignored_elements_are_not_compared_and_the_others_are(dev):
    def nudge_idle(optimizer):
        optimizer.param_groups[0]["params"][0][2] += 1.0  # idle[2] (a module's own parameters come first)

    make = _nudging_on_device(nudge_idle)
    with pytest.raises(ParityError) as caught:
        assert_training_parity(WithIdle(), _batches(2), dev, make, rtol=RTOL, atol=ATOL)
    assert caught.value.entry == "idle" and caught.value.step is None and not caught.value.outputs
    result = assert_training_parity(WithIdle(), _batches(2), dev, make, rtol=RTOL, atol=ATOL,
                                    ignore={"idle": slice(1, None)}, compare_optimizer_state=True)
    assert result.device.state["idle"][2] == 2.0  # nudged twice, and not compared

    def nudge_all(optimizer):
        optimizer.param_groups[0]["params"][0].add_(1.0)  # idle[0] too: must still be compared

    with pytest.raises(ParityError, match="'idle'"):
        assert_training_parity(WithIdle(), _batches(2), dev, _nudging_on_device(nudge_all),
                               rtol=RTOL, atol=ATOL, ignore={"idle": slice(1, None)})


def test_optimizer_state_is_compared_when_asked(dev):
    def nudge_momentum(optimizer):
        first = optimizer.param_groups[0]["params"][0]
        optimizer.state[first]["momentum_buffer"].mul_(1.5)

    make = _nudging_on_device(nudge_momentum)
    # One step: the nudge comes after the update, so only the optimizer state differs.
    assert_training_parity(_mlp(), _batches(1), dev, make, rtol=RTOL, atol=ATOL)
    with pytest.raises(ParityError) as caught:
        assert_training_parity(_mlp(), _batches(1), dev, make, rtol=RTOL, atol=ATOL,
                               compare_optimizer_state=True)
    assert caught.value.entry == "0.weight.momentum_buffer"
    assert "first diverging optimizer state entry: '0.weight.momentum_buffer'" in str(caught.value)


def test_dtype_runs_the_device_side_in_that_dtype_against_the_cpu_dtype(dev):
    # bfloat16 keeps 8 bits of mantissa: about 4e-3 relative per rounding, a few per layer.
    result = assert_training_parity(_mlp(), _batches(2), dev, _sgd, rtol=3e-2, atol=3e-2, dtype=torch.bfloat16)
    assert result.device.losses.dtype == torch.bfloat16 and result.reference.losses.dtype == torch.float32
    assert result.device.state["0.weight"].dtype == torch.bfloat16
    with pytest.raises(ParityError):  # it really computed in bfloat16
        assert_training_parity(_mlp(), _batches(2), dev, _sgd, rtol=RTOL, atol=ATOL, dtype=torch.bfloat16)


def test_autocast_applies_to_both_runs(dev):
    result = assert_training_parity(_mlp(), _batches(2), dev, _sgd, rtol=RTOL, atol=ATOL, autocast=torch.bfloat16)
    assert result.device.outputs.dtype == torch.bfloat16 == result.reference.outputs.dtype
    assert result.device.state["0.weight"].dtype == torch.float32
    plain = assert_training_parity(_mlp(), _batches(2), dev, _sgd, rtol=RTOL, atol=ATOL)
    assert not torch.allclose(plain.device.losses, result.device.losses, rtol=1e-4, atol=0)


def test_loss_fn_tuple_inputs_and_probe(dev):
    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 2), nn.Linear(3, 2)

        def forward(self, x, y):
            return self.a(x) + self.b(y), self.a(x)

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    batches = [((torch.randn(5, 3, generator=g), torch.randn(5, 3, generator=g)), torch.randn(5, 2, generator=g))
               for _ in range(3)]
    probe = (torch.ones(1, 3), torch.zeros(1, 3))
    result = assert_training_parity(Pair(), batches, dev, _sgd, rtol=RTOL, atol=ATOL,
                                    loss_fn=lambda out, target: nn.functional.mse_loss(out[0], target), probe=probe)
    trained = result.reference.state
    a_of_ones = trained["a.weight"].sum(1) + trained["a.bias"]
    both, a_only = result.device.outputs
    torch.testing.assert_close(both, (a_of_ones + trained["b.bias"])[None], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(a_only, a_of_ones[None], rtol=RTOL, atol=ATOL)


def test_a_diverging_element_of_a_tuple_output_is_named(dev):
    class TwoHeads(nn.Module):
        """Two outputs; the second is off on the device in eval mode only (the loss uses the first)."""

        def __init__(self):
            super().__init__()
            self.body = _mlp()

        def forward(self, x):
            out = self.body(x)
            skew = not self.training and x.device.type != "cpu"
            return out, out * 1.01 if skew else out

    with pytest.raises(ParityError) as caught:
        assert_training_parity(TwoHeads(), _batches(2), dev, _sgd, rtol=RTOL, atol=ATOL,
                               loss_fn=lambda out, target: nn.functional.cross_entropy(out[0], target))
    assert caught.value.outputs and caught.value.step is None and caught.value.entry is None
    assert "inference outputs diverge:\n    [1]: Mismatched elements" in str(caught.value)


def test_train_steps_trains_in_place_on_the_models_device(dev):
    model = _mlp().to(dev)
    before = model[0].weight.detach().cpu().clone()
    losses = train_steps(model, torch.optim.SGD(model.parameters(), lr=0.5), _batches(1) * 3)
    assert losses.device == torch.device("cpu") and losses.shape == (3,)
    assert losses[-1] < losses[0]
    assert not torch.equal(model[0].weight.detach().cpu(), before)


# -- the plugin, in fresh pytest processes ----------------------------------------------------


def _pytest(tmp_path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=tmp_path, env=full_env, capture_output=True, text=True, timeout=300)


PROBE_TESTS = '''
import gc
from accelkit.sdk.testing import device_under_test

DEVICE = device_under_test()  # at import: the plugin activated it before collection


def test_device(dev, no_gc):
    assert dev is DEVICE and dev.type == "{expected}"
    assert not gc.isenabled()
'''


def test_the_plugin_activates_the_named_device_once_for_the_session(tmp_path):
    (tmp_path / "test_probe.py").write_text(PROBE_TESTS.format(expected="ref"))
    run = _pytest(tmp_path, "-p", "accelkit.sdk.testing.plugin", "--accelkit-device", "ref", "test_probe.py",
                  env={"ACCELKIT_TEST_DEVICE": "nonesuch"})  # the option wins over the variable
    assert run.returncode == 0, run.stdout + run.stderr
    assert "accelkit device under test: ref" in run.stdout
    assert "1 passed" in run.stdout


def test_the_plugin_reads_the_device_from_the_environment_and_refuses_an_unknown_one(tmp_path):
    (tmp_path / "test_probe.py").write_text(PROBE_TESTS.format(expected="ref"))
    run = _pytest(tmp_path, "-p", "accelkit.sdk.testing.plugin", "test_probe.py",
                  env={"ACCELKIT_TEST_DEVICE": "nonesuch"})
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout + run.stderr
    assert "accelkit device under test ($ACCELKIT_TEST_DEVICE / default)" in run.stderr
    assert "nonesuch" in run.stderr


def test_without_the_plugin_nothing_is_activated_and_the_option_is_unknown(tmp_path):
    (tmp_path / "test_probe.py").write_text(PROBE_TESTS.format(expected="ref"))
    run = _pytest(tmp_path, "test_probe.py")
    assert run.returncode == pytest.ExitCode.INTERRUPTED, run.stdout + run.stderr  # a collection error
    assert "no accelkit device under test: load the pytest plugin" in run.stdout
    run = _pytest(tmp_path, "--accelkit-device", "ref", "test_probe.py")
    assert run.returncode == pytest.ExitCode.USAGE_ERROR
    assert "unrecognized arguments: --accelkit-device" in run.stderr


def test_this_session_runs_under_the_plugin(dev):
    assert device_under_test() is dev
