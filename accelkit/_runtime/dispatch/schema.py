"""What an aten op's schema says, as the dispatch pipeline needs it: which ops are views, which
write their arguments, how in-place and ``out=`` overloads map to functional ones, where a
generator goes, and which host tensors an op takes beside device tensors."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch._ops import OpOverload

from accelkit._runtime.device.context import BackendContext
from accelkit._runtime.device.random import reserve
from accelkit.sdk.random_stream import counters_drawn


def overload_named(name: str) -> OpOverload | None:
    """The overload called ``name``, as the dispatcher (``aten::mm.default``, ``aten::mm``) or
    ``str(op)`` (``aten.mm.default``) writes it; None when there is no such op."""
    namespace, sep, rest = name.partition("::")
    if sep:
        base, _, overload = rest.partition(".")
    else:
        namespace, _, rest = name.partition(".")
        base, _, overload = rest.rpartition(".")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), base), overload or "default")
    except (AttributeError, RuntimeError):
        return None


def is_write(arg: Any) -> bool:
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
    ``self`` and the runtime stores it (``Pipeline.native_inplace``). This is how in-place ops
    without a functional counterpart (``normal_``, ``bernoulli_.float``) run natively.
    """
    arguments = op._schema.arguments
    return bool(arguments) and is_write(arguments[0]) and not out_arg_names(op)


def out_arg_names(op: OpOverload) -> list[str]:
    return [a.name for a in op._schema.arguments if a.kwarg_only and is_write(a)]


#: What a factory's functional overload takes where its ``out=`` overload takes ``out``
#: (``arange.start_step`` and ``arange.start_out``).
_TENSOR_OPTIONS = frozenset({"dtype", "layout", "device", "pin_memory"})


def _signature(op: OpOverload, skip_out: bool, skip_options: bool = False) -> list[tuple[str, str]]:
    return [
        (a.name, str(a.type))
        for a in op._schema.arguments
        if not (skip_out and a.kwarg_only and is_write(a))
        and not (skip_options and a.kwarg_only and a.name in _TENSOR_OPTIONS)
    ]


def variants_of(functional: OpOverload) -> tuple[OpOverload | None, OpOverload | None]:
    """The in-place and ``out=`` overloads computing the same thing as ``functional`` (an
    ``out=`` overload whose ``out`` is a list of tensors is not derived: None)."""
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
    if out is not None and any(a.type.kind() == "ListType" for a in out._schema.arguments
                               if a.name in out_arg_names(out)):
        out = None  # lists of outs (``_foreach_add.List_out``) are left to the fallback
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
    if name.endswith("_") and op._schema.arguments and is_write(op._schema.arguments[0]):
        packet = getattr(torch.ops.aten, name[:-1], None)
        if packet is not None and op._overloadname in packet.overloads():
            return getattr(packet, op._overloadname), "inplace"
    return None, ""


def generator_slot(op: OpOverload) -> tuple[int, str] | None:
    """Position and name of ``op``'s generator argument, or None when it takes none."""
    for i, a in enumerate(op._schema.arguments):
        if "Generator" in str(a.type):
            return i, a.name
    return None


def fill_generator(ctx: BackendContext, slot: tuple[int, str], op: OpOverload, args: tuple, kwargs: dict,
                   kernel_args: list, kernel_kwargs: dict) -> None:
    """Put the draw ``op`` makes in its generator ``slot`` of the kernel's arguments: the
    counters it takes from the generator the caller passed (the device generator when None), as
    an :class:`accelkit.sdk.RandomDraw` (see :mod:`accelkit.sdk.random_stream`)."""
    index, name = slot
    given = args[index] if index < len(args) else kwargs.get(name)
    draw = reserve(ctx, given, counters_drawn(op, args, kwargs))
    if index < len(kernel_args):
        kernel_args[index] = draw
    else:
        kernel_kwargs[name] = draw


