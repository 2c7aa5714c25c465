"""The survey behind :data:`accelkit._runtime.dispatch.scalar_checks.CHECKED_SCALARS`: which aten
overloads' CPU kernels refuse a number that does not fit the tensor's dtype.

Every aten overload with a number argument (``Scalar``, ``Scalar?``, ``Scalar[]``) is a
candidate, and so is every overload of the same op that takes a 0-dim tensor where a sibling
takes that number (``masked_fill.Tensor`` beside ``masked_fill.Scalar``). Overloads PyTorch
implements as CompositeImplicitAutograd are left out: they decompose before reaching any
device, so the ops they decompose into carry the check.

For each candidate argument and each dtype in :data:`DTYPES`, the survey builds a call from
the schema (tensors of that dtype, bool masks, int64 indices, defaults elsewhere), runs it on
the CPU with an in-range number (the control), then with numbers outside that dtype's range
and outside every narrower one's. An argument is *checked* when one of them raises PyTorch's
``value cannot be converted to type ... without overflow``. A candidate whose control fails for
every dtype (sparse-only or quantized ops, ops needing structured inputs) is *unprobed*.

``python tests/scalar_survey.py`` prints the table in the form the runtime module holds it.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._ops import OpOverload

aten = torch.ops.aten

#: The dtypes every candidate is tried with.
DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool,
          torch.float16, torch.bfloat16, torch.float32, torch.float64)

#: What PyTorch's checked conversion says when a number does not fit (c10::checked_convert).
OVERFLOW = "without overflow"

#: Arguments that hold indices (int64), masks (bool) or a 1-D list of positions.
_INDEX_NAMES = frozenset({"index", "indices", "target"})
_MASK_NAMES = frozenset({"mask", "condition"})


def _number_kind(t: Any) -> str | None:
    """``"scalar"`` for Scalar / Scalar?, ``"list"`` for Scalar[], else None."""
    if t.kind() == "OptionalType":
        t = t.getElementType()
    if t.kind() == "NumberType":
        return "scalar"
    if t.kind() == "ListType" and t.getElementType().kind() == "NumberType":
        return "list"
    return None


def _is_tensor(t: Any) -> bool:
    if t.kind() == "OptionalType":
        t = t.getElementType()
    return t.kind() == "TensorType"


def _is_out(arg: Any) -> bool:
    return arg.kwarg_only and arg.alias_info is not None and arg.alias_info.is_write


def all_overloads() -> Iterator[OpOverload]:
    for qualified in sorted(torch._C._dispatch_get_all_op_names()):
        if not qualified.startswith("aten::"):
            continue
        name, _, overload = qualified[len("aten::"):].partition(".")
        try:
            yield getattr(getattr(aten, name), overload or "default")
        except (AttributeError, RuntimeError):
            continue


def _reaches_a_device(op: OpOverload) -> bool:
    """Whether a device can see ``op``: it takes a tensor or a device, and PyTorch does not
    decompose it above the device (CompositeImplicitAutograd)."""
    if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
        return False
    return any("Tensor" in str(a.type) or a.name == "device" for a in op._schema.arguments)


#: Ops with number arguments that are not computations on tensors: export-time assertions
#: about symbolic sizes, whose only tensor is a dependency token.
NOT_COMPUTATIONS = frozenset({
    "aten::_functional_assert_scalar", "aten::_functional_sym_constrain_range",
    "aten::_functional_sym_constrain_range_for_size",
})


@functools.cache
def candidates() -> list[tuple[OpOverload, str, str]]:
    """(overload, argument name, ``"scalar" | "list" | "tensor"``) for every candidate."""
    found: list[tuple[OpOverload, str, str]] = []
    number_names: dict[str, set[str]] = {}  # op name without a trailing _ -> its number arguments
    overloads = [op for op in all_overloads()
                 if _reaches_a_device(op) and op._schema.name not in NOT_COMPUTATIONS]
    for op in overloads:
        for arg in op._schema.arguments:
            kind = _number_kind(arg.type)
            if kind is not None:
                found.append((op, arg.name, kind))
                number_names.setdefault(op._schema.name.rstrip("_"), set()).add(arg.name)
    for op in overloads:
        names = number_names.get(op._schema.name.rstrip("_"), set())
        for arg in op._schema.arguments:
            if arg.name != "self" and arg.name in names and _is_tensor(arg.type) and not _is_out(arg):
                found.append((op, arg.name, "tensor"))
    return found


# -- building a call ------------------------------------------------------------------------------


def _tensor(name: str, dtype: torch.dtype, shape: tuple[int, ...], index_1d: bool) -> torch.Tensor:
    if name in _MASK_NAMES:
        return (torch.arange(torch.Size(shape).numel()) % 2 == 0).reshape(shape)
    if name in _INDEX_NAMES:
        return torch.zeros(shape[:1] if index_1d else shape, dtype=torch.int64)
    return torch.ones(shape, dtype=dtype)


#: Shapes tried for the tensors of a call, until the control call runs: (shape for a name,
#: whether indices are 1-D).
_PROFILES: tuple[tuple[Callable[[str], tuple[int, ...]], bool], ...] = (
    (lambda name: (2,), True),
    (lambda name: (2,), False),
    (lambda name: {"mat": (2, 2)}.get(name, (2,)), True),
    (lambda name: {"vec": (2,), "vec1": (2,), "vec2": (2,), "batch1": (2, 2, 2),
                   "batch2": (2, 2, 2)}.get(name, (2, 2)), True),
    (lambda name: (2, 2, 2), True),
)

_INT_BY_NAME = {"dim": 0, "bins": 4, "steps": 2}
_INTS_BY_NAME = {"pad": [1, 1], "size": [2], "dims": [0], "dim": [0]}
#: Tensors that stand for one number (``linspace.Tensor_Tensor``'s start and end): 0-dim.
_NUMBER_TENSOR_NAMES = frozenset({"start", "end", "scalar", "scalars"})
_NUMBER_BY_NAME = {"end": 2, "step": 1, "start": 0}


class Unbuildable(Exception):
    """The schema has an argument the survey cannot make a value for."""


def build(op: OpOverload, dtype: torch.dtype, profile: int, probed: str, kind: str, value: Any,
          out_dtype: torch.dtype, empty: bool = False) -> tuple[list, dict]:
    """Arguments for ``op`` with tensors of ``dtype`` (with no elements when ``empty``) and
    ``value`` in argument ``probed``."""
    shape_for, index_1d = _PROFILES[profile]

    def shape_of(name: str) -> tuple[int, ...]:
        shape = shape_for(name)
        return (0, *shape[1:]) if empty else shape

    # A factory (no tensors but numbers in tensor form, like linspace.Tensor_Tensor's ends)
    # makes the dtype under test.
    has_tensors = any(_is_tensor(a.type) or "Tensor" in str(a.type) for a in op._schema.arguments
                      if a.name != probed and not _is_out(a) and a.name not in _NUMBER_TENSOR_NAMES)
    foreach = op._schema.name.startswith("aten::_foreach_")
    args: list = []
    kwargs: dict = {}
    for arg in op._schema.arguments:
        t = arg.type
        optional = t.kind() == "OptionalType"
        inner = t.getElementType() if optional else t
        k = inner.kind()
        if arg.name == probed:
            if kind == "tensor":
                v = torch.tensor([value] * 2 if foreach else value,
                                 dtype=torch.float64 if abs(value) >= 2**63 else None)
            elif kind == "list":
                v = [value, value]
            else:
                v = value
        elif _is_out(arg):
            if k == "ListType":  # the outs of a foreach op: one per input tensor
                v = [torch.empty(shape_of(arg.name), dtype=out_dtype) for _ in range(2)]
            else:
                v = torch.empty(0, dtype=out_dtype)
        elif k == "TensorType":
            if optional and arg.has_default_value():
                v = None
            elif arg.name in _NUMBER_TENSOR_NAMES or (foreach and arg.name == "other"):
                # a foreach op's packed scalars hold one number per tensor
                v = torch.ones(2 if foreach and arg.name == "scalars" else (), dtype=dtype)
            else:
                v = _tensor(arg.name, dtype, shape_of(arg.name), index_1d)
        elif k == "ListType" and inner.getElementType().kind() in ("TensorType", "OptionalType"):
            if arg.name in _INDEX_NAMES:
                v = [torch.zeros(shape_of(arg.name)[:1], dtype=torch.int64)]
            else:
                v = [_tensor(arg.name, dtype, shape_of(arg.name), index_1d) for _ in range(2)]
        elif _number_kind(t) == "scalar":
            v = None if optional else (arg.default_value if arg.has_default_value()
                                       else _NUMBER_BY_NAME.get(arg.name, 1))
        elif _number_kind(t) == "list":
            v = [1, 1]
        elif str(arg.real_type) == "ScalarType" and not arg.has_default_value():
            v = dtype
        elif arg.name == "dtype" and not has_tensors:
            v = dtype  # a factory: its dtype is the one under test
        elif arg.has_default_value():
            v = arg.default_value
        elif optional:
            v = None
        elif k == "IntType" or k == "SymIntType":
            v = _INT_BY_NAME.get(arg.name, 1)
        elif k == "ListType" and str(inner.getElementType()) in ("int", "SymInt"):
            v = _INTS_BY_NAME.get(arg.name, [1])
        elif k == "FloatType":
            v = 0.5
        elif k == "BoolType":
            v = False
        elif k == "StringType" and arg.name == "reduce":
            v = "add"
        else:
            raise Unbuildable(f"{arg.name}: {t}")
        if arg.kwarg_only:
            kwargs[arg.name] = v
        else:
            args.append(v)
    return args, kwargs


def run(op: OpOverload, args: list, kwargs: dict) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        op(*args, **kwargs)


def overflows(op: OpOverload, args: list, kwargs: dict) -> bool:
    """Whether the CPU refuses this call with PyTorch's overflow error."""
    try:
        run(op, args, kwargs)
    except RuntimeError as error:
        return OVERFLOW in str(error)
    except Exception:  # noqa: BLE001 - any other refusal is not the overflow check
        return False
    return False


