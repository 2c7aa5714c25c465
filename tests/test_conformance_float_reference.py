"""The ops suite's second reference for bfloat16/float16 results (``accelkit_conformance.float_reference``):
the op run on the CPU in float32 and rounded once, for a backend that keeps float32 inside an
op where CPU's kernel rounds intermediates."""

from __future__ import annotations

import torch
from torch.testing._internal.opinfo.core import SampleInput

from accelkit_conformance import float_reference
from accelkit_conformance.compare import assert_same

# a x b where a product pair nearly cancels: CPU's bfloat16 kernel rounds each product first.
# The last component: 2.0625 * 3.34375 - (-1.4921875) * (-4.40625) is 0.322..., or 0.34375 when
# each product is rounded first.
A = torch.tensor([[2.0625, -1.4921875, -2.765625]], dtype=torch.bfloat16)
B = torch.tensor([[-4.40625, 3.34375, -4.15625]], dtype=torch.bfloat16)


def test_the_reference_is_the_float32_computation_rounded_once():
    sample = SampleInput(A, args=(B,), kwargs={"dim": 1})
    expected = torch.linalg.cross(A, B, dim=1)
    reference = float_reference.forward(torch.linalg.cross, float_reference.widened(sample, torch.bfloat16), sample, expected)
    once = torch.linalg.cross(A.float(), B.float(), dim=1).bfloat16()
    # outputs first, then the sample's tensors after the call (unchanged here)
    assert len(reference) == 3 and reference[0].dtype == torch.bfloat16
    assert torch.equal(reference[0], once)
    assert torch.equal(reference[1], A) and torch.equal(reference[2], B)


def test_cpus_bfloat16_kernel_can_miss_the_float32_result_by_more_than_the_tolerance():
    kernel = torch.linalg.cross(A, B, dim=1)
    once = torch.linalg.cross(A.float(), B.float(), dim=1).bfloat16()
    try:
        assert_same(once, kernel)
    except AssertionError:
        pass
    else:
        raise AssertionError("these inputs no longer show the difference the reference exists for")


def test_a_wrong_result_matches_neither_reference():
    sample = SampleInput(A, args=(B,), kwargs={"dim": 1})
    expected = torch.linalg.cross(A, B, dim=1)
    reference = float_reference.forward(torch.linalg.cross, float_reference.widened(sample, torch.bfloat16), sample, expected)
    wrong = reference[0] + 0.5
    for against in (expected, reference[0]):
        try:
            assert_same(wrong, against)
        except AssertionError:
            continue
        raise AssertionError("a result off by 0.5 passed")


def test_only_reduced_precision_has_a_second_reference():
    x = torch.randn(3)
    assert float_reference.widened(SampleInput(x), torch.float32) is None
    assert float_reference.forward(torch.sin, None, SampleInput(x), torch.sin(x)) is None


def test_a_dtype_argument_naming_the_tested_dtype_computes_in_float32_too():
    # logspace(4.3, -3, 2) in bfloat16: CPU's kernel rounds 4.3 to 4.3125 first and returns
    # 20480; 10 ** 4.3 = 19952.6 rounds once to 19968.
    sample = SampleInput(4.3, args=(-3, 2), kwargs={"dtype": torch.bfloat16})
    expected = torch.logspace(4.3, -3, 2, dtype=torch.bfloat16)
    assert expected[0].item() == 20480
    reference = float_reference.forward(torch.logspace, float_reference.widened(sample, torch.bfloat16), sample, expected)
    assert reference[0].dtype == torch.bfloat16 and reference[0][0].item() == 19968
    assert torch.equal(reference[0], torch.logspace(4.3, -3, 2, dtype=torch.float32).bfloat16())


def test_the_float32_copy_is_taken_before_a_run_updates_the_sample():
    # instance_norm with running statistics updates them in place: a copy taken after the CPU
    # run would start from updated statistics and apply the update twice.
    x = torch.tensor([[[1.0, 2.0, 4.0, 8.0]]], dtype=torch.bfloat16)
    mean, var = torch.zeros(1, dtype=torch.bfloat16), torch.ones(1, dtype=torch.bfloat16)
    sample = SampleInput(x, kwargs={"running_mean": mean, "running_var": var, "use_input_stats": True, "momentum": 0.5})
    wide = float_reference.widened(sample, torch.bfloat16)
    expected = torch.nn.functional.instance_norm(x, **sample.kwargs)
    reference = float_reference.forward(torch.nn.functional.instance_norm, wide, sample, expected)
    once_mean = torch.zeros(1)
    torch.nn.functional.instance_norm(x.float(), running_mean=once_mean, running_var=torch.ones(1), momentum=0.5)
    assert mean.item() == once_mean.bfloat16().item() == 1.875  # CPU's run updated the sample once
    assert torch.equal(reference[2], once_mean.bfloat16())  # outputs, input, running_mean, running_var


def test_results_of_another_structure_have_no_reference():
    assert float_reference.rounded_like([torch.zeros(2)], [torch.zeros(2), torch.zeros(2)]) is None
    assert float_reference.rounded_like([torch.zeros(3)], [torch.zeros(2)]) is None


def test_gradients_are_the_float32_gradients_rounded_to_each_inputs_dtype():
    a = A.clone().requires_grad_()
    b = torch.tensor([[0.5, 0.25, 3.0]], requires_grad=True)  # float32: kept as it is
    sample = SampleInput(a, args=(b,))
    grad_out = torch.tensor([[1.0, -2.0, 0.75]], dtype=torch.bfloat16)
    grads = float_reference.gradients(torch.mul, float_reference.widened(sample, torch.bfloat16), [0], [grad_out], [a, b])
    wide_a = A.float().requires_grad_()
    wide_b = b.detach().clone().requires_grad_()
    want = torch.autograd.grad(wide_a * wide_b, [wide_a, wide_b], grad_out.float())
    assert grads[0].dtype == torch.bfloat16 and torch.equal(grads[0], want[0].bfloat16())
    assert grads[1].dtype == torch.float32 and torch.equal(grads[1], want[1])
