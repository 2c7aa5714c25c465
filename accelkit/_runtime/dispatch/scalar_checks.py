"""PyTorch's rule that a number must fit the tensor it is used with, applied on every device.

CPU kernels convert some number arguments — ``fill_``'s value, ``clamp``'s bounds, ``add``'s
``alpha`` — with c10's checked conversion, which refuses a number the target type cannot hold:
``torch.full((2,), 1000, dtype=torch.int8)`` raises ``RuntimeError: value cannot be converted
to type int8_t without overflow``. A backend that converts on its own wraps 1000 to -24 and
computes garbage. The runtime applies the CPU's rule to the same arguments of the same ops,
before the backend's kernel runs, on every path a call takes: native kernels and their derived
in-place and ``out=`` variants (:func:`guard`), decompositions (:func:`guard_plan`); the CPU
fallback runs the CPU kernel itself. Ops PyTorch decomposes above the device
(CompositeImplicitAutograd: ``where`` with a number, ``clip``) reach one of these.

Which arguments: :data:`CHECKED_NUMBERS` and :data:`CHECKED_TENSOR_NUMBERS` (a 0-dim tensor
standing for the number, as in ``masked_fill.Tensor``), derived by the survey in
``tests/scalar_survey.py``: every aten overload reaching a device with a number argument (and
every sibling taking that argument as a tensor) is run on the CPU with tensors of ten dtypes
and numbers outside each dtype's range; those that raise the overflow error are listed here.
``tests/test_scalar_table.py`` re-runs the survey against the installed PyTorch and fails when
this table and the CPU disagree. An entry names an op (in-place and overload suffixes
dropped) and covers every overload of it that has the argument — also the few the survey
cannot run on the CPU (CUDA-only ``addmm.dtype``), which get their siblings' rule.

How a call is checked, cheapest first:

1. a number in [0, 127] (or a bool) fits every dtype: nothing more to do;
2. otherwise, a number inside the range every tensor of the call can hold — and, when it is a
   float beside integer tensors, the default float dtype it may promote to — fits whatever the
   op converts it to (the result dtype, or a wider compute type). Signed ranges are taken
   symmetric (``sub`` negates its alpha); a 0-dim tensor fits when its dtype's range lies
   inside; inf and nan fit when every tensor is floating. Arguments converted to a type of
   their own (:data:`OWN_TYPE_NUMBERS`) skip this step;
3. anything else (uint8's -1, ``clamp`` of an int tensor with a float bound, complex numbers)
   is decided by the CPU itself: the op runs on host copies of its arguments, and its overflow
   error, if it raises one, is raised here. Nothing has run on the device yet.

``tests/test_scalar_table.py`` also checks that steps 1 and 2 accept nothing the CPU refuses.
Ops outside the table pay nothing; an op in it pays a few hundred nanoseconds per call for
steps 1-2, and a host copy of its arguments for step 3.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch._ops import OpOverload

from accelkit._runtime.device import tensors as T
from accelkit._runtime.device.context import BackendContext

#: Number arguments (``Scalar``, ``Scalar?``, ``Scalar[]``) whose CPU kernels refuse a value
#: that does not fit, by op name (see the module docstring).
CHECKED_NUMBERS: dict[str, tuple[str, ...]] = {
    "_add_relu": ("alpha",),
    "_addmm_activation": ("alpha", "beta"),
    "_foreach_add": ("alpha",),
    "_foreach_addcdiv": ("scalars", "value"),
    "_foreach_addcmul": ("scalars", "value"),
    "_foreach_clamp_max": ("scalar", "scalars"),
    "_foreach_clamp_min": ("scalar", "scalars"),
    "_foreach_lerp": ("weight",),
    "_foreach_maximum": ("scalar", "scalars"),
    "_foreach_minimum": ("scalar", "scalars"),
    "_foreach_pow": ("exponent",),
    "_foreach_sub": ("alpha",),
    "_sparse_addmm": ("alpha", "beta"),
    "_unsafe_masked_index": ("fill",),
    "add": ("alpha",),
    "addbmm": ("alpha", "beta"),
    "addcdiv": ("value",),
    "addcmul": ("value",),
    "addmm": ("alpha", "beta"),
    "addmv": ("alpha", "beta"),
    "addr": ("alpha", "beta"),
    "arange": ("end", "start", "step"),
    "baddbmm": ("alpha", "beta"),
    "celu": ("alpha",),
    "clamp": ("max", "min"),
    "clamp_max": ("max",),
    "clamp_min": ("min",),
    "constant_pad_nd": ("value",),
    "elu": ("alpha", "input_scale", "scale"),
    "elu_backward": ("alpha", "input_scale", "scale"),
    "fill": ("value",),
    "full": ("fill_value",),
    "full_like": ("fill_value",),
    "hardshrink": ("lambd",),
    "hardshrink_backward": ("lambd",),
    "hardtanh": ("max_val", "min_val"),
    "hardtanh_backward": ("max_val", "min_val"),
    "histc": ("max", "min"),
    "index_add": ("alpha",),
    "index_fill": ("value",),
    "leaky_relu": ("negative_slope",),
    "leaky_relu_backward": ("negative_slope",),
    "lerp": ("weight",),
    "linspace": ("end", "start"),
    "logspace": ("end", "start"),
    "masked_fill": ("value",),
    "multi_margin_loss": ("p",),
    "multi_margin_loss_backward": ("p",),
    "new_full": ("fill_value",),
    "pow": ("exponent",),
    "range": ("end", "start", "step"),
    "rrelu_with_noise": ("lower", "upper"),
    "rrelu_with_noise_backward": ("lower", "upper"),
    "rrelu_with_noise_functional": ("lower", "upper"),
    "rsub": ("alpha",),
    "scalar_tensor": ("s",),
    "scatter": ("value",),
    "softplus": ("beta", "threshold"),
    "softplus_backward": ("beta", "threshold"),
    "softshrink_backward": ("lambd",),
    "sub": ("alpha",),
    "threshold": ("threshold", "value"),
    "threshold_backward": ("threshold",),
}

#: Tensor arguments standing for numbers (0-dim, or a foreach op's packed list) that the CPU
#: reads and converts with the same check, by op name.
CHECKED_TENSOR_NUMBERS: dict[str, tuple[str, ...]] = {
    "_foreach_addcdiv": ("scalars",),
    "_foreach_addcmul": ("scalars",),
    "index_fill": ("value",),
    "linspace": ("end", "start"),
    "logspace": ("end", "start"),
    "masked_fill": ("value",),
}

#: Number arguments converted to a type of their own rather than the tensors' (multi margin
#: loss reads its norm degree as an int): step 2 of the check does not apply to them. Found by
#: ``tests/test_scalar_table.py``, which fails on any other such argument.
OWN_TYPE_NUMBERS: dict[str, tuple[str, ...]] = {
    "multi_margin_loss": ("p",),
    "multi_margin_loss_backward": ("p",),
}

#: What c10's checked conversion says; only this error is taken from the CPU's verdict.
OVERFLOW = "without overflow"

#: Arguments that never take part in type promotion (integer indices).
_INDEX_ARGUMENTS = frozenset({"index", "indices"})

_Tensor = torch.Tensor
_INF = math.inf


def op_name(op: OpOverload) -> str:
    """``op``'s name as the tables key it: no namespace, overload or in-place suffix."""
    name = op._schema.name.split("::", 1)[1]
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def _is_number_type(t: Any) -> bool:
    if t.kind() == "OptionalType":
        t = t.getElementType()
    if t.kind() == "ListType":
        t = t.getElementType()
    return t.kind() == "NumberType"