def control_value(probed: str) -> int:
    return 0 if probed in ("start", "min") else 1


def moderate_values(dtype: torch.dtype) -> list[Any]:
    """Numbers just outside ``dtype``'s range that are still small (at most 2**17), so that
    an op whose work grows with the number (``arange``'s end, a polynomial's degree) stays
    cheap: tried on non-empty tensors."""
    return {
        torch.int8: [128, -129, float("nan")], torch.uint8: [256, -256], torch.int16: [32768, -32769],
        torch.bool: [2], torch.float16: [131008.0, -131008.0],
    }.get(dtype, [])


def huge_values(dtype: torch.dtype) -> list[Any]:
    """Numbers outside ``dtype``'s range and outside the wider types an op might convert to
    instead (its accumulation type, float32 for reduced floats): tried on empty tensors, so
    no op does work proportional to them. Floats first: they fail a conversion before an op
    can size anything by them."""
    values: list[Any] = [1e300, -1e300]
    if not dtype.is_floating_point and dtype != torch.bool:
        info = torch.iinfo(dtype)
        values += [float("nan")] + ([info.max + 1, info.min - 1] if info.bits >= 32 else []) + [2**40]
    return values


@functools.cache
def find_setup(op: OpOverload, probed: str, kind: str, dtype: torch.dtype,
               empty: bool) -> tuple[int, torch.dtype] | None:
    """(profile, out dtype) for which the control call with ``dtype`` runs, or None."""
    out_dtypes = (dtype, torch.bool, torch.int64, torch.float32) if any(
        _is_out(a) for a in op._schema.arguments) else (dtype,)
    for profile in range(len(_PROFILES)):
        for out_dtype in out_dtypes:
            try:
                args, kwargs = build(op, dtype, profile, probed, kind, control_value(probed),
                                     out_dtype, empty)
                run(op, args, kwargs)
            except Unbuildable:
                return None
            except Exception:  # noqa: BLE001 - try the next setup
                continue
            return profile, out_dtype
    return None


