"""Device-side checks on tpu: when a refused value is reported, what it says, and what it keeps.

CPU PyTorch is the reference for the errors; the device-generic cases of every op live in
``accelkit/sdk/testing/generic/test_bad_input.py``. Here: the machinery — strict mode reports at the next
synchronisation, debug mode at the op, a refused in-place write leaves its tensor as it was,
several failures are each reported, and waiting statuses stay bounded.
"""

from __future__ import annotations

import pytest
import torch

from accelkit_backends.tpu import checks, execution_mode

OUT_OF_BOUNDS = "index 5 is out of bounds for dimension 0 with size 3"


@pytest.fixture(autouse=True)
def no_pending(dev):
    """Every test starts and ends with no status waiting: a failure one test left unreported
    would surface in whichever test synchronises next."""
    torch.tpu.synchronize()
    yield
    left = checks.pending()
    torch.tpu.synchronize()
    assert left == 0, f"{left} statuses were left waiting"


def _bad_index(dev):
    return torch.tensor([0, 5], device=dev)


def test_strict_mode_reports_at_the_next_synchronisation_naming_the_op(dev):
    x = torch.arange(3.0, device=dev)
    y = x[_bad_index(dev)]  # returns: the program cannot raise
    assert checks.pending() >= 1
    z = x + 1  # later ops run as usual
    with pytest.raises(IndexError, match=OUT_OF_BOUNDS) as info:
        z.cpu()
    message = str(info.value)
    assert "aten.index.Tensor on tpu:0" in message and "ACCELKIT_TPU_MODE=debug" in message
    assert checks.pending() == 0
    del y


@pytest.mark.parametrize("sync", ["cpu", "item", "synchronize", "tolist", "save"])
def test_every_synchronisation_reports(dev, sync, tmp_path):
    x = torch.arange(3.0, device=dev)
    x.gather(0, _bad_index(dev))
    syncs = {
        "cpu": lambda: x.cpu(),
        "item": lambda: x[0].item(),
        "synchronize": torch.tpu.synchronize,
        "tolist": x.tolist,
        "save": lambda: torch.save(x, tmp_path / "x.pt"),
    }
    with pytest.raises(RuntimeError, match=OUT_OF_BOUNDS):
        syncs[sync]()


def test_debug_mode_reports_at_the_op_with_pytorchs_exception(dev):
    x = torch.arange(3.0, device=dev)
    with execution_mode("debug"):
        with pytest.raises(IndexError, match=OUT_OF_BOUNDS) as info:
            x[_bad_index(dev)]
    assert "aten.index.Tensor on tpu:0" in str(info.value)
    assert "ACCELKIT_TPU_MODE" not in str(info.value)
    assert checks.pending() == 0


def test_debug_mode_passes_pytorchs_argument_errors_unwrapped(dev):
    with execution_mode("debug"):
        with pytest.raises(RuntimeError, match=r"\[2, 3\] X \[4, 5\]") as info:  # the Meta kernel's words
            torch.ones(2, 3, device=dev) @ torch.ones(4, 5, device=dev)
    assert type(info.value) is RuntimeError


@pytest.mark.parametrize("mode", ["strict", "debug"])
@pytest.mark.parametrize("write", ["setitem", "index_put_accumulate", "scatter_", "scatter_add_",
                                   "index_add_", "index_copy_", "index_fill_", "put_", "floor_divide_",
                                   "remainder_", "masked_scatter_"])
def test_a_refused_in_place_op_leaves_its_tensor_unchanged(dev, mode, write):
    bad = _bad_index(dev)
    x = torch.arange(1, 4, device=dev) * 10
    before = x.cpu()
    writes = {
        "setitem": lambda: x.__setitem__(bad, 7),
        "index_put_accumulate": lambda: x.index_put_((bad,), torch.tensor(7, device=dev), accumulate=True),
        "scatter_": lambda: x.scatter_(0, bad, 7),
        "scatter_add_": lambda: x.scatter_add_(0, bad, torch.ones(2, dtype=x.dtype, device=dev)),
        "index_add_": lambda: x.index_add_(0, bad, torch.ones(2, dtype=x.dtype, device=dev)),
        "index_copy_": lambda: x.index_copy_(0, bad, torch.ones(2, dtype=x.dtype, device=dev)),
        "index_fill_": lambda: x.index_fill_(0, bad, 7),
        "put_": lambda: x.put_(bad, torch.ones(2, dtype=x.dtype, device=dev)),
        "floor_divide_": lambda: x.floor_divide_(torch.tensor([1, 0, 1], device=dev)),
        "remainder_": lambda: x.remainder_(torch.tensor([1, 0, 1], device=dev)),
        "masked_scatter_": lambda: x.masked_scatter_(torch.ones(3, dtype=torch.bool, device=dev),
                                                     torch.ones(2, dtype=x.dtype, device=dev)),
    }
    with execution_mode(mode), pytest.raises((IndexError, RuntimeError)):
        writes[write]()
        torch.tpu.synchronize()
    assert torch.equal(x.cpu(), before)
    x.add_(1)  # the tensor and the process keep working
    assert torch.equal(x.cpu(), before + 1)


