"""Fused eager (``accelkit_backends.tpu.fused``): ops are recorded and regions of them run as one
XLA program. Semantics are strict mode's; these tests pin where regions end, that repeated
regions are compiled once, and that errors, memory and aliasing behave as in strict mode."""

from __future__ import annotations

import gc
import warnings

import pytest
import torch
from torch import nn

import accelkit
from accelkit_backends.tpu import execution_mode
from conftest import host_peak_growth


def fused_stats() -> dict:
    return accelkit.stats()["tpu"]["fused"]


def chain(y: torch.Tensor, length: int = 10) -> torch.Tensor:
    """``length`` elementwise ops."""
    for i in range(length):
        y = y * 1.01 if i % 3 == 0 else y + 0.5 if i % 3 == 1 else torch.relu(y)
    return y


def close_to_strict(fused: torch.Tensor, strict: torch.Tensor) -> None:
    # A compiled region lets XLA contract a multiply and an add into one FMA: 1-2 ulp apart.
    torch.testing.assert_close(fused, strict, rtol=4e-7, atol=1e-6)


# -- recording and flushing -------------------------------------------------------------------


def test_ops_are_recorded_until_a_host_read(dev):
    x = torch.randn(37, device=dev)
    strict = chain(x).cpu()
    with execution_mode("fused"):
        y = chain(x)
        assert fused_stats()["pending_ops"] == 10
        assert y.shape == (37,) and y.dtype == torch.float32  # known before anything ran
        got = y.cpu()
        assert fused_stats()["pending_ops"] == 0
    assert fused_stats()["flushes"] == {"host read": 1}
    assert torch.equal(got, strict)  # first sight: run op by op, exactly strict's programs


@pytest.mark.parametrize("read", ["item", "print", "bool", "synchronize", "numpy"])
def test_every_host_read_and_sync_flushes(dev, read, capsys):
    x = torch.randn(5, device=dev)
    with execution_mode("fused"):
        y = (x * 2).sum()
        assert fused_stats()["pending_ops"] > 0
        if read == "item":
            value = y.item()
        elif read == "print":
            print(y)
            value = float(capsys.readouterr().out.split("(")[1].split(",")[0])
        elif read == "bool":
            value = 1.0 if y > -1e9 else 0.0
        elif read == "synchronize":
            torch.tpu.synchronize()
            assert fused_stats()["pending_ops"] == 0
            value = y.item()
        else:
            value = float(y.cpu().numpy())
        assert fused_stats()["pending_ops"] == 0
    if read != "bool":
        assert value == pytest.approx(float((x.cpu() * 2).sum()), rel=1e-3 if read == "print" else 1e-6)


def test_a_kernel_that_reads_the_host_flushes_first_and_runs_strictly(dev):
    a = torch.randn(6, device=dev)
    with execution_mode("fused"):
        c = a + 1
        assert torch.equal(c, c.clone())  # aten.equal reads its result on the host
        assert fused_stats()["flushes"] == {"kernel outside regions": 1}
        assert fused_stats()["outside_regions"] == {"aten.equal.default": 1}
    assert torch.equal(c.cpu(), a.cpu() + 1)


def test_a_host_step_stays_in_the_region_until_it_reads_a_value(dev):
    x = torch.arange(10.0, device=dev)
    with execution_mode("fused"):
        y = x * 2
        rows = torch.arange(3, device=dev)  # a host step computing from Python numbers
        picked = y[torch.tensor([4, 1], device=dev) + rows[:2]]  # integer indexing: nothing read
        assert fused_stats()["regions"] == 0 and fused_stats()["pending_ops"] >= 4
        repeats = torch.tensor([1, 0, 2], device=dev) + 0
        spread = torch.repeat_interleave(repeats)  # reads its total on the host: a flush there
        assert fused_stats()["flushes"] == {"host read": 1}
        selected = y[y > 10]  # a mask's count is read on the host: another
    assert picked.cpu().tolist() == [8.0, 4.0]
    assert spread.cpu().tolist() == [0, 2, 2]
    assert selected.cpu().tolist() == [12.0, 14.0, 16.0, 18.0]


