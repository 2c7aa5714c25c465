"""``torch.compile`` for every accelkit backend: what is the same whatever the backend lowers to.

Dynamo captures a graph and hands it to :class:`GraphCompiler`; AOTAutograd turns it into
functional aten graphs (a forward and a backward when gradients are needed, else one inference
graph), decomposing the ops the backend has no kernel for with the backend's own table. Each
aten graph is then prepared here and lowered by the backend (:class:`accelkit.sdk.GraphLowering`):

- **input mutations**: an in-place update of a graph input (an optimizer step, ``x.add_(1)``)
  is kept in the inference graph as ``copy_(input, new)``; the node is removed, ``new`` becomes
  an extra output of the program, and after the run it is stored into the input's memory (no
  dispatch; the version counter is bumped as ``copy_`` would). Mutations in training graphs
  (BatchNorm's running statistics) are written back by AOTAutograd after the run, through the
  eager ``copy_``. Outputs that alias inputs are rebuilt by AOTAutograd as views of the inputs.
- **random ops**: each program call reserves, for each random node in graph order, the counters
  it draws from the device generator (:class:`RandomNodes`), exactly as the same ops would
  eagerly, and passes the draws to the program: a compiled dropout takes the mask eager code takes
  for the same seed, and ``torch.manual_seed`` makes it reproducible;
- **splitting**: a node the backend cannot lower (or that computes on the CPU) is cut out: the
  graph becomes compiled segments and eager nodes between them, which run through the
  dispatcher like eager code and are counted per op in ``stats()["compile"]["eager_nodes"]``.
  Under the fallback policy ``deny`` compiling such a graph raises, naming the ops;
- **statistics**: :data:`accelkit._runtime.compile.stats.STATS`;
- **persistent cache**: ``ACCELKIT_COMPILE_CACHE=DIR`` is handed to the backend once.
"""

from __future__ import annotations

import operator
import os
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from accelkit._errors import FallbackDeniedError
from accelkit._runtime.device import tensors as T
from accelkit._runtime.compile.stats import STATS
from accelkit.sdk._compile import ParameterInputs, parameter_stamp
from accelkit._runtime.dispatch.decomp_guards import replacements_while_tracing
from accelkit._runtime.compile.flex_attention import inline_flex_attention
from accelkit._runtime.device.random import reserve
from accelkit.sdk.random_stream import counters_drawn

CACHE_ENV = "ACCELKIT_COMPILE_CACHE"

aten = torch.ops.aten