#: How an argument is checked: a number, a number of its own type, a tensor of numbers.
NUMBER, OWN_TYPE, TENSOR = "number", "own type", "tensor"


def checked_arguments(op: OpOverload) -> tuple[tuple[int, str, str], ...]:
    """(position, name, how) of each argument of ``op`` the CPU checks; empty for almost
    every op."""
    name = op_name(op)
    numbers, tensors = CHECKED_NUMBERS.get(name, ()), CHECKED_TENSOR_NUMBERS.get(name, ())
    if not numbers and not tensors:
        return ()
    own_type = OWN_TYPE_NUMBERS.get(name, ())
    found = []
    for position, arg in enumerate(op._schema.arguments):
        if arg.name in numbers and _is_number_type(arg.type):
            found.append((position, arg.name, OWN_TYPE if arg.name in own_type else NUMBER))
        elif arg.name in tensors and "Tensor" in str(arg.type) and not arg.is_out:
            found.append((position, arg.name, TENSOR))
    return tuple(found)


# -- what every tensor of a call can hold ---------------------------------------------------------


@functools.cache
def _range(dtype: torch.dtype) -> tuple[float, float, bool]:
    """(lowest, highest, whether inf and nan fit) for numbers any op may convert to ``dtype``
    or to a wider type it computes in; an empty range for dtypes without one (quantized)."""
    if dtype == torch.bool:
        return -_INF, _INF, True
    if dtype.is_floating_point or dtype.is_complex:
        top = float(torch.finfo(dtype).max)
        return -top, top, True
    try:
        info = torch.iinfo(dtype)
    except TypeError:
        return 1.0, 0.0, False
    if info.min == 0:
        return 0, info.max, False
    return -info.max, info.max, False  # symmetric: an op may negate the number (sub's alpha)


