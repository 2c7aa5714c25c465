"""The dispatch pipeline: backend kernel → decomposition → CPU fallback → clear error.

Every aten op that reaches PrivateUse1 takes exactly one of these paths:

1. a **native kernel** from the backend's :class:`~accelkit.sdk.KernelTable`, registered
   directly on PrivateUse1 (with in-place and ``out=`` overloads derived from functional ones);
2. a **view**: ops whose result aliases an input only change metadata, so they run through the
   Meta kernel on the device tensor and share its storage;
3. a **decomposition** into smaller ops, which dispatch again;
4. the **CPU fallback**, under the policy ``deny | warn | allow``: arguments are copied to the
   host, the CPU kernel runs, mutated arguments and results are copied back.

Native, decomposed and fallback executions are counted per op (:func:`accelkit.stats`).
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch._C import DispatchKey, DispatchKeySet
from torch._ops import OpOverload

from accelkit._runtime.device import tensors as T
from accelkit._runtime.device.context import BackendContext
from accelkit._runtime.dispatch.fallback import HostCall
from accelkit._runtime.dispatch.out_rules import OutDtypeRule, cast_error
from accelkit._runtime.dispatch.scalar_checks import _plain, checked_arguments, guard_plan
from accelkit._runtime.dispatch.schema import (
    UNDECLARED_WRITES,
    HostOperand,
    fill_generator,
    foreign_host_tensor,
    functional_of,
    generator_slot,
    host_operand_error,
    is_inplace_view_op,
    is_view_op,
    is_write,
    out_arg_names,
    takes_host_operand,
)
from accelkit._runtime.dispatch.specialize import NO_LANE, Lane
from accelkit.sdk._allocator import ViewSpec
from accelkit.sdk._kernels import KernelDeclined
from accelkit.sdk._records import UnsupportedDtypeError

META = T.META
_AUTOCAST = DispatchKeySet(DispatchKey.AutocastPrivateUse1)
_Tensor = torch.Tensor


# ---------------------------------------------------------------------------------------------
# Result checks shared by derived variants and the decomposition path
# ---------------------------------------------------------------------------------------------


def check_inplace(self: _Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """Refuse an in-place result that cannot be stored in ``self``, before anything is written."""
    if tuple(shape) != tuple(self.shape):
        raise RuntimeError(
            f"output with shape {list(self.shape)} doesn't match the broadcast shape {list(shape)}"
        )
    if not torch.can_cast(dtype, self.dtype):
        raise cast_error(dtype, self.dtype)


def _is_broadcast(t: _Tensor) -> bool:
    """True when a stride-0 dimension makes several elements of ``t`` share one location."""
    return any(st == 0 and sz > 1 for sz, st in zip(t.shape, t.stride()))


def writable(self_: _Tensor) -> bool:
    """Whether an in-place kernel may write ``self_``. Several elements of a broadcast
    (expanded) view share one location; whether writing it is allowed depends on the op
    (``fill_``/``zero_`` yes, arithmetic no), so the CPU kernel decides."""
    return not (0 in self_.stride() and _is_broadcast(self_))


def prepare_out(ctx: BackendContext, out: _Tensor, shape: tuple[int, ...]) -> None:
    """Resize an ``out=`` tensor to ``shape`` as PyTorch does (its dtype is checked first, by
    :class:`~accelkit._runtime.dispatch.out_rules.OutDtypeRule`)."""
    if tuple(out.shape) != tuple(shape):
        if out.numel():
            warnings.warn(
                f"An output with one or more elements was resized since it had shape "
                f"{list(out.shape)}, which does not match the required output shape {list(shape)}. "
                "This behavior is deprecated, and in a future PyTorch release outputs will not be "
                "resized unless they have zero elements.",
                UserWarning,
                stacklevel=4,
            )
        T.set_geometry(ctx, out, shape, T.contiguous_strides(shape), out.storage_offset())


def _takes_dtype(functional: OpOverload) -> bool:
    """Whether ``functional`` has a keyword ``dtype`` argument (asked once per derived ``out=``
    overload: its ``out=`` calls then compute in the out tensor's dtype, :func:`_dtype_from_out`)."""
    return any(a.name == "dtype" and a.kwarg_only for a in functional._schema.arguments)


def _dtype_from_out(takes_dtype: bool, kwargs: dict, outs: list[_Tensor]) -> bool:
    """Ops whose functional overload takes a ``dtype`` compute in the ``out=`` tensor's dtype,
    as on CPU, including factories whose ``out=`` overload has none (``arange.start_out``:
    ``arange(3.1, out=int64)`` counts to 3, where a float arange would count to 4); True when
    ``kwargs`` got that dtype (the CPU kernel then has the last word on it)."""
    if takes_dtype and len(outs) == 1 and kwargs.get("dtype") is None:
        kwargs["dtype"] = outs[0].dtype
        return True
    return False


# ---------------------------------------------------------------------------------------------
# The pipeline
# ---------------------------------------------------------------------------------------------


class Pipeline:
    """Installs and runs the dispatch pipeline for one backend (see the module docstring)."""

    def __init__(self, ctx: BackendContext):
        self.ctx = ctx
        self._read = ctx.allocator.read
        self._plans: dict[OpOverload, Callable] = {}
        self._lanes: dict[int, Lane | None] = {}  # id(kernel) -> its lane
        self._decomposing = threading.local()
        self._out_dtypes = OutDtypeRule(ctx.name)

    # -- arrays in, tensors out ------------------------------------------------------------

    def _to_array(self, value: Any, held: list, op: OpOverload) -> Any:
        """A kernel argument of ``op`` as the backend sees it: device tensors as arrays (host
        tensors ``op`` takes are copied over; others raise :class:`HostOperand`), other values
        unchanged.

        Kernels get values, not stored elements: a conjugate or negative view (which reaches
        mm and the like unresolved) is resolved into a temporary, appended to ``held`` so that
        it lives until the kernel returns.
        """
        if isinstance(value, _Tensor):
            # Only device storages carry a payload; asking the storage is much cheaper than
            # building ``value.device``, which is left for the rare tensors that have none.
            payload = getattr(value.untyped_storage(), "payload", None)
            if payload is None and value.device.type != self.ctx.name:
                if not takes_host_operand(op, value):
                    raise HostOperand(value)
                if value._is_zerotensor() or value.is_conj() or value.is_neg():
                    value = T.host_values(value)
                return self.ctx.allocator.from_host(value)
            if value.is_conj() or value.is_neg():
                value = value.resolve_conj().resolve_neg()
                held.append(value)
                payload = T.buffer_of(value)
            elif payload is None:
                payload = T.buffer_of(value)  # raises the clear error
            return self._read(payload.block, ViewSpec.of(value))
        if isinstance(value, (list, tuple)) and value and any(isinstance(v, _Tensor) for v in value):
            return type(value)(self._to_array(v, held, op) if v is not None else None for v in value)
        return value

    def _wrap(self, result: Any) -> Any:
        if isinstance(result, tuple):
            return tuple(self._wrap(r) for r in result)
        if isinstance(result, list):
            return [self._wrap(r) for r in result]
        if result is None or isinstance(result, (bool, int, float, complex)):
            return result
        return T.from_array(self.ctx, result)

    def _meta(self, array: Any) -> tuple[tuple[int, ...], torch.dtype]:
        return self.ctx.allocator.array_meta(array)

    # -- native kernels --------------------------------------------------------------------

    def _call(self, op: OpOverload, fn: Callable, gen: tuple[int, str] | None, args: Any,
              kwargs: dict) -> Any:
        """Call ``op``'s kernel with device tensors as arrays and the device generator filled
        in; PyTorch's mixed-device error for a host tensor ``op`` does not take."""
        to_array, held = self._to_array, []
        try:
            arrays = [to_array(a, held, op) for a in args]
            array_kwargs = {k: to_array(v, held, op) for k, v in kwargs.items()} if kwargs else {}
        except HostOperand as e:
            raise host_operand_error(self.ctx, op, args, kwargs, e.tensor) from None
        if gen is not None:
            fill_generator(self.ctx, gen, op, args, kwargs, arrays, array_kwargs)
        return fn(*arrays, **array_kwargs)

    def _lane(self, op: OpOverload, fn: Callable) -> Lane | None:
        """The prepared-call lane of kernel ``fn`` (:mod:`accelkit._runtime.dispatch.specialize`), shared by the op's
        variants; None when ``fn`` offers none, or when ``op`` takes a generator."""
        if generator_slot(op) is not None:
            return None
        key = id(fn)  # kernels stay alive in the context's table
        if key not in self._lanes:
            self._lanes[key] = Lane.of(self.ctx, fn)
        return self._lanes[key]

    def _caller(self, op: OpOverload, fn: Callable) -> Callable[[tuple, dict], Any]:
        """``call(args, kwargs)``: ``fn``'s result for these arguments, through its lane when
        it has one, otherwise through :meth:`_call`."""
        call, gen, lane = self._call, generator_slot(op), self._lane(op, fn)
        if lane is None:
            return lambda args, kwargs: call(op, fn, gen, args, kwargs)
        planned = lane.arrays

        def call_planned(args: tuple, kwargs: dict) -> Any:
            result = planned(args, kwargs)
            if result is not NO_LANE:
                return result
            return call(op, fn, gen, args, kwargs)

        return call_planned

    def native(self, op: OpOverload, fn: Callable) -> Callable:
        """Wrap a functional backend kernel as a PrivateUse1 kernel for ``op``.

        A kernel that raises :class:`~accelkit.sdk.KernelDeclined` hands these arguments to
        :meth:`_declined`'s choice: the backend's decomposition for declined calls, or the CPU
        fallback (under the fallback policy, counted as a fallback). The derived in-place and
        ``out=`` variants hand them to the CPU fallback.
        """
        ctx, name, call, wrap = self.ctx, str(op), self._call, self._wrap
        declined = self._declined(op)
        gen = generator_slot(op)
        store = _undeclared_writer(ctx, op)  # None for almost every op

        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                result = call(op, fn, gen, args, kwargs)
            except KernelDeclined:
                return declined(*args, **kwargs)
            ctx.counters.count(name, "native")
            if store is not None:
                result = store(args, kwargs, result)
            return wrap(result)

        lane = self._lane(op, fn) if store is None else None
        if lane is None:
            return run
        # ``run`` is the general path: the lane hands it every call it does not cover.
        return lane.front(name, run, declined, wrap)

    def _declined(self, op: OpOverload) -> Callable[..., Any]:
        """``declined(*args, **kwargs)``: where functional ``op``'s kernel sends a call it
        declines — the decomposition the backend named for them
        (:meth:`~accelkit.sdk.KernelTable.decompose_declined`), or else the CPU fallback."""
        decomposition = self.ctx.kernels.declined_decompositions.get(op)
        if decomposition is None:
            return functools.partial(self.cpu_fallback, op)
        return functools.partial(self._decomposed(decomposition), op)

    def install_native_front(self, native: Any, op: OpOverload, fn: Callable, kernel: Callable) -> bool:
        """Make the native extension's C++ front of ``fn``'s lane (``_native/lane.cpp``) the
        PrivateUse1 kernel of functional ``op``, with ``kernel`` (:meth:`native` behind the
        number check) as its Python path; False, leaving ``op`` to the caller, when it does not
        apply: ``op`` has no lane, or an argument that is neither a tensor nor defaulted, or
        checks a number whose default step 1 of the check would not pass, or the process
        has several devices (the front runs on device 0)."""
        if self.ctx.devices is not None or _undeclared_writer(self.ctx, op) is not None:
            return False
        lane = self._lane(op, fn)
        if lane is None:
            return False
        checked = {name for _, name, _ in checked_arguments(op)}
        for argument in op._schema.arguments:
            kind = argument.type
            if isinstance(kind, torch.OptionalType):
                kind = kind.getElementType()
            if isinstance(kind, torch.TensorType):
                if argument.name in checked:
                    return False  # a tensor standing for a number: always checked
                continue
            if not argument.has_default_value():
                return False
            default = argument.default_value
            if default is not None and type(default) not in (bool, int, float, str):
                return False
            if argument.name in checked and not (default is None or _plain(default)):
                return False
        name, wrap, counters = str(op), self._wrap, self.ctx.counters
        count = functools.partial(counters.count, name, "native")  # while counting is paused
        take = native.install_lane_front(
            op._schema.name, op._schema.overload_name, kernel, lane.lookup, count, counters,
            self.ctx.allocator.adopt, wrap, self._declined(op), KernelDeclined,
        )
        counters.add_source(name, "native", take)
        return True

    def _stored(self, self_: _Tensor, result: Any) -> tuple[Any, torch.dtype | None]:
        """``result`` as ``self_`` stores it, and the dtype it was cast to (None: none);
        PyTorch's error when ``self_`` cannot hold it."""
        shape, dtype = self._meta(result)
        check_inplace(self_, shape, dtype)
        if dtype != self_.dtype:
            return self.ctx.allocator.cast(result, self_.dtype), self_.dtype
        return result, None

    def native_inplace(self, op: OpOverload, fn: Callable) -> Callable:
        """Derive ``op`` (an in-place overload) from the functional kernel ``fn``."""
        if op._schema.arguments[0].type.kind() == "ListType":
            return self._native_inplace_list(op, fn)
        ctx, name, call, stored = self.ctx, str(op), self._call, self._stored
        cpu_fallback, gen = self.cpu_fallback, generator_slot(op)
        refuse_host_writes = self._refuse_host_writes

        def run(self_: _Tensor, *args: Any, **kwargs: Any) -> _Tensor:
            refuse_host_writes(op, (self_, *args), kwargs, (self_,))
            if not writable(self_):
                return cpu_fallback(op, self_, *args, **kwargs)
            try:
                result = call(op, fn, gen, (self_, *args), kwargs)
            except KernelDeclined:
                return cpu_fallback(op, self_, *args, **kwargs)
            result = stored(self_, result)[0]
            ctx.counters.count(name, "native")
            T.write_values(ctx, self_, result)
            return self_

        lane = self._lane(op, fn)
        if lane is None:
            return run
        # ``run`` is the general path: the lane hands it every call it does not cover (so
        # ``run`` calls ``fn`` directly: asking the lane again would find no plan either).
        return lane.inplace_front(name, run, functools.partial(cpu_fallback, op), writable, stored)

    def _native_inplace_list(self, op: OpOverload, fn: Callable) -> Callable:
        """Derive ``op``, an in-place overload whose ``self`` is a list of tensors
        (``_foreach_add_``), from the functional kernel ``fn``, which returns one result per
        tensor: every result is checked against its tensor before any is written, so an error
        leaves them all unchanged."""
        arguments = op._schema.arguments
        written = [(i, a.name) for i, a in enumerate(arguments) if is_write(a)]
        if len(written) > 1 and all(arguments[i].type.kind() == "ListType" for i, _ in written):
            return self._native_inplace_lists(op, fn, written)
        ctx, name, call, stored = self.ctx, str(op), self._call, self._stored
        cpu_fallback, gen = self.cpu_fallback, generator_slot(op)

        def run(selves: list[_Tensor], *args: Any, **kwargs: Any) -> None:
            self._refuse_host_writes(op, (selves, *args), kwargs, selves)
            if not all(writable(s) for s in selves):
                return cpu_fallback(op, selves, *args, **kwargs)
            try:
                results = call(op, fn, gen, (selves, *args), kwargs)
            except KernelDeclined:
                return cpu_fallback(op, selves, *args, **kwargs)
            if len(results) != len(selves):
                raise RuntimeError(f"{name}: the kernel returned {len(results)} results for "
                                   f"{len(selves)} tensors")
            results = [stored(s, r)[0] for s, r in zip(selves, results)]
            ctx.counters.count(name, "native")
            for s, r in zip(selves, results):
                T.write_values(ctx, s, r)
            return None

        lane = self._lane(op, fn)
        if lane is None:
            return run
        # ``run`` is the general path: the lane hands it every call it does not cover.
        return lane.inplace_list_front(name, run, functools.partial(cpu_fallback, op), writable, stored)

    def _native_inplace_lists(self, op: OpOverload, fn: Callable, written: list[tuple[int, str]]) -> Callable:
        """``op`` writes several tensor lists (``_fused_adam_``: params, grads, moments), at the
        schema positions ``written``. ``fn`` returns, per written list in that order, the new
        value of each of its tensors, or None for a list the call leaves unchanged. Every new
        value is checked against its tensor before any is written, so an error leaves them all
        unchanged."""
        ctx, name, call, stored = self.ctx, str(op), self._call, self._stored
        cpu_fallback, gen = self.cpu_fallback, generator_slot(op)

        def run(*args: Any, **kwargs: Any) -> None:
            targets = [args[i] if i < len(args) else kwargs.get(n) for i, n in written]
            tensors = [t for tensors in targets for t in (tensors or ())]
            self._refuse_host_writes(op, args, kwargs, tensors)
            if not all(writable(t) for t in tensors):
                return cpu_fallback(op, *args, **kwargs)
            try:
                results = call(op, fn, gen, args, kwargs)
            except KernelDeclined:
                return cpu_fallback(op, *args, **kwargs)
            if len(results) != len(targets):
                raise RuntimeError(f"{name}: the kernel returned {len(results)} lists for "
                                   f"{len(targets)} written arguments")
            stores = []
            for (_, arg), tensors, new in zip(written, targets, results):
                if new is None:
                    continue
                if len(new) != len(tensors):
                    raise RuntimeError(f"{name}: the kernel returned {len(new)} values for the "
                                       f"{len(tensors)} tensors of {arg}")
                stores.extend((t, stored(t, r)[0]) for t, r in zip(tensors, new))
            ctx.counters.count(name, "native")
            for t, r in stores:
                T.write_values(ctx, t, r)
            return None

        return run

    def native_out(self, op: OpOverload, fn: Callable, functional: OpOverload) -> Callable:
        """Derive ``op`` (an ``out=`` overload) from ``fn``, the kernel of ``functional``."""
        ctx, name, call, meta = self.ctx, str(op), self._caller(op, fn), self._meta
        cpu_fallback, check_outs, settle = self.cpu_fallback, self._check_outs, ctx.allocator.settle
        refuse_host_writes = self._refuse_host_writes
        out_names = out_arg_names(op)
        store = _undeclared_writer(ctx, op)
        takes_dtype = _takes_dtype(functional)

        def run(*args: Any, **kwargs: Any) -> Any:
            given = dict(kwargs)
            outs = [kwargs.pop(n) for n in out_names]
            refuse_host_writes(op, args, given, outs)
            if _dtype_from_out(takes_dtype, kwargs, outs):
                check_outs(op, args, given, outs, None)
            try:
                result = call(args, kwargs)
            except KernelDeclined:
                return cpu_fallback(op, *args, **given)
            ctx.counters.count(name, "native")
            if store is not None:
                result = store(args, kwargs, result)
            results = result if isinstance(result, tuple) else (result,)
            settle(results)  # a refused op must leave ``out`` unchanged
            metas = [meta(r) for r in results]
            if any(dtype != out.dtype for out, (_, dtype) in zip(outs, metas)):
                check_outs(op, args, given, outs, [dtype for _, dtype in metas])
            for out, (shape, _) in zip(outs, metas):
                prepare_out(ctx, out, shape)
            for out, r, (_, dtype) in zip(outs, results, metas):
                if dtype != out.dtype:
                    r = ctx.allocator.cast(r, out.dtype)
                if out.numel():
                    T.write_values(ctx, out, r)
            return outs[0] if len(outs) == 1 else tuple(outs)

        return run

    # -- the boxed fallback: view → decomposition → CPU ------------------------------------

    def fallback(self, op: OpOverload, *args: Any, **kwargs: Any) -> Any:
        plan = self._plans.get(op)
        if plan is None:
            plan = self._plan(op)
            if plan != self.cpu_fallback:  # the CPU kernel checks numbers itself
                plan = guard_plan(self.ctx, op, plan)
            self._plans[op] = plan
        return plan(op, *args, **kwargs)

    def _plan(self, op: OpOverload) -> Callable:
        if is_view_op(op) or is_inplace_view_op(op):
            return _run_meta
        if self.ctx.cpu_reason(op) is not None:
            return self.cpu_fallback  # declared CPU by design: no decomposition is tried
        functional, kind = functional_of(op)
        if kind == "out" and functional in self.ctx.decompositions:
            # Preferred over the op's own ``out=`` decomposition: PyTorch wraps some of those
            # in an opmath cast (pw_cast_for_opmath) that casts ``out`` too, so in bfloat16 they
            # write a float32 copy and leave ``out`` unwritten.
            return self._decomposed_out(functional)
        decomposition = self.ctx.decompositions.get(op)
        if decomposition is not None:
            return self._decomposed(decomposition)
        if kind == "inplace" and functional in self.ctx.decompositions:
            return self._decomposed_inplace(functional)
        return self.cpu_fallback

    def _decomposed(self, decomposition: Callable) -> Callable:
        def run(op: OpOverload, *args: Any, **kwargs: Any) -> Any:
            try:
                result = self._decompose(op, decomposition, args, kwargs)
            except UnsupportedDtypeError:
                # The decomposition works in a dtype the device lacks (logspace in float64 for
                # a float32 result): the CPU kernel runs the op instead; a result of that dtype
                # is still refused when it comes back. An out= decomposition writes ``out``
                # last; an op that writes other arguments may have written them.
                outs = out_arg_names(op)
                if any(is_write(a) and a.name not in outs for a in op._schema.arguments):
                    raise
                result = NotImplemented
            if result is NotImplemented:
                return self.cpu_fallback(op, *args, **kwargs)
            self.ctx.counters.count(str(op), "decomposed")
            return result

        return run

    def _decompose(self, op: OpOverload, decomposition: Callable, args: tuple, kwargs: dict) -> Any:
        """``decomposition(*args, **kwargs)``, or NotImplemented when ``op`` is already being
        decomposed on this thread (a decomposition that re-enters its own op).

        A host tensor ``op`` does not take raises here, naming ``op``, rather than in
        whichever of its parts meets it first."""
        self._check_host_operands(op, args, kwargs)
        active = self._active_decompositions()
        if op in active:
            return NotImplemented
        active.add(op)
        try:
            with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST):
                return decomposition(*args, **kwargs)
        finally:
            active.discard(op)

    def _decomposed_out(self, functional: OpOverload) -> Callable:
        """Run an ``out=`` overload as ``functional``'s decomposition, then store the results.

        The decomposition is called directly, not through the dispatcher: the functional
        overload of a structured op (``upsample_nearest1d``) is itself implemented on
        PrivateUse1 as ``empty`` + the ``out=`` overload, which would re-enter this plan. A
        functional op with a device kernel (the backend chose not to derive its ``out=``) is
        dispatched instead, so the kernel runs.
        """
        ctx = self.ctx
        decomposition = ctx.decompositions[functional]
        if torch._C._dispatch_has_kernel_for_dispatch_key(functional.name(), "PrivateUse1"):
            decomposition = functional
        takes_dtype = _takes_dtype(functional)

        def run(op: OpOverload, *args: Any, **kwargs: Any) -> Any:
            given = dict(kwargs)
            names = out_arg_names(op)
            outs = [kwargs.pop(n) for n in names]
            self._refuse_host_writes(op, args, given, outs)
            if _dtype_from_out(takes_dtype, kwargs, outs):
                self._check_outs(op, args, given, outs, None)
            result = self._decompose(op, decomposition, args, kwargs)
            if result is NotImplemented:
                return self.cpu_fallback(op, *args, **given)
            results = result if isinstance(result, tuple) else (result,)
            # A refused op must leave ``out`` unchanged (see DeviceAllocator.settle).
            ctx.allocator.settle([self._to_array(r, [], op) for r in results])
            if any(r.dtype != out.dtype for out, r in zip(outs, results)):
                self._check_outs(op, args, given, outs, [r.dtype for r in results])
            for out, r in zip(outs, results):
                prepare_out(ctx, out, tuple(r.shape))
            for out, r in zip(outs, results):
                out.copy_(r)
            ctx.counters.count(str(op), "decomposed")
            return outs[0] if len(outs) == 1 else tuple(outs)

        return run

    def _decomposed_inplace(self, functional: OpOverload) -> Callable:
        """Run an in-place overload as its functional op, then store the result in ``self``."""

        def run(op: OpOverload, self_: _Tensor, *args: Any, **kwargs: Any) -> Any:
            self._check_host_operands(op, (self_, *args), kwargs)
            result = functional(self_, *args, **kwargs)
            check_inplace(self_, tuple(result.shape), result.dtype)
            self_.copy_(result)
            self.ctx.counters.count(str(op), "decomposed")
            return self_

        return run

    def _refuse_host_writes(self, op: OpOverload, args: tuple, kwargs: dict, written: Any) -> None:
        """PyTorch's mixed-device error when a tensor ``op`` writes (an ``out=`` tensor, an
        in-place ``self``) is a host tensor, before anything runs."""
        for t in written:
            if t is not None and getattr(t.untyped_storage(), "payload", None) is None and (
                t.device.type != self.ctx.name
            ):
                raise host_operand_error(self.ctx, op, args, kwargs, t)

    def _check_outs(self, op: OpOverload, args: tuple, given: dict, outs: list[_Tensor],
                    results: list[torch.dtype] | None) -> None:
        """PyTorch's error when ``op`` refuses ``outs``, whose dtypes are not those of its
        ``results`` (None: the result is to be computed in the out dtype, for an op with a
        ``dtype`` argument, checked before the kernel runs); ``given`` are the caller's
        keyword arguments."""
        names = out_arg_names(op)
        kwargs = {k: v for k, v in given.items() if k not in names}
        self._out_dtypes.check(op, args, kwargs, outs, [o.dtype for o in outs] if results is None else results)

    def _check_host_operands(self, op: OpOverload, args: tuple, kwargs: dict) -> None:
        """PyTorch's mixed-device error when ``op``'s arguments hold a host tensor it does not
        take (native kernels find them while converting their arguments)."""
        host = foreign_host_tensor(self.ctx, op, args, kwargs)
        if host is not None:
            raise host_operand_error(self.ctx, op, args, kwargs, host)

    def _active_decompositions(self) -> set:
        active = getattr(self._decomposing, "ops", None)
        if active is None:
            active = self._decomposing.ops = set()
        return active

    # -- CPU fallback ----------------------------------------------------------------------

    def cpu_fallback(self, op: OpOverload, *args: Any, **kwargs: Any) -> Any:
        """Run ``op`` on the CPU with host copies of the device arguments, then copy back."""
        ctx = self.ctx
        self._check_host_operands(op, args, kwargs)
        if ctx.admit_fallback(op):
            ctx.counters.count(str(op), "fallback")
        return HostCall(ctx, op).run(args, kwargs)


def _run_meta(op: OpOverload, *args: Any, **kwargs: Any) -> Any:
    return op.redispatch(META, *args, **kwargs)


def _undeclared_writer(ctx: BackendContext, op: OpOverload) -> Callable | None:
    """For an op in :data:`UNDECLARED_WRITES`, a function ``(args, kwargs, kernel result) ->
    op's results`` that stores the new argument values the kernel returned after the op's
    results into those (device tensor) arguments; None for every other op."""
    names = UNDECLARED_WRITES.get(op)
    if not names:
        return None
    position = {a.name: i for i, a in enumerate(op._schema.arguments)}
    slots = [(position[n], n) for n in names]
    count = len(slots)

    def store(args: Any, kwargs: dict, result: Any) -> Any:
        for (index, name), new in zip(slots, result[-count:]):
            target = args[index] if index < len(args) else kwargs.get(name)
            if new is None or target is None:
                continue
            if ctx.allocator.array_meta(new)[1] != target.dtype:
                new = ctx.allocator.cast(new, target.dtype)
            T.write(ctx, target, new)
        return tuple(result[:-count])

    return store
