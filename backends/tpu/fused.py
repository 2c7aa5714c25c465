"""Fused eager (``ACCELKIT_TPU_MODE=fused``): ops are recorded, and a region of them runs as one
XLA program.

An op recorded in fused mode does everything strict mode does before its program would run —
the runtime's checks, PyTorch's Meta kernel (through the program's abstract evaluation, so a bad
shape, dtype or argument raises at the op), the allocation of its results (so capacity and
out-of-memory are exact, at the op) — and returns :class:`Pending` arrays of the right shape and
dtype instead of running. Views, aliasing and in-place writes are strict mode's: a write of a
pending value into a block is recorded like any other program (a scatter into a view).

The pending **region** is flushed — traced through the same lowerings into one program, or run
op by op — when a value must exist:

- a host read (``.cpu()``, ``.item()``, printing, Python control flow on a tensor), a
  synchronisation, a device-side check read;
- a kernel that cannot be recorded (it reads values on the host between programs), the CPU
  fallback, a compiled graph, a collective (its arguments are read: before it, the same on
  every rank; its results are concrete: after it);
- the size limit (``ACCELKIT_TPU_FUSED_OPS``, 1024 ops by default). At the first cut by size,
  the region's ops are searched for a period (a loop body repeated without a host read), and
  later regions are cut at a multiple of it, so that they repeat.

Regions are cached by their structure (each op's program and argument geometry, which earlier
results it reads, which results are still referenced). A structure met for the first time runs
op by op, through the same per-op programs as strict mode; met again soon after (within
:data:`RECENT_FLUSHES` flushes), it is compiled as one program, and every later meeting runs
that program. A training loop's steps therefore hit the
cache after warm-up, and a decode loop whose shapes change at every step never compiles a region
it will not see again. Only results some live tensor (or a pending device-side check) still
references are returned by a region: intermediates are never materialised.

Statistics: ``accelkit.stats()["tpu"]["fused"]``.
"""

from __future__ import annotations

import collections
import functools
import math
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import jax
import numpy as np

from accelkit.sdk import env_count
from accelkit_backends.tpu import modes
from accelkit_backends.tpu.programs import LOADED, Program, next_use

OPS_ENV = "ACCELKIT_TPU_FUSED_OPS"
DEFAULT_OPS = 1024
#: Region structures remembered (seen once or compiled); the least recently met are forgotten.
KNOWN_REGIONS = 4096
#: Shortest and longest loop bodies looked for at a cut by size.
PERIODS = (2, 512)
#: A region is compiled when it is met again within this many flushes of its last meeting: a
#: loop's body recurs at once, a decode step's shapes recur only at the next request, too rarely
#: to repay a compile (it runs op by op, as strict mode would).
RECENT_FLUSHES = 32


class Pending:
    """A result that is recorded, not computed: one array of a recorded op's output.

    It has what the runtime and the allocator read before a value exists (``shape``, ``dtype``,
    ``size``, ``ndim``). Once its region is flushed, ``value`` is the array, and every block
    that held it (:func:`hold`) holds the array instead.
    """

    __slots__ = ("shape", "dtype", "value", "holders", "region", "node", "leaf", "failure", "__weakref__")

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, region: _Region, node: int, leaf: int):
        self.shape = shape
        self.dtype = dtype
        self.value: jax.Array | None = None
        self.holders: list[weakref.ref] | None = None
        self.region, self.node, self.leaf = region, node, leaf  # where it is computed
        self.failure: BaseException | None = None  # why its region could not run

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def block_until_ready(self) -> jax.Array:
        return concrete(self).block_until_ready()

    # A kernel that reads a value on the host (a count that sizes its next program) reads it
    # from a pending array too: the read flushes the region.
    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        value = np.asarray(concrete(self))
        return value if dtype is None else value.astype(dtype)

    def __int__(self) -> int:
        return int(concrete(self))

    def __index__(self) -> int:
        return int(concrete(self))

    def __float__(self) -> float:
        return float(concrete(self))

    def __bool__(self) -> bool:
        return bool(concrete(self))

    def __repr__(self) -> str:
        state = "flushed" if self.value is not None else "pending"
        return f"Pending({self.shape}, {self.dtype}, {state})"


