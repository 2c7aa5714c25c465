"""The ops suite compares selection ops up to how they break ties (``accelkit_conformance.ties``):
another valid choice among equal elements passes, anything PyTorch does promise is still
checked. The "device" results here are CPU tensors built to be right or wrong on purpose."""

from __future__ import annotations

import pytest
import torch
from torch.testing._internal.opinfo.core import SampleInput

from accelkit_conformance.ties import open_ties

# Equal values in every row: which of them an index names is open.
TIED = torch.tensor([[3.0, 1.0, 3.0, 2.0, 1.0, 3.0],
                     [0.0, 0.0, 5.0, 5.0, 0.0, 4.0]])


def _reversed_ties_sort(x: torch.Tensor, dim: int, descending: bool = False):
    """A correct sort that breaks ties the other way from a stable one."""
    flipped = x.flip(dim)
    values, indices = torch.sort(flipped, dim=dim, descending=descending, stable=True)
    return torch.return_types.sort((values, x.shape[dim] - 1 - indices))


def test_a_sort_that_breaks_ties_another_way_passes():
    sample = SampleInput(TIED, args=(1,))
    ties = open_ties("sort", sample)
    expected = torch.sort(TIED, dim=1, stable=True)
    actual = _reversed_ties_sort(TIED, 1)
    assert not torch.equal(actual.indices, expected.indices)  # the check below has work to do
    ties.assert_same_outputs(actual, expected, TIED, where="sample")


def test_an_index_naming_a_different_value_fails():
    ties = open_ties("sort", SampleInput(TIED, args=(1,)))
    expected = torch.sort(TIED, dim=1, stable=True)
    wrong = expected.indices.clone()
    wrong[0, 0], wrong[0, -1] = wrong[0, -1].item(), wrong[0, 0].item()  # a 1 and a 3 swapped
    with pytest.raises(AssertionError, match="name an element whose value differs"):
        ties.assert_same_outputs(torch.return_types.sort((expected.values, wrong)), expected, TIED, where="sample")


def test_sort_indices_must_be_a_permutation():
    ties = open_ties("argsort", SampleInput(TIED, kwargs={"dim": 1}))
    expected = torch.argsort(TIED, dim=1)
    repeated = expected.clone()
    repeated[0, 1] = repeated[0, 0]  # both name a 1.0: right values, but one element twice
    with pytest.raises(AssertionError, match="not a permutation"):
        ties.assert_same_outputs(repeated, expected, TIED, where="sample")


def test_values_are_still_compared_exactly():
    ties = open_ties("topk", SampleInput(TIED, args=(2, 1)))
    expected = torch.topk(TIED, 2, 1)
    off = torch.return_types.topk((expected.values + 0.5, expected.indices))
    with pytest.raises(AssertionError, match=r"output\[0\]"):
        ties.assert_same_outputs(off, expected, TIED, where="sample")


def test_index_out_of_range_fails():
    ties = open_ties("mode", SampleInput(TIED, args=(1,)))
    expected = torch.mode(TIED, 1)
    outside = torch.return_types.mode((expected.values, expected.indices + TIED.shape[1]))
    with pytest.raises(AssertionError, match="outside dimension 1"):
        ties.assert_same_outputs(outside, expected, TIED, where="sample")


def test_kthvalue_without_keepdim_may_name_any_equal_element():
    ties = open_ties("kthvalue", SampleInput(TIED, args=(5, 1)))
    expected = torch.kthvalue(TIED, 5, 1)  # row 0: a 3.0 (three of them); row 1: a 5.0 (two)
    other = torch.return_types.kthvalue((expected.values, torch.tensor([5, 2])))
    assert not torch.equal(other.indices, expected.indices)
    ties.assert_same_outputs(other, expected, TIED, where="sample")


def test_a_stable_sort_is_compared_as_any_op():
    assert open_ties("sort", SampleInput(TIED, kwargs={"dim": 1, "stable": True})) is None
    assert open_ties("argsort", SampleInput(TIED, args=(1, False, True))) is None
    assert open_ties("add", SampleInput(TIED, args=(TIED,))) is None


def test_gradients_are_compared_summed_over_equal_elements():
    ties = open_ties("sort", SampleInput(TIED, args=(1,)))
    grad_out = torch.arange(12.0).view(2, 6)
    cpu = torch.zeros_like(TIED).scatter(1, torch.sort(TIED, dim=1, stable=True).indices, grad_out)
    device = torch.zeros_like(TIED).scatter(1, _reversed_ties_sort(TIED, 1).indices, grad_out)
    assert not torch.equal(cpu, device)
    ties.assert_same_input_gradient(device, cpu, TIED, where="gradient")
    misplaced = device.clone()
    misplaced[0, 0], misplaced[0, 1] = misplaced[0, 1].item(), misplaced[0, 0].item()  # a 3.0's and a 1.0's
    with pytest.raises(AssertionError, match="summed over equal elements"):
        ties.assert_same_input_gradient(misplaced, cpu, TIED, where="gradient")


def test_dimension_comes_from_args_kwargs_or_the_default():
    x = torch.zeros(2, 3, 4)
    assert open_ties("sort", SampleInput(x)).dim == 2
    assert open_ties("sort", SampleInput(x, args=(0, True))).dim == 0
    assert open_ties("sort", SampleInput(x, kwargs={"dim": -2})).dim == 1
    assert open_ties("topk", SampleInput(x, args=(1,))).dim == 2
    assert open_ties("msort", SampleInput(x)).dim == 0


def test_empty_and_zero_dimensional_inputs_are_compared_as_any_op():
    for source in (torch.zeros(0), torch.zeros(3, 0), torch.tensor(2.0)):
        ties = open_ties("sort", SampleInput(source))
        ties.assert_same_input_gradient(torch.zeros_like(source), torch.zeros_like(source), source, where="gradient")
        ties.assert_same_outputs(torch.sort(source), torch.sort(source), source, where="sample")
    with pytest.raises(AssertionError):
        ties.assert_same_input_gradient(torch.ones_like(source), torch.zeros_like(source), source, where="gradient")
