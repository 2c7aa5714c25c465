"""neuron's adaptive eager: eager ops recorded, and run as one scheduled program per region.

Strictly (``ACCELKIT_NEURON_EAGER=strict``, or :func:`eager_mode`), each eager aten op is one
tile program whose results go to HBM. Adaptively (the default, as TorchNeuron's), a *static* kernel
(:func:`.launch.tile_kernel` ``static=True``: its instructions follow from shapes, dtypes and
static arguments) is not run at the op: PyTorch's Meta kernel gives its results' geometry at
once (so shape, dtype and argument errors raise at the op), and each result is a device tensor
over a pending block (:class:`Deferred`). Device memory is accounted at the op exactly as
strictly (the pending block is adopted with the result's bytes, so ``torch.OutOfMemoryError``
comes at the op). The recorded ops form a *region*; a flush runs it as one program of the same
kernels through the compiled path's machinery (:class:`.graph_lowering.GraphProgram`): one
scheduled program on the core whose kernels overlap, elementwise chains fused with their
intermediates in SBUF (:mod:`.fusion`), intermediates nobody references any more never stored.
Programs are cached by the region's structure (ops, layouts, which results are still
referenced), so a training loop's steps reuse one program; float arguments are program inputs,
so a new learning rate is not a new program. A structure met for the first time runs op by op,
through the same kernel instances as strictly; met again within :data:`RECENT_FLUSHES` flushes
(a loop's body), it is built into a program, which every later meeting runs. A sequence of ops
never repeated (a one-off computation, a shape that changes at every call) builds no program.

A region is flushed

- when the host reads a pending value or memory the region will write (``.cpu()``, ``.item()``,
  printing, a CPU fallback's copies, a host-staged collective), or writes memory the region
  reads or writes (``copy_`` from the host);
- at ``synchronize()`` (and events), before storing into an ``out=`` argument, at a cast;
- before an op that is not recorded (a kernel that reads values, a random op, a complex one,
  a compiled graph) when that op reads or writes anything the region touches;
- when an op reads memory an in-place write of the region changed;
- at :data:`MAX_NODES` ops (the size limit).

In-place writes (``add_``, ``copy_`` of a pending value, an optimizer's update) are recorded as
stores, applied in order after the program, so views and aliasing behave as strictly. Values
are bit-for-bit the strict ones: each kernel computes as it does eagerly, and fusion computes
each op with its eager body on the same chunks (:mod:`.fusion`).

A kernel that fails at a flush (a value check such as a class index out of range, an int64
value outside int32) raises at the flush, naming the op: the region is then run again op by op
as strictly, so the ops before the failing one and their in-place writes take effect, and
nothing after it does (reading a result of those raises).

Recorded ops whose results nobody can read any more are not run, so a value check in such an
op raises nothing (strictly it raises at the op).

What differs from strict, by design: per-op figures (kernel instances, replays, the estimate's
kernels) count region programs where strictly each op is counted; tests of strict's own
bookkeeping pin ``eager_mode("strict")``.

Figures: ``accelkit.stats()["neuron"]["adaptive"]``.
"""

from __future__ import annotations

import contextlib
import math
import operator
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from numpy.lib.array_utils import byte_bounds

from accelkit.sdk import RandomDraw, ViewSpec, env_choice
from accelkit_backends.neuron.sim import numerics as nx

MODE_ENV = "ACCELKIT_NEURON_EAGER"
MODES = ("adaptive", "strict")
DEFAULT_MODE = "adaptive"
#: Ops a region records before it is flushed.
MAX_NODES = 512
#: Region programs kept (a new structure beyond it starts the cache afresh).
MAX_PROGRAMS = 1024
#: A region is built into a program when its structure is met again within this many flushes
#: of its last meeting (a loop's body recurs at once); met for the first time, or again only
#: long after, it runs op by op as strictly, so a structure never seen again (a one-off
#: sequence, a shape that changes at every call) costs no program build.
RECENT_FLUSHES = 32
#: Structures met once and remembered for :data:`RECENT_FLUSHES` (beyond it, forgotten).
MAX_SEEN = 4096

_mode: str | None = None
_lock = threading.RLock()
_local = threading.local()


def mode() -> str:
    """``"adaptive"`` or ``"strict"``: :func:`eager_mode`'s, else ``ACCELKIT_NEURON_EAGER``."""
    global _mode
    if _mode is None:
        _mode = env_choice(MODE_ENV, MODES, DEFAULT_MODE)
    return _mode


