"""neuron's graph lowering: one aten graph as one program of the same tile kernels as eager.

A program is the graph's nodes bound once to their tile kernels (one op library for both
paths); a call runs them in order on the simulated core as one program
(:meth:`NeuronCore.program`: the kernels share the engines' timelines, so each overlaps the
ones before it wherever the data allows, and the program's schedule is computed once), with the
graph's intermediates handed from kernel to kernel as HBM arrays. Chains of elementwise ops run
as one fused tile program whose intermediates stay in SBUF (:mod:`.fusion`). Views (``view``,
``permute``, ``expand``, ...) are strides over the same HBM, as eagerly. The kernels a program
runs are counted and estimated as the eager ones are.

Shapes are static, as neuronx-cc's are: ``dynamic=True`` is refused with the rule and the way
round it (``accelkit.bucketed``); every new input shape is a new program, counted in
``stats()["compile"]``. A graph Dynamo makes dynamic by itself (after a shape change, or
``mark_dynamic``) is accepted, and a program takes every shape from the call, never a symbolic
size from the graph's fake values: kernels, views and factories read the arrays and the sizes
the call passes (a symbolic size arrives as a Python int), and what is planned before the run
(fusion) uses the nodes' sizes evaluated at the call's (:mod:`.graph_shapes`), so the program
at a shape is fused as a static graph of that shape is.
"""

from __future__ import annotations

import itertools
import operator
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree

from accelkit.sdk import GraphLowering, RandomDraw, graph_parts
from accelkit_backends.neuron import adaptive, fusion, graph_shapes, launch, runtime
from accelkit_backends.neuron.conversion import convert
from accelkit_backends.neuron.kernels.shape import copy_view
from accelkit_backends.neuron.launch import kernels
from accelkit_backends.neuron.sim import numerics as nx
from accelkit_backends.neuron.sim import replay
from accelkit_backends.neuron.sim.straight_line import straight_line
from accelkit_backends.neuron.tiling import pairs


class NeuronStaticShapeError(RuntimeError):
    """A graph with symbolic sizes: neuronx-cc compiles static shapes only."""


class NeuronGraphLowering(GraphLowering):
    name = "neuron"
    #: A program prepares its parameters' casts and layouts once (:mod:`.parameter_layouts`).
    reuses_parameters = True

    def lowers(self, op: torch._ops.OpOverload) -> bool:
        if op in _SIZE_QUERIES or op in _GRAPH_OPS or kernels.get(op) is not None or _is_constant_factory(op):
            return True
        if _per_tensor_op(op) is not None:
            return True
        # as_strided addresses the tensor's storage, which a program input (an HBM view) does
        # not carry; view.dtype reinterprets bytes. Both run eagerly.
        return _is_view(op) and op not in (torch.ops.aten.view.dtype, torch.ops.aten.as_strided.default)

    def lowers_node(self, node: torch.fx.Node) -> bool:
        if not self.lowers(node.target):
            return False
        if not any(_is_complex(n) for n in (node, *node.all_input_nodes)):
            return True
        # complex64 is float32 pairs in HBM: views are strides over them, copies and casts have
        # pair programs, and of the kernels only those with a complex program take it; the
        # rest run eagerly (where they take the CPU fallback).
        op = node.target
        return (op in _SIZE_QUERIES or op in _COMPLEX_GRAPH_OPS or launch.computes_complex(op)
                or _is_view(op) and op not in _NOT_COMPLEX_VIEWS)

    def lower(self, graph: torch.fx.GraphModule, random_nodes: Sequence[torch.fx.Node]) -> Any:
        from accelkit_backends.neuron.parameter_layouts import ParameterReusingProgram

        _refuse_requested_dynamic_shapes(graph)
        return ParameterReusingProgram(graph, random_nodes)

    def programs_compiled(self) -> int:
        from accelkit_backends.neuron.parameter_layouts import ColdProgram

        return GraphProgram.compiled_total + ColdProgram.compiled_total


