"""Cases PyTorch's own device-generic tests (``test_ops.py``, ``test_indexing.py``) found on
neuron, re-written against CPU torch: an empty contraction in ``addmm``, uint8 masks, values
that do not broadcast to an empty index, ``nonzero`` into a 0-dim ``out=``, and ``mode``.

The device-generic versions (every backend) are in ``accelkit.sdk.testing.generic``'s
``test_edge_inputs.py`` and ``test_outs.py``; these add what is neuron's own: the tile programs
run natively.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import assert_native

import accelkit

UINT8_WARNING = "indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool instead."


def _messages(fn) -> tuple[object, list[str]]:
    """``fn()`` and its UserWarnings, as PyTorch words them (without the C++ source location
    it appends), the fallback's own warnings left out."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with accelkit.fallback_policy("allow"):
            result = fn()
    return result, [str(w.message).split(" (Triggered internally at")[0] for w in caught
                    if issubclass(w.category, UserWarning)]


# -- addmm with an empty contraction (K = 0) ------------------------------------------------


@pytest.mark.parametrize("m, n", [(2, 3), (130, 600)])  # one tile; several row and column tiles
@pytest.mark.parametrize("beta, alpha", [(2, 1), (1, 3), (0.5, 0)])
def test_addmm_with_an_empty_contraction_is_beta_times_input_natively(dev, m, n, beta, alpha):
    bias, a, b = torch.randn(m, n), torch.randn(m, 0), torch.randn(0, n)
    expected = torch.addmm(bias, a, b, beta=beta, alpha=alpha)
    got = torch.addmm(bias.to(dev), a.to(dev), b.to(dev), beta=beta, alpha=alpha)
    torch.testing.assert_close(got.cpu(), expected)
    assert_native("aten.addmm.default")


def test_addmm_with_an_empty_contraction_and_beta_zero_ignores_nan_input(dev):
    bias = torch.full((3, 4), float("nan"))
    got = torch.addmm(bias.to(dev), torch.ones(3, 0, device=dev), torch.ones(0, 4, device=dev), beta=0)
    assert torch.equal(got.cpu(), torch.zeros(3, 4))
    assert_native("aten.addmm.default")


# -- uint8 masks ---------------------------------------------------------------------------


def test_a_uint8_mask_reads_with_pytorchs_deprecation_warning(dev):
    x, mask = torch.arange(6.0).reshape(2, 3), torch.tensor([1, 0, 1], dtype=torch.uint8)
    expected, cpu_warnings = _messages(lambda: x[:, mask])
    got, device_warnings = _messages(lambda: x.to(dev)[:, mask.to(dev)])
    assert torch.equal(got.cpu(), expected)
    assert cpu_warnings == device_warnings == [UINT8_WARNING]
    assert_native("aten.index.Tensor")


@pytest.mark.parametrize("accumulate", [False, True])
def test_a_uint8_mask_writes_with_pytorchs_deprecation_warning(dev, accumulate):
    x, mask = torch.zeros(4), torch.tensor([1, 0, 1, 1], dtype=torch.uint8)
    values = torch.tensor([1.0, 2.0, 3.0])
    _, cpu_warnings = _messages(lambda: x.index_put_((mask,), values, accumulate=accumulate))
    y = torch.zeros(4, device=dev)
    _, device_warnings = _messages(lambda: y.index_put_((mask.to(dev),), values.to(dev), accumulate=accumulate))
    assert torch.equal(y.cpu(), x)
    assert cpu_warnings == device_warnings == [UINT8_WARNING]


def test_a_bool_mask_gives_no_warning(dev):
    x, mask = torch.arange(4.0), torch.tensor([True, False, True, False])
    _, device_warnings = _messages(lambda: x.to(dev)[mask.to(dev)])
    assert device_warnings == []


# -- values that do not broadcast to the indexed shape ---------------------------------------