@contextlib.contextmanager
def eager_mode(name: str) -> Iterator[None]:
    """Within the block, neuron's eager ops run ``"adaptive"`` or ``"strict"``; the pending
    region is flushed on the way in and out."""
    global _mode
    if name not in MODES:
        raise ValueError(f"neuron eager mode {name!r}: use one of {', '.join(MODES)}")
    previous = mode()
    flush("mode change")
    _mode = name
    try:
        yield
    finally:
        flush("mode change")
        _mode = previous


def engaged() -> bool:
    """Whether an op reaching a neuron kernel now may be recorded (adaptive, and not inside a
    flush or a compiled program)."""
    return (_mode or mode()) == "adaptive" and not getattr(_local, "running", 0)


@contextlib.contextmanager
def running() -> Iterator[None]:
    """Within the block, kernels on this thread run at once (a flush, a compiled program)."""
    _local.running = getattr(_local, "running", 0) + 1
    try:
        yield
    finally:
        _local.running -= 1


# ---------------------------------------------------------------------------------------------
# Pending values
# ---------------------------------------------------------------------------------------------


class Deferred:
    """The block of a recorded op's result: ``array`` (flat ``uint8``, as any neuron block) once
    a flush computed it, None before. The allocator adopts it at the op with the result's bytes
    (``nbytes``), so memory is accounted as strictly."""

    __slots__ = ("array", "shape", "dtype", "nbytes", "site", "adopted", "freed", "error", "result",
                 "written", "views", "__weakref__")

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, site: tuple[int, int]):
        self.array: np.ndarray | None = None
        self.shape, self.dtype = shape, dtype
        self.nbytes = math.prod(shape) * dtype.itemsize
        #: (node, output) in the open region; None once flushed.
        self.site: tuple[int, int] | None = site
        self.adopted = self.freed = False
        #: The error that kept it from being computed (its op or an earlier one failed).
        self.error: BaseException | None = None
        #: The result object the kernel returned, while something holds it (before adoption).
        self.result: Any = None
        #: A store of the region writes into it.
        self.written = False
        #: Live :class:`PendingView` objects of it (a kernel argument read from a tensor that
        #: is gone since, as numpy views keep memory alive strictly).
        self.views = 0

    def wanted(self) -> bool:
        """Whether its value can still be read: a live tensor holds it, or a view of it (the
        result object on its way to a tensor or to ``self``, an argument read earlier)."""
        return self.views > 0 or (self.adopted and not self.freed)


class PendingView:
    """A view (``ViewSpec``) of a pending block: what a kernel gets for a tensor whose value a
    flush has not computed yet. ``shape``, ``dtype`` (numpy) and ``strides`` (bytes) as a numpy
    array's."""

    __slots__ = ("deferred", "view", "shape", "dtype", "strides", "__weakref__")

    def __init__(self, deferred: Deferred, view: ViewSpec):
        self.deferred, self.view = deferred, view
        self.shape = tuple(view.size)
        self.dtype = nx.numpy_dtype(view.dtype)
        self.strides = tuple(s * self.dtype.itemsize for s in view.stride)
        deferred.views += 1

    def __del__(self) -> None:
        self.deferred.views -= 1

    def identity(self) -> bool:
        """Whether the view is the whole result as it was made (same dtype, shape, dense)."""
        d, view = self.deferred, self.view
        if view.offset or view.dtype != d.dtype or self.shape != d.shape:
            return False
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(tuple(view.stride))):
            if size > 1 and stride != expected:
                return False
            expected *= size
        return True


def _contiguous(shape: tuple[int, ...], dtype: torch.dtype) -> ViewSpec:
    return ViewSpec.contiguous(dtype, shape)


def read_block(block: np.ndarray, view: ViewSpec) -> np.ndarray:
    """A typed, strided numpy view of a flat ``uint8`` block (the allocator's ``read``)."""
    dtype = nx.numpy_dtype(view.dtype)
    strides = tuple(s * dtype.itemsize for s in view.stride)
    try:  # numpy checks that the view lies inside the block
        return np.ndarray(view.size, dtype, block, view.offset * dtype.itemsize, strides)
    except (TypeError, ValueError):  # a view numpy's buffer check cannot place (an empty one past the end)
        usable = block.shape[0] - block.shape[0] % dtype.itemsize
        typed = block[:usable].view(dtype)
        return np.lib.stride_tricks.as_strided(typed[view.offset:], view.size, strides, writeable=True)