def settings(op: OpOverload, probed: str, kind: str,
             values_for: Callable[[torch.dtype, bool], list[Any]]) -> Iterator[tuple[list, dict, Any]]:
    """(args, kwargs, value) for each dtype whose control call runs and each of
    ``values_for(dtype, empty)``: small numbers on tensors with elements; numbers that could
    make an op work in proportion to them (huge ones) only beside tensors made empty, or in a
    factory, only those that cannot size a result. So a polynomial's degree given as the only tensor
    (``laguerre_polynomial_l.x_scalar``) gets small numbers only."""
    others = [a for a in op._schema.arguments if "Tensor" in str(a.type) and a.name != probed
              and not _is_out(a) and a.name not in _NUMBER_TENSOR_NAMES]
    factory = not others and any(a.name == "dtype" or _is_out(a) for a in op._schema.arguments)
    phases = [False] + ([True] if others or factory else [])
    for empty in phases:
        for dtype in DTYPES:
            values = [v for v in values_for(dtype, empty)
                      if not (kind == "tensor" and v != v) and (not empty or not factory or _sizes_nothing(v))
                      and (empty or not isinstance(v, (int, float)) or v != v or abs(v) <= SMALL)]
            if not values:
                continue
            setup = find_setup(op, probed, kind, dtype, empty)
            if setup is None:
                continue
            profile, out_dtype = setup
            for value in values:
                args, kwargs = build(op, dtype, profile, probed, kind, value, out_dtype, empty)
                yield args, kwargs, value