def test_the_cpu_fallback_reads_pending_arguments(dev):
    x = torch.randn(8, device=dev)
    with warnings.catch_warnings(), execution_mode("fused"):
        warnings.simplefilter("ignore")  # the fallback's once-per-op warning
        y = x * 3
        low, high = torch.ops.aten._aminmax.default(y)  # no tpu kernel: the CPU runs it
        assert accelkit.stats()["ops"]["aten._aminmax.default"]["fallback"] == 1
        assert fused_stats()["pending_ops"] == 0
    assert low.item() == (x.cpu() * 3).min().item() and high.item() == (x.cpu() * 3).max().item()


def test_a_compiled_graph_flushes_pending_inputs(dev):
    x = torch.randn(4, 4, device=dev)
    compiled = torch.compile(lambda t: (t @ t).relu(), backend="tpu")
    with execution_mode("fused"):
        y = x + 1
        got = compiled(y)
        assert fused_stats()["flushes"].get("compiled graph", 0) >= 1
    torch.testing.assert_close(got.cpu(), ((x.cpu() + 1) @ (x.cpu() + 1)).relu(), rtol=1e-5, atol=1e-5)


def test_leaving_fused_mode_runs_what_is_pending(dev):
    x = torch.randn(3, device=dev)
    with execution_mode("fused"):
        y = x * 5
    assert fused_stats()["flushes"] == {"mode change": 1} and fused_stats()["pending_ops"] == 0
    assert torch.equal(y.cpu(), x.cpu() * 5)


# -- regions that repeat ----------------------------------------------------------------------


def test_a_training_loop_compiles_its_step_once(dev):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 3))
    reference = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 3))
    reference.load_state_dict(model.state_dict())
    model.to(dev)
    x, y = torch.randn(9, 12), torch.randint(0, 3, (9,))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    xd, yd = x.to(dev), y.to(dev)

    def step(m, o, a, b):
        o.zero_grad()
        loss = nn.functional.cross_entropy(m(a), b)
        loss.backward()
        o.step()
        return loss.item()

    with execution_mode("fused"):
        losses = [step(model, opt, xd, yd) for _ in range(3)]
        compiles = accelkit.stats()["compiles"]
        region_compiles = fused_stats()["compiles"]
        losses += [step(model, opt, xd, yd) for _ in range(5)]
        assert accelkit.stats()["compiles"] == compiles  # after warm-up: no program compiles
        assert fused_stats()["compiles"] == region_compiles
        assert fused_stats()["hits"] >= 5
    expected = [step(reference, ref_opt, x, y) for _ in range(8)]
    assert losses == pytest.approx(expected, rel=1e-5)


def test_a_loop_without_host_reads_is_cut_into_repeating_regions(dev, monkeypatch):
    from accelkit_backends.tpu import fused

    monkeypatch.setattr(fused, "_limit", 64)
    monkeypatch.setattr(fused, "_cut_every", None)
    x = torch.randn(16, device=dev)
    with execution_mode("fused"):
        y = x
        for _ in range(100):  # a loop body of 3 ops, never read
            y = torch.tanh(y * 0.5 + 0.25)
        cut = fused_stats()["cut_every"]
        assert cut is not None and cut % 3 == 0 and cut <= 64
        for _ in range(300):
            y = torch.tanh(y * 0.5 + 0.25)
        got = y.cpu()
    stats = fused_stats()
    assert stats["flushes"]["size limit"] >= 10
    assert stats["compiles"] <= 2 and stats["hits"] >= 8, stats  # one region repeated
    expected = x.cpu()
    for _ in range(400):
        expected = torch.tanh(expected * 0.5 + 0.25)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_a_decode_loop_whose_shapes_grow_compiles_no_region(dev):
    cache = torch.randn(1, 4, device=dev)
    token = torch.randn(1, 4, device=dev)
    with execution_mode("fused"):
        for _ in range(12):  # a new length at every step: every region is met once
            cache = torch.cat([cache, token * 0.5])
            token = torch.softmax(cache @ token.T, dim=0).T @ cache
            assert token.abs().sum().item() >= 0
    stats = fused_stats()
    assert stats["compiles"] == 0 and stats["op_by_op"] == stats["regions"] == 12


