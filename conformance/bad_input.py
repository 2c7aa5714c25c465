"""Bad input, held to CPU PyTorch's semantics: one table of cases and the check that runs one.

Every case is an op given input PyTorch refuses on the CPU (an index out of range, an integer
divisor of zero, a fill value its dtype cannot hold) or a near miss it accepts (``ignore_index``,
a float division by zero, a fill CPU wraps), so a backend is held both to raising and to not
raising. :func:`check_like_cpu` runs a case on the CPU and on the device and demands the CPU's
outcome:

- where the CPU raises, the device raises the same exception type (or a subclass), and CPU's
  message is part of the device's (a device may add what names the op or the device); where the
  CPU returns, the device returns the same values;
- the error surfaces no later than the op's results are read to the host and the device is
  synchronised (a substrate that cannot raise inside a program, like XLA, raises there);
- the inputs the case names are unchanged, in particular by a failed op. This is stricter than
  the CPU, whose indexing and scatter kernels write the elements before the bad one
  (``x[[0, 5]] = 1`` leaves row 0 written): on an accelerator a failed op must lose nothing;
- afterwards the device still works: the same op on the same tensors, with the bad input
  repaired, gives the CPU's values.

Where PyTorch itself computes an op differently on an accelerator than on the CPU (``one_hot``
leaves its class check to scatter's, as on CUDA), the reference is that computation, run on the
CPU. A case names the op it exercises, builds its inputs deterministically on a given device and runs
the op on them; ``core`` marks the cases the conformance contract suite holds every backend to
(out-of-range read, write, scatter, gather, embedding and loss target; integer division by zero;
an overflowing fill). Names are ``<op>.<what>``, valid as pytest parameter ids.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from accelkit_conformance.compare import assert_same, map_tensors

Inputs = dict[str, Any]
CPU = torch.device("cpu")


@dataclass(frozen=True)
class BadInput:
    """One case: ``run(**inputs(device))`` on bad input, compared with the CPU.

    :ivar name: ``<op>.<what>``, unique; the pytest parameter id.
    :ivar op: the user-facing call it exercises, e.g. ``"x[idx] = v"`` or ``"torch.gather"``.
    :ivar inputs: the op's arguments on ``device`` by name, the same values on every call.
    :ivar run: runs the op on ``**inputs``; an in-place op returns its target.
    :ivar repair: replacements (by name) that make the input valid, for the follow-up; empty
        when the case is valid as it is.
    :ivar unchanged: names of the inputs the op must leave as they were (a failed op its
        target); None: every tensor input.
    :ivar core: held to by the conformance contract suite.
    :ivar valid: CPU accepts these inputs (a near miss the device must not refuse).
    :ivar accelerator_path: for an op PyTorch itself computes differently on an accelerator than
        on the CPU, that computation: the expected outcome is it, run on the CPU.
    """

    name: str
    op: str
    inputs: Callable[[torch.device], Inputs]
    run: Callable[..., Any]
    repair: Callable[[torch.device], Inputs] = field(default=lambda device: {})
    unchanged: tuple[str, ...] | None = None
    core: bool = False
    valid: bool = False
    accelerator_path: Callable[..., Any] | None = None

    @property
    def reference(self) -> Callable[..., Any]:
        """What the device is compared with, run on the CPU."""
        return self.accelerator_path or self.run

    def __repr__(self) -> str:
        return f"BadInput({self.name})"


# -- running a case -------------------------------------------------------------------------------


def run_to_host(run: Callable[..., Any], inputs: Inputs, device: torch.device) -> Any:
    """``run(**inputs)`` with its tensors read to the host and ``device`` synchronised, so an
    error the device defers (to its next synchronisation point) surfaces here."""
    result = map_tensors(run(**inputs), lambda t: t.detach().to(CPU))
    torch.get_device_module(device).synchronize()
    return result


@dataclass(frozen=True)
class Outcome:
    """What running a case gave: a host ``value`` or the ``error`` it raised."""

    value: Any = None
    error: Exception | None = None

    def describe(self) -> str:
        if self.error is not None:
            return f"raised {type(self.error).__name__}({str(self.error)!r})"
        return f"returned {self.value!r}"


def outcome(run: Callable[..., Any], inputs: Inputs, device: torch.device) -> Outcome:
    """The :class:`Outcome` of ``run(**inputs)`` on ``device`` (see :func:`run_to_host`)."""
    try:
        return Outcome(value=run_to_host(run, inputs, device))
    except Exception as error:  # noqa: BLE001 - every error is an outcome to compare
        return Outcome(error=error)


def assert_same_outcome(got: Outcome, expected: Outcome, *, where: str) -> None:
    """Assert the device's outcome is the CPU's: the same exception type with CPU's message
    contained in the device's, or the same values."""
    if expected.error is not None:
        if not isinstance(got.error, type(expected.error)):
            raise AssertionError(f"{where}: on CPU it {expected.describe()}; on the device it {got.describe()}")
        if str(expected.error) not in str(got.error):
            raise AssertionError(
                f"{where}: the device's {type(got.error).__name__} does not contain CPU's message "
                f"{str(expected.error)!r}: {str(got.error)!r}"
            )
        return
    if got.error is not None:
        raise AssertionError(f"{where}: on CPU it {expected.describe()}; on the device it {got.describe()}")
    assert_same(got.value, expected.value, where=where)