#: Ops that write to arguments their schema does not mark as mutable: batch norm updates its
#: running statistics in place although they are declared ``Tensor?``.
#: A native kernel for such an op cannot write (it is functional): it returns the op's results
#: followed by the new values of these arguments, in this order (None leaves one unchanged), and
#: the runtime stores them (:func:`accelkit._runtime.dispatch.pipeline._undeclared_writer`).
UNDECLARED_WRITES: dict[OpOverload, tuple[str, ...]] = {
    torch.ops.aten.native_batch_norm.default: ("running_mean", "running_var"),
    torch.ops.aten.native_batch_norm.out: ("running_mean", "running_var"),
    # These declare the running statistics written (Tensor(a!)) but are neither in-place nor
    # out= ops: a kernel returns their new values the same way.
    torch.ops.aten._native_batch_norm_legit.default: ("running_mean", "running_var"),
    torch.ops.aten._native_batch_norm_legit.out: ("running_mean", "running_var"),
    torch.ops.aten._batch_norm_with_update.default: ("running_mean", "running_var"),
    torch.ops.aten._batch_norm_with_update.out: ("running_mean", "running_var"),
    # The CPU kernel clamps the weight in place and returns it.
    torch.ops.aten._saturate_weight_to_fp16.default: ("weight",),
}


#: Ops that take host tensors of any shape beside device tensors, as PyTorch's accelerators
#: do: indices may stay on the CPU. Every other op takes a host tensor only when it is 0-dim
#: (a number in tensor form, like a CPU scalar beside a CUDA tensor).
_HOST_OPERAND_OPS = frozenset({
    "aten::index", "aten::_unsafe_index", "aten::index_put", "aten::index_put_",
    "aten::_index_put_impl_", "aten::_unsafe_index_put",
})


class HostOperand(Exception):
    """Raised while converting arguments: a host tensor among an op's device arguments that
    the op does not take (turned into :func:`host_operand_error` by the caller)."""

    def __init__(self, tensor: torch.Tensor):
        super().__init__()
        self.tensor = tensor


def takes_host_operand(op: OpOverload, tensor: torch.Tensor) -> bool:
    """Whether ``op`` may run with host tensor ``tensor`` among its device arguments (read
    ones: an argument ``op`` writes never takes a host tensor, see :func:`written_args`)."""
    return tensor.dim() == 0 or op._schema.name in _HOST_OPERAND_OPS


@functools.cache
def written_args(op: OpOverload) -> frozenset[str]:
    """Names of the arguments ``op`` writes (``out=`` tensors, ``self`` of an in-place op).

    PyTorch's accelerators write results only into device tensors: a CPU tensor there is
    refused, 0-dim or not (TensorIterator admits CPU scalars as inputs only)."""
    return frozenset(a.name for a in op._schema.arguments if is_write(a))


def _named_values(op: OpOverload, args: tuple, kwargs: dict) -> Iterator[tuple[str, Any]]:
    """(argument name, value) for each argument of a call, and for each element of a list
    argument."""
    names = [a.name for a in op._schema.arguments]
    for name, value in (*zip(names, args), *kwargs.items()):
        for v in value if isinstance(value, (list, tuple)) else (value,):
            yield name, v


def foreign_host_tensor(ctx: BackendContext, op: OpOverload, args: tuple, kwargs: dict) -> Any:
    """The first host tensor among ``op``'s arguments (lists included) that ``op`` does not
    take beside device tensors, or None."""
    written = written_args(op)
    for name, v in _named_values(op, args, kwargs):
        if isinstance(v, torch.Tensor) and v.device.type != ctx.name and (
            name in written or not takes_host_operand(op, v)
        ):
            return v
    return None


def host_operand_error(ctx: BackendContext, op: OpOverload, args: tuple, kwargs: dict,
                       host: torch.Tensor) -> RuntimeError:
    """PyTorch's mixed-device error for ``host``, a host tensor ``op`` does not take, naming
    the argument that holds it and the fix."""
    device, where, written = None, "an argument", False
    for name, v in _named_values(op, args, kwargs):
        if v is host and where == "an argument":
            where, written = f"argument '{name}'", name in written_args(op)
        elif device is None and isinstance(v, torch.Tensor) and v.device.type == ctx.name:
            device = str(v.device)
    device = device or f"{ctx.name}:0"
    if written:
        fix = (f"pass a {device} tensor (torch.empty(..., device='{device}')) and copy it to "
               f"the {host.device.type} afterwards: results of {ctx.name} tensors are written "
               f"only into {ctx.name} tensors")
    else:
        fix = (f"move it with .to('{device}') (a {host.device} tensor is taken beside "
               f"{ctx.name} tensors only when it is 0-dim)")
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, "
        f"{device} and {host.device}! {where} of {op} is a {host.device} tensor of shape "
        f"{tuple(host.shape)}: {fix}"
    )
