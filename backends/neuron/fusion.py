"""Fusion of elementwise chains in a compiled graph: one tile program per chain, intermediates
kept in SBUF.

Eagerly, ``le`` then ``where`` are two programs: the first stores its mask to HBM, the second
loads it back. A compiled graph runs such a chain as one program (:func:`.tiling.map_flat_fused`):
every input is loaded once per chunk, each op computes from the tiles of the ops before it, and
only values used after the chain (or returned by the graph) are stored. Each op's arithmetic is
its eager body's, on the same chunks and tile dtypes, so results are bit-for-bit the eager ones.

:func:`plan` groups a graph's nodes. A group is a run of fusable nodes (ops whose body is one
:func:`.tiling.map_flat` and looks at no values) with one static output shape; a node that does
not use the group's results (a view of an input, a constant) runs before it, so it does not end
the group. A long chain streams narrower chunks so that all its tiles fit in a share of SBUF; one
that would need chunks narrower than :data:`.tiling.MIN_FUSED_COLUMNS` is split into groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from accelkit_backends.neuron import cost, runtime, tiling
from accelkit_backends.neuron.launch import OutSpec, body_of
from accelkit_backends.neuron.sim.errors import SbufOverflowError

aten = torch.ops.aten

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
})

#: The share of SBUF a fused group's buffers may plan for; the rest is for the temporaries its
#: ops allocate.
SBUF_SHARE = 0.5


class FusedGroup:
    """Consecutive fusable nodes of one output shape, run as one program.

    ``stored[i]`` says whether node ``i``'s value is needed after the group (a later node or
    the graph's output uses it); only those are written to HBM.
    """

    def __init__(self, nodes: Sequence[torch.fx.Node], stored: Sequence[bool], columns: int = tiling.FMAX):
        self.nodes = list(nodes)
        self.stored = list(stored)
        #: The chunk width that keeps every buffer of the chain in the planned share of SBUF.
        self.columns = columns
        self.name = "fused(" + "+".join(_op_name(n) for n in self.nodes) + ")"
        self._specs = [[OutSpec(tuple(n.meta["val"].shape), n.meta["val"].dtype)] for n in self.nodes]
        self._bodies = [body_of(n.target) for n in self.nodes]
        #: False once the chain turned out not to fuse (it then runs op by op).
        self.fuses = True
        #: The halves the group was split into when its tiles overflowed SBUF.
        self.parts: list[FusedGroup] | None = None

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
                if len(self.nodes) < 2:
                    raise
                self.parts = self._halves()
                self.run(env, run_node)
                return
            except tiling.NotFusable:
                self.fuses = False
        for node in self.nodes:
            env[node] = run_node(node)

    def _halves(self) -> list[FusedGroup]:
        middle = len(self.nodes) // 2
        halves = []
        for part in (self.nodes[:middle], self.nodes[middle:]):
            members = set(part)
            stored = [self.stored[self.nodes.index(n)] or any(u not in members for u in n.users if u in self.nodes)
                      for n in part]
            halves.append(FusedGroup(part, stored, self.columns))
        return halves

    def _run_fused(self, env: dict[torch.fx.Node, Any]) -> None:
        internal: dict[torch.fx.Node, Any] = {}

        def value(node: torch.fx.Node) -> Any:
            return internal[node] if node in internal else env[node]

        key = _external_key(self.nodes, env)
        with runtime.core().kernel(self.name, (self, key)) as k:
            with tiling.recording_flat_maps() as maps:
                for node, body, spec in zip(self.nodes, self._bodies, self._specs):
                    args = torch.fx.node.map_arg(node.args, value)
                    kwargs = dict(torch.fx.node.map_arg(node.kwargs, value))
                    count = len(maps)
                    internal[node] = body(k, spec, *args, **kwargs)
                    if len(maps) != count + 1 or maps[-1].out is not internal[node]:
                        raise tiling.NotFusable(f"{node.target} did not run as one elementwise map")
            tiling.map_flat_fused(k, maps, self.stored, self.columns)
        cost.LEDGER.note_instance(self.name, key)
        for node, keep in zip(self.nodes, self.stored):
            if keep:
                env[node] = internal[node]


def plan(body: Sequence[torch.fx.Node], outputs: Sequence[Any], partitions: int,
         sbuf_partition_bytes: int) -> list[torch.fx.Node | FusedGroup]:
    """The graph's body as the units a program runs in order: single nodes and fused groups."""
    returned = {o for o in outputs if isinstance(o, torch.fx.Node)}
    budget = int(sbuf_partition_bytes * SBUF_SHARE)
    units: list[torch.fx.Node | FusedGroup] = []
    group: list[torch.fx.Node] = []
    hoisted: list[torch.fx.Node] = []

    def close() -> None:
        units.extend(hoisted)
        hoisted.clear()
        if len(group) > 1:
            members = set(group)
            stored = [n in returned or any(u not in members for u in n.users) for n in group]
            units.append(FusedGroup(group, stored, _columns(group, budget)))
        else:
            units.extend(group)
        group.clear()

    for node in body:
        if _fusable(node):
            if group and not _fits(group, node, partitions, budget):
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


def _fusable(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.target not in FUSABLE or body_of(node.target) is None:
        return False
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and all(isinstance(d, int) for d in val.shape) and val.numel() > 0


def _fits(group: list[torch.fx.Node], node: torch.fx.Node, partitions: int, budget: int) -> bool:
    """``node`` joins ``group``: same shape, and the chain's buffers still fit in ``budget`` with
    chunks no narrower than :data:`.tiling.MIN_FUSED_COLUMNS` (a chain too small to fill the
    widest chunks fits with narrower ones anyway)."""
    if tuple(node.meta["val"].shape) != tuple(group[0].meta["val"].shape):
        return False
    needed = min(tiling.MIN_FUSED_COLUMNS, -(-group[0].meta["val"].numel() // partitions))
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
                key.append(("array", v.shape, v.dtype.str, v.strides) if hasattr(v, "strides") else ("value", v))
    return tuple(key)
