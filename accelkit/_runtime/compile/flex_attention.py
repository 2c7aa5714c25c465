"""FlexAttention in compiled graphs: its higher-order ops become aten ops of the same program.

Under ``torch.compile``, ``flex_attention`` reaches a backend's compiler as two higher-order ops,
``flex_attention`` (forward) and ``flex_attention_backward``, carrying the ``score_mod`` and
``mask_mod`` functions as subgraphs. No backend compiler lowers a higher-order op, and splitting it
out of the program would run attention eagerly, op by op. Instead each node is replaced, before the
graph is lowered, by PyTorch's own dense implementation of it (``sdpa_dense`` and
``sdpa_dense_backward``: the scores matrix, ``score_mod`` and ``mask_mod`` vectorised over batch,
head, query and key positions, the masked softmax, and the backward through the joint graph of
``score_mod``) traced into aten ops with the backend's decompositions. The backend then lowers
those ops into its one program like any others (tpu: in its XLA program; neuron: its tile kernels,
fused where they chain). The values are PyTorch's dense reference's, eager FlexAttention's on the
device; the block mask serves only as its ``mask_mod`` (a dense program computes every block).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.fx

_HOPS: dict[Any, Callable[..., Any]] = {}


def _implementations() -> dict[Any, Callable[..., Any]]:
    if not _HOPS:
        import importlib

        hops = importlib.import_module("torch._higher_order_ops.flex_attention")

        _HOPS[hops.flex_attention] = hops.sdpa_dense
        _HOPS[hops.flex_attention_backward] = hops.sdpa_dense_backward
    return _HOPS


def inline_flex_attention(gm: torch.fx.GraphModule, decompositions: Mapping[Any, Callable]) -> int:
    """Replace every FlexAttention higher-order node of ``gm`` by its dense aten implementation;
    returns how many were replaced."""
    implementations = _implementations()
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in implementations]
    for node in nodes:
        _inline(gm, node, implementations[node.target], decompositions)
    if nodes:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return len(nodes)


def _inline(gm: torch.fx.GraphModule, node: torch.fx.Node, dense: Callable, decompositions: Mapping) -> None:
    from torch._guards import detect_fake_mode
    from torch.fx.experimental.proxy_tensor import make_fx

    graph_inputs: list[torch.fx.Node] = []
    examples: list[Any] = []

    def example(arg: torch.fx.Node) -> Any:
        if arg.op == "get_attr":
            return getattr(gm, arg.target)  # a subgraph (score_mod, mask_mod, joint graph)
        value = arg.meta["val"]
        if isinstance(value, torch.Tensor):
            graph_inputs.append(arg)
            examples.append(value)
            return _Slot(len(examples) - 1)
        return value

    template = torch.fx.node.map_aggregate(node.args, lambda a: example(a) if isinstance(a, torch.fx.Node) else a)

    def traced(*tensors: torch.Tensor) -> list:
        args = torch.fx.node.map_aggregate(template, lambda a: tensors[a.index] if isinstance(a, _Slot) else a)
        return _flat(dense(*args))

    fake_mode = detect_fake_mode(examples)
    with fake_mode:
        functional = torch.func.functionalize(traced, remove="mutations")
        sub = make_fx(functional, decomposition_table=dict(decompositions))(*examples)
    _drop_layout_copies(sub)
    _fold_constants(sub, examples[0].device)
    for constant in [n for n in sub.graph.nodes if n.op == "get_attr"]:  # torch.tensor(-inf) and such
        name = f"{node.name}_{constant.target}"
        value = getattr(sub, constant.target)
        if isinstance(value, torch.Tensor):
            gm.register_buffer(name, value)
        else:
            setattr(gm, name, value)
        constant.target = name
    with gm.graph.inserting_before(node):
        placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        outputs = gm.graph.graph_copy(sub.graph, dict(zip(placeholders, graph_inputs)))
    _replace_results(node, list(outputs))
    gm.graph.erase_node(node)


_EMPTY = ("new_empty", "new_empty_strided", "empty_like", "empty", "empty_strided")


def _fresh(node: Any) -> bool:
    """Whether ``node`` is uninitialised memory: an empty factory, or a view of one."""
    while isinstance(node, torch.fx.Node) and isinstance(node.target, torch._ops.OpOverload):
        name = node.target._schema.name.removeprefix("aten::")
        if name in _EMPTY:
            return True
        if not node.target.is_view or not node.args:
            return False
        node = node.args[0]
    return False


def _drop_layout_copies(sub: torch.fx.GraphModule) -> None:
    """``copy(empty, x)`` (the dense implementation giving its results the inputs' strides) is
    ``x`` in a functional program, whose results take their own layout."""
    for node in list(sub.graph.nodes):
        if node.target is not torch.ops.aten.copy.default:
            continue
        destination, source = node.args[:2]
        if (_fresh(destination) and destination.meta["val"].shape == source.meta["val"].shape
                and destination.meta["val"].dtype == source.meta["val"].dtype):
            node.replace_all_uses_with(source)
    sub.graph.eliminate_dead_code()
    sub.recompile()


def _fold_constants(sub: torch.fx.GraphModule, device: torch.device) -> None:
    """Compute the nodes that depend on no input (``torch.tensor(-inf)``, the position ranges,
    a score_mod's Python numbers made tensors) once, for real, as device constants of the graph."""
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    values: dict[torch.fx.Node, Any] = {}
    with unset_fake_temporarily():
        for node in list(sub.graph.nodes):
            if node.op == "get_attr":
                value = getattr(sub, node.target)
                if isinstance(value, FakeTensor):
                    if value.constant is None:
                        continue
                    value = value.constant
                values[node] = value
                continue
            if node.op != "call_function" or any(a not in values for a in node.all_input_nodes):
                continue
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), values.__getitem__)
            values[node] = node.target(*args, **kwargs)
        folded = {node: value.to(device) for node, value in values.items()
                  if node.op != "get_attr" and isinstance(value, torch.Tensor)
                  and not all(user in values for user in node.users)}  # used by some computed node
    for node, value in folded.items():
        name = f"_folded_{node.name}"
        sub.register_buffer(name, value)
        with sub.graph.inserting_before(node):
            constant = sub.graph.get_attr(name)
        node.replace_all_uses_with(constant)
    sub.graph.eliminate_dead_code()
    sub.recompile()