# ---------------------------------------------------------------------------------------------
# The region being recorded
# ---------------------------------------------------------------------------------------------

_LOWERING, _JIT = 0, 1
_ARG = object()  # a jitted function's array argument, in a node's template
_PENDING = object()  # in a node's shape key: the argument is recorded (has no weak type yet)


class _Node:
    """One recorded program call: what to call, with which inputs, giving which outputs."""

    __slots__ = ("kind", "fn", "owner", "template", "inputs", "outputs", "treedef", "shape_key", "name")

    def __init__(self, kind: int, fn: Any, owner: Any, template: Any, inputs: tuple, shape_key: Any, name: str):
        self.kind = kind
        self.fn = fn  # lowering: its _Signature; jit: the jitted function
        self.owner = owner  # lowering: the Lowering (runs the op alone); jit: the tracked function
        self.template = template  # lowering: the number of arrays; jit: the argument template
        self.inputs = inputs  # per input: ("x", external index) or (nodes back, leaf)
        self.shape_key = shape_key
        self.name = name
        # One output's weak reference itself, several outputs' in a tuple: a recorded op's objects
        # live until the flush, and each one costs the garbage collector (see _refs below).
        self.outputs: weakref.ref | tuple[weakref.ref, ...] = ()
        self.treedef: Any = None

    def output_refs(self) -> tuple[weakref.ref, ...]:
        """The weak references to the node's outputs, in leaf order."""
        outputs = self.outputs
        return (outputs,) if type(outputs) is weakref.ref else outputs

    def key(self) -> tuple:
        """What a region's cache key holds of this node."""
        return (self.kind, id(self.fn), self.template if self.kind == _LOWERING else self.shape_key, self.inputs)


class _Region:
    def __init__(self) -> None:
        self.nodes: list[_Node] = []
        self.externals: list[Any] = []
        self.external_index: dict[int, int] = {}
        # Each external array's part of a reader's shape key (an array's shape, dtype and weak
        # type are Python properties: read once per region, not once per reading op).
        self.external_avals: list[tuple] = []

    def ref(self, value: Any) -> tuple:
        if type(value) is Pending:
            if value.value is not None:
                value = value.value
            else:
                return _ref(len(self.nodes) - value.node, value.leaf)
        return self.external(value)

    def external(self, value: Any) -> tuple:
        """The reference of an input that is not computed in the region."""
        index = self.external_index.get(id(value))
        return _external_refs[index if index is not None else self.add_external(value)]

    def add_external(self, value: Any) -> int:
        """Make ``value`` (not yet one) an external input; returns its index."""
        index = self.external_index[id(value)] = len(self.externals)
        self.externals.append(value)
        self.external_avals.append(_aval(value))
        _external_ref(index)
        return index


# A recorded op's objects live until its region is flushed, so each one costs the garbage
# collector a visit per collection until then, and their number sets how often Python runs a
# full collection (over every object of torch and jax: it was a quarter of a long chain's time).
# Input references are therefore shared, not made per op, and a node's cache key is made at the
# flush.
_refs: dict[tuple[int, int], tuple[int, int]] = {}
_external_refs: list[tuple[str, int]] = []


def _ref(back: int, leaf: int) -> tuple[int, int]:
    """The (shared) reference to leaf ``leaf`` of the node ``back`` nodes before the reader."""
    ref = _refs.get((back, leaf))
    if ref is None:
        ref = _refs[(back, leaf)] = (back, leaf)
    return ref


def _external_ref(index: int) -> tuple[str, int]:
    """The (shared) reference to the region's external input ``index``."""
    while len(_external_refs) <= index:
        _external_refs.append(("x", len(_external_refs)))
    return _external_refs[index]


