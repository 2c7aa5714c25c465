"""neuron's adaptive eager (``adaptive.py``): recorded ops run as one program per region, with
strict eager's values, views, in-place writes, memory accounting and errors."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from conftest import run_python
from torch import nn

import accelkit
from accelkit_backends.neuron import adaptive, eager_mode, fusion


def _adaptive() -> dict:
    """The adaptive figures without a flush (``accelkit.stats()`` flushes first)."""
    return adaptive.stats()


@pytest.fixture
def fresh(dev):
    """The neuron device, adaptive, with no open region and the stats cleared."""
    with eager_mode("adaptive"):
        accelkit.reset_stats()
        yield dev


def test_adaptive_is_the_default_and_strict_the_switch():
    assert adaptive.DEFAULT_MODE == "adaptive"
    code = """
        import accelkit, torch
        from accelkit_backends.neuron import adaptive
        dev = accelkit.select_device("neuron")
        x = torch.ones(8, device=dev)
        (x * 2).cpu()  # a kernel instance runs at once the first time
        y = x * 2
        print(adaptive.mode(), adaptive.pending())
    """
    assert run_python(code).stdout.split() == ["adaptive", "True"]
    assert run_python(code, {"ACCELKIT_NEURON_EAGER": "strict"}).stdout.split() == ["strict", "False"]


def test_a_chain_is_one_fused_program_with_strict_values(fresh):
    x, g = torch.randn(64, 96), torch.randn(64, 96)
    dx, dg = x.to(fresh), g.to(fresh)

    def block(x, g):
        return x + torch.nn.functional.silu(g) * torch.tanh(x * 0.5 + 1.0) - 0.1 * g

    _warm(lambda: block(dx, dg).cpu())
    out = block(dx, dg)
    assert adaptive.pending() and adaptive._region.nodes.__len__() >= 6  # recorded, not run
    adaptive_values = out.cpu()
    estimate = accelkit.stats()["neuron"]["estimate"]
    with eager_mode("strict"):
        accelkit.reset_stats()
        strict_values = block(dx, dg).cpu()
        strict_kernels = accelkit.stats()["neuron"]["estimate"]["kernels"]
    assert torch.equal(adaptive_values, strict_values)  # bit for bit
    assert estimate["kernels"] < strict_kernels  # the chain fused


def _warm(fn, *args):
    """Run ``fn`` until its ops are recorded and its regions run as programs: the first call
    runs its new kernel instances at once, the second records them and runs the region (met
    for the first time) op by op, the third builds its program."""
    for _ in range(3):
        fn(*args)
        torch.neuron.synchronize()
    accelkit.reset_stats()


def test_flush_points(fresh):
    stats = _adaptive
    a = torch.randn(8, 8).to(fresh)
    _warm(lambda: (a * 2 + 1, (a * 2 + 1).sum(), a.exp(), a + 3, a - 1, torch.zeros(4).to(fresh) + 1))
    b = a * 2 + 1
    assert stats()["open_ops"] == 2
    b.sum().item()  # a host read
    assert stats()["open_ops"] == 0 and stats()["flushes"]["a pending value is read"] == 1

    c = a.exp()
    torch.neuron.synchronize()
    assert stats()["open_ops"] == 0 and stats()["flushes"]["synchronize"] == 1
    assert torch.equal(c.cpu(), a.cpu().exp()) or torch.allclose(c.cpu(), a.cpu().exp())

    d = a + 3
    assert stats()["open_ops"] == 1
    index = torch.tensor([3, 0, 5]).to(fresh)
    # index_select's kernel reads the indices' values: not recorded, it flushes what it reads.
    picked = torch.index_select(d, 0, index)
    assert stats()["flushes"]["an op that is not recorded"] == 1
    assert torch.equal(picked.cpu(), torch.index_select(a.cpu() + 3, 0, index.cpu()))

    before = a.cpu()
    e = a - 1
    a.copy_(torch.zeros(8, 8))  # the host writes memory the region reads: flushed first
    assert stats()["flushes"]["the host writes memory the region uses"] == 1
    assert torch.equal(e.cpu(), before - 1) and torch.equal(a.cpu(), torch.zeros(8, 8))
    x = torch.zeros(4).to(fresh)
    for _ in range(adaptive.MAX_NODES + 5):
        x = x + 1
    assert stats()["flushes"]["size limit"] == 1
    assert torch.equal(x.cpu(), torch.full((4,), float(adaptive.MAX_NODES + 5)))


def test_flush_before_a_cpu_fallback_reads_pending_values(fresh):
    a = torch.complex(torch.randn(5, 5), torch.randn(5, 5))
    b = a.to(fresh) * 3
    with accelkit.fallback_policy("allow"):
        det = torch.linalg.det(b)  # complex LU is not computed on neuron: the CPU fallback copies b to the host
    assert _adaptive()["open_ops"] == 0
    torch.testing.assert_close(det.cpu(), torch.linalg.det(a * 3))


def _mlp_steps(dev, steps: int, mode: str):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to(dev)
    x, y = torch.randn(16, 32).to(dev), torch.randint(0, 10, (16,)).to(dev)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    with eager_mode(mode):
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss)
        values = [l.cpu() for l in losses], [p.cpu() for p in model.parameters()]
    return values


def test_training_loop_hits_the_program_cache_with_strict_values(fresh):
    for _ in range(2):  # warm-up: each region structure met twice (once op by op, then built)
        _mlp_steps(fresh, 3, "adaptive")
    accelkit.reset_stats()
    steps = 6
    losses, params = _mlp_steps(fresh, steps, "adaptive")
    stats = _adaptive()
    # One region per step (cut where the next forward reads the updated weights), each served
    # by a cached program: nothing is built, nothing runs op by op.
    assert stats["regions"] == steps and stats["program_cache_hits"] == steps, str(stats)
    assert stats["programs_built"] == 0 and stats["regions_op_by_op"] == 0, str(stats)
    strict_losses, strict_params = _mlp_steps(fresh, steps, "strict")
    assert all(torch.equal(a, b) for a, b in zip(losses, strict_losses))
    assert all(torch.equal(a, b) for a, b in zip(params, strict_params))


def test_in_place_writes_through_views(fresh):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)

    def program(t: torch.Tensor) -> list[torch.Tensor]:
        b = t * 2  # pending on neuron
        row = b[1]  # a view of a pending value
        row.mul_(3)  # in place through the view
        b.t()[2].add_(t[:, 0])  # a transposed view, written with a strided input
        col = t[:, 1]
        col.copy_(b[:, 5])  # a view of a device tensor written with a pending value
        s = b.sum(0)  # reads b after the writes
        t.add_(1)  # in place on memory the region read
        return [b, s, t, row]

    expected = program(base.clone())
    _warm(lambda: [v.cpu() for v in program(base.clone().to(fresh))])
    got = [v.cpu() for v in program(base.clone().to(fresh))]
    assert _adaptive()["stores_recorded"] >= 3
    for e, g in zip(expected, got):
        assert torch.equal(e, g)


def test_a_region_met_once_runs_op_by_op_and_a_recurring_one_is_built_once(fresh):
    x = torch.randn(64, 96).to(fresh)

    def chain(scale: float) -> torch.Tensor:
        return (torch.tanh(x * scale) + x).sigmoid()

    # Each op's kernel instance made, one op per region (a new instance runs at once): the chain's
    # structure itself is then met for the first time below, whatever this process ran before.
    for op in (lambda: x * 0.5, lambda: torch.tanh(x), lambda: x + x, lambda: x.sigmoid()):
        op().cpu()
    accelkit.reset_stats()
    first = chain(0.5).cpu()  # recorded; its structure met for the first time: op by op
    stats = _adaptive()
    assert stats["regions_op_by_op"] == 1 and stats["programs_built"] == 0, str(stats)
    values = [chain(scale).cpu() for scale in (0.5, 0.25, 0.125)]  # met again: built once, reused
    stats = _adaptive()
    assert stats["programs_built"] == 1 and stats["program_cache_hits"] == 2, str(stats)
    assert torch.equal(values[0], first)
    with eager_mode("strict"):
        assert all(torch.equal(v, chain(scale).cpu()) for v, scale in zip(values, (0.5, 0.25, 0.125)))


def test_a_program_dropped_from_the_cache_is_freed_with_its_graph_and_recordings(fresh):
    # The core's timings and the replay recordings name a program, never hold it: a worker that
    # met thousands of regions kept them all alive (and grew by GBs) when they did.
    x = torch.randn(64, 96).to(fresh)
    _warm(lambda: (torch.tanh(x * 0.5) + x).sigmoid().cpu())
    programs = [weakref.ref(p) for p in adaptive._programs.values()]
    groups = [weakref.ref(unit) for p in adaptive._programs.values() for plan in p._plans.values() for unit in plan
              if isinstance(unit, fusion.FusedGroup)]
    assert programs and groups
    (torch.tanh(x * 0.5) + x).sigmoid().cpu()  # a cache hit: replayed from the recording
    adaptive._programs.clear()
    gc.collect()
    assert [p() for p in programs if p() is not None] == []
    assert [g() for g in groups if g() is not None] == []


def test_a_region_run_op_by_op_leaves_no_cycle_holding_its_results(fresh):
    x = torch.randn(64, 96).to(fresh)
    for op in (lambda: x * 0.75, lambda: torch.cos(x), lambda: x - x):
        op().cpu()  # each kernel instance made: the chain below is recorded
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        out = (torch.cos(x * 0.75) - x).cpu()  # its structure met for the first time: op by op
        assert _adaptive()["regions_op_by_op"] >= 1
        gc.collect()
        held = [type(o).__name__ for o in gc.garbage if isinstance(o, (adaptive.Deferred, adaptive._Region))]
        assert held == []
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    with eager_mode("strict"):
        assert torch.equal(out, (torch.cos(x * 0.75) - x).cpu())


def test_a_region_run_op_by_op_gives_results_in_pytorchs_dtypes(fresh):
    # neuron's layer norm computes bfloat16 statistics where PyTorch's are float32: a region
    # run op by op (met for the first time) converts them as strict eager and programs do.
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*shape, generator=g).to(torch.bfloat16) for shape in ((2, 5, 16), (16,), (16,)))
    dx, dw, db = x.to(fresh), w.to(fresh), b.to(fresh)

    def norm():
        out, mean, rstd = torch.native_layer_norm(dx, [16], dw, db, 1e-5)
        return [out, mean, rstd, (out * 2).sum(-1)]

    [v.cpu() for v in norm()]  # new kernel instances run at once
    accelkit.reset_stats()
    got = [v.cpu() for v in norm()]
    assert _adaptive()["regions_op_by_op"] == 1
    with eager_mode("strict"):
        strict = [v.cpu() for v in norm()]
    assert [v.dtype for v in got] == [torch.bfloat16, torch.float32, torch.float32, torch.bfloat16]
    assert all(torch.equal(a, s) for a, s in zip(got, strict))


def test_a_copy_of_a_pending_value_written_in_place_copies_the_written_value(fresh):
    # As F.linear then multi-head attention do: mm's pending result, its bias added in place,
    # then a transposed view of it made contiguous. The copy must read the value after the
    # in-place add (the region's store), not the mm's result (found by a transformer encoder
    # layer trained adaptively, which differed from strict in the last digits).
    x, w, b = torch.randn(10, 16), torch.randn(48, 16), torch.randn(48)

    def program(x, w, b):
        proj = torch.mm(x, w.t())
        proj.add_(b)
        heads = proj.view(5, 2, 3, 16).permute(2, 0, 1, 3).contiguous()  # a strided copy
        return [heads, proj.sum(0)]  # proj itself is gone at the flush

    expected = program(x, w, b)
    dev_args = [t.to(fresh) for t in (x, w, b)]
    _warm(lambda: [v.cpu() for v in program(*dev_args)])
    got = [v.cpu() for v in program(*dev_args)]
    assert _adaptive()["stores_recorded"] >= 2 and _adaptive()["ops_recorded"] >= 2
    with eager_mode("strict"):
        strict = [v.cpu() for v in program(*dev_args)]
    for e, s, g in zip(expected, strict, got):
        assert torch.equal(g, s)
        torch.testing.assert_close(g, e)


def test_a_profile_sees_the_ops_recorded_inside_it_and_not_those_before(fresh):
    from accelkit_backends.neuron import profile

    x = torch.randn(512).to(fresh)
    _warm(lambda: (torch.exp(x) * 2).cpu())
    before = torch.sigmoid(x)  # recorded before the block: run on the way in, not profiled
    with profile() as result:
        inside = torch.exp(x) * 2  # recorded inside: run on the way out, profiled
    assert not adaptive.pending()
    assert result.instructions and result.programs
    assert all(label.startswith("eager region (exp") for label, _, _ in result.programs), result.programs
    torch.testing.assert_close(inside.cpu(), torch.exp(x.cpu()) * 2)
    torch.testing.assert_close(before.cpu(), torch.sigmoid(x.cpu()))


def test_out_of_memory_at_the_op(fresh):
    a = torch.ones(1 << 20).to(fresh)  # 4 MiB
    _warm(lambda: a + 1)
    capacity = torch.neuron.memory_stats()["capacity_bytes"]
    fillers = []  # never written: no host memory behind them
    free = capacity - torch.neuron.memory_allocated()
    while free >= 4 << 20:
        size = 1 << (free.bit_length() - 1)  # a power of two is its own size class
        fillers.append(torch.empty(size, dtype=torch.uint8, device=fresh))
        free -= size
    with pytest.raises(torch.OutOfMemoryError, match="out of memory: tried to allocate 4.00 MiB"):
        a + 1  # recorded, and accounted at the op: the error is raised here, as strictly
    assert _adaptive()["open_ops"] == 1
    before = accelkit.stats()["neuron"]["estimate"]["kernels"]  # flushes: nothing reads the add
    assert accelkit.stats()["neuron"]["estimate"]["kernels"] == before
    with eager_mode("strict"), pytest.raises(torch.OutOfMemoryError, match="tried to allocate 4.00 MiB"):
        a + 1
    fillers.pop()
    assert torch.equal((a + 1).cpu(), torch.full((1 << 20,), 2.0))
    del fillers


def test_device_side_error_raises_at_the_flush_naming_the_op(fresh):
    logits = torch.randn(4, 10).to(fresh)
    bad = torch.tensor([1, 2, 12, 3]).to(fresh)  # class 12 of 10
    good = torch.tensor([1, 2, 9, 3]).to(fresh)
    _warm(lambda: (nn.functional.cross_entropy(logits * 2, good) + 1).item())
    scaled = logits * 2  # before the failing op: computed as strictly
    loss = nn.functional.cross_entropy(scaled, bad)  # recorded: no error yet
    after = loss + 1  # after the failing op: never computed
    with pytest.raises(Exception, match="nll_loss_forward") as raised:
        after.item()
    assert "adaptive eager" in str(raised.value)
    assert _adaptive()["errors_at_flush"] == 1
    assert torch.equal(scaled.cpu(), logits.cpu() * 2)
    with pytest.raises(RuntimeError, match="never computed"):
        loss.cpu()
    with eager_mode("strict"), pytest.raises(type(raised.value)):
        nn.functional.cross_entropy(scaled, bad)  # strictly: at the op


def test_strict_mode_records_nothing(fresh):
    with eager_mode("strict"):
        accelkit.reset_stats()
        a = torch.randn(4).to(fresh) + 1
        assert _adaptive()["ops_recorded"] == 0 and _adaptive()["open_ops"] == 0
        assert a.cpu().shape == (4,)


def test_the_mode_switch_is_validated():
    with pytest.raises(ValueError, match="adaptive, strict"):
        with eager_mode("fused"):
            pass