def _root(array: np.ndarray) -> Any:
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def _block(value: np.ndarray, owners: set[int]) -> np.ndarray:
    """A computed result as the block of its tensor: memory of its own, as strictly (the
    allocator adopts only a result that owns its memory, and copies any other). A kernel may
    return a view of an argument, or two results may share memory; a later in-place write into
    one tensor must not show in another."""
    root = _root(value)
    if not (value.flags.c_contiguous and value.flags.owndata) or id(root) in owners:
        value = np.array(value, copy=True, order="C")
        root = value
    owners.add(id(root))
    return value.reshape(-1).view(np.uint8)


def _flat(array: np.ndarray) -> np.ndarray:
    """A result as a block: its row-major bytes."""
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    return array.reshape(-1).view(np.uint8)


# ---------------------------------------------------------------------------------------------
# The open region
# ---------------------------------------------------------------------------------------------


class _In:
    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i


class _Float(_In):
    __slots__ = ()


class _Ref:
    """A pending value in a region: output ``out`` of node ``node``, through ``view`` (None: as
    made)."""

    __slots__ = ("node", "out", "view")

    def __init__(self, node: int, out: int, view: ViewSpec | None):
        self.node, self.out, self.view = node, out, view

    def key(self) -> tuple:
        return ("ref", self.node, self.out, None if self.view is None else tuple(self.view))


class _Node:
    __slots__ = ("op", "args", "kwargs", "outs", "multi")

    def __init__(self, op: Any, args: tuple, kwargs: dict, outs: list[Deferred], multi: bool):
        self.op, self.args, self.kwargs, self.outs, self.multi = op, args, kwargs, outs, multi

    @property
    def name(self) -> str:
        return str(self.op).removeprefix("aten.")


class _Store:
    __slots__ = ("block", "view", "value")

    def __init__(self, block: Any, view: ViewSpec, value: _Ref):
        self.block, self.view, self.value = block, view, value


class _Region:
    def __init__(self) -> None:
        self.entries: list[_Node | _Store] = []
        self.nodes: list[_Node] = []
        self.inputs: list[np.ndarray] = []
        self.floats: list[float] = []
        self.key: list = []
        #: ids of the memory the region reads (its inputs' roots) and writes (store targets),
        #: with the objects, which keep the ids valid.
        self.reads: dict[int, Any] = {}
        self.writes: dict[int, Any] = {}
        #: Per written memory (id as in ``writes``) whose last store covered it from its start
        #: with a whole result: (node, output, dtype, bytes). A later read inside those bytes
        #: reads that result instead of the memory (no flush needed).
        self.shadows: dict[int, tuple[int, int, torch.dtype, int]] = {}
        #: Per memory the region reads, the first op that reads it.
        self.first_read: dict[int, int] = {}

    def touches(self, root: Any) -> bool:
        return id(root) in self.reads or id(root) in self.writes


_region = _Region()
_programs: dict[tuple, Any] = {}
#: Per region structure met once and not built: the flush number of that meeting.
_seen: dict[tuple, int] = {}
_flushes = 0
STATS = {"regions": 0, "ops_recorded": 0, "stores_recorded": 0, "programs_built": 0, "program_cache_hits": 0,
         "regions_op_by_op": 0, "ops_not_recorded": 0, "flushes": {}, "errors_at_flush": 0}


def stats() -> dict[str, Any]:
    return {"mode": mode(), **{k: dict(v) if isinstance(v, dict) else v for k, v in STATS.items()},
            "open_ops": len(_region.nodes)}


def reset_stats() -> None:
    STATS.update(regions=0, ops_recorded=0, stores_recorded=0, programs_built=0, program_cache_hits=0,
                 regions_op_by_op=0, ops_not_recorded=0, flushes={}, errors_at_flush=0)


def pending() -> bool:
    """Whether ops are recorded and not yet run."""
    return bool(_region.entries)


# ---------------------------------------------------------------------------------------------
# What kernels and the allocator call
# ---------------------------------------------------------------------------------------------


def _mutates(op: Any) -> bool:
    return any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments)


_NEVER = frozenset({torch.ops.aten.native_batch_norm.default})  # writes its running statistics