def _refuse_requested_dynamic_shapes(graph: torch.fx.GraphModule) -> None:
    """Refuse a graph that is dynamic because the user asked for it (``dynamic=True``). A graph
    Dynamo made dynamic by itself after a shape changed (its default, automatic dynamic shapes)
    is accepted: its sizes arrive as numbers, and each new shape is one more program, as
    neuronx-cc compiles one NEFF per shape."""
    if torch._dynamo.config.assume_static_by_default:  # False only while dynamic=True compiles
        return
    for node in graph.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        sizes = tuple(val.shape) if isinstance(val, torch.Tensor) else (val,)
        if any(isinstance(size, torch.SymInt) for size in sizes):
            raise NeuronStaticShapeError(
                f"torch.compile(backend='neuron') got a graph with symbolic sizes ({node.name}: "
                f"{list(sizes) if isinstance(val, torch.Tensor) else val}). neuronx-cc compiles static "
                "shapes only, one program per shape, and so does this backend: drop dynamic=True, or "
                "pad varying lengths to a few declared sizes with accelkit.bucketed(...)"
            )


_count_lock = threading.Lock()
#: Name programs in the simulator's per-instance caches (see GraphProgram.token).
_tokens = itertools.count()


class GraphProgram:
    """One aten graph's nodes, run in order through the neuron kernels; one program per
    input structure (shapes, dtypes, strides)."""

    #: Programs built by every graph of the process.
    compiled_total = 0
    #: Graphs lowered in the process (numbers their labels).
    built = 0

    def __init__(self, graph: torch.fx.GraphModule, random_nodes: Sequence[torch.fx.Node]):
        self._placeholders, self._body, self._outputs = graph_parts(graph)
        # Random nodes get the call's draws in their generator argument (native_dropout, whose
        # schema has none, too: its kernel takes the keyword).
        self._random = {node: i for i, node in enumerate(random_nodes)}
        self._steps = {node: _step(node) for node in self._body}
        #: Names the program in the core's per-instance timings: the program itself there would
        #: keep it, its graph and its recordings alive after its cache (adaptive eager's, or
        #: torch.compile's) dropped it.
        self.token = next(_tokens)
        with _count_lock:
            type(self).built += 1
            number = type(self).built
        ops = [str(n.target).removeprefix("aten.").split(".")[0] for n in self._body
               if isinstance(n.target, torch._ops.OpOverload) and not _is_view(n.target)]
        #: The program's name in estimates and traces: its number and first and last ops.
        self.label = f"graph {number} ({ops[0]} ... {ops[-1]}, {len(ops)} ops)" if ops else f"graph {number}"
        #: The units (nodes and fused groups) a call runs: one plan for a static graph, one per
        #: input structure for a graph with symbolic sizes (see :meth:`_units`).
        self._symbolic = graph_shapes.symbolic(self._placeholders)
        self._plans: dict[tuple, list] = {}
        if not self._symbolic:
            self._plans[()] = self._plan({})
        self._structures: set[tuple] = set()
        #: Per input structure (and aliasing), the program's recording (see :meth:`_record`).
        self._recordings: dict[tuple, replay.Recording] = {}
        #: Per recording that calls kernels: its replay written out as one function.
        self._straight: dict[tuple, Any] = {}

    def __call__(self, inputs: list, draws: Sequence[RandomDraw]) -> list:
        # Under adaptive eager, inputs may be pending: computed first (and the kernels of the
        # program run at once, never recorded).
        inputs = adaptive.concrete(inputs)
        with adaptive.running():
            return self._call(inputs, draws)

    def _call(self, inputs: list, draws: Sequence[RandomDraw]) -> list:
        structure = tuple(_structure_of(value) for value in inputs)
        if structure not in self._structures:
            self._structures.add(structure)
            with _count_lock:
                type(self).compiled_total += 1
        core = runtime.core()
        instance = (self.token, structure)
        arrays = [v for v in inputs if isinstance(v, np.ndarray)]
        if self._random or os.environ.get(launch.REPLAY_ENV) == "0":
            return self._run(inputs, draws, instance)
        key = (structure, replay.aliasing(arrays))
        recording = self._recordings.get(key)
        if recording is None and not core.record_instructions:
            return self._record(inputs, draws, instance, key, arrays)
        if recording is not None and recording.refused is None and core.can_replay_program(instance) \
                and recording.lock.acquire(blocking=False):
            verify = os.environ.get(launch.VERIFY_ENV) == "1"
            before = [replay.twin(a) for a in arrays] if verify else None
            try:
                ran = self._straight[key](arrays) if self._straight.get(key) is not None else None
                outputs = ran[0] if ran is not None else recording.replay(arrays)
            finally:
                recording.lock.release()
            core.replayed_program(instance, self.label)
            if verify:
                self._verify(inputs, draws, instance, arrays, before, outputs)
            return outputs
        return self._run(inputs, draws, instance)

    def _record(self, inputs: list, draws: Sequence[RandomDraw], instance: tuple, key: tuple, arrays: list[np.ndarray]) -> list:
        """Run the program, recording it as the calls of its kernels' recordings: a later call
        with the same structure replays those (numerics only) once the schedule is known. A
        program with a kernel that cannot replay, or work outside kernels (a dtype conversion
        or a constant made on the host), refuses."""
        core = runtime.core()
        recording = replay.Recording(arrays)
        before = core.kernels_run
        with replay.program_into(recording):
            outputs = self._run(inputs, draws, instance)
        if recording.calls != core.kernels_run - before:
            recording.refuse("a kernel of the program is not static")
        recording.finish(list(outputs))
        self._recordings[key] = recording
        self._straight[key] = straight_line(recording)
        return outputs

    def _verify(self, inputs: list, draws: Sequence[RandomDraw], instance: tuple, arrays: list[np.ndarray],
                before: list[np.ndarray], outputs: list) -> None:
        """Run the program in full on copies of its inputs as they were (leaving no trace on the
        clock or the estimates); its outputs must equal the replay's bit for bit."""
        copies = iter(before)
        fresh = [next(copies) if isinstance(v, np.ndarray) else v for v in inputs]
        with runtime.core().detached():
            expected = self._run(fresh, draws, instance)
        if not replay.same_bits(list(outputs), list(expected)):
            raise launch.ReplayMismatch(f"neuron {self.label}: a replay of the program differs from running it")

    def _plan(self, bound: dict) -> list:
        """Nodes and fused groups, from the nodes' shapes at the symbols' values ``bound``."""
        spec = runtime.core().spec
        shapes = graph_shapes.node_shapes(self._body, bound)
        return fusion.plan(self._body, self._outputs, shapes, spec.partitions, spec.sbuf_partition_bytes)

    def _units(self, structure: tuple, inputs: list) -> list:
        """The plan for a call with this input structure: planned from the call's own sizes
        when the graph's are symbolic."""
        if not self._symbolic:
            return self._plans[()]
        units = self._plans.get(structure)
        if units is None:
            units = self._plans[structure] = self._plan(graph_shapes.bind(self._placeholders, inputs))
        return units

    def _run(self, inputs: list, draws: Sequence[RandomDraw], instance: tuple) -> list:
        env: dict[torch.fx.Node, Any] = dict(zip(self._placeholders, inputs))
        units = self._units(instance[1], inputs)

        def run_node(node: torch.fx.Node) -> Any:
            args = torch.fx.node.map_arg(node.args, env.__getitem__)
            kwargs = dict(torch.fx.node.map_arg(node.kwargs, env.__getitem__))
            if node in self._random:
                kwargs["generator"] = draws[self._random[node]]
            return self._steps[node](node, args, kwargs)

        arrays = [v for v in inputs if isinstance(v, np.ndarray)]
        with runtime.core().program(instance, self.label) as program:
            for unit in units:
                if isinstance(unit, fusion.FusedGroup):
                    unit.run(env, run_node)
                else:
                    env[unit] = run_node(unit)
            results = [env[o] if isinstance(o, torch.fx.Node) else o for o in self._outputs]
            if program is not None:
                # Whatever goes in or out stays in HBM; intermediates may stay in SBUF.
                program.boundary = [*arrays, *(a for a in pytree.tree_leaves(results) if isinstance(a, np.ndarray))]
        return [_own(r, arrays) if isinstance(o, torch.fx.Node) else r for o, r in zip(self._outputs, results)]


