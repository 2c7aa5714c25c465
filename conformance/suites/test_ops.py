"""Ops: every OpInfo of PyTorch's ``op_db`` on the device, compared with the CPU.

One test per (OpInfo, dtype, variant). The OpInfo's sample inputs are generated on the device
(so tensors a sample deliberately keeps on the CPU stay there), copied to the CPU, and the op
runs on both:

- ``forward``: outputs, and the inputs after the call (in-place effects), must match the CPU;
- ``backward`` (OpInfos that support autograd, in their backward dtypes): gradients of every
  differentiable output, for the same random output gradients, must match the CPU's.

Selection ops whose indices PyTorch leaves open among equal values (an unstable ``sort``,
``topk``, ``kthvalue``, ``mode``, ...) are compared on what PyTorch promises (:mod:`.ties`).
A bfloat16/float16 result that misses CPU's kernel gets a second reference: CPU computing in
float32, rounded once (:mod:`.float_reference`); the record counts the comparisons it settled,
and the report lists those tests.

Where PyTorch's OpInfo skips or expects to fail its own comparison with the CPU on every device
(``TestCommon.test_compare_cpu``: nondeterministic outputs such as ``empty`` or ``bernoulli``),
the test is skipped with PyTorch's reason; its tolerance overrides widen the defaults. A
backend's declared tolerances (``[[tolerance]]``) take precedence.
"""

from __future__ import annotations

import itertools
import zlib

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

from accelkit_conformance import float_reference, session, upstream
from accelkit_conformance.ties import open_ties
from accelkit_conformance.cases import Case, param_id
from accelkit_conformance.compare import (
    assert_same,
    tensors_in,
    to_cpu_leaf,
    to_device_leaf,
)

SETTINGS = session.current()
upstream.skip_test_fn_lookup()


def _cases():
    device_type = SETTINGS.device.type
    for op in op_db:
        forward = op.supported_dtypes(device_type)
        backward = op.supported_backward_dtypes(device_type) if op.supports_autograd else set()
        for dtype, name in zip(SETTINGS.torch_dtypes, SETTINGS.dtypes):
            variants = []
            if dtype in forward:
                variants.append("forward")
            if SETTINGS.profile.op_backward and dtype in backward and dtype in forward:
                variants.append("backward")
            skip = upstream.skip_reason(op.decorators, upstream.OP_TEST, dtype, op.full_name)
            for variant in variants:
                marks = [pytest.mark.skip(reason=skip)] if skip else []
                yield pytest.param(op, dtype, variant, id=param_id(op.full_name, name, variant), marks=marks)


def _samples(op, dtype: torch.dtype, requires_grad: bool, limit: int | None):
    torch.manual_seed(zlib.crc32(op.full_name.encode()))
    samples = op.sample_inputs(SETTINGS.device, dtype, requires_grad=requires_grad)
    return enumerate(itertools.islice(samples, limit))


def _describe(i: int, sample) -> str:
    text = sample.summary() if hasattr(sample, "summary") else repr(sample)
    text = " ".join(text.split())
    return f"sample {i} ({text[:300]}{'...' if len(text) > 300 else ''})"


def _on_cpu(sample):
    """The CPU twin of a device sample: tensors copied, device arguments (``device=`` or
    positional, as in ``x.to(device, dtype)``) pointed at the CPU."""
    cpu = sample.transform(lambda t: to_cpu_leaf(t) if isinstance(t, torch.Tensor) else t)
    cpu.args = tuple(_cpu_if_device(a) for a in cpu.args)
    if "device" in cpu.kwargs:
        cpu.kwargs["device"] = _cpu_if_device(torch.device(cpu.kwargs["device"]))
    return cpu


def _cpu_if_device(value):
    if isinstance(value, torch.device) and value.type == SETTINGS.device.type:
        return torch.device("cpu")
    return value


def _call(op, sample):
    return op(sample.input, *sample.args, **sample.kwargs)


@pytest.mark.parametrize("op, dtype, variant", list(_cases()))
def test_op(op, dtype, variant, recorder):
    case = Case("ops", op.full_name, str(dtype).removeprefix("torch."), variant)
    tolerance = SETTINGS.declared.tolerance(case) or upstream.tolerance(op.decorators, upstream.OP_TEST, dtype)
    # An expected failure runs every sample: passing on the profile's first few says nothing.
    declared = SETTINGS.declared.lookup(case)
    limit = None if declared is not None and declared.kind == "xfail" else SETTINGS.profile.op_samples
    ran, cpu_errors = 0, []
    for i, sample in _samples(op, dtype, requires_grad=variant == "backward", limit=limit):
        where = _describe(i, sample)
        cpu_sample = _on_cpu(sample)
        wide = float_reference.widened(cpu_sample, dtype)  # before a run updates the sample
        try:
            expected = cpu_sample.output_process_fn_grad(_call(op, cpu_sample))
        except Exception as exc:  # an input the CPU rejects tells nothing about the device
            cpu_errors.append(f"{type(exc).__name__}: {exc}")
            continue
        if variant == "forward":
            ran += _check_forward(op, wide, sample, cpu_sample, expected, where, recorder, tolerance)
        else:
            ran += _check_backward(op, wide, sample, cpu_sample, expected, where, recorder, tolerance, seed=i)
    if not ran:
        if cpu_errors:
            why = f"the CPU rejected every sample ({cpu_errors[0]})"
        elif variant == "backward":
            why = "no sample input has a differentiable output"
        else:
            why = "the OpInfo has no sample inputs"
        pytest.skip(f"{op.full_name} {case.dtype} {variant}: {why}")


