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

from accelkit._runtime import _tensors as T
from accelkit._runtime._specialize import NO_LANE, Lane
from accelkit.sdk._allocator import ViewSpec
from accelkit.sdk._kernels import KernelDeclined
from accelkit._runtime._context import BackendContext

META = T.META
_AUTOCAST = DispatchKeySet(DispatchKey.AutocastPrivateUse1)
_Tensor = torch.Tensor


# ---------------------------------------------------------------------------------------------
# Schema helpers
# ---------------------------------------------------------------------------------------------


def _is_write(arg: Any) -> bool:
    return arg.alias_info is not None and arg.alias_info.is_write


def is_view_op(op: OpOverload) -> bool:
    """True for ops whose results alias an input without writing to it (pure metadata)."""
    returns = op._schema.returns
    return bool(returns) and any(
        r.alias_info is not None and not r.alias_info.is_write for r in returns
    )


def is_inplace_view_op(op: OpOverload) -> bool:
    return torch.Tag.inplace_view in op.tags


def is_inplace_op(op: OpOverload) -> bool:
    """True for ops that write their first argument (``normal_``), not counting ``out=`` ops.

    A backend kernel registered for such an op is still functional: it returns the new value of
    ``self`` and the runtime stores it (:meth:`Pipeline.native_inplace`). This is how in-place
    ops without a functional counterpart (``normal_``, ``bernoulli_.float``) run natively.
    """
    arguments = op._schema.arguments
    return bool(arguments) and _is_write(arguments[0]) and not out_arg_names(op)


def out_arg_names(op: OpOverload) -> list[str]:
    return [a.name for a in op._schema.arguments if a.kwarg_only and _is_write(a)]


#: What a factory's functional overload takes where its ``out=`` overload takes ``out``
#: (``arange.start_step`` and ``arange.start_out``).
_TENSOR_OPTIONS = frozenset({"dtype", "layout", "device", "pin_memory"})


def _signature(op: OpOverload, skip_out: bool, skip_options: bool = False) -> list[tuple[str, str]]:
    return [
        (a.name, str(a.type))
        for a in op._schema.arguments
        if not (skip_out and a.kwarg_only and _is_write(a))
        and not (skip_options and a.kwarg_only and a.name in _TENSOR_OPTIONS)
    ]


def variants_of(functional: OpOverload) -> tuple[OpOverload | None, OpOverload | None]:
    """The in-place and ``out=`` overloads computing the same thing as ``functional``."""
    name = functional._schema.name.split("::")[1]
    overload = functional._overloadname
    inplace = None
    packet = getattr(torch.ops.aten, name + "_", None)
    if packet is not None and overload in packet.overloads():
        candidate = getattr(packet, overload)
        if _signature(candidate, False)[1:] == _signature(functional, False)[1:]:
            inplace = candidate
    out = None
    want = _signature(functional, False, skip_options=True)
    packet = getattr(torch.ops.aten, name)
    for other in packet.overloads():
        candidate = getattr(packet, other)
        if out_arg_names(candidate) and _signature(candidate, True, skip_options=True) == want:
            out = candidate
            break
    return inplace, out


def functional_of(op: OpOverload) -> tuple[OpOverload | None, str]:
    """For an in-place or ``out=`` overload, its functional overload and the variant kind."""
    name = op._schema.name.split("::")[1]
    if out_arg_names(op):
        want = _signature(op, True)
        packet = getattr(torch.ops.aten, name)
        for other in packet.overloads():
            candidate = getattr(packet, other)
            if not out_arg_names(candidate) and _signature(candidate, False) == want:
                return candidate, "out"
        return None, ""
    if name.endswith("_") and op._schema.arguments and _is_write(op._schema.arguments[0]):
        packet = getattr(torch.ops.aten, name[:-1], None)
        if packet is not None and op._overloadname in packet.overloads():
            return getattr(packet, op._overloadname), "inplace"
    return None, ""


def _generator_slot(op: OpOverload) -> tuple[int, str] | None:
    for i, a in enumerate(op._schema.arguments):
        if "Generator" in str(a.type):
            return i, a.name
    return None


# ---------------------------------------------------------------------------------------------
# Result checks shared by derived variants and the decomposition path
# ---------------------------------------------------------------------------------------------