#: (case, x shape, indices on the CPU, values shape): CPU raises "shape mismatch" for each,
#: also when the indices select nothing.
MISMATCH_CASES = [
    ("empty index", (3,), lambda: (torch.tensor([], dtype=torch.int64),), (2,)),
    ("empty index, 2-d", (3, 4), lambda: (torch.tensor([], dtype=torch.int64),), (3, 4)),
    ("all-false mask", (3,), lambda: (torch.tensor([False, False, False]),), (2,)),
    ("two indices", (3,), lambda: (torch.tensor([0, 2]),), (3,)),
    ("more dims than the result", (3,), lambda: (torch.tensor([0, 2]),), (1, 1, 2)),
]


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("shape, make_indices, values_shape", [c[1:] for c in MISMATCH_CASES],
                         ids=[c[0] for c in MISMATCH_CASES])
def test_values_that_do_not_broadcast_raise_like_cpu_and_leave_x_unchanged(
        dev, shape, make_indices, values_shape, accumulate):
    indices, values = make_indices(), torch.ones(values_shape)
    with pytest.raises(RuntimeError) as cpu_error:
        torch.zeros(shape).index_put_(indices, values, accumulate=accumulate)
    x = torch.zeros(shape, device=dev)
    with pytest.raises(RuntimeError) as device_error:
        x.index_put_(tuple(i.to(dev) for i in indices), values.to(dev), accumulate=accumulate)
    assert str(device_error.value) == str(cpu_error.value)
    assert str(cpu_error.value).startswith("shape mismatch: value tensor of shape")
    assert torch.equal(x.cpu(), torch.zeros(shape))


@pytest.mark.parametrize("accumulate", [False, True])
def test_values_that_broadcast_to_an_empty_index_change_nothing(dev, accumulate):
    x = torch.arange(3.0, device=dev)
    x.index_put_((torch.tensor([], dtype=torch.int64, device=dev),), torch.ones(1, device=dev),
                 accumulate=accumulate)
    assert torch.equal(x.cpu(), torch.arange(3.0))


# -- nonzero into a 0-dim out= (CPU fallback resizing a host copy) ---------------------------


def test_nonzero_into_a_zero_dim_out_is_resized_like_cpu(dev):
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    cpu_out = torch.zeros((), dtype=torch.int64)
    _, cpu_warnings = _messages(lambda: torch.nonzero(x, out=cpu_out))
    out = torch.zeros((), dtype=torch.int64, device=dev)
    _, device_warnings = _messages(lambda: torch.nonzero(x.to(dev), out=out))
    assert out.shape == cpu_out.shape and torch.equal(out.cpu(), cpu_out)
    assert [m.split(". ")[0] for m in device_warnings] == [m.split(". ")[0] for m in cpu_warnings]


# -- mode ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
@pytest.mark.parametrize("keepdim", [False, True])
def test_mode_and_its_out_variant_match_cpu_on_the_device(dev, dtype, keepdim):
    """``mode`` (decompositions/sort.py) and its ``out=`` form: the CPU's values and indices
    (ties between values included), with the fallback denied."""
    x = torch.tensor([[1, 2, 2, 0], [3, 3, 1, 1], [0, 5, 5, 5]]).to(dtype)
    expected = torch.mode(x, 1, keepdim)
    with accelkit.fallback_policy("deny"):
        got = torch.mode(x.to(dev), 1, keepdim)
        outs = (torch.empty(0, dtype=dtype, device=dev), torch.empty(0, dtype=torch.int64, device=dev))
        torch.mode(x.to(dev), 1, keepdim, out=outs)
    for values, indices in (got, outs):
        assert torch.equal(values.cpu(), expected.values) and torch.equal(indices.cpu(), expected.indices)
    ops = accelkit.stats()["ops"]
    assert ops["aten.mode.default"]["fallback"] == 0 and ops["aten.mode.values"]["fallback"] == 0