def recordable(op: Any, static: bool) -> bool:
    """Whether ``op``'s kernel may be recorded: static, writing no argument, and returning
    tensors (one, or a tuple of them)."""
    returns = op._schema.returns
    return (static and op not in _NEVER and not _mutates(op) and bool(returns)
            and all(r.type.kind() == "TensorType" for r in returns))


#: Per recorded op, whether it returns several tensors (its schema read once).
_MULTI: dict[Any, bool] = {}


def record(op: Any, args: tuple, kwargs: dict, specs: list) -> Any:
    """Record ``op`` (its kernel is static) with results of geometry ``specs``; returns its
    results as pending values, or None when these arguments cannot be recorded (the caller
    runs the op at once, after :func:`concrete`)."""
    if not specs or any(s is None or 0 in s.shape for s in specs):
        return None
    with _lock:
        region = _region
        if len(region.nodes) >= MAX_NODES:
            flush("size limit")
            region = _region
        template = _template((args, kwargs), region)
        if template is None:  # reads what the region wrote, or a view it cannot express
            flush("read after an in-place write")
            args, kwargs = concrete((args, kwargs))
            region = _region
            template = _template((args, kwargs), region)
            if template is None:
                return None
        (t_args, t_kwargs), key = template
        index = len(region.nodes)
        outs = [Deferred(tuple(s.shape), s.dtype, (index, j)) for j, s in enumerate(specs)]
        multi = _MULTI.get(op)
        if multi is None:
            multi = _MULTI[op] = len(op._schema.returns) > 1
        node = _Node(op, t_args, t_kwargs, outs, multi)
        region.nodes.append(node)
        region.entries.append(node)
        region.key.append((op, key))
        STATS["ops_recorded"] += 1
        results = []
        for d in outs:
            view = PendingView(d, _contiguous(d.shape, d.dtype))
            d.result = weakref.ref(view)
            results.append(view)
        return tuple(results) if multi else results[0]


class _Cut(Exception):
    """An argument the open region cannot take as it is."""


def _template(value: Any, region: _Region) -> tuple[Any, tuple] | None:
    """``value`` (an op's arguments) with arrays, pending views and floats as region references,
    and its part of the region's key; None if it reads memory the region wrote in a way no
    recorded value stands for, or holds what a region cannot take (a random draw). The region
    takes the new inputs only when the whole of ``value`` could be expressed."""
    walker = _Walker(region)
    try:
        template = walker.walk(value)
    except _Cut:
        return None
    node = len(region.nodes)
    region.inputs.extend(walker.inputs)
    for root in walker.roots:
        region.reads[id(root)] = root
        region.first_read.setdefault(id(root), node)
    region.floats.extend(walker.floats)
    return template, tuple(walker.keys)