_lock = threading.RLock()
_region = _Region()
_local = threading.local()
_limit: int | None = None
_cut_every: int | None = None  # a multiple of the loop body found at the first cut by size


class _Known:
    """A region structure: met before (``program`` None) or compiled."""

    __slots__ = ("program", "tally", "last_met")

    def __init__(self, flush: int) -> None:
        self.program: Program | None = None
        self.tally: Any = None
        self.last_met = flush


_known: collections.OrderedDict[Any, _Known] = collections.OrderedDict()
#: A node's shape key -> its output leaves' (shape, dtype), the output's tree, and whether that
#: tree is ``(array, None)`` (a lowering with one result and no check: no tree to build).
_shapes: dict[Any, tuple[list, Any, bool]] = {}
_SHAPES_KEPT = 65536

STATS = {"ops_recorded": 0, "regions": 0, "op_by_op": 0, "compiles": 0, "hits": 0, "results": 0, "failed_regions": 0,
         "flushes": collections.Counter(), "outside_regions": collections.Counter()}
_flushes = 0  # flushes so far (the clock of RECENT_FLUSHES)


def limit() -> int:
    """``ACCELKIT_TPU_FUSED_OPS``, read once.

    :raises ValueError: the variable is not a whole number of at least 2.
    """
    global _limit
    if _limit is None:
        _limit = env_count(OPS_ENV, DEFAULT_OPS, "ops", 2)
    return _limit


def recording() -> bool:
    """Whether a program call on this thread is recorded rather than run."""
    return modes._mode == "fused" and not getattr(_local, "suspended", 0)


def flushing() -> bool:
    """Whether program calls on this thread run recorded work (a flush, or a kernel that
    cannot be recorded) in fused mode, rather than being recorded or run in strict mode."""
    return modes._mode == "fused" and getattr(_local, "suspended", 0) > 0


@contextmanager
def suspended() -> Iterator[None]:
    """Run program calls on this thread at once, as strict mode does."""
    _local.suspended = getattr(_local, "suspended", 0) + 1
    try:
        yield
    finally:
        _local.suspended -= 1


def hold(holder: Any, array: Any) -> None:
    """``holder`` (a block) now holds ``array``; if it is pending, the block gets its value at the
    flush."""
    if type(array) is Pending and array.value is None:
        if array.holders is None:
            array.holders = [weakref.ref(holder)]
        else:
            array.holders.append(weakref.ref(holder))


def concrete(value: Any) -> Any:
    """``value`` as an array: a pending one is flushed (with its whole region) first."""
    if type(value) is not Pending:
        return value
    if value.value is None:
        flush("host read")
    if value.value is None:
        raise RuntimeError(f"a tpu tensor of shape {list(value.shape)} was never computed: the fused region "
                           f"that computes it failed ({value.failure!r})") from value.failure
    return value.value


def resolve(value: Any) -> Any:
    """``value`` (a kernel argument: an array, a device view, a list or tuple of them, anything
    else) with every pending array replaced by its value, flushing the region if one is pending."""
    kind = type(value)
    if kind is Pending:
        return concrete(value)
    if kind is tuple or kind is list:
        return kind(resolve(v) for v in value)
    if kind is dict:
        return {k: resolve(v) for k, v in value.items()}
    spec = getattr(value, "spec", None)
    if spec is not None and type(getattr(value, "array", None)) is Pending:
        return value._replace(array=concrete(value.array))
    return value