class GraphCompiler:
    """The Dynamo backend of one accelkit backend (see the module docstring)."""

    def __init__(self, lowering: Any):
        self._make = lowering
        self._lowering: Any = None
        self._cache_dir: str | None = None
        self._decompositions: dict | None = None

    @property
    def lowering(self) -> Any:
        if self._lowering is None:
            from accelkit.sdk import GraphLowering

            made = self._make if isinstance(self._make, GraphLowering) else self._make()
            if not isinstance(made, GraphLowering):
                raise TypeError(f"graph_compiler: expected a GraphLowering, got {type(made).__name__}")
            self._lowering = made
        return self._lowering

    def programs_compiled(self) -> int:
        return self.lowering.programs_compiled() if self._lowering is not None else 0

    def persistent_cache(self) -> dict[str, Any] | None:
        if self._cache_dir is None:
            return None
        return {"directory": self._cache_dir, **self.lowering.cache_statistics()}

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        from torch._dynamo.backends.common import aot_autograd
        from torch._functorch.partitioners import min_cut_rematerialization_partition

        from accelkit import _runtime

        ctx = _runtime.active()
        started = time.perf_counter()
        STATS.add(graphs_captured=1)
        self.use_cache_directory()
        with replacements_while_tracing():
            compiled = aot_autograd(
                fw_compiler=lambda g, inputs: self._compile(ctx, g, "forward"),
                bw_compiler=lambda g, inputs: self._compile(ctx, g, "backward"),
                inference_compiler=lambda g, inputs: self._compile(ctx, g, "inference"),
                decompositions=self._decompositions_for(ctx),
                partition_fn=min_cut_rematerialization_partition,
                keep_inference_input_mutations=True,
            )(gm, example_inputs)
        STATS.add(compile_seconds=time.perf_counter() - started)
        return compiled

    def use_cache_directory(self) -> None:
        """Hand ``ACCELKIT_COMPILE_CACHE`` to the lowering (once per directory); the runtime
        calls it at activation, so a backend's eager programs use the cache too."""
        directory = os.environ.get(CACHE_ENV)
        if directory and directory != self._cache_dir:
            os.makedirs(directory, exist_ok=True)
            self.lowering.use_cache_directory(directory)
            self._cache_dir = directory

    def _decompositions_for(self, ctx: Any) -> dict:
        """The backend's decompositions of the ops it cannot lower (a lowered op stays whole)."""
        if self._decompositions is None:
            lowers = self.lowering.lowers
            self._decompositions = {op: fn for op, fn in ctx.decompositions.items() if not lowers(op)}
        return self._decompositions

    # -- one aten graph ------------------------------------------------------------------------

    def _compile(self, ctx: Any, gm: torch.fx.GraphModule, kind: str) -> Callable[..., Any]:
        inline_flex_attention(gm, self._decompositions_for(ctx))
        constants = _lift_constants(gm, ctx.device)
        writebacks = _lift_input_mutations(gm)
        eager = [node for node in gm.graph.nodes if node.op == "call_function" and not self._lowerable(ctx, node)]
        eager_ops = [str(node.target) for node in eager]
        if eager and ctx.fallback_policy == "deny":
            raise FallbackDeniedError(
                f"torch.compile(backend={ctx.name!r}): the {kind} graph has nodes the {ctx.name} "
                f"compiler cannot lower ({', '.join(sorted(set(eager_ops)))}); they would run "
                "eagerly between compiled programs, which the fallback policy 'deny' forbids. "
                "Allow it with accelkit.fallback_policy('warn'), or give the backend a lowering."
            )
        for op in sorted(set(eager_ops)):
            if ctx.fallback_policy == "warn" and ("compile", op) not in ctx._warned:
                ctx._warned.add(("compile", op))
                warnings.warn(
                    f"torch.compile(backend={ctx.name!r}): {op} cannot be lowered; the graph is "
                    "split there and the node runs eagerly (set ACCELKIT_FALLBACK=allow to "
                    "silence, =deny to forbid)",
                    stacklevel=2,
                )
        built = self.programs_compiled()
        if not eager:
            # The mutated inputs' new values stay backend arrays: they are stored, not returned.
            run = Segment(ctx, self, gm, stored=len(writebacks)).run_owned
            segments = 1
        else:
            # Split programs and eager nodes may run in another order than the graph's, which
            # would hand random ops other counters than eagerly: random nodes run eagerly too,
            # where their draws keep the graph's order.
            random_nodes = [node for node in gm.graph.nodes if _is_random(node) and node not in eager]
            run, segments = self._split(ctx, gm, eager + random_nodes)
        STATS.graph(kind, segments, eager_ops)
        STATS.add(programs=self.programs_compiled() - built)
        positions = [p for p, _ in writebacks]
        outputs_kept = len(_output_args(gm)) - len(writebacks)

        def compiled(args: list) -> Any:
            values = list(args)
            args.clear()  # boxed convention: the inputs are ours to let go once read
            if constants:
                values.extend(constants)
            destinations = [values[p] for p in positions]
            results = run(values)
            if writebacks:
                for destination, value in zip(destinations, results[outputs_kept:]):
                    _store(ctx, destination, value)
                results = results[:outputs_kept]
            return results

        compiled._boxed_call = True  # type: ignore[attr-defined]  # AOTAutograd passes one list
        return compiled

    def _lowerable(self, ctx: Any, node: torch.fx.Node) -> bool:
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            if not self.lowering.lowers_node(node):
                return False
            return _on_device(node, ctx.name)
        if target is operator.getitem:
            return True
        if isinstance(target, torch._ops.HigherOrderOperator | torch._ops.OpOverloadPacket):
            return False
        return not _has_tensors(node)  # Python arithmetic on sizes

    def _split(self, ctx: Any, gm: torch.fx.GraphModule, eager: list) -> tuple[Callable[..., Any], int]:
        """Compiled segments for the lowerable regions, the ``eager`` nodes between them."""
        from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
        from torch.fx.passes.operator_support import OperatorSupportBase

        unsupported = set(eager)

        class Support(OperatorSupportBase):
            def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
                return node.op == "call_function" and node not in unsupported

        partitioner = CapabilityBasedPartitioner(gm, Support(), allows_single_node_partition=True)
        fused = partitioner.fuse_partitions(partitioner.propose_partitions())
        segments = 0
        for node in list(fused.graph.nodes):
            if node.op != "call_module":
                continue
            submodule = fused.get_submodule(node.target)
            segment = Segment(ctx, self, submodule)
            node.op, node.target = "call_function", segment
            segments += 1
        fused.graph.lint()
        fused.recompile()
        def run(values: list) -> list:
            arguments = list(values)
            values.clear()
            return list(_as_tuple(fused(*arguments)))

        return run, segments