def test_a_view_written_by_a_refused_op_leaves_its_base_unchanged(dev):
    base = torch.arange(12.0, device=dev).reshape(3, 4)
    column = base[:, 1]
    with pytest.raises(IndexError):
        column.index_fill_(0, torch.tensor([3], device=dev), -1.0)
        base.cpu()
    assert torch.equal(base.cpu(), torch.arange(12.0).reshape(3, 4))


def test_later_failures_are_named_in_the_first_error_not_raised_again(dev):
    x = torch.arange(3.0, device=dev)
    x[_bad_index(dev)]
    x.gather(0, torch.tensor([9], device=dev))
    with pytest.raises(IndexError, match=OUT_OF_BOUNDS) as info:
        torch.tpu.synchronize()
    assert "1 later op failed too: aten.gather.default" in str(info.value)
    torch.tpu.synchronize()  # nothing left


def test_an_augmented_assignment_through_a_bad_index_raises_once(dev):
    x = torch.arange(3.0, device=dev)
    with pytest.raises(IndexError, match=OUT_OF_BOUNDS):
        x[_bad_index(dev)] += 1  # reads, then writes, through the same bad index
        x.cpu()
    assert x.tolist() == [0.0, 1.0, 2.0]


def test_a_failure_known_while_tracing_raises_at_the_op_in_strict_mode(dev):
    x = torch.tensor([4, 5], device=dev)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        torch.div(x, 0, rounding_mode="floor")
    assert checks.pending() == 0


def test_passing_checks_cost_no_synchronisation_and_stay_bounded(dev):
    x = torch.arange(3.0, device=dev)
    index = torch.tensor([2, 0], device=dev)
    for _ in range(checks.PENDING_LIMIT + 20):
        y = x[index]
    assert 0 < checks.pending() <= checks.PENDING_LIMIT
    assert y.tolist() == [2.0, 0.0]
    assert checks.pending() == 0


def test_a_failure_among_many_waiting_statuses_is_not_lost(dev):
    x = torch.arange(3.0, device=dev)
    good = torch.tensor([1], device=dev)
    x[_bad_index(dev)]
    with pytest.raises(IndexError, match=OUT_OF_BOUNDS):
        for _ in range(checks.PENDING_LIMIT + 20):
            x[good]
        torch.tpu.synchronize()
    torch.tpu.synchronize()  # the statuses after the failed one were all good


@pytest.mark.parametrize("read_each", [True, False], ids=["read-each", "folded"])
def test_both_ways_of_reading_statuses_raise_the_first_failure_and_name_the_later(dev, monkeypatch, read_each):
    # XLA's CPU platform reads each status as it is; an accelerator folds FOLD into one read.
    monkeypatch.setattr(checks, "_read_each", lambda status: read_each)
    x = torch.arange(3.0, device=dev)
    good = torch.tensor([1], device=dev)
    for _ in range(checks.FOLD + 3):
        x[good]
    x[_bad_index(dev)]
    x.gather(0, torch.tensor([9], device=dev))
    for _ in range(checks.FOLD):  # the last failure falls in another fold than the first
        x[good]
    x.gather(0, torch.tensor([7], device=dev))
    with pytest.raises(IndexError, match=OUT_OF_BOUNDS) as info:
        torch.tpu.synchronize()
    assert "2 later ops failed too: aten.gather.default, aten.gather.default" in str(info.value)
    torch.tpu.synchronize()  # nothing left


def test_ops_with_no_conditions_return_no_status(dev):
    x = torch.arange(3.0, device=dev)
    (x * 2 + 1).sin()
    assert checks.pending() == 0


def test_a_refused_op_leaves_its_out_tensor_unchanged_and_raises_at_the_op(dev):
    x = torch.arange(3.0, device=dev)
    out = torch.full((2,), -1.0, device=dev)
    with pytest.raises(RuntimeError, match=OUT_OF_BOUNDS):
        torch.gather(x, 0, _bad_index(dev), out=out)  # before anything is stored into out
    assert out.tolist() == [-1.0, -1.0]


def test_an_out_tensor_waits_only_for_the_program_that_fills_it(dev):
    x = torch.arange(3.0, device=dev)
    x.gather(0, torch.tensor([1], device=dev))  # a passing check, still waiting
    waiting = checks.pending()
    torch.add(x, 1, out=torch.empty(3, device=dev))
    assert checks.pending() == waiting >= 1
    torch.tpu.synchronize()