def test_only_results_something_references_are_materialised(dev):
    x = torch.randn(64, device=dev)
    with execution_mode("fused"):
        kept = x * 2  # referenced after the flush
        y = chain(kept, 20)  # 20 intermediates, none referenced
        y.cpu()
    assert fused_stats()["results"] == 2  # kept and y


# -- errors, memory and aliasing as in strict mode ----------------------------------------------


def _error_of(fn) -> str:
    with pytest.raises(Exception) as info:
        fn()
    return f"{type(info.value).__name__}: {info.value}"


@pytest.mark.parametrize("case", ["broadcast", "matmul", "dtype"])
def test_argument_errors_raise_at_the_op_as_in_strict_mode_and_record_nothing(dev, case):
    a, b = torch.randn(3, device=dev), torch.randn(4, device=dev)
    m, n = torch.randn(2, 3, device=dev), torch.randn(4, 5, device=dev)
    ints = torch.ones(3, dtype=torch.int32, device=dev)
    bad = {"broadcast": lambda: a + b, "matmul": lambda: m @ n, "dtype": lambda: ints.add_(a)}[case]
    strict = _error_of(bad)
    with execution_mode("fused"):
        fused = _error_of(bad)
        if case != "dtype":  # refused by the Meta kernel: nothing recorded
            assert fused_stats()["pending_ops"] == 0
    assert fused == strict
    assert torch.equal(ints.cpu(), torch.ones(3, dtype=torch.int32))  # the refused write wrote nothing


