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

import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch.multiprocessing.reductions import StorageWeakRef


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
    #: When True, programs are called ``program(inputs, draws, parameters)`` with a
    #: :class:`ParameterInputs`: which inputs are ``nn.Parameter`` tensors and whether they
    #: changed since a previous call, so that a program may prepare a parameter once (lay it
    #: out, cast it) and reuse the prepared copy, as an ahead-of-time compiler treats weights.
    reuses_parameters: bool = False

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


class ParameterStamp(NamedTuple):
    """The state of one program input that is an ``nn.Parameter``, taken at the call. Two
    stamps of the same live parameter, storage, address, version and block writes mean the
    contents are the same: an in-place write (an optimizer step, ``copy_`` under ``no_grad``)
    bumps the version, and ``param.data = other`` changes the storage. A write through
    ``param.data`` leaves the version alone (PyTorch gives ``.data`` a version counter of its
    own); the backend's count of writes to the block sees it, where the backend keeps one
    (:meth:`DeviceAllocator.block_writes`)."""

    #: The parameter; dead (returns None) once it is gone, so an id is never reused by mistake.
    owner: weakref.ref
    #: Its storage, weakly: expired once freed, so a new storage at a reused address differs.
    storage: StorageWeakRef
    #: Its ``data_ptr()``.
    address: int
    #: Its version counter (``_version``).
    version: int
    #: The backend's count of writes to the storage's block (:meth:`DeviceAllocator.block_writes`),
    #: which also sees writes through ``param.data``; None where the backend does not count.
    writes: Any = None

    def same_as(self, earlier: ParameterStamp | None) -> bool:
        """Whether ``earlier`` (a stamp taken before this one) stamps the same contents."""
        if (earlier is None or self.address != earlier.address or self.version != earlier.version
                or self.writes != earlier.writes):
            return False
        if earlier.storage.expired() or self.storage != earlier.storage:
            return False
        owner = self.owner()
        return owner is not None and owner is earlier.owner()


class ParameterInputs(NamedTuple):
    """What a program of a lowering with ``reuses_parameters`` gets besides its inputs."""

    #: Per input: its :class:`ParameterStamp` if it is an ``nn.Parameter`` of the device, else None.
    stamps: list
    #: ``hold(array) -> handle``: counts a backend array the program keeps across calls (a
    #: prepared parameter) as device memory until the handle is dropped.
    hold: Callable[[Any], Any]


def parameter_stamp(tensor: Any, writes: Any = None) -> ParameterStamp | None:
    """The stamp of ``tensor`` if it is an ``nn.Parameter``, else None; ``writes`` is the
    backend's count of writes to its storage's block."""
    if not isinstance(tensor, torch.nn.Parameter):
        return None
    return ParameterStamp(weakref.ref(tensor), StorageWeakRef(tensor.untyped_storage()), tensor.data_ptr(),
                          tensor._version, writes)


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