class _Call:
    """Where, in a call of one op, the tensors (and the ``dtype``) are whose types a number
    must fit (see the module docstring, step 2)."""

    def __init__(self, op: OpOverload, checked: tuple[tuple[int, str, str], ...]):
        numbered = {position for position, _, _ in checked}
        self.tensors: list[tuple[int, str]] = []
        self.dtype: tuple[int, str] | None = None
        for position, arg in enumerate(op._schema.arguments):
            if position in numbered or arg.name in _INDEX_ARGUMENTS:
                continue
            if "Tensor" in str(arg.type):
                self.tensors.append((position, arg.name))
            elif arg.name == "dtype":
                self.dtype = (position, arg.name)

    def dtypes(self, args: tuple, kwargs: dict) -> tuple[torch.dtype, ...]:
        found = []
        count = len(args)
        for position, name in self.tensors:
            value = args[position] if position < count else kwargs.get(name)
            if isinstance(value, _Tensor):
                found.append(value.dtype)
            elif type(value) is list or type(value) is tuple:
                found.extend(v.dtype for v in value if isinstance(v, _Tensor))
        if self.dtype is not None:
            position, name = self.dtype
            dtype = args[position] if position < count else kwargs.get(name)
            if dtype is not None:
                found.append(dtype)
        return tuple(found)


#: dtypes of a call's tensors -> (lowest, highest, inf/nan fit, all floating): see _fits.
_INTERSECTIONS: dict[tuple[torch.dtype, ...], tuple[float, float, bool, bool]] = {}


def _intersection(dtypes: tuple[torch.dtype, ...]) -> tuple[float, float, bool, bool]:
    found = _INTERSECTIONS.get(dtypes)
    if found is None:
        low, high, nonfinite = -_INF, _INF, True
        for dtype in dtypes:
            least, most, takes_nonfinite = _range(dtype)
            low, high, nonfinite = max(low, least), min(high, most), nonfinite and takes_nonfinite
        floating = all(d.is_floating_point or d.is_complex for d in dtypes)
        if len(_INTERSECTIONS) > 4096:
            _INTERSECTIONS.clear()
        found = _INTERSECTIONS[dtypes] = (low, high, nonfinite, floating)
    return found


def _fits(value: Any, dtypes: tuple[torch.dtype, ...]) -> bool:
    """Step 2: ``value`` (a Python number) fits beside tensors of ``dtypes``: inside all their
    ranges — and the default float dtype's when a float meets integer tensors it may promote
    (or stands alone in a factory without a dtype, where an int is an int64)."""
    kind = type(value)
    if kind is not int and kind is not float:
        return kind is bool
    if not dtypes:
        dtypes = (torch.get_default_dtype() if kind is float else torch.int64,)
    low, high, nonfinite, floating = _intersection(dtypes)
    if kind is float and not floating:
        low, high, nonfinite, _ = _intersection((*dtypes, torch.get_default_dtype()))
    return low <= value <= high or (nonfinite and kind is float and not math.isfinite(value))


@functools.cache
def _values(dtype: torch.dtype) -> tuple[float, float, bool]:
    """(lowest, highest, whether inf and nan occur) among the values a ``dtype`` tensor holds."""
    if dtype == torch.bool:
        return 0, 1, False
    if dtype.is_floating_point or dtype.is_complex:
        top = float(torch.finfo(dtype).max)
        return -top, top, True
    try:
        info = torch.iinfo(dtype)
    except TypeError:
        return -_INF, _INF, True
    return info.min, info.max, False


def _tensor_fits(value: _Tensor, dtypes: tuple[torch.dtype, ...]) -> bool:
    """Step 2 for a tensor standing for numbers: every value its dtype can hold fits every one
    of ``dtypes`` (no need to read it from the device). Such a number is stored as it is,
    never negated, so the ranges are the dtypes' own."""
    low, high, nonfinite = _values(value.dtype)
    for dtype in dtypes:
        if dtype == torch.bool:
            continue
        least, most, takes_nonfinite = _values(dtype)
        if not (least <= low and high <= most and (takes_nonfinite or not nonfinite)):
            return False
    return True


def _plain(value: Any) -> bool:
    """Step 1: a number that fits every dtype."""
    kind = type(value)
    return kind is bool or ((kind is int or kind is float) and 0 <= value <= 127)


# -- the CPU's verdict ----------------------------------------------------------------------------


