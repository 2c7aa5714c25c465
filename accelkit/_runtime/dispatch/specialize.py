"""Specialised calls: a native kernel prepared once per call layout, then run with only what
changes between calls.

Most calls of an op repeat the same layout: the same tensor geometries and dtypes, the same
static arguments. A kernel that offers ``specialize`` (see :class:`accelkit.sdk.KernelEntry`)
is asked once per layout for a *plan*; every later call with that layout hands the plan only
the device blocks and the Python numbers. That skips the per-argument conversion to arrays and
whatever the kernel can do ahead (for the tpu backend: encoding the arguments and finding the
compiled program), and the inspection of its result: the result's shape and dtype, once
checked (against the dtype rules for a functional op; against ``self`` for an in-place
variant), are those of every later call.

Lists of device tensors (``_foreach_*``, ``cat``) are covered for kernels that say they take
them (``specializes_tensor_lists``): the layout has a tuple of their view specs.

Calls this lane does not cover take the general path unchanged: host tensors, conjugate or
negative views, lists of anything but ints (or device tensors, above), and any layout the
kernel declines to specialise (in place, also a broadcast ``self``). Ops that take a
generator, or write arguments their schema does not declare (``UNDECLARED_WRITES``), never
use it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from accelkit._runtime.device import tensors as T
from accelkit._runtime.device.context import BackendContext
from accelkit.sdk._allocator import ViewSpec
from accelkit.sdk._kernels import CallLayout, KernelDeclined

#: Returned by a lane for a call it does not cover: the caller takes the general path.
NO_LANE = object()

_PLANS_PER_KERNEL = 4096  # layouts kept per kernel; beyond it the cache starts afresh

_Tensor = torch.Tensor
#: Arguments that are part of the layout by value (checked by exact type).
_STATIC = frozenset({int, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                     torch.memory_format})
_NOT_TENSORS = _STATIC | {float, complex, list}
#: Ends the items of a key whose call has keyword arguments; their names follow it.
_KEYWORDS = object()
#: Starts a list of tensors in a key: their number follows, then four items per tensor.
_TENSORS = object()


#: A plan's ``stores`` when the layout's first argument is a broadcast view: in place, that
#: layout always takes the general path.
_NOT_IN_PLACE = object()


class _Plan:
    """A kernel's plan for one layout, and what is known after its first call: what its
    single-array result looks like as a new tensor (None for other results), and how it is
    stored into the first argument by the op's in-place variant."""

    __slots__ = ("run", "result", "stores")

    def __init__(self, run: Callable[[list, list], Any] | None):
        self.run = run  # None: the kernel declined the layout
        self.result: tuple[type, tuple[int, ...], torch.dtype] | None = None  # contiguous
        self.stores: tuple[ViewSpec, torch.dtype | None] | object | None = None


def _layout(key: tuple) -> CallLayout:
    """The :class:`~accelkit.sdk.CallLayout` a kernel's ``specialize`` receives, from a lane's
    flat cache key.

    In the key a tensor is four items (a dtype *instance* first), a number its type, a
    static value a (type, value) pair (a type first, never a dtype instance), and a list of
    tensors :data:`_TENSORS`, their number and four items each (a tuple of view specs in the
    layout). A call with keyword arguments ends with :data:`_KEYWORDS` and the tuple of their
    names; their values are the last items.
    """
    items, i, end, names = [], 0, len(key), ()
    while i < end:
        item = key[i]
        if type(item) is torch.dtype:
            items.append(ViewSpec(*key[i:i + 4]))
            i += 4
        elif item is float or item is complex:
            items.append(item)
            i += 1
        elif item is _KEYWORDS:
            names = key[i + 1]
            break
        elif item is _TENSORS:
            count = key[i + 1]
            items.append(tuple(ViewSpec(*key[j:j + 4]) for j in range(i + 2, i + 2 + 4 * count, 4)))
            i += 2 + 4 * count
        else:
            items.append(key[i + 1])
            i += 2
    positional = len(items) - len(names)
    return CallLayout(tuple(items[:positional]), tuple(zip(names, items[positional:])))


