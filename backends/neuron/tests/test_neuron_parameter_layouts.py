"""A compiled graph's parameters prepared once (:mod:`accelkit_backends.neuron.parameter_layouts`):
the results are those of the graph run whole, a weight written between calls is seen by the next
call, and the preparation's cost is in the call that does it."""

from __future__ import annotations

import json

import pytest
import torch
import torch._dynamo
from torch import nn

import accelkit
from conftest import run_python
from accelkit_backends.neuron import runtime
from accelkit_backends.neuron.graph_lowering import NeuronGraphLowering


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    with accelkit.fallback_policy("deny"):
        yield
    torch._dynamo.reset()


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 384), nn.GELU(), nn.Linear(384, 128))


def run(model: nn.Module, x: torch.Tensor, calls: int, autocast: bool) -> list[tuple[torch.Tensor, dict]]:
    """``calls`` inferences of ``model`` compiled for neuron: per call, the result on the host
    and the call's estimate."""
    compiled = torch.compile(model, backend="neuron")
    results = []
    with torch.no_grad(), torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
        for _ in range(calls):
            accelkit.reset_stats()
            y = compiled(x).cpu()
            results.append((y, accelkit.stats()["estimate"]))
    return results


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16-autocast"])
def test_reused_parameters_give_the_bits_of_the_graph_run_whole(dev, autocast, monkeypatch):
    x = torch.randn(128, 256)
    reused = run(mlp().to(dev), x.to(dev), 3, autocast)
    torch._dynamo.reset()
    monkeypatch.setattr(NeuronGraphLowering, "reuses_parameters", False)
    whole = run(mlp().to(dev), x.to(dev), 2, autocast)
    for y, _ in reused:
        assert torch.equal(y, whole[0][0])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        expected = mlp()(x)
    tolerance = dict(atol=3e-2, rtol=3e-2) if autocast else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(reused[-1][0].float(), expected.float(), **tolerance)


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16-autocast"])
def test_the_preparation_is_paid_once_by_the_call_that_does_it(dev, autocast, monkeypatch):
    """On a target whose DMA transposes (trn2, the tests' default), only casts are prepared: a
    float32 graph runs as it is. On trn1 see the next test."""
    x = torch.randn(128, 256)
    first, second, third = [e for _, e in run(mlp().to(dev), x.to(dev), 3, autocast)]
    torch._dynamo.reset()
    monkeypatch.setattr(NeuronGraphLowering, "reuses_parameters", False)
    _, whole = [e for _, e in run(mlp().to(dev), x.to(dev), 2, autocast)]
    assert first["launches"] == second["launches"] == whole["launches"] == 1
    assert second["seconds"] == third["seconds"]
    if not autocast and runtime.core().spec.transpose_in_dma:
        assert first["seconds"] == second["seconds"]
        return
    # Later calls skip the weights' casts (and transposes): cheaper than the graph run whole.
    assert second["seconds"] < whole["seconds"] and second["seconds"] < first["seconds"]
    assert second["per_op"]["aten.convert"]["calls"] < first["per_op"]["aten.convert"]["calls"]


TRN1_CALLS = """
import json, torch, torch._dynamo, accelkit
from accelkit_backends.neuron.graph_lowering import NeuronGraphLowering
dev = accelkit.select_device("neuron")

def seconds(reuse, calls):
    NeuronGraphLowering.reuses_parameters = reuse
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).to(dev)
    compiled, x = torch.compile(model, backend="neuron"), torch.randn(256, 256).to(dev)
    result = []
    with torch.no_grad():
        for _ in range(calls):
            accelkit.reset_stats()
            compiled(x).cpu()
            result.append(accelkit.stats()["estimate"]["seconds"])
    return result

from accelkit_backends.neuron import runtime
print("ROW " + json.dumps({"reused": seconds(True, 3), "whole": seconds(False, 2),
                          "hbm_bandwidth": runtime.core().spec.hbm_bandwidth}))
"""


def test_on_trn1_weights_are_transposed_once_by_the_tensor_engine():
    """trn1 has no transposing DMA: ``F.linear``'s ``W.t()`` is laid out row-major by the call
    that prepares it, and later calls read the row-major copy: cheaper than the graph run
    whole, whose matmuls transpose W at every call. The preparing call does the graph's work
    and, on top, stores the laid-out weights to HBM and loads them back: at most that dearer."""
    result = run_python(TRN1_CALLS, {"ACCELKIT_NEURON_TARGET": "trn1"})
    assert result.returncode == 0, result.stderr[-2000:]
    row = json.loads([ln for ln in result.stdout.splitlines() if ln.startswith("ROW ")][-1][4:])
    (first, second, third), whole = row["reused"], row["whole"][1]
    assert second == third < min(first, whole)
    weight_bytes = (256 * 512 + 512 * 256) * 4
    assert first <= whole + 2 * weight_bytes / row["hbm_bandwidth"]


def test_a_weight_written_in_place_between_calls_is_seen_by_the_next_call(dev):
    model = nn.Linear(256, 128)
    x = torch.randn(64, 256)
    compiled = torch.compile(model.to(dev), backend="neuron")
    xd = x.to(dev)
    with torch.no_grad():
        before = compiled(xd).cpu()
        compiled(xd)  # reuses the prepared weight
        model.weight.mul_(-2.0)
        model.bias.add_(1.0)
        after = compiled(xd).cpu()
        expected = nn.functional.linear(x, model.weight.cpu(), model.bias.cpu())
    torch.testing.assert_close(after, expected, atol=1e-4, rtol=1e-5)
    assert not torch.allclose(after, before)