def _snapshot(inputs: Inputs, names: tuple[str, ...] | None) -> dict[str, torch.Tensor]:
    if names is None:
        names = tuple(name for name, value in inputs.items() if isinstance(value, torch.Tensor))
    return {name: inputs[name].detach().to(CPU).clone() for name in names}


def check_like_cpu(case: BadInput, device: torch.device) -> Outcome:
    """Run ``case`` on the CPU and on ``device`` and assert the device behaves as the CPU does
    (see the module docstring); returns the device's outcome."""
    expected = outcome(case.reference, case.inputs(CPU), CPU)
    inputs = case.inputs(device)
    before = _snapshot(inputs, case.unchanged)
    got = outcome(case.run, inputs, device)
    assert_same_outcome(got, expected, where=f"{case.name} ({case.op})")
    for name, value in before.items():
        after = inputs[name].detach().to(CPU)
        if not torch.equal(after, value):
            what = "the failed" if got.error is not None else "the"
            raise AssertionError(f"{case.name}: {what} {case.op} changed {name!r}: {value.tolist()} -> {after.tolist()}")
    cpu_inputs = case.inputs(CPU)
    repaired, cpu_repaired = {**inputs, **case.repair(device)}, {**cpu_inputs, **case.repair(CPU)}
    again = outcome(case.run, repaired, device)
    assert_same_outcome(again, outcome(case.reference, cpu_repaired, CPU),
                        where=f"{case.name}: the repaired {case.op} afterwards")
    assert_same(
        {name: value for name, value in repaired.items() if isinstance(value, torch.Tensor)},
        {name: value for name, value in cpu_repaired.items() if isinstance(value, torch.Tensor)},
        where=f"{case.name}: the inputs after the repaired {case.op}",
    )
    return got


# -- inputs ---------------------------------------------------------------------------------------


def _grid(device: torch.device, rows: int = 2, cols: int = 3) -> torch.Tensor:
    """``[[0., 1., 2.], [3., 4., 5.]]`` (by default) on ``device``."""
    return torch.arange(rows * cols, dtype=torch.float32, device=device).reshape(rows, cols)


def _long(values: Any, device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)


def _tens(*shape: int) -> Callable[[torch.device], torch.Tensor]:
    """A tensor of tens (values unlike the grid's, so a write shows)."""
    return lambda device: torch.full(shape, 10.0, device=device)


def _setitem(x: torch.Tensor, idx: Any, v: Any) -> torch.Tensor:
    x[idx] = v
    return x


def _on_grid(name: str, op: str, run: Callable[..., Any], bad: Any, good: Any, *, host: bool = False,
             core: bool = False, **more: Callable[[torch.device], torch.Tensor]) -> BadInput:
    """A case of ``run(x, idx, **more)`` on the 2 x 3 grid ``x`` with the index ``bad``
    (repaired: ``good``), on the device or, for ``host``, on the CPU as users may pass it."""
    where = (lambda device: CPU) if host else (lambda device: device)
    return BadInput(
        name, op,
        inputs=lambda d: {"x": _grid(d), "idx": _long(bad, where(d)), **{k: build(d) for k, build in more.items()}},
        run=run,
        repair=lambda d: {"idx": _long(good, where(d))},
        core=core,
    )


# -- the table ------------------------------------------------------------------------------------


