"""tpu's graph lowering: one aten graph as one jitted JAX function (see :mod:`.compiler`)."""

from __future__ import annotations

import operator
import threading
import warnings
from collections.abc import Sequence
from typing import Any

import jax
import jax.monitoring
import numpy as np
import torch

from accelkit.sdk import GraphLowering, RandomDraw, ShardWindow, ViewSpec, graph_parts
from accelkit_backends.tpu import cache_files, checks, fused, modes, stored_programs
from accelkit_backends.tpu.buffers import JaxView, jax_dtype, materialize
from accelkit_backends.tpu.graph_ops import GRAPH_OPS, RANDOM, indexed_view, is_view
from accelkit_backends.tpu.lowering import Lowering, kernels
from accelkit_backends.tpu.cost import COSTS, ProgramCost, Tally
from accelkit_backends.tpu.programs import LOADED, Program, next_use

def _pure_lowerings() -> tuple[type, ...]:
    """Lowering classes whose ``fn`` is the whole kernel (subclasses adding host-side work,
    such as reading a result back, stay eager)."""
    from accelkit_backends.tpu.kernels.random import DeviceGeneratorLowering

    return (Lowering, DeviceGeneratorLowering)


class TpuGraphLowering(GraphLowering):
    name = "tpu"

    def __init__(self) -> None:
        self._pure = _pure_lowerings()
        self._cache_counts: dict[str, int] = {}

    def lowers(self, op: torch._ops.OpOverload) -> bool:
        if op in _SIZE_QUERIES:
            return True
        if op in GRAPH_OPS:
            return True
        entry = kernels.get(op)
        if entry is not None:
            return type(entry.fn) in self._pure
        return is_view(op)

    def lower(self, graph: torch.fx.GraphModule, random_nodes: Sequence[torch.fx.Node]) -> GraphProgram:
        return GraphProgram(graph, random_nodes)

    def programs_compiled(self) -> int:
        return GraphProgram.compiled_total

    def use_cache_directory(self, path: str) -> None:
        """JAX's persistent compilation cache, for every program however quick to compile, and
        tpu's store of eager op programs beside it (:mod:`.stored_programs`), each entry written
        atomically (:mod:`.cache_files`)."""
        if stored_programs.wanted():
            try:
                stored_programs.open_store(path, jax.devices()[0])
            except RuntimeError as why:
                warnings.warn(f"tpu's program store stays closed ({why}); eager programs use jax's cache", stacklevel=2)
        cache_files.use_jax_cache(path)
        if not self._cache_counts:
            self._cache_counts.update(hits=0, requests=0)
            jax.monitoring.register_event_listener(self._cache_event)

    def _cache_event(self, event: str, **kwargs: Any) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            self._cache_counts["hits"] += 1
        elif event == "/jax/compilation_cache/compile_requests_use_cache":
            self._cache_counts["requests"] += 1

    def cache_statistics(self) -> dict[str, int]:
        """Executables found in the persistent cache (``hits``) and compiled and stored
        (``misses``), eager ops' programs included; ``store_*`` count the program store's part
        alone (``store_unreadable``: entries that could not be loaded, so compiled again)."""
        counts = self._cache_counts
        hits, misses = counts.get("hits", 0), counts.get("requests", 0) - counts.get("hits", 0)
        store = stored_programs.STORE
        if store is None:
            return {"hits": hits, "misses": misses}
        eager = store.statistics()
        return {"hits": hits + eager["hits"], "misses": misses + eager["misses"],
                **{f"store_{name}": count for name, count in eager.items()}}


_count_lock = threading.Lock()


class _Structure:
    """A graph program's executable for one input structure: the jitted program, the outputs
    known while tracing (position -> value), and the cost tally while it has one executable."""

    __slots__ = ("program", "statics", "only")

    def __init__(self, program: Program, statics: dict[int, Any]):
        self.program = program
        self.statics = statics
        self.only: Tally | None = None