def test_out_of_memory_raises_at_the_op(dev):
    gc.collect()  # earlier tests' garbage, freed now rather than inside the counted window
    capacity = torch.tpu.get_device_properties().total_memory
    x = torch.randn(4, device=dev)
    before = torch.tpu.memory_allocated()
    with execution_mode("fused"):
        y = x + 1
        assert torch.tpu.memory_allocated() == before + 16  # a pending result's memory counts at once
        big = torch.zeros(1, device=dev).expand(capacity // 4 + 1)
        held = torch.tpu.memory_allocated()
        with host_peak_growth(2**30):
            with pytest.raises(torch.OutOfMemoryError, match="tpu:0") as refused:
                big * 2  # the result is allocated at the op: refused there
            assert torch.tpu.memory_allocated() == held
            # The refused op left nothing to compute: the flush does not make its result, even
            # while the error (and so its traceback's pending result) is still referenced.
            assert torch.equal(y.cpu(), x.cpu() + 1)
        assert refused.value is not None


def test_a_device_side_check_fails_at_the_read_naming_the_op_and_writes_nothing(dev):
    table = torch.arange(12.0, device=dev).reshape(4, 3)
    with execution_mode("fused"):
        index = torch.tensor([0, 7], device=dev) + 0  # 7 is out of range: known on the device only
        table.index_add_(0, index, torch.ones(2, 3, device=dev))
        assert fused_stats()["pending_ops"] > 0  # nothing raised at the op
        with pytest.raises(RuntimeError, match="index 7 is out of bounds.*aten.index_add.default on tpu:0"):
            table.cpu()
    assert torch.equal(table.cpu(), torch.arange(12.0).reshape(4, 3))  # unchanged


def test_in_place_writes_through_views_alias_as_on_cpu(dev):
    cpu = torch.arange(24.0).reshape(4, 6)
    base = cpu.to(dev)
    with execution_mode("fused"):
        for t in (cpu, base):
            row = t[1]
            column = t[:, 2]
            transposed = t.t()
            row.mul_(2)
            column.add_(100)
            transposed[3, 0] = -1
            t.view(-1)[::5].sub_(0.5)
            t.diagonal().copy_(torch.tensor([7.0, 8.0, 9.0, 10.0], device=t.device))
        assert fused_stats()["pending_ops"] > 0
        got = base.cpu()
    assert torch.equal(got, cpu)


def test_random_ops_draw_as_in_strict_mode(dev):
    torch.tpu.manual_seed(3)
    strict = [torch.rand(5, device=dev).cpu(), torch.nn.functional.dropout(torch.ones(64, device=dev), 0.5).cpu()]
    torch.tpu.manual_seed(3)
    with execution_mode("fused"):
        fused = [torch.rand(5, device=dev), torch.nn.functional.dropout(torch.ones(64, device=dev), 0.5)]
        fused = [t.cpu() for t in fused]
    assert all(torch.equal(a, b) for a, b in zip(strict, fused))


def test_every_kernel_either_records_or_runs_outside_regions():
    from accelkit_backends.tpu.kernels import kernels
    from accelkit_backends.tpu.lowering import Lowering

    for entry in kernels:
        fn = entry.fn
        call = type(fn).__call__
        plain = call is Lowering.__call__ or getattr(type(fn), "fusable", False)
        assert plain or getattr(call, "outside_regions", False), f"{entry.op}: {type(fn).__qualname__}"


def test_a_region_whose_program_fails_runs_op_by_op(dev, monkeypatch):
    from accelkit_backends.tpu import fused

    def broken(*args):
        raise RuntimeError("XLA could not compile the region")

    x = torch.randn(11, device=dev)
    with execution_mode("fused"):
        for _ in range(2):  # met twice: the second time it would be compiled
            chain(x, 7).cpu()
        monkeypatch.setattr(fused, "_compiled", broken)
        got = chain(x, 7).cpu()
    assert fused_stats()["failed_regions"] == 1
    close_to_strict(got, chain(x, 7).cpu())


def test_results_of_a_region_that_could_not_run_raise_when_read(dev, monkeypatch):
    from accelkit_backends.tpu import fused

    def broken(*args):
        raise RuntimeError("the device went away")

    x = torch.randn(13, device=dev)
    with execution_mode("fused"):
        y, z = x * 2, x + 3
        monkeypatch.setattr(fused, "_op_by_op", broken)
        with pytest.raises(RuntimeError, match="the device went away"):
            y.cpu()
        monkeypatch.undo()
        with pytest.raises(RuntimeError, match=r"shape \[13\] was never computed.*the device went away"):
            z.cpu()
        assert torch.equal((x * 2).cpu(), x.cpu() * 2)  # later regions run


def test_with_several_devices_the_fused_default_runs_strictly_and_a_request_is_refused():
    import os
    import subprocess
    import sys

    code = (
        "import warnings, torch, accelkit\n"
        "from accelkit_backends.tpu import execution_mode\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    accelkit.select_device('tpu')\n"
        "print(torch.tpu.device_count(), accelkit.stats()['tpu']['mode'])\n"
        "print(any('fused regions run on one tpu device' in str(w.message) for w in seen))\n"
        "try:\n"
        "    with execution_mode('fused'): pass\n"
        "except ValueError as e: print('refused:', e)\n"
    )
    env = {**os.environ, "ACCELKIT_TPU_DEVICES": "2", "ACCELKIT_TPU_MODE": "fused"}
    env.pop("ACCELKIT_DEVICE", None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "2 strict" and lines[1] == "True"
    assert lines[2].startswith("refused: fused mode runs on one tpu device, and ACCELKIT_TPU_DEVICES=2")