class RegionProgram(GraphProgram):
    """An adaptive eager region (:mod:`.adaptive`) as a program: a graph the region built from
    its recorded ops, run as a compiled graph is; counted apart from ``torch.compile``'s."""

    compiled_total = 0
    built = 0

    def __init__(self, graph: torch.fx.GraphModule, random_nodes: Sequence[torch.fx.Node], label: str):
        super().__init__(graph, random_nodes)
        self.label = label


def _structure_of(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return (value.shape, value.dtype.str, value.strides)
    return ("static", value)



def _own(value: Any, inputs: list[np.ndarray]) -> Any:
    """A program output that shares memory with an input becomes a copy: the runtime adopts
    outputs as the memory of new tensors."""
    if isinstance(value, np.ndarray) and any(np.may_share_memory(value, a) for a in inputs):
        recording = replay.active_program()
        return value.copy() if recording is None else recording.derived(np.copy, value)
    return value


# -- one node -------------------------------------------------------------------------------


_SIZE_QUERIES = {
    torch.ops.aten.sym_size.int: lambda x, dim: x.shape[dim],
    torch.ops.aten.sym_numel.default: lambda x: x.size,
    torch.ops.aten.sym_stride.int: lambda x, dim: x.strides[dim] // x.dtype.itemsize,
    torch.ops.aten.sym_storage_offset.default: lambda x: 0,
}


def _step(node: torch.fx.Node) -> Any:
    target = node.target
    if target is operator.getitem:
        return lambda node, args, kwargs: args[0][args[1]]
    if not isinstance(target, torch._ops.OpOverload):
        return lambda node, args, kwargs: target(*args, **kwargs)  # arithmetic on sizes
    query = _SIZE_QUERIES.get(target)
    if query is not None:
        return lambda node, args, kwargs: query(*args, **kwargs)
    graph_op = _GRAPH_OPS.get(target)
    if graph_op is not None:
        return lambda node, args, kwargs: _conform(graph_op(node, *args, **kwargs), node.meta.get("val"))
    entry = kernels.get(target)
    if entry is not None:
        fn = entry.fn
        return lambda node, args, kwargs: _conform(fn(*args, **kwargs), node.meta.get("val"))
    if _is_constant_factory(target):
        return _constant
    per_tensor = _per_tensor_op(target)
    if per_tensor is not None:
        return _foreach(target, per_tensor)
    return _view


# -- foreach ops: one kernel per tensor of the lists -------------------------------------------
# Optimizers call ``_foreach_add`` and kin; in a program each tensor's op is a kernel of its own,
# and as the tensors are independent, the program overlaps them.


def _per_tensor_op(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The op a functional ``_foreach_<name>`` overload applies to each tensor, when neuron has
    a kernel for it and its arguments line up one for one (``List`` takes ``Tensor``,
    ``ScalarList`` takes ``Scalar``)."""
    name = op._schema.name.removeprefix("aten::")
    if not name.startswith("_foreach_") or name.endswith("_"):
        return None
    packet = getattr(torch.ops.aten, name.removeprefix("_foreach_"), None)
    if packet is None:
        return None
    wanted = {"List": "Tensor", "ScalarList": "Scalar"}.get(op._overloadname, op._overloadname)
    for overload in (wanted, op._overloadname, "default"):
        each = getattr(packet, overload, None) if overload in packet.overloads() else None
        if each is not None and kernels.get(each) is not None and _lines_up(op, each):
            return each
    return None


def _lines_up(op: torch._ops.OpOverload, each: torch._ops.OpOverload) -> bool:
    """``each`` takes ``op``'s arguments in order (lists as their elements); any more it has
    have defaults."""
    mine, theirs = op._schema.arguments, each._schema.arguments
    return len(theirs) >= len(mine) and all(a.default_value is not None or a.type.kind() == "OptionalType"
                                            for a in theirs[len(mine):])


def _foreach(op: torch._ops.OpOverload, each: torch._ops.OpOverload) -> Any:
    fn = kernels.get(each).fn
    foreach_args = op._schema.arguments
    each_args = each._schema.arguments

    def run(node: torch.fx.Node, args: tuple, kwargs: dict) -> list:
        bound = dict(zip((a.name for a in foreach_args), args))
        bound.update(kwargs)
        lists = [v for v in bound.values() if isinstance(v, list | tuple)]
        count = len(lists[0]) if lists else 0
        results = []
        for i in range(count):
            positional, named = [], {}
            for foreach_arg, each_arg in zip(foreach_args, each_args):
                if foreach_arg.name not in bound:
                    continue
                value = bound[foreach_arg.name]
                value = value[i] if isinstance(value, list | tuple) else value
                if each_arg.kwarg_only:
                    named[each_arg.name] = value
                else:
                    positional.append(value)
            results.append(fn(*positional, **named))
        return _conform(results, node.meta.get("val"))

    return run


def _view(node: torch.fx.Node, args: tuple, kwargs: dict) -> np.ndarray:
    """A view op as strides over the same HBM: PyTorch's own view of the array's memory.

    A kernel may hand over its result in another memory layout than PyTorch's (the values are
    the same); where ``view`` then cannot reinterpret the strides, the array is first copied
    into row-major order on the core (a DMA copy, as a compiler inserts for a layout change)."""
    array = args[0]
    try:
        return _strided_view(node, array, args, kwargs)
    except RuntimeError as exc:
        if "view size is not compatible" not in str(exc):
            raise
    return _strided_view(node, _row_major(array), args, kwargs)


def _strided_view(node: torch.fx.Node, array: np.ndarray, args: tuple, kwargs: dict) -> np.ndarray:
    carrier = nx.HOST_CARRIER.get(array.dtype)
    base = torch.from_numpy(array.view(np.int16 if carrier == torch.int16 else np.uint8) if carrier else array)
    viewed = node.target(base, *args[1:], **kwargs)
    if isinstance(viewed, list | tuple):  # split, chunk, unbind: a view per piece
        return [piece.numpy().view(array.dtype) if carrier else piece.numpy() for piece in viewed]
    viewed = viewed.numpy()
    return viewed.view(array.dtype) if carrier else viewed


def _row_major(x: np.ndarray) -> np.ndarray:
    result = np.empty(x.shape, dtype=x.dtype)
    with runtime.core().kernel("layout_copy") as k:
        copy_view(k, result, x)
    return result


# -- the forms ops take in AOTAutograd's graphs ----------------------------------------------
# Eagerly, PyTorch hands PrivateUse1 ``convolution_overrideable``, a batch norm that writes its
# running statistics, and clones through the runtime; in a functional graph they arrive as the
# ops below, each run here on the same tile kernel.


def _kernel(op: torch._ops.OpOverload) -> Any:
    return kernels.get(op).fn


def _convolution(node: torch.fx.Node, *args: Any) -> Any:
    return _kernel(torch.ops.aten.convolution_overrideable.default)(*args)


def _convolution_backward(node: torch.fx.Node, grad: Any, x: Any, w: Any, bias_sizes: Any, *rest: Any) -> Any:
    return _kernel(torch.ops.aten.convolution_backward_overrideable.default)(grad, x, w, *rest)


def _batch_norm(*args: Any) -> tuple:
    return _kernel(torch.ops.aten.native_batch_norm.default)(*args)


def _batch_norm_functional(node: torch.fx.Node, x: Any, weight: Any, bias: Any, running_mean: Any,
                           running_var: Any, training: bool, momentum: float, eps: float) -> tuple:
    out, mean, invstd, new_mean, new_var = _batch_norm(x, weight, bias, running_mean, running_var,
                                                       training, momentum, eps)
    # Not training, the statistics are returned unchanged (as copies: outputs are new memory).
    return (out, mean, invstd, running_mean.copy() if new_mean is None else new_mean,
            running_var.copy() if new_var is None else new_var)


def _batch_norm_no_training(node: torch.fx.Node, x: Any, weight: Any, bias: Any, running_mean: Any,
                            running_var: Any, momentum: float, eps: float) -> tuple:
    return _batch_norm(x, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


def _batch_norm_no_stats(node: torch.fx.Node, x: Any, weight: Any, bias: Any, training: bool,
                         momentum: float, eps: float) -> tuple:
    return _batch_norm(x, weight, bias, None, None, training, momentum, eps)[:3]


def _like(x: np.ndarray) -> torch.Tensor:
    """A meta tensor with the array's sizes, strides and dtype: PyTorch's rules for a result's
    layout (a clone's, a ``*_like`` factory's) applied to the concrete array."""
    itemsize = x.dtype.itemsize
    return torch.empty_strided(x.shape, tuple(s // itemsize for s in x.strides), dtype=nx.torch_dtype(x.dtype),
                               device="meta")


def _is_complex(node: Any) -> bool:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(value, torch.Tensor) and value.dtype.is_complex


def _conj(node: torch.fx.Node, x: np.ndarray) -> np.ndarray:
    """A conjugate view, materialised: a functional graph only reads it, and an HBM array has
    no conjugate bit (the eager kernel of ``_conj_physical``)."""
    return kernels.get(torch.ops.aten._conj_physical.default).fn(x)


def _clone(node: torch.fx.Node, x: np.ndarray, **kwargs: Any) -> np.ndarray:
    """A copy in the layout PyTorch gives the clone of ``x`` (its ``memory_format``)."""
    made = _like(x).clone(**kwargs)
    shape, stride = tuple(made.shape), made.stride()
    itemsize = x.dtype.itemsize
    extent = 1 + sum((size - 1) * step for size, step in zip(shape, stride) if size)
    strides = tuple(s * itemsize for s in stride)

    def body(k: Any, arrays: list[np.ndarray]) -> np.ndarray:  # a DMA copy on the core, as eagerly
        memory = launch.hbm_empty((extent if x.size else 0,), nx.torch_dtype(x.dtype))
        result = np.lib.stride_tricks.as_strided(memory, shape, strides)
        if x.dtype == np.complex64:  # float32 pairs
            copy_view(k, pairs(result), pairs(arrays[0]))
        else:
            copy_view(k, result, arrays[0])
        return result

    # Static: the copy's instructions follow from the layouts alone, so a program holding it replays.
    instance = ("clone", (("array", x.shape, x.dtype.str, x.strides),), (shape, strides))
    return launch.run_static("clone", instance, [x], (), body)


def _to_copy(node: torch.fx.Node, x: np.ndarray, **kwargs: Any) -> np.ndarray:
    """A cast (``.float()``, ``.to(torch.bfloat16)``): the conversion program the allocator's
    casts run eagerly."""
    return convert(x, node.meta["val"].dtype)


def _copy(node: torch.fx.Node, x: np.ndarray, src: np.ndarray, non_blocking: bool = False) -> np.ndarray:
    """The functional ``copy`` (an in-place ``copy_`` into a graph's own tensor, after
    functionalization): ``src`` cast to ``x``'s dtype and broadcast to its shape, as new memory
    (the conversion program, then the clone's DMA copy)."""
    dtype = node.meta["val"].dtype
    value = src if nx.torch_dtype(src.dtype) == dtype else convert(src, dtype)
    if value.shape != x.shape:
        value = np.broadcast_to(value, x.shape)
    return _clone(node, value)


def _is_constant_factory(op: torch._ops.OpOverload) -> bool:
    """A factory of Python numbers (``full``, ``scalar_tensor``, ``arange``, ...): no tensor
    argument, a ``device`` one, no random numbers."""
    arguments = op._schema.arguments
    return (any(a.name == "device" for a in arguments)
            and not any("Tensor" in str(a.type) for a in arguments)
            and torch.Tag.nondeterministic_seeded not in op.tags)


def _constant(node: torch.fx.Node, args: tuple, kwargs: dict) -> np.ndarray:
    """The factory's values, made by PyTorch's CPU kernel from the graph's static numbers
    (a fresh array per call: outputs become the memory of new tensors)."""
    kwargs = {**kwargs, "device": "cpu"}
    kwargs.pop("pin_memory", None)

    def make() -> np.ndarray:
        return nx.from_torch(node.target(*args, **kwargs))

    recording = replay.active_program()
    return make() if recording is None else recording.made(make)


#: Factories shaped like a tensor argument (``full_like``, ``new_zeros``, ...): the fill value's
#: position in the arguments, or the value itself.
_LIKE_FACTORIES = {
    torch.ops.aten.full_like.default: ("argument", 1), torch.ops.aten.new_full.default: ("argument", 2),
    torch.ops.aten.zeros_like.default: ("value", 0), torch.ops.aten.new_zeros.default: ("value", 0),
    torch.ops.aten.ones_like.default: ("value", 1), torch.ops.aten.new_ones.default: ("value", 1),
    torch.ops.aten.empty_like.default: ("value", 0), torch.ops.aten.new_empty.default: ("value", 0),
}


def _filled_like(node: torch.fx.Node, *args: Any, **kwargs: Any) -> np.ndarray:
    """A ``*_like``/``new_*`` factory: its result's shape, strides and dtype are PyTorch's for
    the call's array and sizes, its values one number; made as a graph constant is (an empty one
    reads as zeros)."""
    how, fill = _LIKE_FACTORIES[node.target]
    value = args[fill] if how == "argument" else fill
    kwargs = {**kwargs, "device": "meta"}
    kwargs.pop("pin_memory", None)
    made = node.target(_like(args[0]), *args[1:], **kwargs)
    shape, stride, dtype = tuple(made.shape), made.stride(), made.dtype

    def make() -> np.ndarray:
        return nx.from_torch(torch.empty_strided(shape, stride, dtype=dtype).fill_(value))

    recording = replay.active_program()
    return make() if recording is None else recording.made(make)


_GRAPH_OPS = {
    **dict.fromkeys(_LIKE_FACTORIES, _filled_like),
    torch.ops.aten.convolution.default: _convolution,
    torch.ops.aten.convolution_backward.default: _convolution_backward,
    torch.ops.aten._native_batch_norm_legit_functional.default: _batch_norm_functional,
    torch.ops.aten._native_batch_norm_legit_no_training.default: _batch_norm_no_training,
    torch.ops.aten._native_batch_norm_legit.no_stats: _batch_norm_no_stats,
    torch.ops.aten.clone.default: _clone,
    torch.ops.aten._to_copy.default: _to_copy,
    torch.ops.aten.copy.default: _copy,
    torch.ops.aten._conj.default: _conj,
}
#: Graph ops that handle complex64 (as float32 pairs).
_COMPLEX_GRAPH_OPS = frozenset({*_LIKE_FACTORIES, torch.ops.aten.clone.default, torch.ops.aten._to_copy.default,
                                torch.ops.aten._conj.default})
#: Views a complex64 node does not take in a program (``_neg_view`` sets a bit no array has).
_NOT_COMPLEX_VIEWS = frozenset({torch.ops.aten.view.dtype, torch.ops.aten.as_strided.default,
                                torch.ops.aten._neg_view.default})


def _conform(out: Any, val: Any) -> Any:
    """A kernel's results in PyTorch's result dtypes (``node.meta["val"]``), as eagerly."""
    if isinstance(val, torch.Tensor) and isinstance(out, np.ndarray):
        dtype = nx.numpy_dtype(val.dtype)
        if out.dtype == dtype:
            return out
        recording = replay.active_program()
        return out.astype(dtype) if recording is None else recording.derived(lambda a: a.astype(dtype), out)
    if isinstance(val, list | tuple) and isinstance(out, list | tuple):
        cast = [_conform(o, v) for o, v in zip(out, val)]
        return tuple(cast) if isinstance(out, tuple) else cast
    return out


def _is_view(op: torch._ops.OpOverload) -> bool:
    schema = op._schema
    if not schema.returns or not schema.arguments:
        return False
    first, out = schema.arguments[0].alias_info, schema.returns[0].alias_info
    return first is not None and out is not None and not first.is_write and not out.is_write
