"""Bad input on the device under test gives CPU PyTorch's outcome, and loses nothing.

Every case of :mod:`accelkit_conformance.bad_input` (out-of-range indices in every indexing op,
loss targets, integer division by zero, overflowing fills, and the near misses CPU accepts),
then random indices in and out of range for reads, writes and scatters: the device's outcome
is the CPU's (the values when it returns, the exception type when it raises), errors surface by
the next synchronisation, and a failed op leaves its target as it was.
"""

from __future__ import annotations

import pytest
import torch
from accelkit_conformance.bad_input import CASES, CPU, Outcome, check_like_cpu, outcome
from accelkit_conformance.compare import assert_same
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelkit.sdk.testing import device_under_test

DEVICE = device_under_test()


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_matches_cpu(name):
    check_like_cpu(CASES[name], DEVICE)


def test_the_table_is_bad_input_on_cpu():
    """Each case CPU refuses raises there (IndexError or RuntimeError, not a TypeError of the
    case itself), each declared valid one returns, and each repaired one returns."""
    for name, case in CASES.items():
        got = outcome(case.reference, case.inputs(CPU), CPU)
        if case.valid:
            assert got.error is None, f"{name} is declared valid, but on CPU it {got.describe()}"
        else:
            assert isinstance(got.error, (IndexError, RuntimeError)), f"{name}: on CPU it {got.describe()}"
        repaired = outcome(case.reference, {**case.inputs(CPU), **case.repair(CPU)}, CPU)
        assert repaired.error is None, f"{name} repaired: on CPU it {repaired.describe()}"
        for unchanged in case.unchanged or ():
            assert unchanged in case.inputs(CPU), f"{name}: no input {unchanged!r}"


def test_the_check_catches_a_half_written_tensor():
    """CPU itself writes row 0 of ``x[[0, 5]] = -1`` before it raises: the check, stricter than
    the CPU, refuses that."""
    with pytest.raises(AssertionError, match="the failed x\\[idx\\] = v changed 'x'"):
        check_like_cpu(CASES["setitem.row"], CPU)


# -- random indices -------------------------------------------------------------------------------

#: Few examples over few shapes: each new geometry is a new program on a compiling backend.
RANDOM = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow])
SIZES = st.integers(1, 3)


def _grid(device: torch.device, rows: int, cols: int) -> torch.Tensor:
    return torch.arange(rows * cols, dtype=torch.float32, device=device).reshape(rows, cols)


@st.composite
def _indexed_grid(draw):
    """(rows, cols, dim, index values): an index along ``dim``, each value within two of the
    dimension's range on either side, so about half the draws are out of range."""
    rows, cols, dim = draw(SIZES), draw(SIZES), draw(st.sampled_from([0, 1]))
    size = (rows, cols)[dim]
    values = draw(st.lists(st.integers(-size - 2, size + 1), min_size=1, max_size=3))
    return rows, cols, dim, values


def _compare(run, build, device: torch.device, target: str, where: str) -> None:
    """``run(**build(d))`` on the CPU and on ``device``: the same values, or the same exception
    type with ``target`` unchanged on the device."""
    expected = outcome(run, build(CPU), CPU)
    inputs = build(device)
    before = inputs[target].cpu().clone()
    got = outcome(run, inputs, device)
    if expected.error is not None:
        assert isinstance(got.error, type(expected.error)), (
            f"{where}: on CPU it {expected.describe()}; on the device it {got.describe()}")
        assert torch.equal(inputs[target].cpu(), before), f"{where}: the failed op changed {target}"
    else:
        assert got.error is None, f"{where}: on CPU it {expected.describe()}; on the device it {got.describe()}"
        assert_same(got.value, expected.value, where=where)
    _assert_still_works(device)


def _assert_still_works(device: torch.device) -> None:
    assert torch.equal((torch.arange(4.0, device=device) * 2).cpu(), torch.arange(4.0) * 2)


@RANDOM
@given(case=_indexed_grid())
def test_random_index_read_matches_cpu(case):
    rows, cols, dim, values = case

    def build(d):
        return {"x": _grid(d, rows, cols), "idx": torch.tensor(values, device=d)}

    def read(x, idx):
        return x[idx] if dim == 0 else x[:, idx]

    _compare(read, build, DEVICE, "x", f"x[{'' if dim == 0 else ':, '}{values}] of a {rows}x{cols} x")


@RANDOM
@given(case=_indexed_grid(), value=st.sampled_from([-1.0, 7.5]))
def test_random_index_write_matches_cpu(case, value):
    rows, cols, dim, values = case

    def build(d):
        return {"x": _grid(d, rows, cols), "idx": torch.tensor(values, device=d)}

    def write(x, idx):
        if dim == 0:
            x[idx] = value
        else:
            x[:, idx] = value
        return x

    _compare(write, build, DEVICE, "x", f"x[{'' if dim == 0 else ':, '}{values}] = {value} on a {rows}x{cols} x")


@st.composite
def _scatter(draw):
    """(op, rows, cols, dim, index rows): an index no larger than the target in any dimension,
    its values within two of the scattered dimension's range on either side."""
    rows, cols, dim = draw(SIZES), draw(SIZES), draw(st.sampled_from([0, 1]))
    size = (rows, cols)[dim]
    index_rows, index_cols = draw(st.integers(1, rows)), draw(st.integers(1, cols))
    index = draw(st.lists(st.lists(st.integers(-2, size + 1), min_size=index_cols, max_size=index_cols),
                          min_size=index_rows, max_size=index_rows))
    return draw(st.sampled_from(["scatter_", "scatter_add_", "index_put_"])), rows, cols, dim, index


def _index_put_along(x: torch.Tensor, dim: int, idx: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``x[idx[0]] += 10`` along ``dim`` (along 1 through the transposed view)."""
    (x if dim == 0 else x.t()).index_put_((idx[0],), src[0, 0], accumulate=True)
    return x


#: Scatters whose result does not depend on the order of duplicate indices.
SCATTERS = {
    "scatter_": lambda x, dim, idx, src: x.scatter_(dim, idx, -1.0),
    "scatter_add_": lambda x, dim, idx, src: x.scatter_add_(dim, idx, src),
    "index_put_": _index_put_along,
}


@RANDOM
@given(case=_scatter())
def test_random_index_scatter_matches_cpu(case):
    op, rows, cols, dim, index = case

    def build(d):
        return {"x": _grid(d, rows, cols), "idx": torch.tensor(index, device=d),
                "src": torch.full((len(index), len(index[0])), 10.0, device=d)}

    def scatter(x, idx, src):
        return SCATTERS[op](x, dim, idx, src)

    _compare(scatter, build, DEVICE, "x", f"x.{op}(dim={dim}, index={index}) on a {rows}x{cols} x")


def test_outcome_reports_what_happened():
    """The comparison's own building block: a value, or the error raised by the read-back."""
    assert outcome(lambda x: x + 1, {"x": torch.ones(2)}, CPU).value.tolist() == [2.0, 2.0]
    failed = outcome(lambda x: x[torch.tensor([3])], {"x": torch.ones(2)}, CPU)
    assert isinstance(failed, Outcome) and isinstance(failed.error, IndexError)
    assert "index 3 is out of bounds" in failed.describe()