#: The largest number tried on tensors with elements.
SMALL = 2**17


def _sizes_nothing(value: Any) -> bool:
    """Whether a factory cannot size a result by ``value``: it is not finite, or too large
    for any size (arange's end of 2**31 would make an 8 GiB result)."""
    return isinstance(value, float) and (not math.isfinite(value) or abs(value) >= 2.0**64)


def out_of_range(dtype: torch.dtype, empty: bool) -> list[Any]:
    return huge_values(dtype) if empty else moderate_values(dtype)


def probe(op: OpOverload, probed: str, kind: str) -> bool | None:
    """Whether the CPU refuses an out-of-range number in argument ``probed`` (for some dtype);
    None when no call could be made."""
    tried = False
    for args, kwargs, _ in settings(op, probed, kind, out_of_range):
        if overflows(op, args, kwargs):
            return True
        tried = True
    return False if tried else None


#: Why the survey cannot run some candidates on the CPU, by overload name prefix.
UNPROBED = {
    "aten.segment_reduce": "needs consistent segment lengths",
    "aten._segment_reduce_backward": "needs consistent segment lengths",
    "aten._sparse_semi_structured_addmm": "sparse tensors only",
    "aten.sparse_sampled_addmm": "sparse tensors only",
    "aten.sspaddmm": "sparse tensors only",
    "aten.native_norm": "sparse tensors only",
    "aten.addmm.dtype": "no CPU kernel (CUDA only)",
    "aten.baddbmm.dtype": "no CPU kernel (CUDA only)",
    "aten.cudnn_convolution_add_relu": "no CPU kernel (CUDA only)",
    "aten.miopen_convolution_add_relu": "no CPU kernel (ROCm only)",
}


@functools.cache
def survey() -> tuple[dict[str, tuple[str, ...]], list[str]]:
    """(the checked arguments of each checked overload, the unprobed candidates as
    ``overload:argument``)."""
    torch.set_num_threads(1)  # small tensors: threads only cost
    checked: dict[str, list[str]] = {}
    unprobed: list[str] = []
    for op, name, kind in candidates():
        refuses = probe(op, name, kind)
        if refuses:
            checked.setdefault(str(op), []).append(name)
        elif refuses is None:
            unprobed.append(f"{op}:{name}")
    return {op: tuple(names) for op, names in sorted(checked.items())}, sorted(unprobed)


if __name__ == "__main__":
    table, missing = survey()
    for op, names in table.items():
        print(f"    {op!r}: {names!r},")
    print(f"# {len(table)} overloads; unprobed: {len(missing)}")
    for entry in missing:
        print("#  ", entry)