def outside_regions(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a kernel that cannot be recorded (it reads values on the host, or works on its
    results in Python): in fused mode the pending region is flushed first, and the kernel runs
    as in strict mode on concrete arrays."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not recording():
            return fn(*args, **kwargs)
        if _region.nodes:
            owner = args[0] if args else None  # the kernel object, for methods
            name = getattr(owner, "name", None) or getattr(owner, "__name__", None) or fn.__qualname__
            STATS["outside_regions"][name] += 1
            flush("kernel outside regions")
        with suspended():
            return fn(*resolve(args), **resolve(kwargs))

    run.outside_regions = True
    return run


# ---------------------------------------------------------------------------------------------
# Recording
# ---------------------------------------------------------------------------------------------


def _aval(value: Any) -> Any:
    kind = type(value)
    if kind is Pending:
        return (value.shape, value.dtype) if value.value is None else _aval(value.value)
    shape = getattr(value, "shape", None)
    if shape is not None:
        return (shape, value.dtype, getattr(value, "weak_type", False))
    return kind


def _abstract(value: Any) -> Any:
    if type(value) is Pending:
        return jax.ShapeDtypeStruct(value.shape, value.dtype) if value.value is None else value.value
    return value


def _record(node: _Node, evaluate: Callable[..., Any], *operands: Any) -> Any:
    """Add ``node`` to the region and return its output tree of :class:`Pending` arrays;
    ``evaluate(*operands)`` gives the outputs' shapes and dtypes when its shape key is new."""
    found = _shapes.get(node.shape_key)
    if found is None:
        out = evaluate(*operands)
        leaves, treedef = jax.tree_util.tree_flatten(out)
        single = (node.kind == _LOWERING and isinstance(out[0], jax.ShapeDtypeStruct) and out[1] is None)
        found = ([(tuple(leaf.shape), np.dtype(leaf.dtype)) for leaf in leaves], treedef, single)
        if len(_shapes) >= _SHAPES_KEPT:
            _shapes.clear()
        _shapes[node.shape_key] = found
    leaves, node.treedef, single = found
    region = _region
    index = len(region.nodes)
    if single:
        (shape, dtype), = leaves
        p = Pending(shape, dtype, region, index, 0)
        node.outputs = weakref.ref(p)
        out = (p, None)
    else:
        pending = [Pending(shape, dtype, region, index, leaf) for leaf, (shape, dtype) in enumerate(leaves)]
        node.outputs = tuple(weakref.ref(p) for p in pending)
        out = jax.tree_util.tree_unflatten(node.treedef, pending)
    region.nodes.append(node)
    STATS["ops_recorded"] += 1
    if len(region.nodes) >= (_cut_every or _limit or limit()):
        _cut_by_size()
    return out


def record_program(lowering: Any, signature: Any, arrays: list, scalars: list) -> tuple[Any, Any]:
    """Record a lowering's program call; returns ``(result, status)`` as pending arrays (the
    status None when the program states no device-side check).

    :raises Exception: PyTorch's error for these arguments (from the Meta kernel), at once.
    """
    with _lock:
        region = _region
        index = len(region.nodes)
        inputs, avals = [], [id(signature)]
        for a in arrays:
            if type(a) is Pending:
                if a.value is None:
                    back = index - a.node
                    inputs.append(_refs.get((back, a.leaf)) or _ref(back, a.leaf))
                    avals += (a.shape, a.dtype, _PENDING)
                    continue
                a = a.value
            found = region.external_index.get(id(a))  # region.external, inline (every input)
            if found is None:
                found = region.add_external(a)
            inputs.append(_external_refs[found])
            avals += region.external_avals[found]
        # Scalars' kinds are fixed by the signature's structure: they need no place in the key.
        if scalars:
            inputs.extend([region.external(s) for s in scalars])
        shape_key = tuple(avals)  # flat: one object per op
        node = _Node(_LOWERING, signature, lowering, len(arrays), tuple(inputs), shape_key, lowering.name)
        return _record(node, _evaluate, signature, arrays, scalars)


def _evaluate(signature: Any, arrays: list, scalars: list) -> Any:
    """A lowering's outputs as shapes and dtypes for ``arrays`` (pending ones by their shapes)."""
    from accelkit_backends.tpu import checks

    try:
        return signature.evaluate([_abstract(a) for a in arrays], scalars)
    except checks.Refused as refused:
        raise refused.error from None


def record_jit(function: Any, args: tuple) -> Any:
    """Record a call of a tracked jitted function (data movement) whose arguments include a
    pending array; returns its result as pending arrays."""
    with _lock:
        region = _region
        template, inputs, avals = [], [], []
        for a in args:
            if type(a) is Pending or isinstance(a, jax.Array):
                template.append(_ARG)
                inputs.append(region.ref(a))
                avals.append(_aval(a))
            else:
                template.append(a)
        template = tuple(template)
        shape_key = (id(function), tuple(a for a in template if a is not _ARG), tuple(avals))
        node = _Node(_JIT, function.jitted, function, template, tuple(inputs), shape_key,
                     getattr(function.jitted, "__name__", "data movement"))
        return _record(node, lambda: function.jitted.eval_shape(*[_abstract(a) for a in args]))


def abandon(array: Pending) -> None:
    """Forget the recorded op that would compute ``array``, which the device refused room for:
    the op raised, so it must leave nothing to compute at the next flush."""
    with _lock:
        region = array.region
        if region is None or array.value is not None:
            return
        node = region.nodes[array.node]
        node.outputs = (_never_live,) * len(node.output_refs())
        if array.node == len(region.nodes) - 1:
            region.nodes.pop()


def _never_live() -> None:
    """The output reference of an abandoned op (a dead weak reference's answer)."""
    return None


def _fill(template: tuple, values: list) -> list:
    it = iter(values)
    return [next(it) if a is _ARG else a for a in template]


# ---------------------------------------------------------------------------------------------
# Flushing
# ---------------------------------------------------------------------------------------------


def _period(keys: list) -> int | None:
    """The shortest ``p`` for which the last ``2p`` keys are one block of ``p`` repeated."""
    n = len(keys)
    low, high = PERIODS
    for p in range(low, min(high, n // 2) + 1):
        if keys[n - p:] == keys[n - 2 * p:n - p]:
            return p
    return None


def _cut_by_size() -> None:
    global _cut_every
    if _cut_every is None:
        period = _period([node.shape_key for node in _region.nodes])
        if period is not None:
            _cut_every = period * max(1, limit() // period)
    flush("size limit")


def flush(reason: str) -> None:
    """Run the pending region, if any (see the module docstring); ``reason`` is counted."""
    global _region, _flushes
    with _lock:
        region = _region
        if not region.nodes:
            return
        _region = _Region()
        _flushes += 1
        STATS["flushes"][reason] += 1
        STATS["regions"] += 1
        live = []
        for index, node in enumerate(region.nodes):
            outputs = node.outputs
            if type(outputs) is weakref.ref:  # one output (most ops)
                p = outputs()
                if p is not None:
                    live.append((index, 0, p))
                continue
            for leaf, ref in enumerate(outputs):
                p = ref()
                if p is not None:
                    live.append((index, leaf, p))
        STATS["results"] += len(live)
        key = (tuple(node.key() for node in region.nodes), tuple(region.external_avals),
               tuple((i, leaf) for i, leaf, _ in live))
        known = _known.get(key)
        wanted = [(i, leaf) for i, leaf, _ in live]
        try:
            with suspended():
                values = _run(key, known, region, wanted)
        except BaseException as failure:
            for _, _, p in live:
                p.failure, p.region, p.holders = failure, None, None
            raise
        for (_, _, p), value in zip(live, values):
            p.value, p.region = value, None
            if p.holders:
                for ref in p.holders:
                    holder = ref()
                    if holder is not None and holder.array is p:
                        holder.array = value
                p.holders = None


def _run(key: Any, known: _Known | None, region: _Region, wanted: list) -> list:
    """The region's wanted results: op by op, or as one program (see the module docstring). A
    compiled region that fails runs op by op, so that an error is the failing op's own."""
    if known is None or (known.program is None and _flushes - known.last_met > RECENT_FLUSHES):
        if known is None:
            _known[key] = _Known(_flushes)
            if len(_known) > KNOWN_REGIONS:
                _known.popitem(last=False)
        else:
            known.last_met = _flushes
            _known.move_to_end(key)
        STATS["op_by_op"] += 1
        return _op_by_op(region.nodes, region.externals, wanted)
    _known.move_to_end(key)
    try:
        return _compiled(known, region, wanted)
    except Exception:
        STATS["failed_regions"] += 1
        _known.pop(key, None)
        return _op_by_op(region.nodes, region.externals, wanted)


def _op_by_op(nodes: list[_Node], externals: list, live: list) -> list:
    """Run each node's program in turn, as strict mode would have (first sight of a region),
    but only the nodes the live results (and pending checks) depend on, as a compiled region
    would: a result nobody references is never computed."""
    needed = {index for index, _ in live}
    for index in range(len(nodes) - 1, -1, -1):
        if index in needed:
            needed.update(index - r[0] for r in nodes[index].inputs if r[0] != "x")
    computed: list[list | None] = []
    for index, node in enumerate(nodes):
        if index not in needed:
            computed.append(None)
            continue
        args = [externals[r[1]] if r[0] == "x" else computed[index - r[0]][r[1]] for r in node.inputs]
        if node.kind == _LOWERING:
            count = node.template
            out = node.owner.execute(node.fn, args[:count], args[count:])
        else:
            out = node.owner(*_fill(node.template, args))
        computed.append(jax.tree_util.tree_leaves(out))
    return [computed[i][leaf] for i, leaf in live]


def _region_program(nodes: list[_Node], live: list) -> Callable[[list], list]:
    plan = [(node.kind, node.fn.traceable if node.kind == _LOWERING else node.fn, node.template, node.inputs)
            for node in nodes]

    def region(externals: list) -> list:
        computed: list[list] = []
        for index, (kind, fn, template, inputs) in enumerate(plan):
            args = [externals[r[1]] if r[0] == "x" else computed[index - r[0]][r[1]] for r in inputs]
            out = fn(args[:template], args[template:]) if kind == _LOWERING else fn(*_fill(template, args))
            computed.append(jax.tree_util.tree_leaves(out))
        return [computed[i][leaf] for i, leaf in live]

    region.__name__ = f"fused_region_{len(nodes)}_ops"
    return region


def _compiled(known: _Known, region: _Region, live: list) -> list:
    """Run the region as one program: compiled at its second sighting, reused after."""
    from accelkit_backends.tpu.cost import COSTS, ProgramCost

    if known.program is None:
        known.program = LOADED.track(Program(jax.jit(_region_program(region.nodes, live))))
    program = known.program
    program.last_use = next_use()
    externals = region.externals
    out = program.jitted(externals)
    if program.newly_compiled() or known.tally is None:
        STATS["compiles"] += 1
        executable = program.jitted.lower(externals).compile()
        known.tally = COSTS.tally(f"fused region ({len(region.nodes)} ops)", ProgramCost.of(executable, [
            x for x in externals if hasattr(x, "dtype")]))
    else:
        STATS["hits"] += 1
    COSTS.record(known.tally)
    return out


def leave() -> None:
    """Fused mode ends (a mode change): run what is pending."""
    flush("mode change")


def stats() -> dict[str, Any]:
    """``accelkit.stats()["tpu"]["fused"]``: ops recorded, regions flushed (run op by op at
    first sight, compiled at the second, cache hits after), results materialised, and why
    regions were flushed."""
    counters = ("flushes", "outside_regions")
    return {**{k: v for k, v in STATS.items() if k not in counters}, **{k: dict(STATS[k]) for k in counters},
            "pending_ops": len(_region.nodes), "cut_every": _cut_every}


def reset_stats() -> None:
    for key in ("ops_recorded", "regions", "op_by_op", "compiles", "hits", "results", "failed_regions"):
        STATS[key] = 0
    STATS["flushes"].clear()
    STATS["outside_regions"].clear()