class GraphProgram:
    """One aten graph as a jitted JAX function, one executable per input structure."""

    #: Executables built by every graph program of the process.
    compiled_total = 0

    def __init__(self, graph: torch.fx.GraphModule, random_nodes: Sequence[torch.fx.Node]):
        self._placeholders, self._body, self._outputs = graph_parts(graph)
        self._random = {node: i for i, node in enumerate(random_nodes)}
        self._structures: dict[tuple, _Structure] = {}  # per input structure: its program
        self._tallies: dict[tuple, Tally] = {}  # per structure and input shapes: the cost of a run
        self.name = f"compiled graph ({len(self._body)} ops)"

    def __call__(self, inputs: list, draws: Sequence[RandomDraw]) -> list:
        if modes._mode == "fused":
            fused.flush("compiled graph")
            inputs = fused.resolve(inputs)
        arrays, structure = [], []
        for value in inputs:
            kind = type(value)
            if kind is JaxView:
                arrays.append(value.array)
                structure.append(value.spec)
            elif isinstance(value, jax.Array):
                arrays.append(value)
                structure.append(None)
            else:
                structure.append(("static", value))
        if draws:
            windows = tuple(None if d.window is None else (d.window.whole_shape, d.window.start, d.window.shape)
                            for d in draws)
            rng = [(np.asarray(d.seed, dtype=np.uint64), np.asarray(d.offset, dtype=np.uint64)) for d in draws]
        else:
            windows, rng = (), []
        key = (tuple(structure), windows)
        known = self._structures.get(key)
        if known is None:
            statics: dict[int, Any] = {}
            known = self._structures[key] = _Structure(
                LOADED.track(Program(jax.jit(self._program(key, statics)))), statics)
        program = known.program
        program.last_use = next_use()
        outputs = modes.run_program(self.name, inputs, program.jitted, arrays, rng)
        compiled = program.newly_compiled()
        if compiled:
            with _count_lock:
                GraphProgram.compiled_total += compiled
        tally = known.only
        if tally is None or compiled or program.loaded != 1:
            tally = self._tally(key, program, arrays, rng, compiled)
            # One executable: every call until the next compile runs it (no shapes to look at).
            known.only = tally if program.loaded == 1 else None
        COSTS.record(tally)
        statics = known.statics
        if statics:  # sizes the graph returns: Python numbers, fixed per input structure
            outputs = list(outputs)
            for position, value in statics.items():
                outputs[position] = value
        return outputs

    def _tally(self, key: tuple, program: Program, arrays: list, rng: list, compiled: int) -> Tally:
        """The cost tally of the executable just run, analysed once per input shapes (the
        estimate counts a compiled graph's run as one program, as it counts an eager op's)."""
        shapes = (key, tuple((a.shape, a.dtype) for a in arrays))
        tally = self._tallies.get(shapes)
        if tally is None or compiled:
            executable = program.jitted.lower(arrays, rng).compile()  # jax's cache: the one just run
            tally = self._tallies[shapes] = COSTS.tally(self.name, ProgramCost.of(executable, arrays))
        return tally

    def _program(self, key: tuple, statics: dict[int, Any]) -> Any:
        """The traceable program of one input structure; the outputs that are not arrays (sizes,
        known while tracing) go into ``statics`` by position instead."""
        placeholders, body, outputs, random = self._placeholders, self._body, self._outputs, self._random
        structure, windows = key

        def program(arrays: list, rng: list) -> Any:
            env: dict[torch.fx.Node, Any] = {}
            supplied = iter(arrays)
            for node, code in zip(placeholders, structure):
                if code is None:
                    env[node] = next(supplied)
                elif type(code) is ViewSpec:
                    env[node] = materialize(next(supplied), code)
                else:
                    env[node] = code[1]
            with checks.conditions() as stated:
                for node in body:
                    args = torch.fx.node.map_arg(node.args, env.__getitem__)
                    kwargs = dict(torch.fx.node.map_arg(node.kwargs, env.__getitem__))
                    if node in random:
                        i = random[node]
                        window = None if windows[i] is None else ShardWindow(*windows[i])
                        kwargs = {**kwargs, "generator": RandomDraw(rng[i][0], rng[i][1], window)}
                    env[node] = _evaluate(node, args, kwargs)
            results = [env[o] if isinstance(o, torch.fx.Node) else o for o in outputs]
            for position, value in enumerate(results):
                if not isinstance(value, jax.Array):
                    statics[position] = value  # known while tracing: not a program output
                    results[position] = None
            return results, stated.status()

        program.__name__ = "accelkit_tpu_graph"
        return program


_SIZE_QUERIES = {
    torch.ops.aten.sym_size.int: lambda x, dim: x.shape[dim],
    torch.ops.aten.sym_numel.default: lambda x: x.size,
    torch.ops.aten.sym_stride.int: lambda x, dim: _contiguous_stride(x.shape, dim),
    torch.ops.aten.sym_storage_offset.default: lambda x: 0,
}


def _contiguous_stride(shape: tuple[int, ...], dim: int) -> int:
    stride = 1
    for size in shape[dim % len(shape) + 1:]:
        stride *= size
    return stride


def _evaluate(node: torch.fx.Node, args: tuple, kwargs: dict) -> Any:
    target = node.target
    query = _SIZE_QUERIES.get(target)
    if query is not None:
        return query(*args, **kwargs)  # values inside the program are contiguous
    if not isinstance(target, torch._ops.OpOverload):
        if target is operator.getitem:
            return args[0][args[1]]
        return target(*args, **kwargs)
    graph_op = GRAPH_OPS.get(target)
    if graph_op is not None:
        if target not in RANDOM:
            kwargs.pop("generator", None)
        return graph_op(node, *args, **kwargs)
    entry = kernels.get(target)
    if entry is None:
        return indexed_view(node, *args, **kwargs)
    if "generator" in kwargs or any(a.name == "generator" for a in target._schema.arguments):
        args, kwargs = _key_as_generator(target, args, kwargs)
    return _conform(node, entry.fn.fn(*args, **kwargs))


def _key_as_generator(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Put the node's draw (``kwargs["generator"]``) where the schema has its generator."""
    names = [a.name for a in op._schema.arguments]
    if "generator" in names and names.index("generator") < len(args):
        position = names.index("generator")
        key = kwargs.pop("generator", args[position])
        args = (*args[:position], key, *args[position + 1:])
    return args, kwargs


def _conform(node: torch.fx.Node, out: Any) -> Any:
    """Cast a lowering's results to PyTorch's result dtypes (``node.meta["val"]``), as the
    eager machinery does; shapes are the lowering's own (checked eagerly, once per op)."""
    return _cast(out, node.meta.get("val"))


def _cast(out: Any, val: Any) -> Any:
    if isinstance(val, torch.Tensor) and isinstance(out, jax.Array):
        dtype = jax_dtype(val.dtype)
        return out if out.dtype == dtype else out.astype(dtype)
    if isinstance(val, list | tuple) and isinstance(out, list | tuple):
        cast = [_cast(o, v) for o, v in zip(out, val)]
        return tuple(cast) if isinstance(out, tuple) else cast
    return out