def _indexing_cases() -> list[BadInput]:
    """Out-of-range indices in every indexing op: reads, writes, scatters and lookups."""
    row_out, row_in = [0, 5], [0, 1]  # rows of the 2 x 3 grid
    col_out, col_in = [[0, 3]], [[0, 2]]  # columns, as a [1, 2] gather/scatter index
    col_list_out, col_list_in = [0, 3], [0, 2]  # columns, as a list
    two = {"rows": lambda d: _long([0, 1], d)}
    return [
        _on_grid("getitem.row", "x[idx]", lambda x, idx: x[idx], row_out, row_in, core=True),
        _on_grid("getitem.negative", "x[idx]", lambda x, idx: x[idx], [1, -3], [1, -2]),
        _on_grid("getitem.column", "x[:, idx]", lambda x, idx: x[:, idx], [2, 3], [2, 1]),
        _on_grid("getitem.two_indices", "x[rows, idx]", lambda x, idx, rows: x[rows, idx], [1, 3], [1, 2], **two),
        _on_grid("getitem.host_index", "x[cpu_idx]", lambda x, idx: x[idx], row_out, row_in, host=True, core=True),
        _on_grid("setitem.row", "x[idx] = v", lambda x, idx: _setitem(x, idx, -1.0), row_out, row_in, core=True),
        _on_grid("setitem.column", "x[:, idx] = v", lambda x, idx, v: _setitem(x, (slice(None), idx), v),
                 col_list_out, col_list_in, v=_tens(2, 2)),
        _on_grid("setitem.negative", "x[idx] = v", lambda x, idx: _setitem(x, idx, -1.0), [-3], [-2]),
        _on_grid("setitem.two_indices", "x[rows, idx] = v", lambda x, idx, rows: _setitem(x, (rows, idx), -1.0),
                 [2, 3], [2, 0], **two),
        _on_grid("setitem.host_index", "x[cpu_idx] = v", lambda x, idx: _setitem(x, idx, -1.0), row_out, row_in,
                 host=True),
        _on_grid("index_select", "torch.index_select", lambda x, idx: torch.index_select(x, 1, idx),
                 col_list_out, col_list_in),
        _on_grid("index_put_", "x.index_put_", lambda x, idx, v: x.index_put_((idx,), v), row_out, row_in,
                 v=_tens(3)),
        _on_grid("index_put_.accumulate", "x.index_put_(accumulate=True)",
                 lambda x, idx, v: x.index_put_((idx,), v, accumulate=True), [1, 5], [1, 1], v=_tens(3)),
        _on_grid("index_add_", "x.index_add_", lambda x, idx, v: x.index_add_(1, idx, v), col_list_out, col_list_in,
                 v=_tens(2, 2)),
        _on_grid("index_copy_", "x.index_copy_", lambda x, idx, v: x.index_copy_(1, idx, v),
                 col_list_out, col_list_in, v=_tens(2, 2)),
        _on_grid("index_fill_", "x.index_fill_", lambda x, idx: x.index_fill_(1, idx, -1.0), col_list_out, col_list_in),
        _on_grid("scatter_.src", "x.scatter_(dim, index, src)", lambda x, idx, v: x.scatter_(1, idx, v),
                 col_out, col_in, core=True, v=_tens(1, 2)),
        _on_grid("scatter_.value", "x.scatter_(dim, index, value)", lambda x, idx: x.scatter_(1, idx, -1.0),
                 col_out, col_in),
        _on_grid("scatter_.negative", "x.scatter_(dim, index, src)", lambda x, idx, v: x.scatter_(1, idx, v),
                 [[0, -1]], col_in, v=_tens(1, 2)),
        _on_grid("scatter_add_", "x.scatter_add_", lambda x, idx, v: x.scatter_add_(1, idx, v), col_out, col_in,
                 v=_tens(1, 2)),
        _on_grid("scatter_reduce_", "x.scatter_reduce_(reduce='amax')",
                 lambda x, idx, v: x.scatter_reduce_(1, idx, v, "amax"), col_out, col_in, v=_tens(1, 2)),
        _on_grid("gather", "torch.gather", lambda x, idx: torch.gather(x, 1, idx), col_out, col_in, core=True),
        _on_grid("gather.negative", "torch.gather", lambda x, idx: torch.gather(x, 1, idx), [[-1, 0]], col_in),
        _on_grid("take", "torch.take", lambda x, idx: torch.take(x, idx), [0, 6], [0, 5]),
        _on_grid("take.negative", "torch.take", lambda x, idx: torch.take(x, idx), [-7], [-6]),
        _on_grid("put_", "x.put_", lambda x, idx, v: x.put_(idx, v), [0, 6], [0, 5], v=_tens(2)),
        _on_grid("put_.accumulate", "x.put_(accumulate=True)", lambda x, idx, v: x.put_(idx, v, accumulate=True),
                 [1, -7], [1, -1], v=_tens(2)),
        _on_grid("embedding", "F.embedding", lambda x, idx: F.embedding(idx, x), [1, 3], [1, 0], core=True),
        _on_grid("embedding.negative", "F.embedding", lambda x, idx: F.embedding(idx, x), [-1], [0]),
    ]


