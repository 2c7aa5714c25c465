"""The CPU fallback: one op run by PyTorch's CPU kernel on host copies of its device arguments.

Device arguments are copied to the host once per storage (so aliasing between them holds), the
CPU kernel runs, storages it wrote are copied back (resizing ``out=`` arguments as it did), and
results come back to the device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._ops import OpOverload

from accelkit._runtime.dispatch import host_random
from accelkit._runtime.device import tensors as T
from accelkit._runtime.device.context import BackendContext
from accelkit._runtime.dispatch.schema import UNDECLARED_WRITES, generator_slot, is_write

_Tensor = torch.Tensor


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


def _histc_on_cpu(x: _Tensor, bins: int = 100, min: float = 0, max: float = 0, *, out: _Tensor | None = None) -> _Tensor:
    """``histc`` of any real dtype, as CUDA's kernel takes it (the CPU's takes floating point
    only): integers are counted in float64, which holds them exactly, and the counts come back in
    the input's dtype. MoE routers count tokens per expert so (TorchTitan's)."""
    if x.is_floating_point():
        counts = torch.ops.aten.histc.default(x, bins, min, max)
    else:
        counts = torch.ops.aten.histc.default(x.double(), bins, min, max).to(x.dtype)
    if out is None:
        return counts
    out.resize_(counts.shape).copy_(counts)
    return out


#: Ops the CPU kernel cannot run as a device runs them, and the CPU computation that does: device
#: hooks with no CPU kernel, and dtypes CUDA's kernel takes that the CPU's refuses.
CPU_EQUIVALENTS: dict[OpOverload, Callable] = {
    torch.ops.aten.convolution_overrideable.default: torch.ops.aten.convolution.default,
    torch.ops.aten.convolution_backward_overrideable.default: _convolution_backward_on_cpu,
    torch.ops.aten.histc.default: _histc_on_cpu,
    torch.ops.aten.histc.out: _histc_on_cpu,
}


#: Overloads PyTorch implements once for every device (CompositeExplicitAutograd) in a way that
#: differs from its CPU and CUDA kernels on PrivateUse1, or fails there, each with the reason. That
#: kernel would win over the boxed fallback, so they are routed into the pipeline explicitly,
#: where they run like any other ``out=`` overload (derived, decomposed or on the CPU).
ROUTED_COMPOSITES: dict[OpOverload, str] = {
    torch.ops.aten.mode.values: "its device check refuses PrivateUse1 (mode only supports CPU, CUDA and XPU)",
    torch.ops.aten.addr.out: "math_addr_out writes into an out= tensor on any device, a CPU one too",
    torch.ops.aten.native_group_norm.default: (
        "its math kernel views the input as (N, groups, -1), which a channels_last input refuses; "
        "the CPU and CUDA kernels take any layout"),
    **{op: "it fills the window through a DispatchStub, which has no PrivateUse1 kernel (an internal assert)"
       for op in (torch.ops.aten.kaiser_window.default, torch.ops.aten.kaiser_window.periodic,
                  torch.ops.aten.kaiser_window.beta, torch.ops.aten.kaiser_window.out,
                  torch.ops.aten.kaiser_window.periodic_out, torch.ops.aten.kaiser_window.beta_out)},
}

#: Composites whose C++ reads tensor memory through data pointers, so that on a device tensor
#: they crash (CPU-only helpers PyTorch registers for every device). They go straight to the
#: CPU kernel: neither their own kernel nor a decomposition of them may run.
HOST_MEMORY_COMPOSITES: tuple[OpOverload, ...] = (
    torch.ops.aten._saturate_weight_to_fp16.default,
    torch.ops.aten._grid_sampler_2d_cpu_fallback.default,
    torch.ops.aten._grid_sampler_2d_cpu_fallback.out,
    torch.ops.aten._grid_sampler_2d_cpu_fallback_backward.default,
)


class HostCall:
    """Copies device arguments to the host (one copy per storage, so aliasing is kept), runs
    the CPU kernel, writes mutated storages back and brings results to the device."""

    def __init__(self, ctx: BackendContext, op: OpOverload):
        self.ctx = ctx
        self.op = op
        self.hosts: dict[int, tuple[Any, torch.Tensor]] = {}  # id(buffer) -> (buffer, host bytes)
        self.twins: list[tuple[_Tensor, _Tensor]] = []  # (device tensor, host view)
        self.written: set[int] = set()  # id(buffer) of the storages the op may resize

    def _host(self, t: _Tensor) -> _Tensor:
        buf = T.buffer_of(t)
        entry = self.hosts.get(id(buf))
        if entry is None:
            nbytes = t.untyped_storage().nbytes()
            data = (self.ctx.allocator.read_bytes(buf.block, nbytes) if nbytes else
                    torch.empty(0, dtype=torch.uint8))
            if id(buf) in self.written and not data.untyped_storage().resizable():
                data = data.clone()  # bytes over the backend's memory (numpy): the CPU kernel resizes out=
            entry = (buf, data)
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
        mutated = self._mutated_device_args(args, kwargs)
        self.written = {id(T.buffer_of(v)) for v in mutated.values()}
        cpu_args = [
            self._convert(v, schema.arguments[i] if i < len(schema.arguments) else None, tensors)
            for i, v in enumerate(args)
        ]
        cpu_kwargs = {k: self._convert(v, by_name.get(k), tensors) for k, v in kwargs.items()}
        if "pin_memory" in cpu_kwargs:
            cpu_kwargs["pin_memory"] = None
        before = {id(v): (tuple(v.shape), v.stride(), v.storage_offset())
                  for d, v in self.twins if id(d) in mutated}

        kernel = CPU_EQUIVALENTS.get(op, op)
        if host_random.draws(op):  # its values come from the device's stream
            result = host_random.run(ctx, op, kernel, cpu_args, cpu_kwargs, generator_slot(op))
        else:
            result = kernel(*cpu_args, **cpu_kwargs)

        self._write_back(mutated, before)
        return self._results(result)

    def _mutated_device_args(self, args: tuple, kwargs: dict) -> dict[int, _Tensor]:
        """The device tensors the op writes, by id."""
        schema = self.op._schema
        mutated: dict[int, _Tensor] = {}
        values = list(zip(schema.arguments, args)) + [
            (a, kwargs[a.name]) for a in schema.arguments if a.name in kwargs
        ]
        undeclared = UNDECLARED_WRITES.get(self.op, ())
        for arg, value in values:
            if not (is_write(arg) or arg.name in undeclared):
                continue
            for v in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(v, _Tensor) and v.device.type == self.ctx.name:
                    mutated[id(v)] = v
        return mutated

    def _write_back(self, mutated: dict[int, _Tensor], before: dict) -> None:
        if not mutated:
            return
        ctx = self.ctx
        dirty: set[int] = set()
        for device, host in self.twins:
            if id(device) not in mutated:
                continue
            buf = T.buffer_of(device)
            host_bytes = self.hosts[id(buf)][1]
            # The CPU kernel may flip an out= argument's conjugate bit (linalg_lu_solve with
            # left=False): the device tensor reads its stored elements the same way.
            if host.is_conj() != device.is_conj():
                torch._C._set_conj(device, host.is_conj())
            if host.is_neg() != device.is_neg():
                torch._C._set_neg(device, host.is_neg())
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
                T.write_values(ctx, device, ctx.allocator.from_host(T.host_values(host)))
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