def _on_host(ctx: BackendContext, value: Any) -> Any:
    if isinstance(value, _Tensor):
        return T.to_host(ctx, value) if value.device.type == ctx.name else value
    if isinstance(value, (list, tuple)):
        return type(value)(_on_host(ctx, v) for v in value)
    if isinstance(value, torch.device) and value.type == ctx.name:
        return torch.device("cpu")
    if isinstance(value, str) and value.split(":")[0] == ctx.name:
        return "cpu"
    if isinstance(value, torch.Generator):
        return torch.Generator()  # leaves the device's and the CPU's streams where they are
    return value


def ask_the_cpu(ctx: BackendContext, op: OpOverload, args: tuple, kwargs: dict) -> None:
    """Run ``op`` on host copies of its arguments; raise the overflow error the CPU raises
    (PyTorch's own message), and nothing else: any other refusal is the device's to give."""
    host_args = [_on_host(ctx, a) for a in args]
    host_kwargs = {k: _on_host(ctx, v) for k, v in kwargs.items()}
    if host_kwargs.get("pin_memory"):
        host_kwargs["pin_memory"] = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            op(*host_args, **host_kwargs)
    except RuntimeError as error:
        if OVERFLOW in str(error):
            raise RuntimeError(str(error)) from None
    except Exception:  # noqa: BLE001 - not the overflow check: the device path decides
        pass


class NumberCheck:
    """The check of one op's checked arguments (see the module docstring)."""

    def __init__(self, ctx: BackendContext, op: OpOverload):
        self.ctx = ctx
        self.op = op
        self.checked = checked_arguments(op)
        self._call = _Call(op, self.checked) if self.checked else None

    def settled(self, args: tuple, kwargs: dict) -> bool:
        """Whether steps 1-2 show that every checked argument of this call fits."""
        for position, name, how in self.checked:
            value = args[position] if position < len(args) else kwargs.get(name)
            if value is None or _plain(value):
                continue
            if how is OWN_TYPE:
                return False
            dtypes = self._call.dtypes(args, kwargs)
            if how is TENSOR:
                if not (isinstance(value, _Tensor) and _tensor_fits(value, dtypes)):
                    return False
            elif type(value) is list or type(value) is tuple:
                if not all(_plain(v) or _fits(v, dtypes) for v in value):
                    return False
            elif not _fits(value, dtypes):
                return False
        return True

    def __call__(self, args: tuple, kwargs: dict) -> None:
        """Raise PyTorch's overflow error when a checked argument of this call does not fit."""
        if not self.settled(args, kwargs):
            self.ask(args, kwargs)

    def ask(self, args: tuple, kwargs: dict) -> None:
        """Step 3: the CPU's verdict on this call."""
        ask_the_cpu(self.ctx, self.op, args, kwargs)


def guard(ctx: BackendContext, op: OpOverload, kernel: Callable[..., Any]) -> Callable[..., Any]:
    """``kernel`` (a PrivateUse1 kernel of ``op``) behind the number check; ``kernel`` itself
    for ops the CPU does not check. Step 1 runs inline: a call whose numbers all lie in
    [0, 127] costs one loop over them."""
    check = NumberCheck(ctx, op)
    if not check.checked:
        return kernel
    slots = tuple((position, name) for position, name, how in check.checked if how is not TENSOR)
    if len(slots) < len(check.checked):  # a tensor standing for a number: always step 2
        def tensor_checked(*args: Any, **kwargs: Any) -> Any:
            check(args, kwargs)
            return kernel(*args, **kwargs)

        return tensor_checked
    keyword_only = all(op._schema.arguments[position].kwarg_only for position, _ in slots)
    settled, ask = check.settled, check.ask

    def checked_kernel(*args: Any, **kwargs: Any) -> Any:
        if kwargs or not keyword_only:  # add.Tensor left at alpha=1 passes no keywords
            count = len(args)
            for position, name in slots:
                value = args[position] if position < count else kwargs.get(name)
                kind = type(value)  # step 1, as _plain
                if value is None or kind is bool or ((kind is float or kind is int) and 0 <= value <= 127):
                    continue
                if not settled(args, kwargs):
                    ask(args, kwargs)
                break
        return kernel(*args, **kwargs)

    return checked_kernel


def guard_plan(ctx: BackendContext, op: OpOverload, plan: Callable[..., Any]) -> Callable[..., Any]:
    """Like :func:`guard`, for a plan of the boxed fallback, called as ``plan(op, *args,
    **kwargs)``."""
    check = NumberCheck(ctx, op)
    if not check.checked:
        return plan

    def checked_plan(op: OpOverload, *args: Any, **kwargs: Any) -> Any:
        check(args, kwargs)
        return plan(op, *args, **kwargs)

    return checked_plan
