"""tpu device memory: each block holds one immutable ``jax.Array``; views are read lazily.

A block is a mutable :class:`Holder` around the array that currently holds the storage's bytes
(any shape: its row-major flattening is the storage). Kernels receive :class:`JaxView` values —
the holder's array plus the tensor's geometry — and materialise them *inside* their jitted
program, so a view costs no separate XLA dispatch. A write replaces the array on the fast path
(the view covers the whole storage) and otherwise scatters into it with one jitted update.
"""

from __future__ import annotations

import functools
import sys
import weakref
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch

from accelkit.sdk import DeviceAllocator, ViewSpec
from accelkit_backends.tpu import checks, fused, modes
from accelkit_backends.tpu.fused import Pending
from accelkit_backends.tpu.cost import COSTS
from accelkit_backends.tpu.programs import tracked

TORCH_TO_JAX = {
    torch.float32: jnp.float32, torch.float64: jnp.float64, torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16, torch.int8: jnp.int8, torch.int16: jnp.int16,
    torch.int32: jnp.int32, torch.int64: jnp.int64, torch.uint8: jnp.uint8, torch.bool: jnp.bool_,
    torch.complex64: jnp.complex64, torch.complex128: jnp.complex128,
    torch.uint16: jnp.uint16, torch.uint32: jnp.uint32, torch.uint64: jnp.uint64,
    torch.float8_e4m3fn: jnp.float8_e4m3fn, torch.float8_e5m2: jnp.float8_e5m2,
}
JAX_TO_TORCH = {np.dtype(v): k for k, v in TORCH_TO_JAX.items()}
# numpy has no bf16/fp8: host copies travel as same-width integers and are reinterpreted.
_HOST_CARRIER = {
    torch.bfloat16: (torch.uint16, ml_dtypes.bfloat16),
    torch.float8_e4m3fn: (torch.uint8, ml_dtypes.float8_e4m3fn),
    torch.float8_e5m2: (torch.uint8, ml_dtypes.float8_e5m2),
}


def jax_dtype(dtype: torch.dtype) -> Any:
    try:
        return TORCH_TO_JAX[dtype]
    except KeyError:
        raise TypeError(f"{dtype} has no XLA equivalent on tpu") from None


def torch_dtype(dtype: Any) -> torch.dtype:
    found = JAX_TO_TORCH.get(dtype)  # an array's dtype is already a numpy dtype: no conversion
    return found if found is not None else JAX_TO_TORCH[np.dtype(dtype)]


class Holder:
    """The mutable block: the array holding a storage's bytes (None until first written)."""

    __slots__ = ("array", "nbytes", "__weakref__")

    def __init__(self, nbytes: int, array: jax.Array | None = None):
        self.nbytes = nbytes
        self.array = array
        if type(array) is Pending:
            fused.hold(self, array)


_new_tuple = tuple.__new__  # NamedTuple construction without its generated __new__ (hot path)


class JaxView(NamedTuple):
    """A tensor argument as kernels receive it: the storage's array and the tensor's geometry."""

    array: jax.Array
    spec: ViewSpec


# ---------------------------------------------------------------------------------------------
# Traced helpers (run inside jitted programs)
# ---------------------------------------------------------------------------------------------


_COMPONENT = {np.dtype(jnp.complex64): jnp.float32, np.dtype(jnp.complex128): jnp.float64}


def as_flat(array: jax.Array, dtype: torch.dtype) -> jax.Array:
    """The storage's elements reinterpreted as a flat array of ``dtype`` (traced).

    Complex values are split into and rebuilt from (real, imag) pairs with ``lax.complex``:
    jnp's ``view`` to complex loses the sign of a zero imaginary part.
    """
    target = jax_dtype(dtype)
    flat = array.reshape(-1)
    if flat.dtype == target:
        return flat
    if np.dtype(flat.dtype) in _COMPONENT:
        flat = jnp.stack([jnp.real(flat), jnp.imag(flat)], axis=-1).reshape(-1)
    component = _COMPONENT.get(np.dtype(target))
    want = component if component is not None else target
    if flat.dtype != want:
        width = np.dtype(want).itemsize
        if np.dtype(flat.dtype).itemsize != width:
            flat = flat.view(jnp.uint8)
            flat = flat[: flat.shape[0] - flat.shape[0] % width]
        flat = flat.view(want)
    if component is not None:
        flat = flat[: flat.shape[0] - flat.shape[0] % 2]
        return jax.lax.complex(flat[0::2], flat[1::2])
    return flat


def _is_dense_permutation(spec: ViewSpec) -> tuple[int, ...] | None:
    """If ``spec`` is a permutation of a contiguous layout, the permutation; else None."""
    order = sorted(range(len(spec.size)), key=lambda d: -spec.stride[d])
    expected = 1
    for d in reversed(order):
        if spec.size[d] != 1 and spec.stride[d] != expected:
            return None
        expected *= spec.size[d]
    return tuple(order)


@functools.lru_cache(maxsize=4096)
def _gather_index(spec: ViewSpec) -> np.ndarray:
    index = np.full(spec.size, spec.offset, dtype=np.int64)
    for dim, (size, stride) in enumerate(zip(spec.size, spec.stride)):
        shape = [1] * len(spec.size)
        shape[dim] = size
        index = index + (np.arange(size, dtype=np.int64) * stride).reshape(shape)
    return index


def materialize(array: jax.Array, spec: ViewSpec) -> jax.Array:
    """The view's elements as an array of ``spec.size`` (traced; ``spec`` is static)."""
    flat = as_flat(array, spec.dtype)
    numel = spec.numel
    if numel == 0:
        return jnp.zeros(spec.size, jax_dtype(spec.dtype))
    # Broadcast (stride-0) dimensions: read the rest once, then broadcast.
    if any(st == 0 and sz > 1 for sz, st in zip(spec.size, spec.stride)):
        reduced = ViewSpec(spec.dtype, tuple(1 if st == 0 else sz for sz, st in zip(spec.size, spec.stride)),
                           spec.stride, spec.offset)
        return jnp.broadcast_to(materialize(array, reduced), spec.size)
    order = _is_dense_permutation(spec)
    if order is not None:
        block = jax.lax.slice(flat, (spec.offset,), (spec.offset + numel,))
        permuted = block.reshape(tuple(spec.size[d] for d in order))
        inverse = tuple(order.index(d) for d in range(len(order)))
        return permuted.transpose(inverse) if inverse != tuple(range(len(order))) else permuted
    return flat[_gather_index(spec)]


def value_of(argument: Any) -> Any:
    """A kernel argument as an array: views are materialised, everything else passes (traced)."""
    if isinstance(argument, JaxView):
        return materialize(argument.array, argument.spec)
    return argument


# ---------------------------------------------------------------------------------------------
# Jitted data movement
# ---------------------------------------------------------------------------------------------


@tracked
@functools.partial(jax.jit, static_argnums=(1,))
def _read(array: jax.Array, spec: ViewSpec) -> jax.Array:
    return materialize(array, spec)


@functools.lru_cache(maxsize=4096)
def _scatter_index(spec: ViewSpec) -> tuple[np.ndarray, np.ndarray | None]:
    """Storage positions a view writes, and which of its elements to keep when several
    elements share a position (an expanded view): the last one, as a CPU loop would leave."""
    index = _gather_index(spec).reshape(-1)
    reversed_first = np.unique(index[::-1], return_index=True)[1]
    if len(reversed_first) == len(index):
        return index, None
    keep = np.sort(len(index) - 1 - reversed_first)
    return index[keep], keep


@tracked
@functools.partial(jax.jit, static_argnums=(2, 3))
def _scatter(storage: jax.Array, values: jax.Array, spec: ViewSpec, storage_dtype: torch.dtype) -> jax.Array:
    flat = as_flat(storage, spec.dtype)
    order = _is_dense_permutation(spec) if spec.numel else None
    if order is not None:
        # The view's elements are one stretch of storage in another dimension order (a
        # transpose, channels-last): write it whole, as materialize reads it.
        stretch = values.astype(flat.dtype).transpose(order).reshape(-1)
        updated = jax.lax.dynamic_update_slice(flat, stretch, (spec.offset,))
    else:
        index, keep = _scatter_index(spec)
        values = values.reshape(-1).astype(flat.dtype)
        updated = flat.at[index].set(values if keep is None else values[keep])
    return updated if spec.dtype == storage_dtype else as_flat(updated, storage_dtype)


@tracked
@functools.partial(jax.jit, static_argnums=(1,))
def _in_storage_order(values: jax.Array, order: tuple[int, ...]) -> jax.Array:
    """A view's values as the flat storage of a view with this dimension order."""
    return values.transpose(order).reshape(-1)


@tracked
@functools.partial(jax.jit, static_argnums=(1,))
def _cast(array: jax.Array, dtype: Any) -> jax.Array:
    return array.astype(dtype)


def _host_transfer(device: Any) -> Any:
    """``put(host)``: a numpy array (which the caller will not change) as an array on
    ``device``.

    ``jax.device_put`` spends about 70 µs per call in Python before the transfer, which is
    most of a small ``.to(tpu)``. The function it ends in, ``batched_device_put``, takes 4 µs;
    it is private to jax, so it is used only when it exists and, on a test transfer, gives the
    array ``jax.device_put`` gives. Otherwise this is ``jax.device_put``.
    """
    def public(host: np.ndarray) -> jax.Array:
        return jax.device_put(host, device)

    try:
        from jax._src.core import ShapedArray
        from jax._src.lib import xla_client

        batched_device_put = xla_client.batched_device_put

        sharding, devices = jax.sharding.SingleDeviceSharding(device), [device]

        aval = functools.lru_cache(maxsize=256)(ShapedArray)

        def direct(host: np.ndarray) -> jax.Array:
            return batched_device_put(aval(host.shape, host.dtype), sharding, [host], devices, True)

        probe = np.arange(6, dtype=np.int32).reshape(2, 3)
        got, want = direct(probe), public(probe)
        same = (type(got) is type(want) and got.aval == want.aval and got.sharding == want.sharding
                and got.committed == want.committed and np.array_equal(np.asarray(got), probe))
    except Exception:  # any change in jax's internals: keep to the public function
        return public
    return direct if same else public


_ZEROS: dict[Any, Any] = {}  # device -> its zero-fill program
_SHARED_BYTES = 64 * 1024  # arrays up to this size may be shared (see TpuAllocator.keep_shared)
_SHARED_KEPT = 256  # shared arrays kept at most: 16 MiB of device memory


def _zeros_on(device: Any) -> Any:
    """``zeros(length, dtype)``: flat zeros made on ``device``, one compiled program per length
    and dtype. Storage never written is zero-filled this way when first read (an empty tensor
    given to ``fill_``, ``ones_like``'s seed): about 5 µs, where eager ``jnp.zeros`` plus
    ``device_put`` took about 140 µs."""
    if device not in _ZEROS:
        sharding = jax.sharding.SingleDeviceSharding(device)
        _ZEROS[device] = tracked(jax.jit(jnp.zeros, static_argnums=(0, 1), out_shardings=sharding))
    return _ZEROS[device]


def data_movement_programs() -> int:
    """Programs compiled so far for reading views, scattering into them, writing whole ones in
    another dimension order, casting, and zero-filling storage read before it was written."""
    moves = (_read, _scatter, _in_storage_order, _cast, *_ZEROS.values())
    return sum(program.compiled for program in moves)


class _TensorLease:
    """A host tensor's memory as numpy sees it, for an array that keeps that memory: the numpy
    array's base is this object, which holds the tensor itself (``tensor.numpy()`` holds only
    its storage, and the runtime reuses the memory once the tensor object is gone)."""

    __slots__ = ("tensor", "__array_interface__")

    def __init__(self, tensor: torch.Tensor, as_numpy_sees_it: torch.Tensor):
        self.tensor = tensor
        self.__array_interface__ = as_numpy_sees_it.detach().numpy().__array_interface__


def _array_held_only_by(block: Holder, other_holders: int) -> bool:
    """True when nothing references ``block.array`` but the block and ``other_holders`` known
    references. The array is read from the block here, never passed in: how many references a
    Python call adds to its arguments depends on the interpreter (CPython 3.11 adds one while a
    PEP 523 frame hook is installed, which Dynamo can leave behind), a C call's does not."""
    return sys.getrefcount(block.array) <= 2 + other_holders  # + the block's, getrefcount's argument


@tracked
@functools.partial(jax.jit, donate_argnums=0)
def _donated(array: jax.Array) -> jax.Array:
    return array


def _covers(spec: ViewSpec, nbytes: int) -> bool:
    """The view is the whole storage in row-major order."""
    if spec.offset or spec.numel * spec.dtype.itemsize != nbytes:
        return False
    expected = 1
    for size, stride in zip(reversed(spec.size), reversed(spec.stride)):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _whole_storage_order(spec: ViewSpec, nbytes: int) -> tuple[int, ...] | None:
    """If the view is the whole storage in some dimension order (a transposed or channels-last
    tensor), that order (see :func:`_is_dense_permutation`); else None."""
    if spec.offset or not spec.numel or spec.numel * spec.dtype.itemsize != nbytes:
        return None
    return _is_dense_permutation(spec)


_allocators: list[weakref.ref] = []


def sole_allocator() -> TpuAllocator | None:
    """The allocator of the process's only tpu device; None when there are several (a traced
    program does not know which of them it will run on) or none."""
    live = [a for a in (ref() for ref in _allocators) if a is not None]
    return live[0] if len(live) == 1 else None


