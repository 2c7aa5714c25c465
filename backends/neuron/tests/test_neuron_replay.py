"""Numerics-only replay of static kernel instances (``sim/replay.py``, ``launch.run_static``).

A static instance's second run replays its recorded instructions on the new memory: the values
must be those of running the body (bit for bit), a value check must be made again, and what
fixes the recording (float arguments, aliasing between arguments) must be part of its key. A
body that breaks the static promise is caught by ``ACCELKIT_NEURON_VERIFY_REPLAY=1``.

These tests count, check and profile each eager op's own instance, so they run in strict eager
mode (adaptive eager runs recorded ops in region programs, see ``test_neuron_adaptive.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import accelkit
from accelkit_backends.neuron import eager_mode, launch, profile
from accelkit_backends.neuron.launch import OutSpec, ReplayMismatch, hbm_empty
from accelkit_backends.neuron.tiling import map_flat

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def strict():
    """Each eager op runs at once as its own kernel instance."""
    with eager_mode("strict"):
        yield


def _replay_counts() -> dict:
    return accelkit.stats()["neuron"]["replay"]


def test_a_static_instance_replays_its_numerics_on_new_values(dev):
    g = torch.Generator().manual_seed(0)
    pairs = [(torch.randn(300, generator=g), torch.randn(300, generator=g)) for _ in range(4)]
    for x, y in pairs:
        got = torch.add(x.to(dev), y.to(dev), alpha=2)
        assert torch.equal(got.cpu(), torch.add(x, y, alpha=2))
    counts = _replay_counts()
    assert counts["recorded"] <= 1 and counts["replayed"] >= 3  # recorded once (unless an earlier test did)
    assert "add.Tensor" not in counts["refused"]


def test_replayed_runs_keep_the_first_runs_estimate(dev):
    x, y = torch.randn(4096).to(dev), torch.randn(4096).to(dev)
    per_run = []
    for _ in range(3):
        accelkit.reset_stats()
        torch.mul(x, y)
        estimate = accelkit.stats()["neuron"]["estimate"]
        per_run.append((estimate["device_seconds"], estimate["hbm_bytes"], estimate["kernels"]))
    assert per_run[0] == per_run[1] == per_run[2]
    assert _replay_counts()["replayed"] == 1  # the last run replayed, and cost the same


def test_float_arguments_are_part_of_what_a_replay_repeats(dev):
    x = torch.randn(64, 33)
    for scale in (2.5, 3.5, -1.25, 2.5):
        assert torch.equal((x.to(dev) * scale).cpu(), x * scale)
        assert torch.equal(torch.add(x.to(dev), 1.0, alpha=scale).cpu(), torch.add(x, 1.0, alpha=scale))
    for zero in (0.0, -0.0, 0.0, -0.0):  # equal as numbers, not as bits
        filled = torch.empty(5).to(dev).fill_(zero).cpu()
        assert torch.equal(torch.signbit(filled), torch.full((5,), str(zero).startswith("-")))


def test_arguments_that_share_memory_are_not_replayed_as_separate_ones(dev):
    a, b = torch.randn(2, 128), torch.randn(2, 128)
    da, db = a.to(dev), b.to(dev)
    for _ in range(2):  # recorded with one tensor on both sides, then two
        assert torch.equal(torch.mul(da, da).cpu(), a * a)
        assert torch.equal(torch.mul(da, db).cpu(), a * b)
    for _ in range(2):
        assert torch.equal(torch.sub(da, db).cpu(), a - b)
    # The same instance (shapes, strides, dtypes) with one tensor on both sides ...
    assert torch.equal(torch.sub(da, da).cpu(), torch.zeros_like(a))
    # ... and two views of one storage, then in place on a view of the operand itself.
    both = torch.randn(4, 128)
    d = both.to(dev)
    assert torch.equal(torch.sub(d[:2], d[2:]).cpu(), both[:2] - both[2:])
    for _ in range(2):
        d[:2].mul_(d[2:])
        both[:2].mul_(both[2:])
    assert torch.equal(d.cpu(), both)


def test_a_value_check_is_made_again_at_each_replay(dev):
    logits = torch.randn(8, 5)
    good = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2])
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(logits.to(dev), good.to(dev))
        assert torch.allclose(loss.cpu(), torch.nn.functional.cross_entropy(logits, good))
    bad = good.clone()
    bad[5] = 7
    with pytest.raises(IndexError, match="Target 7 is out of bounds"):
        torch.nn.functional.cross_entropy(logits.to(dev), bad.to(dev))
    numerator, divisor = torch.arange(1, 9), torch.tensor([1, 2, 3, 4, 1, 2, 3, 4])
    for _ in range(2):
        torch.div(numerator.to(dev), divisor.to(dev), rounding_mode="floor")
    target = numerator.to(dev)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        target.floor_divide_(torch.tensor([1, 2, 3, 4, 0, 2, 3, 4]).to(dev))
    assert torch.equal(target.cpu(), numerator)  # the failed in-place op changed nothing


def test_a_compiled_step_replays_bit_for_bit_what_its_programs_computed(dev, monkeypatch):
    monkeypatch.setenv(launch.VERIFY_ENV, "1")  # every replay is also run in full and compared
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).to(dev)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 32).to(dev), torch.randint(0, 10, (16,)).to(dev)
    loss_of = torch.compile(lambda: torch.nn.functional.cross_entropy(model(x), y), backend="neuron")
    before = _replay_counts()["replayed"]
    losses = []
    for _ in range(4):
        optimizer.zero_grad()
        loss = loss_of()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert _replay_counts()["replayed"] > before
    assert losses[-1] < losses[0]


def _register(name: str, body) -> object:
    """``body`` as a static kernel of ``aten.neg``, run through the launcher directly."""
    run = launch._launcher(aten.neg.default, body, static=True)
    run.__name__ = name
    return run


def _forget(shape: tuple[int, ...]) -> None:
    for key in [k for k in launch._RECORDINGS if ("array", shape, "<f4", tuple(s * 4 for s in _strides(shape))) in k[0][1][0]]:
        del launch._RECORDINGS[key]


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))


def test_a_body_that_reads_values_breaks_its_static_promise_and_verification_says_so(dev, monkeypatch):
    shape = (3, 5, 7)  # a shape no other test gives neg, so the recording is this body's

    def reads_a_value(k, out: list[OutSpec], x: np.ndarray) -> np.ndarray:
        result = hbm_empty(out[0])
        scale = 2.0 if float(x.reshape(-1)[0]) > 0 else 3.0  # a value read in Python: not static
        map_flat(k, result, [x], lambda dst, srcs: k.tensor_scalar(dst, srcs[0], "multiply", scale))
        return result

    run = _register("reads_a_value", reads_a_value)
    positive, negative = np.ones(shape, np.float32), -np.ones(shape, np.float32)
    try:
        np.testing.assert_array_equal(run(positive), 2 * positive)  # recorded
        np.testing.assert_array_equal(run(positive), 2 * positive)  # replayed, and right
        monkeypatch.setenv(launch.VERIFY_ENV, "1")
        with pytest.raises(ReplayMismatch, match="registered static but is not"):
            run(negative)  # the replay multiplies by 2, the body by 3
    finally:
        _forget(shape)


def test_a_body_whose_instructions_touch_other_memory_is_never_replayed(dev):
    shape = (4, 6, 5)

    def adds_a_host_table(k, out: list[OutSpec], x: np.ndarray) -> np.ndarray:
        result = hbm_empty(out[0])
        table = np.full(shape, 0.5, np.float32)  # memory that is no argument or result
        map_flat(k, result, [x, table], lambda dst, srcs: k.tensor_tensor(dst, srcs[0], srcs[1], "add"))
        return result

    run = _register("adds_a_host_table", adds_a_host_table)
    try:
        for value in (1.0, 2.0, 3.0):
            x = np.full(shape, value, np.float32)
            np.testing.assert_array_equal(run(x), x + 0.5)
        assert "no argument or result" in _replay_counts()["refused"]["neg.default"]
    finally:
        _forget(shape)
        launch.REPLAY_COUNTS["refused"].pop("neg.default", None)


def test_a_profile_runs_every_instruction_and_records_its_timeline(dev):
    x = torch.randn(512).to(dev)
    for _ in range(2):
        replayed = torch.exp(x)
    with profile() as result:
        profiled = torch.exp(x)
    assert torch.equal(profiled.cpu(), replayed.cpu())
    names = {i.name for i in result.instructions}
    assert any(n.startswith("activation") for n in names) and "dma" in names
    assert len(result.kernels) == 1 and result.kernels[0].instructions == len(result.instructions)


def test_verification_runs_the_body_on_arguments_laid_out_as_the_replayed_ones(dev, monkeypatch):
    # A transposed input takes another path through layer norm's backward (another summation
    # order) than a compacted copy would: the check must not mistake that for a broken replay.
    monkeypatch.setenv(launch.VERIFY_ENV, "1")
    norm = torch.nn.LayerNorm(8)
    on_device = torch.nn.LayerNorm(8).to(dev)
    for _ in range(3):
        x, grad = torch.randn(2, 3, 8), torch.randn(3, 2, 8)
        xd = x.to(dev).requires_grad_(True)
        on_device(xd.transpose(0, 1)).backward(grad.to(dev))
        xc = x.clone().requires_grad_(True)
        norm(xc.transpose(0, 1)).backward(grad)
        torch.testing.assert_close(xd.grad.cpu(), xc.grad)
        torch.testing.assert_close(on_device.weight.grad.cpu(), norm.weight.grad)


def test_a_compiled_program_replays_as_one_once_its_schedule_is_known(dev, monkeypatch):
    from accelkit_backends.neuron.runtime import core

    monkeypatch.delenv(launch.VERIFY_ENV, raising=False)  # verifying runs the kernels one by one

    def block(x, w):
        return torch.relu(x @ w).sum(dim=0) * 0.5

    compiled = torch.compile(block, backend="neuron")
    w = torch.randn(32, 16)
    runs = []
    for _ in range(4):
        x = torch.randn(8, 32)
        accelkit.reset_stats()
        before = _replay_counts()["replayed"]
        got = compiled(x.to(dev), w.to(dev))
        estimate = accelkit.stats()["neuron"]["estimate"]
        runs.append((estimate["device_seconds"], estimate["kernels"], _replay_counts()["replayed"] - before))
        torch.testing.assert_close(got.cpu(), block(x, w))
    # The last runs replay the whole program: no kernel replays one by one, same estimate.
    assert runs[-1][2] == 0 and runs[-1][:2] == runs[1][:2]
    assert any(key for key in core()._program_timings)


def test_a_replayed_program_runs_as_one_function_whose_results_are_fresh_memory(dev, monkeypatch):
    from accelkit_backends.neuron import graph_lowering

    monkeypatch.delenv(launch.VERIFY_ENV, raising=False)
    written = []
    real = graph_lowering.straight_line

    def spy(recording):
        function = real(recording)
        written.append(function)
        return function

    monkeypatch.setattr(graph_lowering, "straight_line", spy)

    def block(x, w):
        hidden = torch.relu(x @ w)  # an intermediate the results never reach: kept memory
        return hidden.sum(dim=0) * 0.5, hidden * 2

    compiled = torch.compile(block, backend="neuron")
    w = torch.randn(32, 16)
    inputs = [torch.randn(8, 32) for _ in range(4)]
    results = [compiled(x.to(dev), w.to(dev)) for x in inputs]  # all held while later runs go on
    assert [f for f in written if f is not None], "no program was written out as one function"
    assert "_empty" in next(f for f in written if f is not None).source
    for x, (total, doubled) in zip(inputs, results):
        want_total, want_doubled = block(x, w)
        torch.testing.assert_close(total.cpu(), want_total)
        torch.testing.assert_close(doubled.cpu(), want_doubled)



COPIES = {
    # AOTAutograd's clone(memory_format=contiguous) of a transposed view.
    "layout": (lambda x: torch.exp(x).transpose(0, 1).contiguous().view(-1) * 2, torch.float32),
    # A cast (_to_copy), as a bfloat16 model's loss takes float32 logits.
    "dtype": (lambda x: torch.exp(x).float() * 2, torch.bfloat16),
}


@pytest.mark.parametrize("copy", COPIES)
def test_a_program_that_copies_into_another_layout_or_dtype_replays(dev, monkeypatch, copy):
    # Both copies are static kernels, so the program holding one replays instead of running its
    # kernels in full every call.
    from accelkit_backends.neuron import graph_lowering

    fn, dtype = COPIES[copy]

    monkeypatch.delenv(launch.VERIFY_ENV, raising=False)
    written = []
    real = graph_lowering.straight_line
    monkeypatch.setattr(graph_lowering, "straight_line", lambda recording: written.append(real(recording)) or written[-1])

    compiled = torch.compile(fn, backend="neuron")
    for _ in range(3):
        x = torch.randn(6, 10, dtype=dtype)
        torch.testing.assert_close(compiled(x.to(dev)).cpu(), fn(x), rtol=1e-2 if dtype == torch.bfloat16 else None,
                                   atol=1e-2 if dtype == torch.bfloat16 else None)
    assert written and written[0] is not None, "the program's recording was refused"