def _logits(device: torch.device) -> torch.Tensor:
    return (torch.arange(6, dtype=torch.float32, device=device).reshape(2, 3) - 2.5) / 2


def _loss_cases() -> list[BadInput]:
    """Class targets outside ``[0, C)`` that are not ``ignore_index``; ``one_hot`` classes."""
    losses = {
        "nll_loss": lambda x, target, **kw: F.nll_loss(F.log_softmax(x, 1), target, **kw),
        "cross_entropy": lambda x, target, **kw: F.cross_entropy(x, target, **kw),
    }
    cases = []
    for name, loss in losses.items():
        core = name == "cross_entropy"

        def case(what: str, target: list[int], run: Callable[..., Any] = loss, **more: Any) -> BadInput:
            return BadInput(f"{name}.{what}", f"F.{name}", lambda d: {"x": _logits(d), "target": _long(target, d)},
                            run, lambda d: {"target": _long([0, 2], d)}, **more)

        cases += [
            case("target_too_large", [0, 5], core=core),
            case("target_negative", [0, -2]),
            case("reduction_none", [3, 1], lambda x, target, loss=loss: loss(x, target, reduction="none")),
            case("ignore_index", [0, -100], core=core, valid=True),
            case("custom_ignore_index", [7, 1], lambda x, target, loss=loss: loss(x, target, ignore_index=7),
                 valid=True),
        ]
    for what, classes in (("too_large", [0, 3]), ("negative", [-1, 1])):
        cases.append(BadInput(f"one_hot.{what}", "F.one_hot", lambda d, classes=classes: {"idx": _long(classes, d)},
                              lambda idx: F.one_hot(idx, 3), lambda d: {"idx": _long([0, 2], d)},
                              accelerator_path=_one_hot_by_scatter))
    return cases


def _one_hot_by_scatter(idx: torch.Tensor) -> torch.Tensor:
    """``F.one_hot(idx, 3)`` as PyTorch computes it on an accelerator (CUDA, XLA, PrivateUse1):
    its classes are not checked on the host (that would synchronise), scatter's own index
    check raises instead ("index 3 is out of bounds for dimension 1 with size 3", CPU's
    "Class values must be smaller than num_classes." is never reached)."""
    return torch.zeros(*idx.shape, 3, dtype=torch.int64, device=idx.device).scatter_(-1, idx.unsqueeze(-1), 1)


#: Integer division and remainder, by rounding: (functional op, in-place op, op with out=).
_DIVISIONS = {
    "floor_divide": (lambda a, z: a // z, lambda a, z: a.floor_divide_(z),
                     lambda a, z, out: torch.floor_divide(a, z, out=out)),
    "div_floor": (lambda a, z: torch.div(a, z, rounding_mode="floor"),
                  lambda a, z: a.div_(z, rounding_mode="floor"),
                  lambda a, z, out: torch.div(a, z, rounding_mode="floor", out=out)),
    "div_trunc": (lambda a, z: torch.div(a, z, rounding_mode="trunc"),
                  lambda a, z: a.div_(z, rounding_mode="trunc"),
                  lambda a, z, out: torch.div(a, z, rounding_mode="trunc", out=out)),
    "remainder": (lambda a, z: a % z, lambda a, z: a.remainder_(z),
                  lambda a, z, out: torch.remainder(a, z, out=out)),
    "fmod": (lambda a, z: torch.fmod(a, z), lambda a, z: a.fmod_(z),
             lambda a, z, out: torch.fmod(a, z, out=out)),
}


def _operands(dtype: torch.dtype, divisor: list[int] | int, *, out: bool = False) -> Callable[[torch.device], Inputs]:
    """``a = [7, -7, 6]`` and the divisor ``z`` (a tensor, or a Python int), with ``out`` zeros."""
    def build(d: torch.device) -> Inputs:
        inputs = {"a": torch.tensor([7, -7, 6], dtype=dtype, device=d),
                  "z": divisor if isinstance(divisor, int) else torch.tensor(divisor, dtype=dtype, device=d)}
        if out:
            inputs["out"] = torch.zeros(3, dtype=dtype, device=d)
        return inputs

    return build


