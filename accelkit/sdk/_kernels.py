"""Kernel tables and decompositions: how a backend says which aten ops it computes natively."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

import torch
from torch._ops import OpOverload, OpOverloadPacket


class KernelDeclined(Exception):
    """Raised by a kernel for arguments it does not handle (a 3-d convolution in a 2-d kernel).

    The runtime then runs the op through the CPU fallback, under the fallback policy and counted
    as a fallback, so a kernel can cover the common case without failing the rest; or through
    the decomposition the backend gave for declined calls
    (:meth:`KernelTable.decompose_declined`). Raise it before writing anything. The message says
    what was declined.
    """


class CallLayout(NamedTuple):
    """What a kernel's ``specialize`` is told about a call: everything that is the same for
    every call it prepares for (see :class:`KernelEntry`).

    Each item is a device tensor's :class:`~accelkit.sdk.ViewSpec`, the type ``float`` or
    ``complex`` for a Python number (its value changes from call to call), or a static value
    itself (ints, bools, dtypes, None, ...; int lists as tuples). A kernel whose
    ``specializes_tensor_lists`` attribute is true also gets layouts with a list of device
    tensors, as a tuple of their view specs (their blocks come in that order).
    """

    #: one item per positional argument
    args: tuple
    #: ``(name, item)`` per keyword argument, in the order of the call
    kwargs: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class KernelEntry:
    """One native kernel.

    :ivar op: the aten overload it implements.
    :ivar fn: called with the op's arguments, device tensors replaced by backend arrays; returns
        a backend array, a tuple of them, or a Python scalar for scalar-returning ops.
        Optionally ``fn`` also offers ``specialize(layout, allocator)``, which prepares a call
        once for every later call with the same :class:`CallLayout` (the tensors' geometries
        and dtypes, which arguments are Python numbers, the static values, the keyword names).
        It returns a *plan* ``plan(blocks, numbers)``, called with the tensors' blocks (as
        the allocator holds them) and the numbers, each in argument order (positional, then
        keywords), and returning what ``fn`` would; or None to leave that layout to ``fn``.
        A plan must behave exactly as ``fn`` does, errors and :class:`KernelDeclined`
        included; it only saves per-call work. A single-array result must have the same shape
        and dtype at every call of its layout (the runtime checks the first and wraps the rest
        as it). Calls with host tensors or generators always go to ``fn``.
        A kernel registered for an in-place op that writes several tensor lists
        (``_fused_adam_``: params, grads, moments) returns, per written list in schema order,
        a list of its tensors' new values, or None for a list the call leaves unchanged; the
        runtime checks them all, then writes them.
    :ivar derive_variants: let the runtime build the in-place and ``out=`` overloads of a
        functional op from this kernel (compute, check the dtype cast, write back).
    """

    op: OpOverload
    fn: Callable[..., Any]
    derive_variants: bool = True


class KernelTable:
    """A backend's native kernels, keyed by aten overload.

    Use :meth:`kernel` as a decorator::

        kernels = KernelTable("ref")

        @kernels.kernel(aten.add.Tensor, aten.add.Scalar)
        def add(x, y, *, alpha=1): ...

    An op packet (``aten.relu``) stands for its ``default`` overload. Registering an overload
    twice is an error that names both functions.

    An op the hardware has no way to compute is declared with :meth:`on_cpu` and its reason: it
    still runs on the CPU fallback (under the fallback policy, counted as a fallback), and the
    reason is shown with it (the coverage audit's ``cpu_by_design`` path, ``stats()``'s
    ``cpu_by_design`` section, the fallback policy's warning and refusal).

    A kernel that covers part of an op's arguments (:class:`KernelDeclined` for the rest) can
    send the rest to a decomposition into the device's other ops instead of the CPU:
    :meth:`decompose_declined`.
    """

    def __init__(self, backend: str):
        self.backend = backend
        self._entries: dict[OpOverload, KernelEntry] = {}
        self._cpu_reasons: dict[OpOverload, str] = {}
        self._declined: dict[OpOverload, Callable[..., Any]] = {}

    def kernel(
        self, *ops: OpOverload | OpOverloadPacket, derive_variants: bool = True
    ) -> Callable[[Callable], Callable]:
        if not ops:
            raise TypeError(f"{self.backend}: kernel() needs at least one aten op")

        def register(fn: Callable) -> Callable:
            for op in ops:
                self.add(op, fn, derive_variants=derive_variants)
            return fn

        return register

    def add(
        self, op: OpOverload | OpOverloadPacket, fn: Callable, *, derive_variants: bool = True
    ) -> None:
        """Register ``fn`` for ``op`` (the decorator's non-decorator form)."""
        if isinstance(op, OpOverloadPacket):
            op = op.default
        if not isinstance(op, OpOverload):
            raise TypeError(f"{self.backend}: expected an aten op such as aten.add.Tensor, got {op!r}")
        if op in self._entries:
            raise ValueError(
                f"{self.backend}: {op} already has the kernel "
                f"{self._entries[op].fn.__qualname__}; cannot also register {fn.__qualname__}"
            )
        self._entries[op] = KernelEntry(op, fn, derive_variants)

    def on_cpu(self, *ops: OpOverload | OpOverloadPacket, reason: str) -> None:
        """Declare ``ops`` CPU by design: the hardware has no way to compute them, and ``reason``
        says why (what it lacks). Their in-place and ``out=`` overloads follow. A declared op
        runs on the CPU fallback even where a decomposition exists; it cannot also have a kernel.

        :raises ValueError: ``reason`` is empty, or an op has a kernel or is declared already.
        """
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(f"{self.backend}: on_cpu() needs the reason the hardware cannot compute the ops")
        for op in ops:
            if isinstance(op, OpOverloadPacket):
                op = op.default
            if not isinstance(op, OpOverload):
                raise TypeError(f"{self.backend}: expected an aten op such as aten.add.Tensor, got {op!r}")
            if op in self._entries or op in self._cpu_reasons:
                raise ValueError(f"{self.backend}: {op} already has a kernel or a CPU declaration")
            self._cpu_reasons[op] = reason.strip()

    def decompose_declined(self, op: OpOverload | OpOverloadPacket, decomposition: Callable[..., Any]) -> None:
        """Run the calls of functional ``op`` that its kernel declines as ``decomposition`` (called
        with the op's arguments, made of device ops: a 3-d convolution as a sum of 2-d ones)
        rather than on the CPU. Counted as decomposed. A decomposition that returns
        ``NotImplemented``, or that meets ``op``'s own declined call again, leaves the call to the
        CPU fallback. The op's in-place and ``out=`` overloads still fall back when declined.

        :raises ValueError: ``op`` has no kernel in this table, or has a declined-call
            decomposition already.
        """
        if isinstance(op, OpOverloadPacket):
            op = op.default
        if op not in self._entries:
            raise ValueError(f"{self.backend}: {op} has no kernel to decline; register it before "
                             f"decompose_declined()")
        if op in self._declined:
            raise ValueError(f"{self.backend}: {op} already sends declined calls to "
                             f"{self._declined[op].__qualname__}")
        self._declined[op] = decomposition

    @property
    def declined_decompositions(self) -> Mapping[OpOverload, Callable[..., Any]]:
        """The decompositions run for declined calls (:meth:`decompose_declined`), by op."""
        return MappingProxyType(self._declined)

    @property
    def cpu_reasons(self) -> Mapping[OpOverload, str]:
        """The ops declared CPU by design (:meth:`on_cpu`), with their reasons."""
        return MappingProxyType(self._cpu_reasons)

    def __contains__(self, op: object) -> bool:
        return op in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[KernelEntry]:
        return iter(self._entries.values())

    def get(self, op: OpOverload) -> KernelEntry | None:
        return self._entries.get(op)


def default_decompositions() -> Mapping[OpOverload, Callable]:
    """PyTorch's core-ATen decomposition table: what the runtime uses when a backend says nothing."""
    from torch._decomp import core_aten_decompositions

    return dict(core_aten_decompositions())


@dataclass(frozen=True)
class AutocastPolicy:
    """Which ops ``torch.autocast(<device>)`` runs in which precision.

    Names are aten op packet names (``"mm"``, ``"layer_norm"``); every overload is covered.

    :ivar lower_precision: ops cast to the autocast dtype (matmul-like work).
    :ivar float32: ops whose floating inputs are cast up to float32 (reductions, losses).
    :ivar promote: ops whose floating inputs are cast to the widest floating input dtype.
    :ivar dtypes: dtypes accepted as ``torch.autocast(dtype=...)``, preferred first. PyTorch's
        own default for a custom device is float16 (per thread), so pass ``dtype=`` explicitly.
    """

    lower_precision: tuple[str, ...]
    float32: tuple[str, ...]
    promote: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)


#: The policy CUDA applies (aten/src/ATen/autocast_mode.cpp), reduced to ops with aten kernels.
CUDA_LIKE_AUTOCAST = AutocastPolicy(
    lower_precision=(
        "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
        "conv_transpose3d", "convolution", "prelu", "addmm", "addmv", "addr", "matmul",
        "einsum", "mm", "mv", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
        "linalg_multi_dot", "scaled_dot_product_attention",
    ),
    float32=(
        "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
        "reciprocal", "rsqrt", "sinh", "tan", "pow", "softplus", "layer_norm",
        "native_layer_norm", "group_norm", "norm", "frobenius_norm", "nuclear_norm",
        "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss",
        "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss",
        "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
        "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
        "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
        "softmax", "log_softmax", "cross_entropy_loss", "sum", "prod", "cumsum", "cumprod",
        "linalg_vector_norm", "linalg_matrix_norm",
    ),
    promote=(
        "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sampler",
        "index_put", "scatter_add", "tensordot", "cat", "stack",
    ),
)
