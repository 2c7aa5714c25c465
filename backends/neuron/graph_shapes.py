"""The concrete shape of each node of a compiled graph, for the call it runs.

Shapes on neuron are static, as neuronx-cc's: one program per concrete input shape. A graph
Dynamo made dynamic by itself (automatic dynamic shapes after a shape change, or
``torch._dynamo.mark_dynamic``) still carries symbolic sizes in its nodes' fake values
(``node.meta["val"]``: ``[s0, 16]``), which no program can be built from. The kernels take
their shapes from the arrays they are given; what is decided before a program runs (which
elementwise chains fuse, with which chunk width) takes them from here: the graph's symbols bound
to the sizes the call passes (a symbolic size arrives as a Python int, a tensor's sizes are its
array's), each node's size expressions evaluated with them. A program at a shape is then
fused as a static graph of that shape is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import sympy
import torch


def symbolic(placeholders: Sequence[torch.fx.Node]) -> bool:
    """Whether the graph has symbolic sizes (its inputs have)."""
    for node in placeholders:
        val = node.meta.get("val")
        sizes = tuple(val.shape) if isinstance(val, torch.Tensor) else (val,)
        if any(isinstance(size, torch.SymInt) for size in sizes):
            return True
    return False


def bind(placeholders: Sequence[torch.fx.Node], inputs: Sequence[Any]) -> dict[sympy.Symbol, int]:
    """The graph's symbols bound to one call's sizes: a symbolic size placeholder to the int
    passed for it, a tensor's symbolic dimension to its array's size."""
    bound: dict[sympy.Symbol, int] = {}
    for node, value in zip(placeholders, inputs):
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) and isinstance(value, int):
            _bind(bound, val, value)
        elif isinstance(val, torch.Tensor) and isinstance(value, np.ndarray) and value.ndim == val.dim():
            for size, given in zip(val.shape, value.shape):
                _bind(bound, size, given)
    return bound


def _bind(bound: dict[sympy.Symbol, int], size: Any, given: int) -> None:
    if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
        bound.setdefault(size.node.expr, int(given))


def node_shapes(nodes: Sequence[torch.fx.Node], bound: dict[sympy.Symbol, int]) -> dict[torch.fx.Node, tuple[int, ...]]:
    """The shape of each node whose value is one tensor, at the sizes ``bound``; a node whose
    sizes depend on a symbol the call does not bind is left out (so never fused)."""
    values = {symbol: sympy.Integer(size) for symbol, size in bound.items()}
    shapes = {}
    for node in nodes:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        shape = tuple(_evaluate(size, values) for size in val.shape)
        if None not in shape:
            shapes[node] = shape
    return shapes


def _evaluate(size: Any, values: dict[sympy.Symbol, sympy.Integer]) -> int | None:
    if not isinstance(size, torch.SymInt):
        return int(size)
    expr = size.node.expr
    shape_env = size.node.shape_env
    # Then with the equalities the shape env learnt while tracing (a symbol replaced by another).
    for attempt in (expr, shape_env.replace(expr) if shape_env is not None else expr):
        value = attempt.xreplace(values)
        if value.is_Integer:
            return int(value)
    return None
