"""The runtime's table of numbers PyTorch checks (``accelkit/_runtime/dispatch/scalar_checks.py``),
re-derived against the installed PyTorch's CPU kernels by the survey in ``scalar_survey.py``,
so the table cannot drift from the CPU; and the shortcuts the runtime takes before asking the
CPU, checked to accept nothing the CPU refuses."""

from __future__ import annotations

import math

import pytest
import scalar_survey as survey
import torch

import accelkit
from accelkit import _runtime
from accelkit._runtime.dispatch import scalar_checks as checks
from accelkit._runtime.dispatch.scalar_checks import NumberCheck, checked_arguments, guard

aten = torch.ops.aten


@pytest.fixture(scope="module")
def surveyed() -> tuple[dict[str, tuple[str, ...]], list[str]]:
    return survey.survey()


def test_the_table_holds_exactly_the_arguments_the_cpu_checks(surveyed):
    table, unprobed = surveyed
    found = {(op, name) for op, names in table.items() for name in names}
    covered = {(str(op), name) for op, name, _ in survey.candidates()
               if any(n == name for _, n, _ in checked_arguments(op))}
    assert sorted(found - covered) == [], "the CPU checks these and the runtime does not"
    extra = covered - found
    assert sorted(e for e in extra if f"{e[0]}:{e[1]}" not in unprobed) == [], (
        "the runtime checks these and the CPU does not")
    # the runtime's rule reaches what the survey could not run only through its siblings
    assert {f"{op}:{name}" for op, name in extra} <= set(unprobed)


def test_the_candidates_the_survey_cannot_run_are_the_known_ones(surveyed):
    _, unprobed = surveyed
    reasons = {entry: [p for p in survey.UNPROBED if entry.startswith(p)] for entry in unprobed}
    assert [entry for entry, matched in reasons.items() if not matched] == []
    assert sorted(set(survey.UNPROBED) - {p for m in reasons.values() for p in m}) == []


def test_every_entry_names_an_op_and_arguments_that_exist():
    for table in (checks.CHECKED_NUMBERS, checks.CHECKED_TENSOR_NUMBERS):
        for name, arguments in table.items():
            packet = getattr(aten, name)
            names = {a.name for ov in packet.overloads() for a in getattr(packet, ov)._schema.arguments}
            assert set(arguments) <= names, name


def boundary_values(dtype: torch.dtype, empty: bool) -> list:
    """Numbers at the edges of what the runtime's shortcuts accept beside ``dtype`` tensors:
    its range's ends, the default float dtype's (a float beside integers), and the numbers
    every dtype takes."""
    values: list = [0, 1, 127, 127.0, 0.5, True, -1, -0.5, math.inf, -math.inf, math.nan]
    for d in (dtype, torch.get_default_dtype()):
        low, high, _ = checks._range(d)
        if math.isfinite(high):
            values += [low, high, float(low), float(high)]
    return values


def test_the_shortcuts_accept_nothing_the_cpu_refuses(surveyed):
    """Steps 1 and 2 of the check let a number through without asking the CPU: for every
    checked argument, every dtype and every number at their edges, a number let through must
    be one the CPU takes."""
    table, _ = surveyed
    kinds = {(str(op), name): kind for op, name, kind in survey.candidates()}
    accepted, refused = 0, []
    for op_name, names in table.items():
        op = eval("torch.ops." + op_name)  # noqa: S307 - our own table of overload names
        check = NumberCheck(None, op)
        for name in names:
            for args, kwargs, value in survey.settings(op, name, kinds[(op_name, name)], boundary_values):
                if name == "step" and abs(value) < 1:
                    continue  # a step that truncates to 0 crashes the CPU's integer range (SIGFPE)
                if check.settled(args, kwargs):
                    accepted += 1
                    if survey.overflows(op, args, kwargs):
                        refused.append((op_name, name, value))
    assert refused == []
    assert accepted > 10000  # the shortcuts are taken, and checked


def test_a_tensor_standing_for_a_number_passes_unread_only_when_its_dtype_fits():
    check = NumberCheck(None, aten.masked_fill.Tensor)
    x, mask = torch.zeros(2, dtype=torch.int8), torch.tensor([True, False])
    assert check.settled((x, mask, torch.tensor(5, dtype=torch.int8)), {})
    assert check.settled((x, mask, torch.tensor(True)), {})
    assert not check.settled((x, mask, torch.tensor(5)), {})  # int64 may not fit: read it
    half = torch.zeros(2, dtype=torch.float16)
    assert check.settled((torch.zeros(2), mask, torch.tensor(-math.inf, dtype=torch.float16)), {})
    assert not check.settled((half, mask, torch.tensor(-1e9)), {})


def test_ops_the_cpu_does_not_check_are_registered_unwrapped():
    ctx = _runtime.active()

    def kernel(*args, **kwargs):
        return None

    for op in (aten.mul.Tensor, aten.div.Tensor, aten.eq.Scalar, aten.sum.default, aten.copy_.default):
        assert guard(ctx, op, kernel) is kernel, op
    assert guard(ctx, aten.add.Tensor, kernel) is not kernel
    assert checked_arguments(aten.add.Tensor) == ((2, "alpha", checks.NUMBER),)
    assert checked_arguments(aten.fill_.Scalar) == ((1, "value", checks.NUMBER),)
    assert checked_arguments(aten.masked_fill.Tensor) == ((2, "value", checks.TENSOR),)
    assert checked_arguments(aten.multi_margin_loss.default) == ((2, "p", checks.OWN_TYPE),)
    assert checked_arguments(aten.fill_.Tensor) == ()  # a same-device value is copied, unchecked


def test_a_decomposed_op_is_checked_before_it_decomposes(dev):
    """On ref, addcmul has no kernel: it runs as its out= overload's decomposition, whose
    parts would wrap the number silently."""
    x = torch.ones(3, dtype=torch.int8).to(dev)
    accelkit.reset_stats()
    torch.addcmul(x, x, x, value=2)
    assert accelkit.stats()["ops"]["aten.addcmul.out"]["decomposed"] == 1
    with pytest.raises(RuntimeError, match="value cannot be converted to type int8_t without overflow"):
        torch.addcmul(x, x, x, value=1000)