class Segment:
    """One lowered graph as a function of tensors: reads the inputs' backend arrays, runs the
    program, wraps its arrays as new device tensors."""

    def __init__(self, ctx: Any, compiler: GraphCompiler, gm: torch.fx.GraphModule, stored: int = 0):
        """``stored``: the last outputs are input mutations' values, returned as backend arrays."""
        lowering = compiler.lowering
        outputs = _output_args(gm)
        self._single = _single_output(gm)
        # An output that is an input (a forward saving its input for the backward) is that
        # input tensor itself, not a copy made by the program.
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self._passthrough = [placeholders.index(o) if isinstance(o, torch.fx.Node) and o.op == "placeholder" else None
                             for o in outputs]
        if any(p is not None for p in self._passthrough):
            output = gm.graph.output_node()
            kept = tuple(None if p is not None else o for o, p in zip(outputs, self._passthrough))
            output.args = (kept[0] if self._single else kept,)
            gm.recompile()
        random_nodes = [n for n in gm.graph.nodes if _is_random(n)]
        self._ctx = ctx
        self._lowering = lowering
        # Per input: True where the graph takes a tensor of this device (Dynamo guards the
        # devices), read as it is; other tensors (CPU scalars) are converted by _array_of.
        self._device_inputs = [_on_this_device(_val(p), ctx.name) for p in placeholders]
        self._draws = RandomNodes(random_nodes, placeholders) if random_nodes else None
        self._program = lowering.lower(gm, random_nodes)
        self._reuses_parameters = getattr(lowering, "reuses_parameters", False)
        self._tensor_outputs = [isinstance(_val(a), torch.Tensor) for a in outputs[: len(outputs) - stored]]
        self._tensor_outputs += [False] * stored
        self.__name__ = f"{lowering.name}_segment"

    def __call__(self, *args: Any) -> Any:
        return self.run_owned(list(args))

    def run_owned(self, args: list) -> Any:
        """Run on ``args``, which it empties once their arrays are read: an input the caller
        no longer holds (a saved activation at the end of its backward) is freed before the
        outputs are allocated, as the eager backward frees it op by op."""
        ctx = self._ctx
        read, on_device = T.read, self._device_inputs
        if len(on_device) != len(args):  # one value a placeholder, always; else the general path
            on_device = [False] * len(args)
        inputs = [read(ctx, a) if device else _array_of(ctx, a) if isinstance(a, torch.Tensor) else a
                  for a, device in zip(args, on_device)]
        kept = {p: args[p] for p in self._passthrough if p is not None}
        parameters = None
        if self._reuses_parameters:
            writes = ctx.allocator.block_writes
            stamps = [parameter_stamp(a, writes(T.buffer_of(a).block)) if device and isinstance(a, torch.nn.Parameter)
                      else None for a, device in zip(args, on_device)]
            parameters = ParameterInputs(stamps, ctx.allocator.hold) if any(stamps) else None
        args.clear()
        draws = self._draws.reserve(ctx, inputs) if self._draws is not None else []
        lowering = self._lowering
        before = lowering.programs_compiled()
        started = time.perf_counter()
        outputs = self._program(inputs, draws) if parameters is None else self._program(inputs, draws, parameters)
        after = lowering.programs_compiled()
        if after != before:
            STATS.add(compile_seconds=time.perf_counter() - started, calls=1, programs=after - before)
        else:
            STATS.hit()
        results = [
            kept[passed] if passed is not None
            else T.from_array(ctx, out) if is_tensor and out is not None else out
            for out, is_tensor, passed in zip(outputs, self._tensor_outputs, self._passthrough)
        ]
        return results[0] if self._single else results


# ---------------------------------------------------------------------------------------------
# Graph preparation
# ---------------------------------------------------------------------------------------------


def _lift_constants(gm: torch.fx.GraphModule, device: torch.device) -> list:
    """Turn tensor constants (``get_attr`` nodes) into trailing placeholders; returns their
    values, on the device, to append to every call's arguments."""
    constants = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    anchor = placeholders[-1] if placeholders else None
    for node in list(gm.graph.nodes):
        if node.op != "get_attr":
            continue
        value = operator.attrgetter(node.target)(gm)
        if not isinstance(value, torch.Tensor):
            continue
        if value.device.type == "cpu" and value.dim() > 0:
            value = value.to(device)
        with gm.graph.inserting_after(anchor) if anchor is not None else gm.graph.inserting_before(None):
            placeholder = gm.graph.placeholder(f"constant_{len(constants)}")
        placeholder.meta.update(node.meta)
        if "val" not in placeholder.meta:
            placeholder.meta["val"] = value
        node.replace_all_uses_with(placeholder)
        gm.graph.erase_node(node)
        anchor = placeholder
        constants.append(value)
    if constants:
        gm.recompile()
    return constants


