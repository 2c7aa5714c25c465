"""Fusion of elementwise chains in a compiled graph: one tile program per chain, intermediates
kept in SBUF.

Eagerly, ``le`` then ``where`` are two programs: the first stores its mask to HBM, the second
loads it back. A compiled graph runs such a chain as one program (:func:`.tiling.map_flat_fused`):
every input is loaded once per chunk, each op computes from the tiles of the ops before it, and
only values used after the chain (or returned by the graph) are stored. Each op's arithmetic is
its eager body's, on the same chunks and tile dtypes, so results are bit-for-bit the eager ones.

:func:`plan` groups a graph's nodes by their concrete shapes at the call (a graph Dynamo made
dynamic is planned per call shape: :mod:`.graph_shapes`). A group is a run of fusable nodes (ops
whose body is one :func:`.tiling.map_flat` and looks at no values) with one static output shape;
a node that does not use the group's results (a view of an input, a constant) runs before it, so
it does not end the group. A long chain streams narrower chunks so that all its tiles fit in a share of SBUF; one
that would need chunks narrower than :data:`.tiling.MIN_FUSED_COLUMNS` is split into groups.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from accelkit_backends.neuron import conversion, cost, tiling
from accelkit_backends.neuron.kernels.matmul import result_blocks_to
from accelkit_backends.neuron.launch import OutSpec, body_of, hbm_empty, run_static
from accelkit_backends.neuron.sim.errors import SbufOverflowError

aten = torch.ops.aten

#: The concrete shape of a graph's nodes for one call (:func:`.graph_shapes.node_shapes`).
Shapes = Mapping[torch.fx.Node, tuple[int, ...]]

#: Ops whose eager body is a single elementwise map that never reads values to decide what to
#: run (integer division checks its divisor first, so it is not here).
FUSABLE = frozenset({
    aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar, aten.mul.Tensor, aten.mul.Scalar,
    aten.div.Tensor, aten.div.Scalar, aten.maximum.default, aten.minimum.default,
    aten.eq.Tensor, aten.eq.Scalar, aten.ne.Tensor, aten.ne.Scalar, aten.lt.Tensor, aten.lt.Scalar,
    aten.le.Tensor, aten.le.Scalar, aten.gt.Tensor, aten.gt.Scalar, aten.ge.Tensor, aten.ge.Scalar,
    aten.logical_and.default, aten.logical_or.default, aten.logical_xor.default, aten.logical_not.default,
    aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.where.self, aten.masked_fill.Scalar,
    aten.clamp.default, aten.neg.default, aten.relu.default, aten.abs.default, aten.gelu.default,
    aten.exp.default, aten.log.default, aten.tanh.default, aten.sigmoid.default, aten.sqrt.default,
    aten.rsqrt.default, aten.reciprocal.default, aten.erf.default, aten.silu.default, aten.sin.default,
    aten.cos.default, aten.expm1.default, aten.log1p.default, aten.sign.default,
    aten._to_copy.default,  # a cast that stays on the device in the default layout (see _body)
})

#: The share of SBUF a fused group's buffers may plan for; the rest is for the temporaries its
#: ops allocate.
SBUF_SHARE = 0.5


_tokens = itertools.count()


class FusedGroup:
    """Consecutive fusable nodes of one output shape, run as one program.

    ``stored[i]`` says whether node ``i``'s value is needed after the group (a later node or
    the graph's output uses it); only those are written to HBM.
    """

    def __init__(self, nodes: Sequence[torch.fx.Node], stored: Sequence[bool], shapes: Shapes,
                 columns: int = tiling.FMAX, head: torch.fx.Node | None = None, head_stored: bool = False):
        self.nodes = list(nodes)
        self.stored = list(stored)
        #: The chunk width that keeps every buffer of the chain in the planned share of SBUF.
        self.columns = columns
        #: A matmul whose result blocks feed the chain from SBUF (``head_stored``: and HBM).
        self.head, self.head_stored = head, head_stored
        #: Every node the program computes, in order: the head first.
        self.computed = ([head] if head is not None else []) + self.nodes
        self.name = "fused(" + "+".join(_op_name(n) for n in self.computed) + ")"
        #: Names the group in the simulator's per-instance caches: the group itself there
        #: would keep its graph alive after the program that ran it is dropped.
        self.token = next(_tokens)
        self._shapes = shapes
        self._specs = [[OutSpec(shapes[n], n.meta["val"].dtype)] for n in self.computed]
        self._bodies = [_body(n) for n in self.computed]
        #: False once the chain turned out not to fuse (it then runs op by op).
        self.fuses = True
        #: The halves the group was split into when its tiles overflowed SBUF.
        self.parts: list[FusedGroup] | None = None
        members = set(self.computed)
        #: The nodes outside the group whose values it reads, in order.
        self._external = list(dict.fromkeys(a for n in self.computed for a in n.all_input_nodes if a not in members))

    def run(self, env: dict[torch.fx.Node, Any], run_node: Any) -> None:
        """Compute the group's nodes into ``env`` (``run_node(node)`` runs one node alone).

        A group whose program overflows SBUF (its ops' temporaries on top of the planned
        buffers) is split in two, for this and every later call; a chain that does not fuse
        runs op by op. Neither writes anything a caller sees before it succeeds."""
        if self.parts is not None:
            for part in self.parts:
                part.run(env, run_node)
            return
        if self.fuses:
            try:
                self._run_fused(env)
                return
            except SbufOverflowError:
                if len(self.computed) < 2:
                    raise
                self.parts = self._halves()
                self.run(env, run_node)
                return
            except tiling.NotFusable:
                self.fuses = False
        for node in self.computed:
            env[node] = run_node(node)

    def _halves(self) -> list[FusedGroup]:
        middle = max(1, len(self.nodes) // 2)
        halves = []
        for cut in (slice(None, middle), slice(middle, None)):
            part, members = self.nodes[cut], set(self.nodes[cut])
            stored = [keep or any(u not in members for u in n.users if u in self.nodes)
                      for n, keep in zip(part, self.stored[cut])]
            head = self.head if not halves else None  # the matmul stays with the first half
            head_stored = head is not None and (self.head_stored or any(u in self.nodes[middle:] for u in head.users))
            halves.append(FusedGroup(part, stored, self._shapes, self.columns, head, head_stored))
        return halves

    def _run_fused(self, env: dict[torch.fx.Node, Any]) -> None:
        # The program is static (fusable ops read no values): it runs as a recorded program,
        # replayed once its schedule is known (launch.run_static). Its arguments are the values
        # of the nodes it reads from outside.
        values = [env[n] for n in self._external]
        arrays = [v for v in values if isinstance(v, np.ndarray)]
        key = _external_key(self.computed, env)

        def program(k: Any, given: list[np.ndarray]) -> tuple:
            replacements = iter(given)
            outside = {n: next(replacements) if isinstance(v, np.ndarray) else v
                       for n, v in zip(self._external, values)}
            return self._program(k, outside)

        head_out, stored = run_static(self.name, (self.token, key), arrays, (), program)
        cost.LEDGER.note_instance(self.name, key)
        if self.head is not None and self.head_stored:
            env[self.head] = head_out
        for node, value in zip([n for n, keep in zip(self.nodes, self.stored) if keep], stored):
            env[node] = value

    def _program(self, k: Any, outside: dict[torch.fx.Node, Any]) -> tuple:
        """The chain as one tile program on kernel ``k``, reading ``outside`` values; returns the
        head's result (when stored) and the stored nodes' values."""
        internal: dict[torch.fx.Node, Any] = {}

        def value(node: torch.fx.Node) -> Any:
            return internal[node] if node in internal else outside[node]

        head = self.head
        chain = zip(self.computed, self._bodies, self._specs)
        head_out = None
        if head is not None:  # the chain reads the matmul's blocks, never this array
            _, head_body, head_spec = next(chain)
            internal[head] = placeholder = hbm_empty(head_spec[0])
        with tiling.recording_flat_maps() as maps:
            for node, body, spec in chain:
                args = torch.fx.node.map_arg(node.args, value)
                kwargs = dict(torch.fx.node.map_arg(node.kwargs, value))
                count = len(maps)
                internal[node] = body(k, spec, *args, **kwargs)
                if len(maps) != count + 1 or maps[-1].out is not internal[node]:
                    raise tiling.NotFusable(f"{node.target} did not run as one elementwise map")
        if head is None:
            tiling.map_flat_fused(k, maps, self.stored, self.columns)
        else:
            def tail(k: Any, block: Any, m0: int, m1: int, n0: int, n1: int) -> None:
                tiling.map_block_fused(k, maps, self.stored, placeholder, block, m0, m1, n0, n1)

            with result_blocks_to(tail, store=self.head_stored):
                head_out = head_body(k, head_spec, *torch.fx.node.map_arg(head.args, outside.__getitem__),
                                     **dict(torch.fx.node.map_arg(head.kwargs, outside.__getitem__)))
        stored = [internal[n] for n, keep in zip(self.nodes, self.stored) if keep]
        return (head_out if head is not None and self.head_stored else None), stored


def plan(body: Sequence[torch.fx.Node], outputs: Sequence[Any], shapes: Shapes, partitions: int,
         sbuf_partition_bytes: int) -> list[torch.fx.Node | FusedGroup]:
    """The graph's body as the units a program runs in order: single nodes and fused groups.
    ``shapes`` has the concrete shape of the nodes whose value is one tensor; a node without
    one is never fused."""
    returned = {o for o in outputs if isinstance(o, torch.fx.Node)}
    budget = int(sbuf_partition_bytes * SBUF_SHARE)
    units: list[torch.fx.Node | FusedGroup] = []
    group: list[torch.fx.Node] = []
    hoisted: list[torch.fx.Node] = []

    def close() -> None:
        units.extend(hoisted)
        hoisted.clear()
        head, readers = _take_head(group, units, shapes) if group else (None, [])
        if len(group) > 1 or head is not None:
            members = set(group)
            stored = [n in returned or any(u not in members for u in n.users) for n in group]
            head_stored = head is not None and (head in returned or any(u not in members for u in head.users))
            units.append(FusedGroup(group, stored, shapes, _columns(group, budget), head, head_stored))
        else:
            units.extend(group)
        units.extend(readers)
        group.clear()

    for node in body:
        if _fusable(node, shapes):
            if group and not _fits(group, node, shapes, partitions, budget):
                close()  # another shape, or SBUF is full: a new group begins
            group.append(node)
            continue
        if group and not _uses(node, group):
            hoisted.append(node)
            continue
        close()
        units.append(node)
    close()
    return units


#: Matmuls whose result blocks can feed an elementwise chain from SBUF (2-D results).
HEADS = frozenset({aten.mm.default, aten.addmm.default})
#: How far back past unrelated nodes a chain looks for the matmul that feeds it.
_HEAD_LOOKBACK = 16


def _take_head(group: list[torch.fx.Node], units: list,
               shapes: Shapes) -> tuple[torch.fx.Node | None, list[torch.fx.Node]]:
    """The matmul feeding ``group``, removed from ``units`` to run in the group's program, and
    the units after it that read its result, removed to run after the group.

    The matmul is a 2-D ``mm``/``addmm`` of the group's shape that a member reads, among the
    last few units. The units after it then run before it (none can depend on it, except its
    readers); its readers must be read by neither the group nor those units."""
    shape = shapes[group[0]]
    if len(shape) != 2:
        return None, []
    read = {a for n in group for a in n.all_input_nodes}
    for position in range(len(units) - 1, max(-1, len(units) - 1 - _HEAD_LOOKBACK), -1):
        unit = units[position]
        if isinstance(unit, FusedGroup):
            return None, []
        if unit in read and unit.target in HEADS and body_of(unit.target) is not None and shapes.get(unit) == shape:
            later = units[position + 1:]
            readers = [u for u in later if unit in u.all_input_nodes]
            if any(r in read or any(r in u.all_input_nodes for u in later) for r in readers):
                return None, []
            units[position:] = [u for u in later if u not in readers]
            return unit, readers
    return None, []


def _body(node: torch.fx.Node) -> Any:
    """The elementwise body the group runs for ``node``: its op's eager body, or for a cast
    (a graph op, with no eager kernel of its own) the conversion's."""
    if node.target is aten._to_copy.default:
        return conversion.cast if _is_plain_cast(node) else None
    return body_of(node.target)


def _is_plain_cast(node: torch.fx.Node) -> bool:
    """A ``_to_copy`` that changes the dtype only: same device, strided, no pinned memory, and
    no memory format but the one the cast would give anyway."""
    source = node.args[0] if node.args else None
    value, before = node.meta.get("val"), getattr(source, "meta", {}).get("val")
    kwargs = node.kwargs
    return (isinstance(value, torch.Tensor) and isinstance(before, torch.Tensor) and value.device == before.device
            and kwargs.get("layout") in (None, torch.strided) and not kwargs.get("pin_memory")
            and kwargs.get("memory_format") in (None, torch.preserve_format)
            and set(kwargs) <= {"dtype", "layout", "device", "pin_memory", "non_blocking", "memory_format"})


def _fusable(node: torch.fx.Node, shapes: Shapes) -> bool:
    if node.op != "call_function" or node.target not in FUSABLE or _body(node) is None:
        return False
    if any(_is_complex(n) for n in (node, *node.all_input_nodes)):
        return False  # complex64 runs as its own pair programs (kernels/complex.py)
    shape = shapes.get(node)
    return shape is not None and math.prod(shape) > 0


def _is_complex(node: torch.fx.Node) -> bool:
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) and value.dtype.is_complex


def _fits(group: list[torch.fx.Node], node: torch.fx.Node, shapes: Shapes, partitions: int, budget: int) -> bool:
    """``node`` joins ``group``: same shape, and the chain's buffers still fit in ``budget`` with
    chunks no narrower than :data:`.tiling.MIN_FUSED_COLUMNS` (a chain too small to fill the
    widest chunks fits with narrower ones anyway)."""
    if shapes[node] != shapes[group[0]]:
        return False
    needed = min(tiling.MIN_FUSED_COLUMNS, -(-math.prod(shapes[node]) // partitions))
    return _columns([*group, node], budget) >= needed


def _columns(group: Sequence[torch.fx.Node], budget: int) -> int:
    members = set(group)
    external = {a for n in members for a in n.all_input_nodes if a not in members}
    return tiling.fused_columns(len(external), len(members), budget)


def _uses(node: torch.fx.Node, group: list[torch.fx.Node]) -> bool:
    members = set(group)
    return any(a in members for a in node.all_input_nodes)


def _op_name(node: torch.fx.Node) -> str:
    return str(node.target).removeprefix("aten.")


def _external_key(nodes: Sequence[torch.fx.Node], env: dict[torch.fx.Node, Any]) -> tuple:
    """What fixes the fused program besides its ops: its external inputs' layouts."""
    members = set(nodes)
    key = []
    for node in nodes:
        for a in node.all_input_nodes:
            if a not in members:
                v = env[a]
                key.append(("array", v.shape, v.dtype.str, v.strides) if hasattr(v, "strides")
                           else ("value", v.hex() if isinstance(v, float) else v))
    return tuple(key)