def _division_cases() -> list[BadInput]:
    """Integer division and remainder by zero (CPU raises), per rounding, dtype and form: a
    tensor divisor with a zero in it, the Python scalar 0, in place and into ``out=``; and the
    divisions by zero that CPU computes (true division of integers, floats)."""
    cases = []
    for dtype in (torch.int32, torch.int64):
        dt = str(dtype).removeprefix("torch.")
        tensor, scalar, into = _operands(dtype, [2, 0, -4]), _operands(dtype, 0), _operands(dtype, [2, 0, -4], out=True)
        nonzero = _operands(dtype, [2, 3, -4])
        repair = lambda d, nonzero=nonzero: {"z": nonzero(d)["z"]}  # noqa: E731
        for name, (functional, in_place, with_out) in _DIVISIONS.items():
            core = (name, dtype) in (("floor_divide", torch.int64), ("remainder", torch.int32))
            cases += [
                BadInput(f"{name}.{dt}.tensor", name, tensor, functional, repair, core=core),
                BadInput(f"{name}.{dt}.scalar", name, scalar, functional, lambda d: {"z": 3}),
                BadInput(f"{name}.{dt}.in_place", f"{name}_", tensor, in_place, repair),
                BadInput(f"{name}.{dt}.out", f"{name}(out=)", into, with_out, repair),
            ]
        cases.append(BadInput(f"div.{dt}.true_division", "torch.div", tensor, lambda a, z: torch.div(a, z), valid=True))
    cases.append(BadInput("floor_divide.float32", "a // z",
                          lambda d: {"a": torch.tensor([1.0, -1.0, 0.0], device=d), "z": torch.zeros(3, device=d)},
                          lambda a, z: a // z, valid=True))
    return cases


def _int8(d: torch.device) -> torch.Tensor:
    return torch.tensor([1, 2, 3], dtype=torch.int8, device=d)


def _full(dtype: torch.dtype, value: Any, fitting: Any = None, **more: Any) -> BadInput:
    """``torch.full((2,), value, dtype=dtype)`` (repaired: ``fitting``)."""
    return BadInput(f"full.{str(dtype).removeprefix('torch.')}", "torch.full", lambda d: {"value": value, "device": d},
                    lambda value, device: torch.full((2,), value, dtype=dtype, device=device),
                    lambda d: {} if fitting is None else {"value": fitting}, **more)


def _fill_cases() -> list[BadInput]:
    """Fill values the dtype cannot hold (CPU: "value cannot be converted to type int8_t without
    overflow"), and the ones CPU accepts: -1 for uint8, a tensor-valued fill, True from 5."""
    int8 = lambda d: {"x": _int8(d), "value": 1000}  # noqa: E731
    fitting = lambda d: {"value": 100}  # noqa: E731
    mask = lambda d: torch.tensor([True, False, True], device=d)  # noqa: E731
    return [
        _full(torch.int8, 1000, 100, core=True),
        _full(torch.int32, 2**40, 2**30),
        _full(torch.float16, 1e6, 6e4),
        BadInput("full.uint8_minus_one", "torch.full", lambda d: {"value": -1, "device": d},
                 lambda value, device: torch.full((2,), value, dtype=torch.uint8, device=device), valid=True),
        _full(torch.bool, 5, valid=True),
        BadInput("fill_.int8", "x.fill_", int8, lambda x, value: x.fill_(value), fitting, core=True),
        BadInput("fill_.tensor_value", "x.fill_(tensor)",
                 lambda d: {"x": _int8(d), "value": torch.tensor(1000, device=d)},
                 lambda x, value: x.fill_(value), unchanged=("value",), valid=True),
        BadInput("new_full.int8", "x.new_full", int8, lambda x, value: x.new_full((2,), value), fitting),
        BadInput("new_full.uint8", "x.new_full", lambda d: {"x": _int8(d).to(torch.uint8), "value": 300},
                 lambda x, value: x.new_full((2,), value), fitting),
        BadInput("masked_fill_.int8", "x.masked_fill_", lambda d: {**int8(d), "mask": mask(d)},
                 lambda x, mask, value: x.masked_fill_(mask, value), fitting),
        BadInput("index_fill_.int8", "x.index_fill_", lambda d: {**int8(d), "idx": _long([0, 2], d)},
                 lambda x, idx, value: x.index_fill_(0, idx, value), fitting),
        BadInput("setitem.int8_value", "x[i] = value", int8, lambda x, value: _setitem(x, 1, value), fitting),
    ]


#: Every case, by name.
CASES: dict[str, BadInput] = {case.name: case for case in (
    _indexing_cases() + _loss_cases() + _division_cases() + _fill_cases()
)}
#: The cases the conformance contract suite holds every backend to.
CORE: dict[str, BadInput] = {name: case for name, case in CASES.items() if case.core}