def _lift_input_mutations(gm: torch.fx.GraphModule) -> list[tuple[int, torch.fx.Node]]:
    """Remove ``copy_(input, new)`` nodes (AOTAutograd's kept input mutations), making each
    ``new`` an extra trailing output; returns ``(placeholder position, new)`` per mutation."""
    positions = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    writebacks = []
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten.copy_.default and node.args[0] in positions:
            destination, source = node.args[0], node.args[1]
            if _val(source) is None or _val(destination) is None:
                continue
            if tuple(_val(source).shape) != tuple(_val(destination).shape) or _val(source).dtype != _val(destination).dtype:
                continue  # a broadcasting or casting copy stays a node: it runs eagerly, into the input
            node.replace_all_uses_with(destination)
            gm.graph.erase_node(node)
            writebacks.append((positions[destination], source))
    if writebacks:
        output = gm.graph.output_node()
        outputs = list(_output_args(gm)) + [source for _, source in writebacks]
        output.args = (tuple(outputs),)
        gm.recompile()
    return writebacks


def _store(ctx: Any, destination: torch.Tensor, value: Any) -> None:
    """Write a compiled input mutation (a tensor, or a backend array) into the input's memory,
    as ``copy_`` would."""
    if destination.device.type != ctx.name:
        destination.copy_(value if isinstance(value, torch.Tensor) else T.from_array(ctx, value))
        return
    T.write(ctx, destination, _array_of(ctx, value) if isinstance(value, torch.Tensor) else value)
    torch.autograd.graph.increment_version(destination)


def _array_of(ctx: Any, tensor: torch.Tensor) -> Any:
    if tensor.device.type == ctx.name:
        return T.read(ctx, tensor)
    return ctx.allocator.from_host(tensor.detach().contiguous())


def _output_args(gm: torch.fx.GraphModule) -> tuple:
    output = gm.graph.output_node()
    return _as_tuple(output.args[0])


def _single_output(gm: torch.fx.GraphModule) -> bool:
    output = gm.graph.output_node()
    return not isinstance(output.args[0], tuple | list)


def _as_tuple(value: Any) -> tuple:
    return tuple(value) if isinstance(value, tuple | list) else (value,)


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else node


def _tensors_of(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors_of(v)]
    return []


def _has_tensors(node: torch.fx.Node) -> bool:
    if _tensors_of(_val(node)):
        return True
    return any(_tensors_of(_val(a)) for a in node.all_input_nodes)


def _on_this_device(value: Any, name: str) -> bool:
    """A tensor on the device ``name`` (a placeholder's fake value)."""
    return isinstance(value, torch.Tensor) and value.device.type == name


def _on_device(node: torch.fx.Node, name: str) -> bool:
    """A node computes on the device when its results are device tensors and its tensor
    inputs are device tensors or CPU scalars (as eager kernels accept)."""
    outputs = _tensors_of(_val(node))
    if any(t.device.type != name for t in outputs):
        return False
    for argument in node.all_input_nodes:
        for t in _tensors_of(_val(argument)):
            if t.device.type != name and not (t.device.type == "cpu" and t.dim() == 0):
                return False
    return True


class RandomNodes:
    """The random nodes of a graph and the counters each draws per call, from their fake
    values' shapes, symbolic sizes resolved against the call's inputs."""

    def __init__(self, nodes: list[torch.fx.Node], placeholders: list[torch.fx.Node]):
        self._counts = [counters_drawn(n.target, *_meta_arguments(n)) for n in nodes]
        self._symbolic = any(not isinstance(c, int) for c in self._counts)
        self._placeholders = placeholders

    def reserve(self, ctx: Any, inputs: list) -> list:
        counts = self._counts if not self._symbolic else self._concrete(ctx, inputs)
        return [reserve(ctx, None, count) for count in counts]

    def _concrete(self, ctx: Any, inputs: list) -> list[int]:
        bindings: dict = {}
        for node, value in zip(self._placeholders, inputs):
            val = node.meta.get("val")
            if isinstance(val, torch.SymInt):
                bindings[val.node.expr] = value
            elif isinstance(val, torch.Tensor) and not isinstance(value, int | float | bool | type(None)):
                shape, _ = ctx.allocator.array_meta(value)
                bindings.update((size.node.expr, actual) for size, actual in zip(val.shape, shape)
                                if isinstance(size, torch.SymInt))
        counts = []
        for count in self._counts:
            if not isinstance(count, int):
                resolved = count.node.expr.xreplace(bindings)
                if not resolved.is_number:
                    raise RuntimeError(f"accelkit: a random op's size {count} depends on values the "
                                       f"compiled graph does not receive; cannot reserve its random counters")
                count = int(resolved)
            counts.append(count)
        return counts


def _meta_arguments(node: torch.fx.Node) -> tuple[tuple, dict]:
    def meta(value: Any) -> Any:
        return value.meta.get("val") if isinstance(value, torch.fx.Node) else value

    return torch.fx.node.map_aggregate(node.args, meta), dict(torch.fx.node.map_aggregate(node.kwargs, meta))


def _is_random(node: torch.fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags
