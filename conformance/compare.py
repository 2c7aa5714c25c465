"""Moving test values between the device and the CPU, and comparing results with CPU's.

A comparison failure raises :class:`AssertionError` (the test's outcome is ``fail``); any other
exception from the device is an ``error``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

#: Default (atol, rtol) per result dtype. Looser than torch.testing's defaults: a backend may
#: legitimately compute through decompositions or a different reduction order than CPU's.
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.complex128: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-4),
    torch.complex64: (1e-4, 1e-4),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1e-2, 1.6e-2),
}


def map_tensors(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``value`` with ``fn`` applied to every tensor inside lists, tuples and dicts."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple / torch.return_types
        return type(value)(*(map_tensors(v, fn) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    return value


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor inside ``value`` (depth first)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from tensors_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors_in(v)


def to_cpu_leaf(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of ``t`` with the same values, strides where possible, and ``requires_grad``."""
    with torch.no_grad():
        out = t.detach().to("cpu")
    return out.requires_grad_(t.requires_grad) if t.requires_grad else out


def to_device_leaf(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A device copy of CPU tensor ``t`` that keeps its strides and ``requires_grad``.

    A non-contiguous ``t`` becomes the same strided view of a device copy of its storage, so
    the device sees the same memory layout as the CPU.
    """
    with torch.no_grad():
        if t.is_contiguous() or t.layout != torch.strided or t.numel() == 0:
            out = t.detach().to(device)
        else:
            flat = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage())
            out = flat.to(device).as_strided(t.size(), t.stride(), t.storage_offset())
    return out.requires_grad_(t.requires_grad) if t.requires_grad else out


def copy_sample(sample: Any, device: torch.device | None = None) -> Any:
    """A copy of an OpInfo ``SampleInput`` whose CPU tensors are on ``device`` (a CPU clone when
    None), as the sample itself would behave there.

    Each CPU storage is copied once and every tensor rebuilt as the same view of its copy (one
    copy per tensor object), so strides, overlapping elements (an expanded input) and aliasing
    between arguments (``out=`` the input itself) are the sample's. Tensors elsewhere (``meta``)
    stay where they are; a ``device`` argument naming the CPU (``device=`` or positional) names
    ``device``.
    """
    copies: dict[tuple[int, torch.dtype], torch.Tensor] = {}
    tensors: dict[int, torch.Tensor] = {}  # id(tensor) -> its copy; the sample keeps ids alive

    def move(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            return t  # a dtype, or a tensor deliberately elsewhere
        if id(t) not in tensors:
            tensors[id(t)] = copy(t)
        return tensors[id(t)]

    def copy(t: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            if t.layout != torch.strided:
                out = t.detach().to(device) if device is not None else t.detach().clone()
            else:
                storage = t.untyped_storage()
                # A storage of no bytes has no address to share: it is its own.
                key = (storage.data_ptr(), t.dtype) if storage.nbytes() else (id(t), t.dtype)
                whole = copies.get(key)
                if whole is None:
                    flat = torch.empty(0, dtype=t.dtype).set_(storage)
                    whole = copies[key] = flat.to(device) if device is not None else flat.clone()
                out = whole.as_strided(t.size(), t.stride(), t.storage_offset())
        return out.requires_grad_(t.requires_grad) if t.requires_grad else out

    copied = sample.transform(move)
    if device is not None:
        def point(value: Any) -> Any:
            named_cpu = (isinstance(value, torch.device) and value.type == "cpu") or (
                isinstance(value, str) and value == "cpu")
            return device if named_cpu else value

        copied.args = tuple(point(a) for a in copied.args)
        if "device" in copied.kwargs:
            copied.kwargs["device"] = point(copied.kwargs["device"])
    return copied


def tolerance_for(dtype: torch.dtype, override: Any = None) -> tuple[float, float]:
    """(atol, rtol) for comparing a result of ``dtype``; integers and bools compare exactly."""
    if not (dtype.is_floating_point or dtype.is_complex):
        return 0.0, 0.0
    if override is not None:
        return override.atol, override.rtol
    return DEFAULT_TOLERANCES.get(dtype, (1e-4, 1e-4))


def assert_same(actual: Any, expected: Any, *, where: str = "output", tolerance: Any = None) -> None:
    """Assert a device result equals the CPU result: same structure, dtypes, shapes and values.

    ``actual`` may hold device tensors; ``expected`` holds CPU tensors. NaNs compare equal.
    ``tolerance`` (an object with ``atol``/``rtol``) overrides the per-dtype defaults for
    floating results.
    """
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise AssertionError(f"{where}: expected a tensor, got {type(actual).__name__}")
        if actual.dtype != expected.dtype:
            raise AssertionError(f"{where}: dtype {actual.dtype} on the device, {expected.dtype} on CPU")
        if actual.shape != expected.shape:
            raise AssertionError(f"{where}: shape {tuple(actual.shape)} on the device, {tuple(expected.shape)} on CPU")
        if expected.layout != torch.strided:
            expected = expected.to_dense()
            actual = actual.to_dense()
        got = actual.detach().to("cpu")
        atol, rtol = tolerance_for(expected.dtype, tolerance)
        torch.testing.assert_close(
            got, expected.detach(), atol=atol, rtol=rtol, equal_nan=True,
            check_device=False, msg=lambda m: f"{where}: {m}",
        )
        return
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            raise AssertionError(f"{where}: expected a sequence of {len(expected)}, got {_describe(actual)}")
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, where=f"{where}[{i}]", tolerance=tolerance)
        return
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            raise AssertionError(f"{where}: expected keys {sorted(expected)}, got {_describe(actual)}")
        for k in expected:
            assert_same(actual[k], expected[k], where=f"{where}[{k!r}]", tolerance=tolerance)
        return
    if isinstance(expected, float) and isinstance(actual, (int, float)) and not isinstance(actual, bool):
        if math.isnan(expected) and math.isnan(actual):
            return
        atol, rtol = tolerance_for(torch.float32, tolerance)
        if not math.isclose(actual, expected, rel_tol=rtol, abs_tol=atol):
            raise AssertionError(f"{where}: {actual!r} on the device, {expected!r} on CPU")
        return
    if actual != expected:
        raise AssertionError(f"{where}: {actual!r} on the device, {expected!r} on CPU")


def _describe(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__
