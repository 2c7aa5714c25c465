"""The shared compiler machinery (``accelkit.sdk.graph_compiler``) with a lowering written here.

The lowering runs each graph with ``torch.fx.Interpreter`` on ref's backend arrays (CPU
tensors): what a backend author's first :class:`accelkit.sdk.GraphLowering` looks like. The
tests check what the runtime promises around any lowering: input mutations written back,
inputs passed through, random draws from the device generator, splitting at nodes the lowering
refuses, the fallback policy, and the statistics.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch._dynamo

import accelkit
from accelkit.sdk import GraphLowering, graph_compiler

aten = torch.ops.aten


class InterpretingLowering(GraphLowering):
    """Runs graphs on the backend's arrays with PyTorch's CPU kernels; refuses ``refused``."""

    name = "interpreter"

    def __init__(self, refused=()):
        self.refused = set(refused)
        self.draws: list[list] = []
        self.graphs: list[torch.fx.GraphModule] = []
        self.built = 0

    def lowers(self, op):
        return op not in self.refused

    def lower(self, graph, random_nodes):
        self.graphs.append(graph)
        self.built += 1
        interpreter = torch.fx.Interpreter(graph)

        def program(inputs, draws):
            self.draws.append(list(draws))
            with torch.random.fork_rng(devices=[]):
                torch.default_generator.manual_seed(draws[0].seed ^ draws[0].offset if draws else 0)
                out = interpreter.run(*inputs)
            return list(out) if isinstance(out, tuple | list) else [out]

        return program

    def programs_compiled(self):
        return self.built


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled(fn, lowering):
    return torch.compile(fn, backend=graph_compiler(lowering))


def test_input_mutations_are_written_back_and_inputs_pass_through(dev):
    lowering = InterpretingLowering()

    def update(x, y):
        x.mul_(2)
        return y, x + y

    x, y = torch.ones(3, device=dev), torch.full((3,), 5.0, device=dev)
    version = x._version
    same, total = compiled(update, lowering)(x, y)
    assert x.cpu().tolist() == [2.0, 2.0, 2.0]
    assert x._version > version
    assert total.cpu().tolist() == [7.0, 7.0, 7.0]
    assert same.data_ptr() == y.data_ptr()  # the input itself, not a copy
    copies = [n for g in lowering.graphs for n in g.graph.nodes if n.target is aten.copy_.default]
    assert copies == []  # the mutation left the graph: the runtime stores it


def test_each_call_reserves_its_random_nodes_counters_from_the_device_generator(dev):
    lowering = InterpretingLowering()
    fn = compiled(lambda x: torch.nn.functional.dropout(x, 0.5) * torch.nn.functional.dropout(x[:3], 0.25).sum(), lowering)
    x = torch.ones(62, device=dev)
    torch.manual_seed(3)
    first = fn(x).cpu()
    torch.manual_seed(3)
    again = fn(x).cpu()
    fn(x)
    assert torch.equal(first, again)
    seeded, repeated, third = lowering.draws
    assert [(d.seed, d.offset) for d in seeded] == [(d.seed, d.offset) for d in repeated]
    # Node by node in graph order, as eagerly: 62 counters (aligned to 64) for the first mask,
    # then 3 (4) for the second; the next call starts where this one ended.
    assert [d.offset for d in seeded] == [0, 64]
    assert [d.offset for d in third] == [68, 132]
    assert {d.seed for d in seeded + third} == {3}
    assert torch.ref.get_rng_state()[8:].view(torch.int64).item() == 136


def test_a_refused_node_splits_the_graph_and_runs_eagerly(dev):
    lowering = InterpretingLowering(refused={aten.sin.default})
    fn = compiled(lambda x: (x * 2).sin() + 1, lowering)
    x = torch.randn(4)
    accelkit.reset_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = fn(x.to(dev))
    torch.testing.assert_close(out.cpu(), (x * 2).sin() + 1)
    stats = accelkit.stats()["compile"]
    assert stats["eager_nodes"] == {"aten.sin.default": 1}
    assert stats["program_segments"] == 2
    assert all(n.target is not aten.sin.default for g in lowering.graphs for n in g.graph.nodes)


def test_deny_refuses_a_graph_it_would_split(dev):
    fn = compiled(lambda x: x.sin() + 1, InterpretingLowering(refused={aten.sin.default}))
    with accelkit.fallback_policy("deny"), pytest.raises(Exception, match=r"aten\.sin\.default.*'deny'"):
        fn(torch.ones(2, device=dev))


def test_statistics_count_graphs_programs_and_reuse(dev):
    lowering = InterpretingLowering()
    fn = compiled(lambda x: x * 3, lowering)
    accelkit.reset_stats()
    for _ in range(3):
        fn(torch.ones(2, device=dev))
    stats = accelkit.stats()["compile"]
    assert stats["graphs_captured"] == 1
    assert stats["aot_graphs"] == {"inference": 1}
    assert stats["programs_compiled"] == 1
    assert stats["program_calls"] == 3 and stats["program_cache_hits"] == 3
    accelkit.reset_stats()
    assert accelkit.stats()["compile"]["program_calls"] == 0
    assert accelkit.stats()["compile"]["programs_compiled"] == 0


def test_a_lowering_that_is_not_a_graph_lowering_is_refused(dev):
    fn = torch.compile(lambda x: x + 1, backend=graph_compiler(lambda: object()))
    with pytest.raises(Exception, match="expected a GraphLowering"):
        fn(torch.ones(2, device=dev))