@pytest.mark.parametrize("write", ["in place", "through .data"])
def test_a_kept_bf16_weight_is_refreshed_after_a_write(dev, write):
    """Under autocast the program keeps each weight's bf16 copy; a write to the weight between
    calls must reach the next call. ``param.data`` has a version counter of its own: there the
    allocator's count of writes to the block is what shows the change (EMA updates and older
    init code write this way)."""
    model = nn.Linear(256, 128)
    x = torch.randn(64, 256)
    compiled = torch.compile(model.to(dev), backend="neuron")
    xd = x.to(dev)
    version = model.weight._version
    with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16):
        before = compiled(xd).cpu()
        compiled(xd)  # reuses the kept copy
        if write == "in place":
            model.weight.mul_(-2.0)
        else:
            model.weight.data.mul_(-2.0)
            model.weight.data[:5].copy_(torch.ones(5, 256))
            assert model.weight._version == version  # the parameter's own counter did not move
        after = compiled(xd).cpu()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = nn.functional.linear(x, model.weight.cpu(), model.bias.cpu())
    torch.testing.assert_close(after.float(), expected.float(), atol=3e-2, rtol=3e-2)
    assert not torch.allclose(after.float(), before.float(), atol=1e-1)


def test_a_weight_replaced_through_load_state_dict_is_seen(dev):
    model = nn.Linear(64, 32).to(dev)
    other = nn.Linear(64, 32)
    x = torch.randn(8, 64)
    compiled = torch.compile(model, backend="neuron")
    with torch.no_grad():
        compiled(x.to(dev))
        compiled(x.to(dev))
        model.load_state_dict(other.state_dict())
        after = compiled(x.to(dev)).cpu()
        expected = other(x)
    torch.testing.assert_close(after, expected, atol=1e-5, rtol=1e-5)


def test_compiled_training_sees_every_optimizer_step(dev):
    """The first step prepares the weights; the step after finds them changed before any reuse,
    and from there the forward runs whole (the weights change at every step)."""
    torch.manual_seed(0)
    cpu_model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    model.load_state_dict(cpu_model.state_dict())
    model = model.to(dev)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    losses = {}
    for name, net, inputs in (("cpu", cpu_model, (x, y)), ("neuron", model, (x.to(dev), y.to(dev)))):
        forward = torch.compile(net, backend="neuron") if name == "neuron" else net
        optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
        losses[name] = []
        for _ in range(4):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(forward(inputs[0]), inputs[1])
            loss.backward()
            optimizer.step()
            losses[name].append(loss.item())
    assert losses["neuron"] == pytest.approx(losses["cpu"], rel=1e-4)
    assert len(set(losses["neuron"])) == 4  # the steps changed the weights


def test_kept_copies_count_as_device_memory(dev):
    torch.manual_seed(0)
    model = nn.Linear(512, 512, bias=False).to(dev)
    x = torch.randn(4, 512).to(dev)
    compiled = torch.compile(model, backend="neuron")
    with torch.no_grad(), torch.autocast("neuron", dtype=torch.bfloat16):
        compiled(x)  # compiles; the preparation's copy is kept from here on
        torch.neuron.synchronize()
        held = torch.neuron.memory_allocated()
        torch._dynamo.reset()
        del compiled
        import gc

        gc.collect()
        released = torch.neuron.memory_allocated()
    # the weight's bf16 copy (512 KiB) was held by the program, and let go with it
    assert held - released >= 512 * 512 * 2


def test_a_compiled_bert_encoder_gives_the_bits_of_the_graph_run_whole(dev, monkeypatch):
    """A small BERT (the shape of the validation table's encoders) under bf16 autocast: the
    reused weights change no bit of its output, and it matches the CPU's autocast."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=256, vocab_size=1000)

    def encode(calls: int) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = transformers.AutoModel.from_config(config).eval().to(dev)
        compiled = torch.compile(model, backend="neuron")
        ids = torch.randint(0, config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(1)).to(dev)
        with torch.no_grad(), torch.autocast("neuron", dtype=torch.bfloat16):
            return [compiled(input_ids=ids).last_hidden_state.cpu() for _ in range(calls)]

    reused = encode(2)
    torch._dynamo.reset()
    monkeypatch.setattr(NeuronGraphLowering, "reuses_parameters", False)
    whole = encode(1)
    assert torch.equal(reused[0], whole[0]) and torch.equal(reused[1], whole[0])
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(reused[1].float(), expected.float(), atol=5e-2, rtol=5e-2)


def test_a_weight_given_new_memory_through_data_is_seen(dev):
    """``param.data = other`` keeps the parameter and its version: the new storage tells."""
    model = nn.Linear(64, 32).to(dev)
    x = torch.randn(8, 64)
    compiled = torch.compile(model, backend="neuron")
    replacement = torch.randn(32, 64)
    with torch.no_grad():
        compiled(x.to(dev))
        compiled(x.to(dev))
        model.weight.data = replacement.to(dev)
        after = compiled(x.to(dev)).cpu()
        expected = nn.functional.linear(x, replacement, model.bias.cpu())
    torch.testing.assert_close(after, expected, atol=1e-5, rtol=1e-5)