@functools.cache
def _type_name(dtype: torch.dtype) -> str:
    """PyTorch's name for a dtype in error messages (``Float``, ``Long``, ``BFloat16``)."""
    return torch.empty(0, dtype=dtype).type().removeprefix("torch.").removesuffix("Tensor")


def check_inplace(self: _Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """Refuse an in-place result that cannot be stored in ``self``, before anything is written."""
    if tuple(shape) != tuple(self.shape):
        raise RuntimeError(
            f"output with shape {list(self.shape)} doesn't match the broadcast shape {list(shape)}"
        )
    if not torch.can_cast(dtype, self.dtype):
        raise RuntimeError(
            f"result type {_type_name(dtype)} can't be cast to the desired output type "
            f"{_type_name(self.dtype)}"
        )


def _is_broadcast(t: _Tensor) -> bool:
    """True when a stride-0 dimension makes several elements of ``t`` share one location."""
    return any(st == 0 and sz > 1 for sz, st in zip(t.shape, t.stride()))


def prepare_out(ctx: BackendContext, out: _Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """Resize an ``out=`` tensor to ``shape`` as PyTorch does, and check the dtype cast."""
    if not torch.can_cast(dtype, out.dtype):
        raise RuntimeError(
            f"result type {_type_name(dtype)} can't be cast to the desired output type "
            f"{_type_name(out.dtype)}"
        )
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


def _as_meta(value: Any) -> Any:
    if isinstance(value, _Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_as_meta(v) for v in value)
    return value


def check_out_dtypes(
    op: OpOverload, args: tuple, kwargs: dict, outs: list[_Tensor], dtypes: list[torch.dtype]
) -> None:
    """Apply ``op``'s own rule for ``out=`` tensors of another dtype than the result.

    No op may narrow a result's dtype category. Beyond that the rule differs per op (``exp``
    casts, ``mm`` and ``where`` refuse), so the op's Meta kernel — which runs the checks the
    CPU kernel runs — decides, raising PyTorch's error.
    """
    for out, dtype in zip(outs, dtypes):
        if not torch.can_cast(dtype, out.dtype):
            raise RuntimeError(
                f"result type {_type_name(dtype)} can't be cast to the desired output type "
                f"{_type_name(out.dtype)}"
            )
    meta_kwargs = {k: _as_meta(v) for k, v in kwargs.items()}
    meta_kwargs.update(zip(out_arg_names(op), (_as_meta(o) for o in outs)))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            op(*[_as_meta(a) for a in args], **meta_kwargs)
    except NotImplementedError:
        pass  # no Meta kernel: keep the generic cast rule


def _dtype_from_out(functional_or_out: OpOverload, kwargs: dict, outs: list[_Tensor]) -> None:
    """Ops with a ``dtype`` argument compute in the ``out=`` tensor's dtype, as on CPU."""
    if len(outs) == 1 and kwargs.get("dtype") is None and any(
        a.name == "dtype" and a.kwarg_only for a in functional_or_out._schema.arguments
    ):
        kwargs["dtype"] = outs[0].dtype


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

    # -- arrays in, tensors out ------------------------------------------------------------

    def _to_array(self, value: Any, held: list) -> Any:
        """A kernel argument as the backend sees it: device tensors as arrays (host tensors are
        copied over), other values unchanged.

        Kernels get values, not stored elements: a conjugate or negative view (which reaches
        mm and the like unresolved) is resolved into a temporary, appended to ``held`` so that
        it lives until the kernel returns.
        """
        if isinstance(value, _Tensor):
            # Only device storages carry a payload; asking the storage is much cheaper than
            # building ``value.device``, which is left for the rare tensors that have none.
            payload = getattr(value.untyped_storage(), "payload", None)
            if payload is None and value.device.type != self.ctx.name:
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
            return type(value)(self._to_array(v, held) if v is not None else None for v in value)
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

    def _call(self, fn: Callable, gen: tuple[int, str] | None, args: Any, kwargs: dict) -> Any:
        """Call a kernel with device tensors as arrays and the device generator filled in."""
        to_array, held = self._to_array, []
        arrays = [to_array(a, held) for a in args]
        array_kwargs = {k: to_array(v, held) for k, v in kwargs.items()} if kwargs else {}
        if gen is not None:
            _fill_generator(self.ctx, gen, arrays, array_kwargs)
        return fn(*arrays, **array_kwargs)

    def _lane(self, op: OpOverload, fn: Callable) -> Lane | None:
        """The prepared-call lane of kernel ``fn`` (:mod:`._specialize`), shared by the op's
        variants; None when ``fn`` offers none, or when ``op`` takes a generator."""
        if _generator_slot(op) is not None:
            return None
        key = id(fn)  # kernels stay alive in the context's table
        if key not in self._lanes:
            self._lanes[key] = Lane.of(self.ctx, fn)
        return self._lanes[key]

    def _caller(self, op: OpOverload, fn: Callable) -> Callable[[tuple, dict], Any]:
        """``call(args, kwargs)``: ``fn``'s result for these arguments, through its lane when
        it has one, otherwise through :meth:`_call`."""
        call, gen, lane = self._call, _generator_slot(op), self._lane(op, fn)
        if lane is None:
            return lambda args, kwargs: call(fn, gen, args, kwargs)
        planned = lane.arrays

        def call_planned(args: tuple, kwargs: dict) -> Any:
            if not kwargs:
                result = planned(args)
                if result is not NO_LANE:
                    return result
            return call(fn, gen, args, kwargs)

        return call_planned

    def native(self, op: OpOverload, fn: Callable) -> Callable:
        """Wrap a functional backend kernel as a PrivateUse1 kernel for ``op``.

        A kernel that raises :class:`~accelkit.sdk.KernelDeclined` hands these arguments to the
        CPU fallback (under the fallback policy, counted as a fallback), as do the derived
        in-place and ``out=`` variants.
        """
        ctx, name, call, wrap = self.ctx, str(op), self._caller(op, fn), self._wrap
        cpu_fallback = self.cpu_fallback
        store = _undeclared_writer(ctx, op)  # None for almost every op
        lane = self._lane(op, fn) if store is None else None
        planned = lane.tensors if lane is not None else None
        count = ctx.counters.count

        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                if planned is not None and not kwargs:
                    # The common case: the lane makes the result tensors too.
                    result = planned(args, wrap)
                    if result is not NO_LANE:
                        count(name, "native")
                        return result
                result = call(args, kwargs)
            except KernelDeclined:
                return cpu_fallback(op, *args, **kwargs)
            count(name, "native")
            if store is not None:
                result = store(args, kwargs, result)
            return wrap(result)

        return run

    def native_inplace(self, op: OpOverload, fn: Callable) -> Callable:
        """Derive ``op`` (an in-place overload) from the functional kernel ``fn``."""
        ctx, name, call, meta = self.ctx, str(op), self._caller(op, fn), self._meta
        cpu_fallback = self.cpu_fallback

        def run(self_: _Tensor, *args: Any, **kwargs: Any) -> _Tensor:
            if 0 in self_.stride() and _is_broadcast(self_):
                # Several elements share one location (an expanded view). Whether writing it is
                # allowed depends on the op (fill_/zero_ yes, arithmetic no): the CPU kernel decides.
                return cpu_fallback(op, self_, *args, **kwargs)
            try:
                result = call((self_, *args), kwargs)
            except KernelDeclined:
                return cpu_fallback(op, self_, *args, **kwargs)
            ctx.counters.count(name, "native")
            shape, dtype = meta(result)
            check_inplace(self_, shape, dtype)
            if dtype != self_.dtype:
                result = ctx.allocator.cast(result, self_.dtype)
            T.write_values(ctx, self_, result)
            return self_

        return run

    def native_out(self, op: OpOverload, fn: Callable) -> Callable:
        """Derive ``op`` (an ``out=`` overload) from the functional kernel ``fn``."""
        ctx, name, call, meta = self.ctx, str(op), self._caller(op, fn), self._meta
        cpu_fallback = self.cpu_fallback
        out_names = out_arg_names(op)
        store = _undeclared_writer(ctx, op)

        def run(*args: Any, **kwargs: Any) -> Any:
            given = dict(kwargs)
            outs = [kwargs.pop(n) for n in out_names]
            _dtype_from_out(op, kwargs, outs)
            try:
                result = call(args, kwargs)
            except KernelDeclined:
                return cpu_fallback(op, *args, **given)
            ctx.counters.count(name, "native")
            if store is not None:
                result = store(args, kwargs, result)
            results = result if isinstance(result, tuple) else (result,)
            metas = [meta(r) for r in results]
            if any(dtype != out.dtype for out, (_, dtype) in zip(outs, metas)):
                check_out_dtypes(op, args, kwargs, outs, [dtype for _, dtype in metas])
            for out, (shape, dtype) in zip(outs, metas):
                prepare_out(ctx, out, shape, dtype)
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
            plan = self._plans[op] = self._plan(op)
        return plan(op, *args, **kwargs)

    def _plan(self, op: OpOverload) -> Callable:
        if is_view_op(op) or is_inplace_view_op(op):
            return _run_meta
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
            result = self._decompose(op, decomposition, args, kwargs)
            if result is NotImplemented:
                return self.cpu_fallback(op, *args, **kwargs)
            self.ctx.counters.count(str(op), "decomposed")
            return result

        return run

    def _decompose(self, op: OpOverload, decomposition: Callable, args: tuple, kwargs: dict) -> Any:
        """``decomposition(*args, **kwargs)``, or NotImplemented when ``op`` is already being
        decomposed on this thread (a decomposition that re-enters its own op)."""
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

        def run(op: OpOverload, *args: Any, **kwargs: Any) -> Any:
            names = out_arg_names(op)
            outs = [kwargs.pop(n) for n in names]
            _dtype_from_out(op, kwargs, outs)
            result = self._decompose(op, decomposition, args, kwargs)
            if result is NotImplemented:
                kwargs.update(zip(names, outs))
                return self.cpu_fallback(op, *args, **kwargs)
            results = result if isinstance(result, tuple) else (result,)
            if any(r.dtype != out.dtype for out, r in zip(outs, results)):
                check_out_dtypes(op, args, kwargs, outs, [r.dtype for r in results])
            for out, r in zip(outs, results):
                prepare_out(ctx, out, tuple(r.shape), r.dtype)
            for out, r in zip(outs, results):
                out.copy_(r)
            ctx.counters.count(str(op), "decomposed")
            return outs[0] if len(outs) == 1 else tuple(outs)

        return run

    def _decomposed_inplace(self, functional: OpOverload) -> Callable:
        """Run an in-place overload as its functional op, then store the result in ``self``."""

        def run(op: OpOverload, self_: _Tensor, *args: Any, **kwargs: Any) -> Any:
            result = functional(self_, *args, **kwargs)
            check_inplace(self_, tuple(result.shape), result.dtype)
            self_.copy_(result)
            self.ctx.counters.count(str(op), "decomposed")
            return self_

        return run

    def _active_decompositions(self) -> set:
        active = getattr(self._decomposing, "ops", None)
        if active is None:
            active = self._decomposing.ops = set()
        return active

    # -- CPU fallback ----------------------------------------------------------------------

    def cpu_fallback(self, op: OpOverload, *args: Any, **kwargs: Any) -> Any:
        """Run ``op`` on the CPU with host copies of the device arguments, then copy back."""
        ctx = self.ctx
        if ctx.admit_fallback(op):
            ctx.counters.count(str(op), "fallback")
        return _HostCall(ctx, op).run(args, kwargs)


def _run_meta(op: OpOverload, *args: Any, **kwargs: Any) -> Any:
    return op.redispatch(META, *args, **kwargs)


def _fill_generator(ctx: BackendContext, slot: tuple[int, str], args: list, kwargs: dict) -> None:
    index, name = slot
    if index < len(args):
        if args[index] is None:
            args[index] = ctx.generator
    elif kwargs.get(name) is None:
        kwargs[name] = ctx.generator


def _on_device_stream(ctx: BackendContext, kernel: Callable, args: list, kwargs: dict) -> Any:
    """Run a random CPU kernel whose schema takes no generator (``native_dropout``) on the
    device's stream: it draws from the CPU default generator, so lend it the device state."""
    cpu = torch.default_generator
    saved = cpu.get_state()
    cpu.set_state(ctx.generator.get_state())
    try:
        result = kernel(*args, **kwargs)
        ctx.generator.set_state(cpu.get_state())
    finally:
        cpu.set_state(saved)
    return result


# ---------------------------------------------------------------------------------------------
# One CPU-fallback call
# ---------------------------------------------------------------------------------------------


def _category(dtype: torch.dtype) -> int:
    if dtype == torch.bool:
        return 0
    if dtype.is_complex:
        return 3
    if dtype.is_floating_point:
        return 2
    return 1


def _scalar_dtype(value: Any, tensors: list[_Tensor]) -> torch.dtype:
    """A dtype for a Python number standing where the schema wants a Tensor.

    PyTorch wraps such numbers as "wrapped numbers", which never widen the dtype of the tensors
    beside them. A 0-d tensor of the widest same-category dtype present behaves the same.
    """
    if isinstance(value, bool):
        own = torch.bool
    elif isinstance(value, int):
        own = torch.int64
    elif isinstance(value, float):
        own = torch.get_default_dtype()
    else:
        own = torch.complex64 if torch.get_default_dtype() == torch.float32 else torch.complex128
    same = [t.dtype for t in tensors if _category(t.dtype) == _category(own)]
    if same:
        return max(same, key=lambda d: d.itemsize)
    return own


def _convolution_backward_on_cpu(grad, input, weight, stride, padding, dilation, transposed,
                                 output_padding, groups, output_mask):
    bias_sizes = [weight.shape[1] * groups if transposed else weight.shape[0]]
    return torch.ops.aten.convolution_backward.default(
        grad, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding,
        groups, output_mask,
    )


#: Ops that exist only as device hooks (no CPU kernel), and the CPU op computing the same thing.
CPU_EQUIVALENTS: dict[OpOverload, Callable] = {
    torch.ops.aten.convolution_overrideable.default: torch.ops.aten.convolution.default,
    torch.ops.aten.convolution_backward_overrideable.default: _convolution_backward_on_cpu,
}

#: Ops that write to arguments their schema does not mark as mutable: batch norm updates its
#: running statistics in place although they are declared ``Tensor?``.
#: A native kernel for such an op cannot write (it is functional): it returns the op's results
#: followed by the new values of these arguments, in this order (None leaves one unchanged), and
#: the runtime stores them (:func:`_undeclared_writer`).
UNDECLARED_WRITES: dict[OpOverload, tuple[str, ...]] = {
    torch.ops.aten.native_batch_norm.default: ("running_mean", "running_var"),
    torch.ops.aten.native_batch_norm.out: ("running_mean", "running_var"),
}


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


class _HostCall:
    """Copies device arguments to the host (one copy per storage, so aliasing is kept), runs
    the CPU kernel, writes mutated storages back and brings results to the device."""

    def __init__(self, ctx: BackendContext, op: OpOverload):
        self.ctx = ctx
        self.op = op
        self.hosts: dict[int, tuple[Any, torch.Tensor]] = {}  # id(buffer) -> (buffer, host bytes)
        self.twins: list[tuple[_Tensor, _Tensor]] = []  # (device tensor, host view)

    def _host(self, t: _Tensor) -> _Tensor:
        buf = T.buffer_of(t)
        entry = self.hosts.get(id(buf))
        if entry is None:
            nbytes = t.untyped_storage().nbytes()
            entry = (buf, self.ctx.allocator.read_bytes(buf.block, nbytes) if nbytes else
                     torch.empty(0, dtype=torch.uint8))
            self.hosts[id(buf)] = entry
        view = torch.empty(0, dtype=t.dtype).set_(
            entry[1].untyped_storage(), t.storage_offset(), t.shape, t.stride()
        )
        view = T.with_math_bits_of(view, t)  # the CPU kernel resolves them as it would on CPU
        self.twins.append((t, view))
        return view

    def _convert(self, value: Any, arg: Any, tensors: list[_Tensor]) -> Any:
        name = self.ctx.name
        if isinstance(value, _Tensor):
            return self._host(value) if value.device.type == name else value
        if isinstance(value, (list, tuple)):
            return type(value)(self._convert(v, arg, tensors) for v in value)
        if isinstance(value, torch.device) and value.type == name:
            return torch.device("cpu")
        if isinstance(value, str) and arg is not None and arg.name == "device":
            return "cpu" if value.split(":")[0] == name else value
        if arg is not None and isinstance(value, (bool, int, float, complex)) and (
            str(arg.type) in ("Tensor", "Optional[Tensor]")
        ):
            # Built at full width, then cast: PyTorch casts a wrapped number to the op's dtype
            # as C++ does (300 → 44 in int8), where torch.tensor(300, dtype=int8) would raise.
            wide = torch.float64 if isinstance(value, float) else (
                torch.complex128 if isinstance(value, complex) else None
            )
            return torch.tensor(value, dtype=wide).to(_scalar_dtype(value, tensors))
        return value

    def run(self, args: tuple, kwargs: dict) -> Any:
        ctx, op = self.ctx, self.op
        schema = op._schema
        by_name = {a.name: a for a in schema.arguments}
        tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, _Tensor)]
        cpu_args = [
            self._convert(v, schema.arguments[i] if i < len(schema.arguments) else None, tensors)
            for i, v in enumerate(args)
        ]
        cpu_kwargs = {k: self._convert(v, by_name.get(k), tensors) for k, v in kwargs.items()}
        if "pin_memory" in cpu_kwargs:
            cpu_kwargs["pin_memory"] = None
        gen = _generator_slot(op)
        if gen is not None:
            _fill_generator(ctx, gen, cpu_args, cpu_kwargs)
        mutated = self._mutated_device_args(args, kwargs)
        before = {id(v): (tuple(v.shape), v.stride(), v.storage_offset())
                  for d, v in self.twins if id(d) in mutated}

        kernel = CPU_EQUIVALENTS.get(op, op)
        if gen is None and torch.Tag.nondeterministic_seeded in op.tags:
            result = _on_device_stream(ctx, kernel, cpu_args, cpu_kwargs)
        else:
            result = kernel(*cpu_args, **cpu_kwargs)

        self._write_back(mutated, before)
        return self._results(result)

    def _mutated_device_args(self, args: tuple, kwargs: dict) -> set[int]:
        schema = self.op._schema
        mutated: set[int] = set()
        values = list(zip(schema.arguments, args)) + [
            (a, kwargs[a.name]) for a in schema.arguments if a.name in kwargs
        ]
        undeclared = UNDECLARED_WRITES.get(self.op, ())
        for arg, value in values:
            if not (_is_write(arg) or arg.name in undeclared):
                continue
            for v in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(v, _Tensor) and v.device.type == self.ctx.name:
                    mutated.add(id(v))
        return mutated

    def _write_back(self, mutated: set[int], before: dict) -> None:
        if not mutated:
            return
        ctx = self.ctx
        dirty: set[int] = set()
        for device, host in self.twins:
            if id(device) not in mutated:
                continue
            buf = T.buffer_of(device)
            host_bytes = self.hosts[id(buf)][1]
            geometry = (tuple(host.shape), host.stride(), host.storage_offset())
            if (
                host.untyped_storage().data_ptr() == host_bytes.untyped_storage().data_ptr()
                and geometry == before[id(host)]
            ):
                dirty.add(id(buf))
                continue
            # The CPU kernel resized this argument (out= resizing): resize the device tensor
            # to match and store the new contents.
            T.set_geometry(ctx, device, host.shape, host.stride(), host.storage_offset())
            if host.numel():
                T.write_values(ctx, device, ctx.allocator.from_host(T.host_values(host).contiguous()))
        for key in dirty:
            buf, host_bytes = self.hosts[key]
            ctx.allocator.write_bytes(buf.block, host_bytes)

    def _results(self, result: Any) -> Any:
        if isinstance(result, _Tensor):
            for device, host in self.twins:
                if host is result:
                    return device
            if result.device.type != "cpu":
                return result
            return self._to_device(result)
        if isinstance(result, tuple):
            return tuple(self._results(r) for r in result)
        if isinstance(result, list):
            return [self._results(r) for r in result]
        return result

    def _to_device(self, host: _Tensor) -> _Tensor:
        ctx = self.ctx
        dense = host.is_contiguous() or host.is_contiguous(memory_format=torch.channels_last)
        stride = host.stride() if dense else None
        device = T.new_tensor(ctx, host.shape, host.dtype, stride)
        if host.numel():
            T.write(ctx, device, ctx.allocator.from_host(T.host_values(host)))
        return device

