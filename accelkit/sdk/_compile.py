"""The compiler contract: what a backend supplies so that ``torch.compile(backend=<name>)`` turns
each captured graph into its own executable.

The runtime owns everything that is the same for every backend (see
``accelkit/_runtime/compile/graph_compiler.py``): Dynamo capture, AOTAutograd's functional forward and
backward aten graphs (with the backend's decompositions for ops it has no kernel for), input
mutations written back into the real tensors, random ops' draws from the device generator, the
split at nodes the backend cannot lower (those run through the eager pipeline and are counted),
the compile statistics and bucketing. A backend supplies a :class:`GraphLowering`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch


class GraphLowering:
    """How one backend lowers functional aten graphs. Subclass it and return
    ``graph_compiler(MyLowering())`` from ``accelkit_make_compiler``.

    The graphs handed to :meth:`lower` are functional (no in-place ops, no ``out=``), every
    ``call_function`` node's target is one of: an aten ``OpOverload`` for which :meth:`lowers`
    said True, ``operator.getitem``, or a Python function of symbolic integers
    (``operator.mul``, ``torch.sym_max``, ...). Every node carries ``meta["val"]``: the fake
    tensor (or integer) PyTorch computed for it, with its dtype and shape.
    """

    #: Named in errors and statistics.
    name: str = "backend"

    def lowers(self, op: torch._ops.OpOverload) -> bool:
        """Whether :meth:`lower` can compile a node calling ``op``. A False node is split out
        of the program and run eagerly (through the backend's kernels or the CPU fallback)."""
        raise NotImplementedError

    def lowers_node(self, node: torch.fx.Node) -> bool:
        """Whether :meth:`lower` can compile this node (its ``meta["val"]`` and its inputs'
        carry their dtypes and shapes): :meth:`lowers` of its op unless a backend whose
        support depends on more than the op (a dtype it has programs for in some ops only)
        overrides it. A False node is split out and run eagerly, as for :meth:`lowers`."""
        return self.lowers(node.target)

    def lower(self, graph: torch.fx.GraphModule, random_nodes: Sequence[torch.fx.Node]) -> Callable[..., Any]:
        """Compile ``graph`` into a program.

        :param random_nodes: the nodes that draw random numbers (dropout, ``rand``, ...), in
            graph order.
        :returns: ``program(inputs, draws) -> outputs``: ``inputs`` holds, per placeholder, the
            backend array of a device tensor (what the allocator's ``read`` returns for it) or a
            Python int for a symbolic size; ``draws`` holds, per random node in graph order, the
            :class:`~accelkit.sdk.RandomDraw` the runtime reserved for it from the device
            generator at this call (the counters the same op would draw eagerly): the node
            computes :mod:`accelkit.sdk.random_stream` from it, as the eager kernel does, so a
            compiled random op equals the eager one.
            ``outputs`` are, per graph output, a backend array or a Python number. The program
            must raise PyTorch's error for bad values as the eager kernels do.
        """
        raise NotImplementedError

    def programs_compiled(self) -> int:
        """Executables built so far (a program compiles once per concrete input shape)."""
        return 0

    def use_cache_directory(self, path: str) -> None:
        """Keep compiled executables in ``path`` across processes (``ACCELKIT_COMPILE_CACHE``).
        The default keeps nothing."""

    def cache_statistics(self) -> dict[str, int]:
        """Counters of the persistent cache since :meth:`use_cache_directory` (e.g. ``hits``,
        ``misses``); reported in ``stats()["compile"]["persistent_cache"]``."""
        return {}


class GraphParts(NamedTuple):
    """A functional aten graph as a lowering walks it."""

    #: The graph's inputs, in the order a program receives them.
    placeholders: list[torch.fx.Node]
    #: The ``call_function`` nodes, in execution order.
    body: list[torch.fx.Node]
    #: What the program returns: per output, a node or a constant.
    outputs: tuple


def graph_parts(graph: torch.fx.GraphModule) -> GraphParts:
    """The placeholders, body and outputs of a graph handed to :meth:`GraphLowering.lower`."""
    nodes = list(graph.graph.nodes)
    output = next(n for n in nodes if n.op == "output")
    outputs = output.args[0] if isinstance(output.args[0], tuple | list) else (output.args[0],)
    return GraphParts([n for n in nodes if n.op == "placeholder"], [n for n in nodes if n.op == "call_function"],
                      tuple(outputs))


def graph_compiler(lowering: GraphLowering | Callable[[], GraphLowering]) -> Callable[..., Any]:
    """The ``torch.compile`` backend that runs captured graphs through ``lowering``.

    :param lowering: the backend's lowering, or a function making it (called at the first
        compilation, so that activation stays cheap).
    :returns: a callable with Dynamo's backend signature ``(gm, example_inputs) -> callable``:
        what ``accelkit_make_compiler`` returns.
    """
    from accelkit.sdk._runtime_link import graph_compiler

    return graph_compiler(lowering)
