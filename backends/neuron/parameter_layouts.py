"""Parameters prepared once: a compiled graph's casts and layouts of its weights, reused.

A graph whose parameter reaches the kernels only through a cast or a view (``F.linear``
multiplies by ``W.t()``, a column-major view; autocast converts ``W`` to bf16 first) would
redo that work at every call: on NeuronCore-v2 a column-major operand is transposed on the
Tensor engine each time, and the cast is one more kernel per weight. neuronx-cc prepares a
compiled program's weights once, when it loads them. This module does the equivalent:

- At lowering (per set of parameter inputs, at its first call), the graph's **prologue** is
  found: the nodes computed from parameters alone by casts and views (:data:`PREPARING_OPS`).
  Its values the rest of the graph uses are the *kept* values (but a contiguous view of a
  parameter, which costs nothing, and a value the graph returns). Two programs are made: the
  **cold** one, the whole graph with each kept value laid out row-major where it is used and
  returned after the graph's outputs; the **warm** one, the graph without the prologue, the
  kept values its trailing inputs.
- At a call, the runtime says which inputs are parameters and stamps their state
  (:class:`accelkit.sdk.ParameterStamp`: owner, address, version). While every stamp matches
  the one the kept copies were made from, the call runs the warm program on them; otherwise it
  runs the cold program, one program as the graph was (so the preparation's cost is in that
  call's estimate), and keeps what it returned. An optimizer step or any in-place write to a
  parameter bumps its version, so the next call prepares it again; but when the copies went
  stale before any call reused them (training: the weights change at every step), calls run
  the graph whole, as before, until the parameters are unchanged from one call to the next.
- The kept copies count as device memory (``ParameterInputs.hold``) until the next
  preparation replaces them or the graph's program is gone.

Calls without parameters (or whose parameters feed no prologue) run the graph as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

import numpy as np

from accelkit.sdk import ParameterInputs
from accelkit_backends.neuron import launch, runtime
from accelkit_backends.neuron.graph_lowering import GraphProgram
from accelkit_backends.neuron.kernels.matmul import row_major_copy
from accelkit_backends.neuron.sim import numerics as nx

aten = torch.ops.aten

#: Ops that only prepare a parameter: a cast and views that neither grow nor reorder it beyond
#: a transpose (an ``expand`` would make the kept copy larger than the parameter).
PREPARING_OPS = frozenset({
    aten._to_copy.default, aten.clone.default, aten.t.default, aten.transpose.int, aten.permute.default,
    aten.view.default, aten._unsafe_view.default, aten.unsqueeze.default, aten.squeeze.dim,
})


class ColdProgram(GraphProgram):
    """The whole graph, its matmuls fed the prepared parameters, which it also returns (after
    the graph's outputs): one program, as the graph was. Counted as the graph's program."""

    compiled_total = 0
    built = 0


class WarmProgram(GraphProgram):
    """The graph without its prologue: the prepared parameters are its trailing inputs. Not
    counted apart: it is the cold program less the preparation."""

    compiled_total = 0
    built = 0


class _Split:
    """The two programs of one graph for one set of parameter inputs."""

    def __init__(self, graph: torch.fx.GraphModule, random_nodes: Sequence[torch.fx.Node],
                 prologue: list[torch.fx.Node], kept: list[torch.fx.Node], label: str, relayout: bool):
        placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
        #: Per kept node, the input position of the parameter it is prepared from.
        self.roots = [placeholders.index(_root(node)) for node in kept]
        results = graph.graph.output_node().args[0]
        #: How many outputs the graph has (the cold program's prepared values follow them).
        self.outputs = len(results) if isinstance(results, tuple | list) else 1
        cold, cold_random = _cold_graph(graph, kept, random_nodes, relayout)
        self.cold = ColdProgram(cold, cold_random)
        self.cold.label = label
        warm, warm_random = _warm_graph(graph, placeholders, prologue, kept, random_nodes)
        self.warm = WarmProgram(warm, warm_random)
        self.warm.label = label
        #: The kept copies; None until the first preparation. Replaced as one value, so that a
        #: concurrent call sees one preparation or the other, never half of each.
        self.kept: _Kept | None = None
        #: The stamps of the last call run whole (parameters that change at every call).
        self.seen: list[Any] | None = None


class _Kept:
    """Prepared copies, the handles that count their memory, the stamps they were made from,
    and whether a call has reused them yet."""

    def __init__(self, arrays: list[Any], handles: list[Any], stamps: list[Any]):
        self.arrays, self.handles, self.stamps = arrays, handles, stamps
        self.reused = False

    def current(self, stamps: list[Any]) -> bool:
        return all(s.same_as(old) for s, old in zip(stamps, self.stamps))


class ParameterReusingProgram:
    """A graph's program (``lower``'s result) that prepares its parameters once (see the module).

    Called ``program(inputs, draws)`` it runs the whole graph; ``program(inputs, draws,
    parameters)`` reuses prepared parameters while their stamps are unchanged."""

    def __init__(self, graph: torch.fx.GraphModule, random_nodes: Sequence[torch.fx.Node]):
        self._graph = graph
        self._random_nodes = list(random_nodes)
        self.whole = GraphProgram(graph, random_nodes)
        self.label = self.whole.label
        #: Per set of parameter positions: its split, or None when nothing is worth preparing.
        self._splits: dict[frozenset[int], _Split | None] = {}

    def __call__(self, inputs: list, draws: Sequence[Any], parameters: ParameterInputs | None = None) -> list:
        if parameters is None:
            return self.whole(inputs, draws)
        positions = frozenset(i for i, stamp in enumerate(parameters.stamps) if stamp is not None)
        if positions not in self._splits:
            self._splits[positions] = self._split(positions)
        split = self._splits[positions]
        if split is None:
            return self.whole(inputs, draws)
        stamps = [parameters.stamps[i] for i in split.roots]
        kept = split.kept
        if kept is not None and kept.current(stamps):
            kept.reused = True
            return split.warm([*inputs, *kept.arrays], draws)
        split.kept = None  # the stale copies' memory is free for the new ones
        changing = (kept is not None and not kept.reused
                    or kept is None and split.seen is not None
                    and not all(s.same_as(old) for s, old in zip(stamps, split.seen)))
        if changing:
            # The parameters change at every call (training): preparing would cost each call
            # more than it saves, so the graph runs whole until they hold still for a call.
            split.seen = stamps
            return self.whole(inputs, draws)
        results = split.cold(inputs, draws)
        outputs, prepared = list(results[:split.outputs]), list(results[split.outputs:])
        split.kept = _Kept(prepared, [parameters.hold(array) for array in prepared], stamps)
        return outputs

    def _split(self, positions: frozenset[int]) -> _Split | None:
        placeholders = [n for n in self._graph.graph.nodes if n.op == "placeholder"]
        prologue = prologue_of(self._graph, {placeholders[i] for i in positions})
        members = set(prologue)
        # Where a DMA can transpose (NeuronCore-v3+), a matmul reads a column-major weight at
        # no extra cost: only casts are worth keeping. On v2 the transposes are too.
        relayout = not runtime.core().spec.transpose_in_dma
        # A value the graph returns keeps its own layout (and memory): it is not kept.
        kept = [n for n in prologue if any(user not in members for user in n.users)
                and not any(user.op == "output" for user in n.users) and _worth_keeping(n, relayout)]
        if not kept:
            return None
        return _Split(self._graph, self._random_nodes, prologue, kept, self.label, relayout)


def prologue_of(graph: torch.fx.GraphModule, parameters: set[torch.fx.Node]) -> list[torch.fx.Node]:
    """The nodes (in graph order) computed from ``parameters`` alone by :data:`PREPARING_OPS`."""
    derived: set[torch.fx.Node] = set()
    prologue = []
    for node in graph.graph.nodes:
        if node.op != "call_function" or node.target not in PREPARING_OPS:
            continue
        inputs = node.all_input_nodes
        if inputs and all(n in parameters or n in derived for n in inputs) and _on_device(node):
            derived.add(node)
            prologue.append(node)
    return prologue


def _on_device(node: torch.fx.Node) -> bool:
    """A cast that stays on the device (``_to_copy`` may also move to the host)."""
    val = node.meta.get("val")
    source = node.all_input_nodes[0].meta.get("val")
    return isinstance(val, torch.Tensor) and isinstance(source, torch.Tensor) and val.device == source.device


def _root(node: torch.fx.Node) -> torch.fx.Node:
    while node.op != "placeholder":
        node = node.all_input_nodes[0]
    return node


def _worth_keeping(node: torch.fx.Node, relayout: bool) -> bool:
    """A prepared value worth a copy: a cast (or copy) of the parameter, or, when ``relayout``,
    a view that a kernel would read column-major. A view of the parameter itself is free."""
    if relayout and not node.meta["val"].is_contiguous():
        return True
    while node.op != "placeholder":
        if node.target in (aten._to_copy.default, aten.clone.default):
            return True
        node = node.all_input_nodes[0]
    return False


def _cold_graph(graph: torch.fx.GraphModule, kept: list[torch.fx.Node], random_nodes: Sequence[torch.fx.Node],
                relayout: bool) -> tuple[torch.fx.GraphModule, list[torch.fx.Node]]:
    """The graph with each kept value returned after the graph's outputs; with ``relayout``,
    made row-major first where it is not, and used in that layout from there on."""
    cold = torch.fx.Graph()
    env: dict[torch.fx.Node, Any] = {}
    returned = []
    for node in graph.graph.nodes:
        if node.op == "output":
            continue
        env[node] = cold.node_copy(node, env.__getitem__)
        if node in kept:
            value = env[node]
            val = node.meta["val"]
            if relayout and not val.is_contiguous():
                if val.dim() == 2 and val.stride(0) == 1:  # a transposed matrix: F.linear's W.t()
                    value = cold.call_function(laid_out, (value,))
                else:
                    value = cold.call_function(aten.clone.default, (value,), {"memory_format": torch.contiguous_format})
                value.meta["val"] = val
                env[node] = value
            returned.append(value)
    results = graph.graph.output_node().args[0]
    results = tuple(results) if isinstance(results, tuple | list) else (results,)
    cold.output(tuple(torch.fx.node.map_arg(results, env.__getitem__)) + tuple(returned))
    return torch.fx.GraphModule(graph, cold), [env[n] for n in random_nodes]


def _warm_graph(graph: torch.fx.GraphModule, placeholders: list[torch.fx.Node], prologue: list[torch.fx.Node],
                kept: list[torch.fx.Node], random_nodes: Sequence[torch.fx.Node]
                ) -> tuple[torch.fx.GraphModule, list[torch.fx.Node]]:
    """The graph without the kept values' preparation, each kept value a trailing input. A
    prologue node something else still uses (through no kept value) stays."""
    kept_set, members = set(kept), set(prologue)
    stays: set[torch.fx.Node] = set()
    for node in reversed(prologue):
        if node not in kept_set and any(user not in members or user in stays for user in node.users):
            stays.add(node)
    warm = torch.fx.Graph()
    env = {p: warm.node_copy(p) for p in placeholders}
    for i, node in enumerate(kept):
        env[node] = warm.placeholder(f"prepared_{i}")
        env[node].meta.update(node.meta)
    for node in graph.graph.nodes:
        if node.op == "placeholder" or node in kept_set or (node in members and node not in stays):
            continue
        env[node] = warm.node_copy(node, env.__getitem__)
    return torch.fx.GraphModule(graph, warm), [env[n] for n in random_nodes]


def laid_out(matrix: np.ndarray) -> np.ndarray:
    """A column-major ``matrix`` copied row-major by the Tensor engine's transposes, the way
    the matmul kernel transposes an operand on NeuronCore-v2 (a strided copy would move one
    element per DMA descriptor); a static kernel, so a program holding it replays."""

    def body(k: Any, arrays: list[np.ndarray]) -> np.ndarray:
        return row_major_copy(k, arrays[0], launch.hbm_empty(matrix.shape, nx.torch_dtype(matrix.dtype)))

    instance = ("weight_layout", (("array", matrix.shape, matrix.dtype.str, matrix.strides),), ())
    return launch.run_static("weight_layout", instance, [matrix], (), body)