class TpuAllocator(DeviceAllocator):
    """Device memory as :class:`Holder` blocks of ``jax.Array`` on one PJRT device.

    Capacity accounting follows the target's HBM; XLA owns the real buffers, so freed blocks
    are not cached (``max_cached=0``): dropping the last reference frees the device memory.
    """

    def __init__(self, device: str, capacity: int, jax_device: Any):
        super().__init__(device, capacity, max_cached=0)
        self.jax_device = jax_device
        self._last: jax.Array | None = None
        self._zeros = _zeros_on(jax_device)
        self._put = _host_transfer(jax_device)
        self._shared: dict[Any, jax.Array] = {}  # see keep_shared
        self._shared_alive: dict[int, weakref.ref] = {}  # id -> every shared array still alive
        self._issued: jax.Array | None = None  # see shared
        _allocators.append(weakref.ref(self))

    # -- blocks ------------------------------------------------------------------------------

    def _alloc_block(self, nbytes: int) -> Holder:
        return Holder(nbytes)

    def _block_from_array(self, array: Any) -> tuple[Holder, int] | None:
        if type(array) is JaxView:
            return None
        if type(array) is Pending and array.value is not None:
            array = array.value
        nbytes = array.dtype.itemsize
        for size in array.shape:
            nbytes *= size
        self._last = array
        return Holder(nbytes, array), nbytes

    def _adoption_refused(self, array: Any) -> None:
        if type(array) is Pending:
            fused.abandon(array)

    def _storage(self, block: Holder, dtype: torch.dtype) -> jax.Array:
        if block.array is None:  # never written: PyTorch's empty memory, here zeros
            block.array = self._zero_storage(max(block.nbytes // dtype.itemsize, 1), dtype)
        return block.array

    def _zero_storage(self, length: int, dtype: torch.dtype) -> jax.Array:
        """``length`` zeros of ``dtype``, shared by every block that needs them when small
        (storage read before it was written: an ``empty`` given to an op that reads it)."""
        key = ("zeros", length, dtype)
        zeros = self._shared.get(key)
        if zeros is None:
            zeros = self._zeros(length, jax_dtype(dtype))
            self.keep_shared(key, zeros)
        return zeros

    # -- arrays shared by many blocks --------------------------------------------------------

    def keep_shared(self, key: Any, array: jax.Array) -> None:
        """Keep ``array`` under ``key`` to be handed out again as the contents of other blocks
        (:meth:`shared`), when it is small (at most 64 KiB; at most 256 are kept). A jax array
        never changes and a write gives its block a new one, so blocks may share one; memory
        is still accounted per block, as PyTorch would allocate it."""
        if array.size * array.dtype.itemsize > _SHARED_BYTES:
            return
        if len(self._shared) >= _SHARED_KEPT:
            self._shared.clear()
        self._shared[key] = array
        alive = self._shared_alive
        alive[id(array)] = weakref.ref(array, lambda _, i=id(array): alive.pop(i, None))

    def shared(self, key: Any) -> jax.Array | None:
        """The array kept under ``key`` (:meth:`keep_shared`), or None. The caller hands it
        out in place of running a program, so it may become the last array adopted, which
        :meth:`synchronize` waits for: the last array that came from a program is remembered
        to be waited for as well (a shared array was finished long ago)."""
        array = self._shared.get(key)
        if array is not None:
            last = self._last
            if last is not None and id(last) not in self._shared_alive:
                self._issued = last
        return array

    # -- views -------------------------------------------------------------------------------

    def read(self, block: Holder, view: ViewSpec) -> JaxView:
        array = block.array
        return _new_tuple(JaxView, (array if array is not None else self._storage(block, view.dtype), view))

    def write(self, block: Holder, view: ViewSpec, array: Any) -> None:
        if isinstance(array, JaxView):
            array = _read(array.array, array.spec)
        if type(array) is Pending and array.value is not None:
            array = array.value
        same_dtype = array.dtype == jax_dtype(view.dtype)
        if same_dtype and _covers(view, block.nbytes):
            block.array = array
        elif same_dtype and (order := _whole_storage_order(view, block.nbytes)) is not None:
            block.array = _in_storage_order(array, order)  # no need to read what is replaced
        else:
            storage = self._storage(block, view.dtype)
            block.array = _scatter(storage, array, view, torch_dtype(storage.dtype))
        if type(block.array) is Pending:
            fused.hold(block, block.array)
        self._last = block.array

    # -- host --------------------------------------------------------------------------------

    def to_host(self, array: Any) -> torch.Tensor:
        checks.raise_pending(self.device)  # a synchronisation: device-side checks report here
        if modes._mode == "fused":
            array = fused.resolve(array)
        shape = None
        if isinstance(array, JaxView):
            whole = array.array.size * array.array.dtype.itemsize
            if _covers(array.spec, whole) and array.array.dtype == jax_dtype(array.spec.dtype):
                array, shape = array.array, array.spec.size  # reshaped on the host: no program to compile
            else:
                array = _read(array.array, array.spec)
        dtype = torch_dtype(array.dtype)
        host = np.array(array)  # a copy: jax's host view is read-only
        if shape is not None:
            host = host.reshape(shape)
        COSTS.wait()
        carrier = _HOST_CARRIER.get(dtype)
        if carrier is not None:
            return torch.from_numpy(host.view(_np_int(carrier[0]))).view(dtype)
        return torch.from_numpy(host)

    def from_host(self, tensor: torch.Tensor) -> jax.Array:
        carrier = _HOST_CARRIER.get(tensor.dtype)
        tensor = tensor.detach()
        host = tensor.view(carrier[0]).numpy().view(carrier[1]) if carrier else tensor.numpy()
        # A private copy: XLA's CPU client keeps suitably aligned host memory instead of copying
        # it (even with may_alias=False, and after the transfer is complete), so the device
        # array would change whenever the caller's tensor did. numpy copies on this thread;
        # torch's clone splits a large copy over its intra-op threads, which costs several
        # times more when the cores are busy.
        return self._put(np.array(host, order="C"))

    def adopt_host(self, tensor: torch.Tensor) -> jax.Array:
        """No copy on XLA's CPU platform: its client keeps suitably aligned host memory as the
        array's (a TPU copies it into HBM, after which the tensor is released)."""
        carrier = _HOST_CARRIER.get(tensor.dtype)
        host = np.asarray(_TensorLease(tensor, tensor.view(carrier[0]) if carrier else tensor))
        return self._put(host.view(carrier[1]) if carrier else host)

    def lend_host(self, block: Holder, view: ViewSpec) -> torch.Tensor | None:
        """On XLA's CPU platform an array is host memory. When the view is the whole storage and
        nothing but the block holds its array (no other block, no caller: see
        :func:`_array_held_only_by`), the array is donated to an identity program. XLA runs it after
        every computation still reading the array, and it returns the same memory as a new
        array, which the block keeps and whose memory is lent through DLPack. While a host view
        of the memory exists, XLA copies instead of donating: the lent memory is then a fresh
        copy that only the block holds. Elsewhere (a TPU's HBM, part of a storage, a shared
        array): None, and the caller stages."""
        if type(block.array) is Pending:
            block.array = fused.concrete(block.array)
        array = block.array
        if (array is None or self.jax_device.platform != "cpu" or not _covers(view, block.nbytes)
                or array.dtype != jax_dtype(view.dtype)):
            return None
        was_last, was_issued = self._last is array, self._issued is array
        del array  # counted below: only the block, self._last and self._issued may hold it
        if not _array_held_only_by(block, was_last + was_issued):
            return None
        checks.raise_pending(self.device)
        lent = _donated(block.array)
        block.array = lent
        if was_last:
            self._last = lent
        if was_issued:
            self._issued = lent
        lent.block_until_ready()
        COSTS.wait()
        return torch.from_dlpack(lent).view(view.size)

    def to_host_into(self, array: Any, out: torch.Tensor) -> None:
        """One copy, from jax's read-only host view into ``out``'s memory."""
        checks.raise_pending(self.device)
        if modes._mode == "fused":
            array = fused.resolve(array)
        if isinstance(array, JaxView):
            whole = array.array.size * array.array.dtype.itemsize
            if _covers(array.spec, whole) and array.array.dtype == jax_dtype(array.spec.dtype):
                array = array.array
            else:
                array = _read(array.array, array.spec)
        carrier = _HOST_CARRIER.get(out.dtype)
        target = out.view(carrier[0]).numpy() if carrier else out.numpy()
        source = np.asarray(array)
        np.copyto(target.reshape(-1), (source.view(_np_int(carrier[0])) if carrier else source).reshape(-1))
        COSTS.wait()

    def array_meta(self, array: Any) -> tuple[tuple[int, ...], torch.dtype]:
        if type(array) is JaxView:
            return array.spec.size, array.spec.dtype
        return array.shape, torch_dtype(array.dtype)

    def cast(self, array: Any, dtype: torch.dtype) -> jax.Array:
        if isinstance(array, JaxView):
            array = _read(array.array, array.spec)
        return _cast(array, jax_dtype(dtype))

    def read_bytes(self, block: Holder, nbytes: int) -> torch.Tensor:
        checks.raise_pending(self.device)
        if block.array is None:
            return torch.zeros(nbytes, dtype=torch.uint8)
        if type(block.array) is Pending:
            block.array = fused.concrete(block.array)
        host = np.array(block.array).reshape(-1).view(np.uint8)
        COSTS.wait()
        return torch.from_numpy(host[:nbytes].copy())

    def write_bytes(self, block: Holder, data: torch.Tensor) -> None:
        if data.numel() < block.nbytes:
            whole = self.read_bytes(block, block.nbytes)  # already a private copy
            whole[: data.numel()] = data
            block.array = self._put(whole.numpy())
        else:
            block.array = self.from_host(data)

    def settle(self, results: Any) -> None:
        if checks.pending():
            checks.settle(results, self.device)

    def synchronize(self) -> None:
        fused.flush("synchronize")
        checks.raise_pending(self.device)
        if type(self._last) is Pending:
            self._last = self._last.value
        if self._last is not None:
            self._last.block_until_ready()
        if self._issued is not None:
            if type(self._issued) is Pending:
                self._issued = self._issued.value
            self._issued.block_until_ready()
            self._issued = None
        COSTS.wait()


def _np_int(dtype: torch.dtype) -> Any:
    return {torch.uint16: np.uint16, torch.uint8: np.uint8}[dtype]