class Lane:
    """Prepared calls of one kernel (one per kernel object, shared by the op's variants)."""

    def __init__(self, ctx: BackendContext, specialize: Callable, tensor_lists: bool = False):
        self._ctx = ctx
        self._specialize = specialize
        self._tensor_lists = tensor_lists
        self._plans: dict[tuple, _Plan] = {}

    @classmethod
    def of(cls, ctx: BackendContext, fn: Callable) -> Lane | None:
        """The lane for kernel ``fn``, or None when it offers no ``specialize``; lists of
        device tensors are covered when ``fn.specializes_tensor_lists`` is true."""
        specialize = getattr(fn, "specialize", None)
        if specialize is None:
            return None
        return cls(ctx, specialize, bool(getattr(fn, "specializes_tensor_lists", False)))

    def _prepare(self, args: tuple, kwargs: dict) -> tuple[_Plan, list, list] | None:
        """The plan for these arguments, with their blocks and numbers; None when the call is
        not covered."""
        key: list = []
        blocks: list = []
        numbers: list = []
        for a in (*args, *kwargs.values()) if kwargs else args:
            kind = type(a)
            if kind is _Tensor or (kind not in _NOT_TENSORS and isinstance(a, _Tensor)):
                payload = getattr(a.untyped_storage(), "payload", None)
                if payload is None or a.is_neg() or a.is_conj():
                    return None
                key.extend((a.dtype, a.shape, a.stride(), a.storage_offset()))
                blocks.append(payload.block)
            elif kind is float or kind is complex:
                key.append(kind)
                numbers.append(a)
            elif kind in _STATIC:
                key.append(kind)  # with the type: True == 1 and both hash alike
                key.append(a)
            elif kind is list:
                if a and type(a[0]) is not int:
                    if not self._tensor_lists:
                        return None
                    key.append(_TENSORS)
                    key.append(len(a))
                    for t in a:
                        if type(t) is not _Tensor and not isinstance(t, _Tensor):
                            return None
                        payload = getattr(t.untyped_storage(), "payload", None)
                        if payload is None or t.is_neg() or t.is_conj():
                            return None
                        key.extend((t.dtype, t.shape, t.stride(), t.storage_offset()))
                        blocks.append(payload.block)
                    continue
                for v in a:
                    if type(v) is not int:
                        return None
                key.append(list)
                key.append(tuple(a))
            else:
                return None
        if kwargs:
            key.append(_KEYWORDS)
            key.append(tuple(kwargs))
        key = tuple(key)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= _PLANS_PER_KERNEL:
                self._plans.clear()
            plan = self._plans[key] = _Plan(self._specialize(_layout(key), self._ctx.allocator))
        if plan.run is None:
            return None
        return plan, blocks, numbers

    def lookup(self, args: tuple, kwargs: dict) -> tuple[_Plan, list] | None:
        """The plan for these arguments and the numbers it is handed, or None when the call is
        not covered: how the native front (``_native/lane.cpp``) asks for a layout it meets
        for the first time (later calls of the layout it keys and runs itself)."""
        prepared = self._prepare(args, kwargs)
        if prepared is None:
            return None
        plan, _, numbers = prepared
        return plan, numbers

    def arrays(self, args: tuple, kwargs: dict) -> Any:
        """The kernel's result for these arguments, or :data:`NO_LANE`."""
        prepared = self._prepare(args, kwargs)
        if prepared is None:
            return NO_LANE
        plan, blocks, numbers = prepared
        return plan.run(blocks, numbers)

    def front(
        self, name: str, general: Callable[..., Any], declined: Callable[..., Any],
        wrap: Callable[[Any], Any],
    ) -> Callable[..., Any]:
        """The PrivateUse1 kernel of functional op ``name``: calls the lane covers run here
        and are counted native; every other call goes to ``general(*args, **kwargs)``, and a
        plan raising :class:`~accelkit.sdk.KernelDeclined` to ``declined(*args, **kwargs)``. ``wrap``
        turns a result into tensors the first time a layout runs, and for results other than
        one array (later single arrays are adopted directly: their shape and dtype, already
        checked, are the first call's)."""
        prepare, count, adopt = self._prepare, self._ctx.counters.count, self._ctx.allocator.adopt
        adopted_tensor = T.adopted_tensor

        def run(*args: Any, **kwargs: Any) -> Any:
            prepared = prepare(args, kwargs)
            if prepared is None:
                return general(*args, **kwargs)
            plan, blocks, numbers = prepared
            try:
                out = plan.run(blocks, numbers)
            except KernelDeclined:
                return declined(*args, **kwargs)
            count(name, "native")
            known = plan.result
            if known is not None and type(out) is known[0]:
                payload = adopt(out)
                if payload is not None:
                    return adopted_tensor(payload, known[1], known[2])
            result = wrap(out)
            if known is None and type(result) is _Tensor:  # one array, through the dtype check
                plan.result = (type(out), tuple(result.shape), result.dtype)
            return result

        return run

    def inplace_front(
        self, name: str, general: Callable[..., Any], declined: Callable[..., Any],
        writable: Callable[[torch.Tensor], bool],
        stored: Callable[[torch.Tensor, Any], tuple[Any, torch.dtype | None]],
    ) -> Callable[..., Any]:
        """The PrivateUse1 kernel of in-place op ``name``, derived from the lane's functional
        kernel: the result of ``self`` and the other arguments is written into ``self``.

        A layout whose ``self`` is not ``writable(self)`` (a broadcast view) always takes the
        general path. The first call of every other layout hands the result to
        ``stored(self, result)``, which raises PyTorch's error when ``self`` cannot hold it
        and otherwise returns it as ``self`` stores it, with the dtype it was cast to (None:
        no cast). Later calls of the layout have the same result shape and dtype: they cast
        as the first did and write into ``self``'s block directly. Uncovered calls go to
        ``general(self, *args, **kwargs)``, and a declining plan's to ``declined(self,
        *args, **kwargs)``.
        """
        prepare, count = self._prepare, self._ctx.counters.count
        write, cast = self._ctx.allocator.write, self._ctx.allocator.cast

        def run(self_: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            prepared = prepare((self_, *args), kwargs)
            if prepared is None:
                return general(self_, *args, **kwargs)
            plan, blocks, numbers = prepared
            stores = plan.stores
            if stores is None and not writable(self_):
                stores = plan.stores = _NOT_IN_PLACE
            if stores is _NOT_IN_PLACE:
                return general(self_, *args, **kwargs)
            try:
                out = plan.run(blocks, numbers)
            except KernelDeclined:
                return declined(self_, *args, **kwargs)
            if stores is None:
                out, cast_to = stored(self_, out)
                stores = plan.stores = (ViewSpec.of(self_), cast_to)
            elif stores[1] is not None:
                out = cast(out, stores[1])
            count(name, "native")
            write(blocks[0], stores[0], out)
            return self_

        return run

    def inplace_list_front(
        self, name: str, general: Callable[..., Any], declined: Callable[..., Any],
        writable: Callable[[torch.Tensor], bool],
        stored: Callable[[torch.Tensor, Any], tuple[Any, torch.dtype | None]],
    ) -> Callable[..., Any]:
        """Like :meth:`inplace_front`, for in-place op ``name`` whose ``self`` is a list of
        tensors (``_foreach_add_``): the kernel returns one result per tensor, written into
        each. The first call of a layout hands every result to ``stored`` before anything is
        written (an error leaves them all unchanged); later calls cast as it did and write
        into the tensors' blocks directly. A layout with a broadcast tensor in ``self`` always
        takes the general path, as do an empty ``self`` and every call the lane does not cover.
        """
        prepare, count = self._prepare, self._ctx.counters.count
        write, cast = self._ctx.allocator.write, self._ctx.allocator.cast

        def run(selves: list, *args: Any, **kwargs: Any) -> None:
            prepared = prepare((selves, *args), kwargs) if selves else None
            if prepared is None:
                return general(selves, *args, **kwargs)
            plan, blocks, numbers = prepared
            stores = plan.stores
            if stores is None and not all(writable(s) for s in selves):
                stores = plan.stores = _NOT_IN_PLACE
            if stores is _NOT_IN_PLACE:
                return general(selves, *args, **kwargs)
            try:
                results = plan.run(blocks, numbers)
            except KernelDeclined:
                return declined(selves, *args, **kwargs)
            if stores is None:
                if len(results) != len(selves):
                    raise RuntimeError(f"{name}: the kernel returned {len(results)} results for "
                                       f"{len(selves)} tensors")
                checked = [stored(s, r) for s, r in zip(selves, results)]
                results = [r for r, _ in checked]
                stores = plan.stores = tuple((ViewSpec.of(s), cast_to) for s, (_, cast_to) in zip(selves, checked))
            else:
                results = [r if cast_to is None else cast(r, cast_to) for r, (_, cast_to) in zip(results, stores)]
            count(name, "native")
            for block, (spec, _), r in zip(blocks, stores, results):  # ``self``'s blocks come first
                write(block, spec, r)
            return None

        return run