class _Slot:
    """Where the ``index``-th tensor input goes in the node's arguments."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


def _flat(results: Any) -> list:
    """``(out, lse, max)`` or ``(dq, dk, dv, (d_buffers...))`` as one list (None kept)."""
    flat: list = []
    for r in results:
        if isinstance(r, tuple | list):
            flat.extend(r)
        else:
            flat.append(r)
    return flat


def _replace_results(node: torch.fx.Node, outputs: list) -> None:
    """Point each ``getitem`` of ``node``'s results (nested for the backward's buffer gradients)
    at the inlined output it stands for."""
    for user in list(node.users):
        if user.target is not operator.getitem:
            raise RuntimeError(f"accelkit: an unexpected use of {node.name}: {user.format_node()}")
        index = user.args[1]
        if index < 3:
            _redirect(user, outputs[index])
            continue
        for inner in list(user.users):  # getitem(getitem(node, 3), j): the buffers' gradients
            _redirect(inner, outputs[3 + inner.args[1]])
        user.graph.erase_node(user)


def _redirect(user: torch.fx.Node, output: torch.fx.Node | None) -> None:
    if output is None:
        raise NotImplementedError(
            f"accelkit: {user.format_node()} needs a gradient of a tensor captured by score_mod, which "
            "the dense FlexAttention backward computes only for captured tensors that require grad")
    user.replace_all_uses_with(output)
    user.graph.erase_node(user)