def _check_forward(op, wide, sample, cpu_sample, expected, where, recorder, tolerance) -> int:
    with recorder.measure():
        actual = _call(op, sample)
    actual = sample.output_process_fn_grad(actual)
    inputs = list(tensors_in((sample.input, sample.args, sample.kwargs)))
    try:
        ties = open_ties(op.full_name, sample)
        if ties is None:
            assert_same(actual, expected, where=f"{where}: output", tolerance=tolerance)
        else:
            ties.assert_same_outputs(actual, expected, cpu_sample.input, where=where, tolerance=tolerance)
        cpu_inputs = list(tensors_in((cpu_sample.input, cpu_sample.args, cpu_sample.kwargs)))
        assert_same(inputs, cpu_inputs, where=f"{where}: inputs after the call", tolerance=tolerance)
    except AssertionError:
        if not _matches_float_reference(op, wide, cpu_sample, expected, list(tensors_in(actual)) + inputs, tolerance):
            raise
        recorder.settled_by_float_reference()
    return 1


def _matches_float_reference(op, wide, cpu_sample, expected, results: list, tolerance) -> bool:
    """Whether ``results`` (the device's outputs, then its inputs after the call) match the op
    run on ``wide``, the sample's float32 copy, rounded (:mod:`.float_reference`)."""
    reference = float_reference.forward(op, wide, cpu_sample, expected)
    return reference is not None and _matches(results, reference, tolerance)


def _matches(results: list, reference: list, tolerance) -> bool:
    try:
        assert_same(results, reference, where="float32 reference", tolerance=tolerance)
    except AssertionError:
        return False
    return True


def _differentiable(t: torch.Tensor) -> bool:
    return t.requires_grad and (t.dtype.is_floating_point or t.dtype.is_complex)


def _check_backward(op, wide, sample, cpu_sample, expected, where, recorder, tolerance, seed: int) -> int:
    cpu_outs = list(tensors_in(expected))
    cpu_inputs = [t for t in tensors_in((cpu_sample.input, cpu_sample.args, cpu_sample.kwargs)) if t.requires_grad]
    wanted = [k for k, t in enumerate(cpu_outs) if _differentiable(t)]
    if not wanted or not cpu_inputs:
        return 0
    with recorder.measure():
        actual = _call(op, sample)
    actual = sample.output_process_fn_grad(actual)
    dev_outs = list(tensors_in(actual))
    if len(dev_outs) != len(cpu_outs):
        raise AssertionError(f"{where}: {len(dev_outs)} output tensors on the device, {len(cpu_outs)} on CPU")
    missing = [k for k in wanted if not dev_outs[k].requires_grad]
    if missing:
        raise AssertionError(f"{where}: output tensor(s) {missing} do not require grad on the device (they do on CPU)")
    dev_inputs = [t for t in tensors_in((sample.input, sample.args, sample.kwargs)) if t.requires_grad]
    generator = torch.Generator().manual_seed(seed)
    grads_out = [torch.randn(cpu_outs[k].shape, dtype=cpu_outs[k].dtype, generator=generator) for k in wanted]
    cpu_grads = torch.autograd.grad([cpu_outs[k] for k in wanted], cpu_inputs, grads_out, allow_unused=True)
    with recorder.measure():
        dev_grads = torch.autograd.grad(
            [dev_outs[k] for k in wanted], dev_inputs,
            [to_device_leaf(g, SETTINGS.device) for g in grads_out], allow_unused=True,
        )
    dev_grads = [torch.zeros_like(leaf) if got is None else got for got, leaf in zip(dev_grads, cpu_inputs)]
    try:
        _assert_same_gradients(op, sample, cpu_sample, dev_grads, cpu_grads, cpu_inputs, where, tolerance)
    except AssertionError:
        reference = float_reference.gradients(op, wide, wanted, grads_out, cpu_inputs)
        if reference is None or not _matches(dev_grads, reference, tolerance):
            raise
        recorder.settled_by_float_reference()
    return 1


def _assert_same_gradients(op, sample, cpu_sample, dev_grads, cpu_grads, cpu_inputs, where, tolerance) -> None:
    ties = open_ties(op.full_name, sample)
    for k, (got, want, leaf) in enumerate(zip(dev_grads, cpu_grads, cpu_inputs)):
        want = torch.zeros_like(leaf) if want is None else want
        if ties is not None and leaf is cpu_sample.input:
            ties.assert_same_input_gradient(got, want, leaf, where=f"{where}: gradient of input {k}", tolerance=tolerance)
        else:
            assert_same(got, want, where=f"{where}: gradient of input {k}", tolerance=tolerance)
