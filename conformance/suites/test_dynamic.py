"""Dynamic shapes: ops and a small model under a sequence of changing input shapes.

Each case runs the same computation for every size in :data:`SIZES` and compares every result
with the CPU. It records, in the result's ``dynamic`` field, the input shapes in order, how
many new compilations each shape change caused (under ``torch.compile``: the graphs Dynamo
recompiled, and the programs the backend built), and whether every result was correct; the
test passes when every result was correct (compile counts are measured, not judged).

Modes:

- ``eager``: op by op. Compilations are the backend's own kernel/program compilations
  (``accelkit.stats()["compiles"]``); a backend that does not report them gets None.
- ``compile_static`` / ``compile_auto`` / ``compile_dynamic``: ``torch.compile(backend=<name>)``
  with ``dynamic=False`` / ``None`` (PyTorch's automatic dynamic shapes) / ``True``;
  compilations are the graphs Dynamo hands to the backend.
- ``compile_bucketed``: static compilation of inputs padded to the next power of two, the
  pattern for static-shape compilers (TorchTPU's bounded dynamism, Neuron's buckets).

The ``compile_*`` modes are declared skips for a backend without a compiler.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import accelkit
from accelkit_conformance import session
from accelkit_conformance.cases import Case, param_id
from accelkit_conformance.compare import assert_same
from accelkit_conformance.expectations import COMPILE_MODES

SETTINGS = session.current()
DEV = SETTINGS.device

#: The varying size, in the order the shapes are tried (repeats hit caches).
SIZES = (4, 8, 5, 16, 7, 4)


def _weights(*shape):
    g = torch.Generator().manual_seed(sum(shape))
    return torch.randn(*shape, generator=g)


def _mlp_step(params, x):
    w1, b1, w2, b2 = params
    out = torch.tanh(x @ w1 + b1) @ w2 + b2
    return out


#: case -> (inputs for size n, the varying one first; function; whether the first input's rows
#: are independent, so padding them is harmless)
CASES = {
    "add": (lambda n: [_weights(n, 8), _weights(8)], lambda x, y: x + y, True),
    "matmul": (lambda n: [_weights(n, 16), _weights(16, 8)], lambda x, w: x @ w, True),
    "softmax": (lambda n: [_weights(4, n)], lambda x: F.softmax(x, -1), False),
    "sum": (lambda n: [_weights(n, 8)], lambda x: x.sum(0), False),
    "conv2d": (lambda n: [_weights(1, 3, n + 2, n + 2), _weights(4, 3, 3, 3)], lambda x, w: F.conv2d(x, w), False),
    "cat": (lambda n: [_weights(n, 4), _weights(3, 4)], lambda x, y: torch.cat([x, y]), False),
    "index_select": (lambda n: [torch.arange(n) % 20, _weights(20, 4)], lambda i, x: x[i], False),
    "mlp": (lambda n: [_weights(n, 16), _weights(16, 32), _weights(32), _weights(32, 4), _weights(4)],
            lambda x, *params: _mlp_step(params, x), True),
}
COMPILED_CASES = ("matmul", "mlp")


def _cases():
    for case in CASES:
        for mode in ("eager", *(COMPILE_MODES if case in COMPILED_CASES else ())):
            yield pytest.param(case, mode, id=param_id(f"{case}.{mode}", "float32"))


def _compile_counts() -> tuple[int | None, int]:
    """The backend's own compilations (``stats()["compiles"]``, None when it reports none) and
    the programs its ``torch.compile`` compiler has built, from one ``accelkit.stats()``."""
    stats = accelkit.stats()
    value = stats.get("compiles")
    compiles = value if isinstance(value, int) and not isinstance(value, bool) else None
    return compiles, int(stats["compile"]["programs_compiled"])


def _bucket(n: int) -> int:
    return 1 << (n - 1).bit_length()


@pytest.mark.parametrize("case, mode", list(_cases()))
def test_dynamic(case, mode, recorder):
    make, fn, rows_independent = CASES[case]
    tolerance = SETTINGS.declared.tolerance(Case("dynamic", f"{case}.{mode}", "float32"))
    backward = case == "mlp"
    counter = None
    run = fn
    if mode != "eager":
        from torch import _dynamo
        from torch._dynamo.testing import CompileCounterWithBackend

        _dynamo.reset()
        counter = CompileCounterWithBackend(DEV.type)
        dynamic = {"compile_static": False, "compile_auto": None, "compile_dynamic": True,
                   "compile_bucketed": False}[mode]
        run = torch.compile(fn, backend=counter, dynamic=dynamic)
    shapes, per_step, programs, errors = [], [], [], []
    for n in SIZES:
        cpu_inputs = make(n)
        shapes.append(list(cpu_inputs[0].shape))
        if backward:
            cpu_inputs = [t.requires_grad_() for t in cpu_inputs]
        expected = fn(*cpu_inputs)
        expected_grads = torch.autograd.grad(expected.pow(2).sum(), cpu_inputs) if backward else None
        dev_inputs = [t.detach().to(DEV).requires_grad_(t.requires_grad) for t in cpu_inputs]
        if mode == "compile_bucketed" and rows_independent:
            pad = _bucket(n) - n
            padded = [F.pad(dev_inputs[0], (0, 0, 0, pad)), *dev_inputs[1:]]
        else:
            padded = dev_inputs
        frames_before = counter.frame_count if counter is not None else None
        compiles_before, programs_before = _compile_counts()
        try:
            with recorder.measure():
                actual = run(*padded)[:n] if padded is not dev_inputs else run(*padded)
                grads = torch.autograd.grad(actual.pow(2).sum(), dev_inputs) if backward else None
            assert_same(actual, expected, where=f"size {n}: output", tolerance=tolerance)
            if backward:
                assert_same(list(grads), list(expected_grads), where=f"size {n}: gradients", tolerance=tolerance)
        except AssertionError as exc:
            errors.append(str(exc).splitlines()[0])
        compiles_after, programs_after = _compile_counts()
        if counter is not None:
            per_step.append(counter.frame_count - frames_before)
            programs.append(programs_after - programs_before)
        else:
            per_step.append(None if compiles_after is None or compiles_before is None
                            else compiles_after - compiles_before)
    if counter is not None:
        recorder.compiles = counter.frame_count
    measured = None not in per_step
    recorder.set_dynamic(shapes, per_step[1:] if measured else None, correct=not errors,
                         programs=programs[1:] if counter is not None else None)
    if not measured:
        recorder.compiles = None
    if errors:
        raise AssertionError(f"{len(errors)} of {len(SIZES)} shapes gave wrong results; first: {errors[0]}")