class _Walker:
    """One op's arguments turned into a template (see :func:`_template`). A class rather than
    a recursive closure: a closure that calls itself is a reference cycle, garbage only the
    cyclic collector frees, and one per recorded op made collections frequent enough to cost
    wall time."""

    __slots__ = ("region", "inputs", "roots", "floats", "keys", "first_input", "first_float")

    def __init__(self, region: _Region):
        self.region = region
        self.inputs: list[np.ndarray] = []
        self.roots: list[Any] = []
        self.floats: list[float] = []
        self.keys: list = []
        self.first_input, self.first_float = len(region.inputs), len(region.floats)

    def walk(self, v: Any) -> Any:
        kind = type(v)
        if kind is np.ndarray:
            root = _root(v)
            region = self.region
            if id(root) in region.writes:
                ref = _shadowed(v, root, region)
                if ref is None:
                    raise _Cut
                self.keys.append(ref.key())
                return ref
            self.inputs.append(v)
            self.roots.append(root)
            self.keys.append(("in", v.shape, v.dtype.str, v.strides))
            return _In(self.first_input + len(self.inputs) - 1)
        if kind is PendingView:
            d = v.deferred
            if d.array is not None or d.site is None:
                return self.walk(resolve(v))
            if v.view.dtype != d.dtype:
                raise _Cut
            ref = _pending_ref(v, self.region)
            if ref is None:
                raise _Cut
            self.keys.append(ref.key())
            return ref
        if kind is int or kind is bool or v is None:
            self.keys.append((kind, v))
            return v
        if kind is float:
            self.floats.append(v)
            self.keys.append(float)
            return _Float(self.first_float + len(self.floats) - 1)
        if kind is list or kind is tuple:
            self.keys.append((kind, len(v)))
            return kind([self.walk(x) for x in v])
        if kind is dict:
            self.keys.append((dict, tuple(v)))
            return {k: self.walk(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):  # torch.Size and kin
            base = list if isinstance(v, list) else tuple
            self.keys.append((base, len(v)))
            return base([self.walk(x) for x in v])
        if isinstance(v, (RandomDraw, complex, np.ndarray, PendingView, float, dict)):
            raise _Cut  # a random draw, a complex number, or a subclass of the above
        self.keys.append((kind, v))
        return v


def _pending_ref(view: PendingView, region: _Region) -> _Ref | None:
    """A view of a value pending in ``region`` as a region reference: to its op's result, or,
    when a store of the region wrote that value since, to the result the store wrote (None if
    the store did not cover it from its start with a whole result)."""
    d = view.deferred
    if not d.written:
        return _Ref(d.site[0], d.site[1], None if view.identity() else view.view)
    shadow = region.shadows.get(id(d))
    if shadow is None:
        return None
    node, out, dtype, nbytes = shadow
    written = region.nodes[node].outs[out]
    if dtype != view.view.dtype or _view_end(view.view) > nbytes:
        return None
    # The view is taken of the written result's memory, whose shape may differ from d's.
    return _Ref(node, out, None if PendingView(written, view.view).identity() else view.view)


def _view_end(view: ViewSpec) -> int:
    """One past the last byte ``view`` addresses (0 for an empty view)."""
    if any(size == 0 for size in view.size):
        return 0
    last = view.offset + sum((size - 1) * stride for size, stride in zip(view.size, view.stride))
    return (last + 1) * view.dtype.itemsize


def _shadowed(array: np.ndarray, root: np.ndarray, region: _Region) -> _Ref | None:
    """``array`` (a view of memory a store of the region wrote) as a view of the result that
    store wrote, when the store covered all of ``array``'s bytes; None otherwise."""
    shadow = region.shadows.get(id(root))
    if shadow is None:
        return None
    node, out, dtype, nbytes = shadow
    if nx.numpy_dtype(dtype) != array.dtype:
        return None
    itemsize = array.dtype.itemsize
    start = array.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    low, high = byte_bounds(array)
    low -= root.__array_interface__["data"][0]
    high -= root.__array_interface__["data"][0]
    if low < 0 or high > nbytes or start % itemsize or any(s % itemsize for s in array.strides):
        return None
    view = ViewSpec(dtype, tuple(array.shape), tuple(s // itemsize for s in array.strides), start // itemsize)
    d = region.nodes[node].outs[out]
    identity = PendingView(d, view).identity()
    return _Ref(node, out, None if identity else view)


def resolve(view: PendingView) -> np.ndarray:
    """A pending view's value as a numpy view of its computed block (flushing if needed)."""
    d = view.deferred
    if d.array is None:
        if d.error is None and d.site is not None:
            flush("a pending value is read")
        if d.array is None:
            raise RuntimeError(
                "neuron adaptive eager: this tensor's value was never computed, because an op "
                f"recorded before it failed at a flush: {d.error}") from d.error
    return read_block(d.array, view.view)


def concrete(value: Any) -> Any:
    """``value`` (arguments of an op about to run at once) with pending views computed and
    flushed if it touches the open region."""
    if not _region.entries and not _has_pending(value):
        return value
    with _lock:
        if _touches(value, _region):
            flush("an op that is not recorded")
        return _resolved(value)


def _has_pending(value: Any) -> bool:
    if isinstance(value, PendingView):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_pending(v) for v in value)
    if isinstance(value, dict):
        return any(_has_pending(v) for v in value.values())
    return False


def _touches(value: Any, region: _Region) -> bool:
    if isinstance(value, PendingView):
        return value.deferred.array is None
    if isinstance(value, np.ndarray):
        return region.touches(_root(value))
    if isinstance(value, (list, tuple)):
        return any(_touches(v, region) for v in value)
    if isinstance(value, dict):
        return any(_touches(v, region) for v in value.values())
    return False


def _resolved(value: Any) -> Any:
    if isinstance(value, PendingView):
        return resolve(value)
    if isinstance(value, (list, tuple)) and _has_pending(value):
        return type(value)(_resolved(v) for v in value)
    if isinstance(value, dict) and _has_pending(value):
        return {k: _resolved(v) for k, v in value.items()}
    return value


def for_host_read(array: Any) -> Any:
    """An array the host is about to read: computed, and flushed first if the region writes
    its memory."""
    if isinstance(array, PendingView):
        return resolve(array)
    if _region.writes and isinstance(array, np.ndarray) and id(_root(array)) in _region.writes:
        flush("the host reads memory the region writes")
    return array


def block_array(block: Any, write: bool) -> np.ndarray:
    """A block's memory for the host to read or (``write``) write, flushing what must come
    first."""
    if isinstance(block, Deferred) and block.array is None:
        resolve(PendingView(block, _contiguous(block.shape, block.dtype)))
    array = block.array if isinstance(block, Deferred) else block
    if _region.entries:
        root = _root(array)
        if _region.touches(root) if write else id(root) in _region.writes:
            flush("the host writes memory the region uses" if write else "the host reads memory the region writes")
    return array


def store(block: Any, view: ViewSpec, value: Any) -> bool:
    """An in-place write of ``value`` into ``view`` of ``block``: recorded (True) when
    ``value`` is pending in the open region; otherwise False (the caller writes, through
    :func:`block_array` and :func:`for_host_read`)."""
    if not getattr(_local, "running", 0) and isinstance(value, PendingView) and value.deferred.site is not None \
            and value.deferred.array is None and value.view.dtype == value.deferred.dtype:
        with _lock:
            d = value.deferred
            if d.site is not None and d.array is None:
                region = _region
                target = block if isinstance(block, Deferred) and block.array is None else \
                    _root(block.array if isinstance(block, Deferred) else block)
                # The value as the region holds it now (a store of the region may have written
                # it since its op); a written value no store result stands for is computed first.
                ref = _pending_ref(value, region)
                if ref is None:
                    return False
                identity = ref.view is None
                d = region.nodes[ref.node].outs[ref.out]
                region.entries.append(_Store(block, view, ref))
                region.writes[id(target)] = target
                if isinstance(target, Deferred):
                    target.written = True
                # The store writes the whole value, densely from the memory's start: later reads
                # inside it read the value. Not for memory the region read before (a model's
                # parameters, updated by the optimizer): a read after such an update is where
                # a training loop's next step begins, so the region ends there and every step
                # is the same region, one cached program.
                fresh = isinstance(target, Deferred) or region.first_read.get(id(target), d.site[0]) >= d.site[0]
                if fresh and identity and view.offset == 0 and view.dtype == d.dtype and \
                        PendingView(d, ViewSpec(view.dtype, view.size, view.stride, 0)).identity():
                    region.shadows[id(target)] = (d.site[0], d.site[1], d.dtype, d.nbytes)
                else:
                    region.shadows.pop(id(target), None)
                region.key.append(("store", ref.key()))
                STATS["stores_recorded"] += 1
                return True
    return False


def adoptable(view: PendingView) -> tuple[Deferred, int] | None:
    """The block and bytes of a recorded op's result, to adopt as a new tensor's memory."""
    d = view.deferred
    if d.adopted or d.result is None or d.result() is not view:
        return None
    return d, d.nbytes


def adopted(view: PendingView) -> None:
    """A recorded op's result became a tensor's memory (its accounting succeeded)."""
    d = view.deferred
    d.adopted = True
    d.result = None


# ---------------------------------------------------------------------------------------------
# Flushing
# ---------------------------------------------------------------------------------------------


def flush(reason: str) -> None:
    """Run the open region (if any) as one program; ``reason`` is counted in the stats."""
    global _region, _flushes
    with _lock:
        region = _region
        if not region.entries:
            return
        _region = _Region()
        _flushes += 1
        STATS["regions"] += 1
        STATS["flushes"][reason] = STATS["flushes"].get(reason, 0) + 1
        with running():
            try:
                _run(region)
            finally:
                for node in region.nodes:
                    for d in node.outs:
                        d.site = None
                        d.written = False


def _run(region: _Region) -> None:
    wanted: list[tuple[int, int]] = []
    for i, node in enumerate(region.nodes):
        for j, d in enumerate(node.outs):
            if d.wanted():
                wanted.append((i, j))
    stores = [e for e in region.entries if isinstance(e, _Store)]
    outputs = [_Ref(i, j, None) for i, j in wanted] + [s.value for s in stores]
    if not outputs:
        return  # nothing recorded is read any more: nothing runs
    key = (tuple(region.key), len(region.floats), tuple(r.key() for r in outputs))
    program = _programs.get(key)
    if program is None:
        met = _seen.get(key)
        if met is None or _flushes - met > RECENT_FLUSHES:
            if len(_seen) >= MAX_SEEN:
                _seen.clear()
            _seen[key] = _flushes
            STATS["regions_op_by_op"] += 1
            try:
                _run_op_by_op(region)
            except Exception:
                STATS["errors_at_flush"] += 1
                raise
            return
        _seen.pop(key, None)
        if len(_programs) >= MAX_PROGRAMS:
            _programs.clear()
        program = _programs[key] = _build(region, outputs)
        STATS["programs_built"] += 1
    else:
        STATS["program_cache_hits"] += 1
    try:
        results = program([*region.inputs, *region.floats], [])
    except Exception:  # noqa: BLE001 - run op by op to find the failing op and raise its error
        STATS["errors_at_flush"] += 1
        _run_op_by_op(region)
        return
    owners: set[int] = set()
    for (i, j), value in zip(wanted, results):
        region.nodes[i].outs[j].array = _block(value, owners)
    for entry, value in zip(stores, results[len(wanted):]):
        _write(entry.block, entry.view, value)


def _write(block: Any, view: ViewSpec, value: np.ndarray) -> None:
    if isinstance(block, Deferred):
        if block.array is None:
            return  # nobody can read it any more
        block = block.array
    target = read_block(block, view)
    if np.shares_memory(target, value):
        value = np.array(value, copy=True)
    target[...] = value


def _run_op_by_op(region: _Region) -> None:
    """Run the region's ops one by one as strict eager would have, applying its stores as they
    come; the first op that fails raises, naming itself, and leaves what follows not run."""
    from accelkit_backends.neuron.launch import kernels

    values: dict[tuple[int, int], np.ndarray] = {}

    def actual(v: Any) -> Any:
        return _actual(v, region, values)

    owners: set[int] = set()
    stores = [e.value for e in region.entries if isinstance(e, _Store)]
    needed = _needed(region, [_Ref(i, j, None) for i, n in enumerate(region.nodes)
                              for j, d in enumerate(n.outs) if d.wanted()] + stores)
    index = -1
    for position, entry in enumerate(region.entries):
        if isinstance(entry, _Store):
            _write(entry.block, entry.view, actual(entry.value))
            continue
        index += 1
        if index not in needed:
            continue
        try:
            result = kernels.get(entry.op).fn(*actual(entry.args), **actual(entry.kwargs))
        except Exception as error:
            _fail(region, position, entry, error)
            raise
        results = result if entry.multi else (result,)
        for j, (d, value) in enumerate(zip(entry.outs, results)):
            # Later ops read it as strictly they read its tensor: in PyTorch's result dtype
            # (a kernel may compute another, as layer norm's bfloat16 statistics), row-major,
            # in its own block (a kernel may hand over another layout, and a kernel's order
            # of summation can follow its arguments' layout).
            dtype = nx.numpy_dtype(d.dtype)
            if value.dtype != dtype:
                value = value.astype(dtype)
            d.array = _block(value, owners)
            values[(index, j)] = read_block(d.array, _contiguous(d.shape, d.dtype))
    # Every op ran (the program failed for none of them): the values are the strict ones.


def _actual(v: Any, region: _Region, values: dict[tuple[int, int], np.ndarray]) -> Any:
    """A recorded argument's value in an op-by-op run: ``values`` holds the ops' results so far.
    (A function of the module: a closure calling itself is a cycle, and would keep ``values``,
    every result of the region, until the cyclic collector's next pass.)"""
    if isinstance(v, _Float):
        return region.floats[v.i]
    if isinstance(v, _In):
        return region.inputs[v.i]
    if isinstance(v, _Ref):
        array = values[(v.node, v.out)]
        return array if v.view is None else read_block(_flat(array), v.view)
    if isinstance(v, (list, tuple)):
        return type(v)(_actual(x, region, values) for x in v)
    if isinstance(v, dict):
        return {k: _actual(x, region, values) for k, x in v.items()}
    return v


def _fail(region: _Region, position: int, node: _Node, error: BaseException) -> None:
    """Mark the results of ``node`` and of every op recorded after it as never computed, and
    name ``node`` in ``error``."""
    note = (f"(neuron adaptive eager: raised by aten.{node.name}, recorded earlier and run at a flush; "
            f"{MODE_ENV}=strict raises at the op)")
    if error.args and isinstance(error.args[0], str):
        error.args = (f"{error.args[0]} {note}", *error.args[1:])
    else:
        error.add_note(note)
    for entry in region.entries[position:]:
        if isinstance(entry, _Node):
            for d in entry.outs:
                d.error = error


# -- the region as a graph of the compiled path ---------------------------------------------------


def _view_of(array: np.ndarray, size: tuple, stride: tuple, offset: int) -> np.ndarray:
    """A strided view of a region value as it would lie in its own block (row-major)."""
    if not array.flags.c_contiguous:
        from accelkit_backends.neuron.sim import replay

        recording = replay.active_program()
        array = np.ascontiguousarray(array) if recording is None else recording.derived(np.ascontiguousarray, array)
    itemsize = array.dtype.itemsize
    flat = array.reshape(-1)
    return np.lib.stride_tricks.as_strided(flat[offset:], tuple(size), tuple(s * itemsize for s in stride))


def _meta(shape: tuple, dtype: torch.dtype, stride: tuple | None = None) -> torch.Tensor:
    if stride is None:
        return torch.empty(shape, dtype=dtype, device="meta")
    return torch.empty_strided(shape, stride, dtype=dtype, device="meta")


def _refs(value: Any) -> Iterator[_Ref]:
    if isinstance(value, _Ref):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _refs(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _refs(v)


def _needed(region: _Region, outputs: list[_Ref]) -> set[int]:
    """The nodes the outputs depend on (the others' results nobody can read)."""
    needed: set[int] = set()
    stack = [r.node for r in outputs]
    while stack:
        i = stack.pop()
        if i not in needed:
            needed.add(i)
            node = region.nodes[i]
            stack.extend(r.node for r in _refs((node.args, node.kwargs)))
    return needed


def _build(region: _Region, outputs: list[_Ref]) -> Any:
    from accelkit_backends.neuron.graph_lowering import RegionProgram

    graph = torch.fx.Graph()
    inputs = []
    for i, array in enumerate(region.inputs):
        node = graph.placeholder(f"input{i}")
        node.meta["val"] = _meta(array.shape, nx.torch_dtype(array.dtype),
                                 tuple(s // array.dtype.itemsize for s in array.strides))
        inputs.append(node)
    floats = []
    for i, value in enumerate(region.floats):
        node = graph.placeholder(f"float{i}")
        node.meta["val"] = value
        floats.append(node)
    made: list[list[torch.fx.Node] | None] = []
    views: dict[tuple, torch.fx.Node] = {}
    needed = _needed(region, outputs)

    def fx(v: Any) -> Any:
        if isinstance(v, _Float):
            return floats[v.i]
        if isinstance(v, _In):
            return inputs[v.i]
        if isinstance(v, _Ref):
            source = made[v.node][v.out]
            if v.view is None:
                return source
            key = v.key()
            if key not in views:
                size, stride, offset = tuple(v.view.size), tuple(v.view.stride), v.view.offset
                node = graph.call_function(_view_of, (source, size, stride, offset))
                node.meta["val"] = _meta(size, v.view.dtype, stride)
                views[key] = node
            return views[key]
        if isinstance(v, (list, tuple)):
            return type(v)(fx(x) for x in v)
        if isinstance(v, dict):
            return {k: fx(x) for k, x in v.items()}
        return v

    for i, node in enumerate(region.nodes):
        if i not in needed:  # its results are read by nothing: never computed
            made.append(None)
            continue
        call = graph.call_function(node.op, fx(node.args), fx(node.kwargs))
        metas = [_meta(d.shape, d.dtype) for d in node.outs]
        if node.multi:
            call.meta["val"] = tuple(metas)
            parts = []
            for j, meta in enumerate(metas):
                part = graph.call_function(operator.getitem, (call, j))
                part.meta["val"] = meta
                parts.append(part)
            made.append(parts)
        else:
            call.meta["val"] = metas[0]
            made.append([call])
    graph.output(tuple(fx(r) for r in outputs))
    module = torch.fx.GraphModule(torch.nn.Module(), graph)
    ops = [n.name.split(".")[0] for n in region.nodes]
    label = f"eager region ({ops[0]} ... {ops[-1]}, {len(ops)} ops)" if len(ops) > 1 else f"eager region ({ops[0]})"
    return RegionProgram(module, [], label)
