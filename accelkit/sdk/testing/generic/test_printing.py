"""Printing device tensors: the text is the CPU tensor's, plus ``device='ref:0'`` (on ref).

PyTorch formats a tensor by running ops on its device (to pick widths, scientific notation
and the summary). Those ops are the runtime's concern, not the program's: printing works under
the ``deny`` fallback policy, warns about nothing and leaves the op counters alone.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch

import accelkit
from accelkit.sdk.testing import device_under_test, holds, require_dtype

DEVICE = device_under_test()
SUFFIX = f"device='{DEVICE}'"
_KEYWORD = re.compile(r",\s+(?=[a-z_]+=)")  # the separator before each ``key=value`` suffix


def split_repr(text: str) -> tuple[str, list[str]]:
    """``tensor(<data>, k=v, ...)`` → ``("tensor(<data>", ["k=v", ...])``."""
    assert text.endswith(")")
    parts = _KEYWORD.split(text[:-1])
    return parts[0], parts[1:]


def assert_repr_is_cpu_repr_with_device(device_tensor: torch.Tensor, cpu_tensor: torch.Tensor) -> None:
    actual, expected = repr(device_tensor), repr(cpu_tensor)
    actual_data, actual_suffixes = split_repr(actual)
    expected_data, expected_suffixes = split_repr(expected)
    # The data part — every digit, width, line break and "..." — is exactly the CPU's.
    assert actual_data == expected_data
    # The device comes first among the suffixes; the rest (size, dtype, grad) are the CPU's.
    assert actual_suffixes == [SUFFIX, *expected_suffixes]
    assert actual.count(SUFFIX) == 1


def _seeded(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape) + 7)).to(dtype)


CASES = {
    "float_0d": lambda: torch.tensor(3.14159),
    "int_0d": lambda: torch.tensor(-42),
    "bool_0d": lambda: torch.tensor(True),
    "bf16_0d": lambda: torch.tensor(1.5, dtype=torch.bfloat16),
    "complex_0d": lambda: torch.tensor(2 - 1j),
    "empty_1d": lambda: torch.empty(0),
    "empty_3d_shows_size": lambda: torch.empty(2, 0, 3),
    "empty_int": lambda: torch.empty(0, dtype=torch.int32),
    "float_vector": lambda: torch.tensor([0.5, -1.25, 3.0]),
    "integral_floats": lambda: torch.tensor([1.0, 2.0, -3.0]),
    "mixed_magnitudes_scientific": lambda: torch.tensor([1e-8, 1.0, 3e9]),
    "nan_inf_negative_zero": lambda: torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 2.5]),
    "float_matrix": lambda: _seeded(4, 6),
    "float64": lambda: _seeded(3, 2, dtype=torch.float64),
    "float16": lambda: _seeded(5, dtype=torch.float16),
    "bf16_matrix": lambda: _seeded(3, 4, dtype=torch.bfloat16),
    "int64_large_values": lambda: torch.tensor([[2**40, -7], [0, 123456789]]),
    "int8": lambda: torch.tensor([-128, 0, 127], dtype=torch.int8),
    "uint8": lambda: torch.tensor([0, 17, 255], dtype=torch.uint8),
    "bool_vector": lambda: torch.tensor([True, False, True]),
    "complex64": lambda: torch.complex(_seeded(3), _seeded(3) * 2),
    "summarised_int_vector": lambda: torch.arange(2000),
    "summarised_float_matrix": lambda: _seeded(100, 100),
    "summarised_3d": lambda: _seeded(20, 30, 40),
    "summarised_bf16": lambda: torch.linspace(-1000, 1000, 3000).to(torch.bfloat16),
    "summarised_bool": lambda: torch.arange(1500) % 3 == 0,
    "summarised_with_nan": lambda: torch.cat([_seeded(1500), torch.tensor([float("nan")])]),
}


@pytest.mark.parametrize("make", CASES.values(), ids=CASES.keys())
def test_repr_is_the_cpu_repr_with_device_suffix(dev, make):
    cpu = make()
    require_dtype(cpu.dtype)
    assert_repr_is_cpu_repr_with_device(cpu.to(dev), cpu)


VIEWS = {
    "transposed": lambda x: x.t(),
    "strided_slice": lambda x: x[1::2, ::3],
    "selected_column": lambda x: x[:, 2],
    "expanded": lambda x: x[:1].expand(5, -1),
    "diagonal": lambda x: x.diagonal(),
    "int32_dtype_view": lambda x: x.view(torch.int32),
    "summarised_expanded": lambda x: x[0].expand(200, -1),
}


@pytest.mark.parametrize("view", VIEWS.values(), ids=VIEWS.keys())
def test_repr_of_non_contiguous_views_matches_cpu(dev, view):
    cpu = _seeded(6, 9)
    assert_repr_is_cpu_repr_with_device(view(cpu.to(dev)), view(cpu))


def test_repr_shows_autograd_state_like_cpu(dev):
    leaf_cpu = _seeded(2, 3).requires_grad_()
    leaf = leaf_cpu.detach().to(dev).requires_grad_()
    assert_repr_is_cpu_repr_with_device(leaf, leaf_cpu)
    assert_repr_is_cpu_repr_with_device(leaf * 2, leaf_cpu * 2)  # grad_fn=<MulBackward0>
    assert "grad_fn=<MulBackward0>" in repr(leaf * 2)


def test_parameter_repr_matches_cpu(dev):
    cpu = torch.nn.Parameter(_seeded(2, 2))
    device = torch.nn.Parameter(cpu.detach().to(dev))
    actual, expected = repr(device), repr(cpu)
    assert actual.startswith("Parameter containing:\n")
    head = "Parameter containing:\n"
    assert split_repr(actual[len(head):])[0] == split_repr(expected[len(head):])[0]
    assert split_repr(actual[len(head):])[1] == [SUFFIX, "requires_grad=True"]


def test_str_and_print_give_the_repr(dev, capsys):
    cpu = _seeded(3, 3)
    device = cpu.to(dev)
    assert str(device) == repr(device)
    print(device)
    assert capsys.readouterr().out == repr(device) + "\n"


def test_format_spec_of_0d_tensor_matches_cpu(dev):
    cpu = torch.tensor(2.0 / 3.0)
    assert f"{cpu.to(dev):.4f}" == f"{cpu:.4f}" == "0.6667"
    assert f"{torch.tensor(7).to(dev):>4}" == f"{torch.tensor(7):>4}"


PRINT_OPTIONS = {
    "precision_2": {"precision": 2},
    "sci_mode_on": {"sci_mode": True},
    "sci_mode_off": {"sci_mode": False},
    "low_threshold": {"threshold": 10, "edgeitems": 2},
    "narrow_lines": {"linewidth": 30},
    "profile_full": {"profile": "full"},
}


@pytest.fixture
def restore_print_options():
    yield
    torch.set_printoptions(profile="default")
    torch.set_printoptions(sci_mode=None)


@pytest.mark.parametrize("options", PRINT_OPTIONS.values(), ids=PRINT_OPTIONS.keys())
def test_print_options_apply_as_on_cpu(dev, restore_print_options, options):
    torch.set_printoptions(**options)
    for cpu in (_seeded(7, 8) * 1000, torch.tensor([1e-5, 2.0, 3e4]), torch.arange(40).reshape(4, 10)):
        assert_repr_is_cpu_repr_with_device(cpu.to(dev), cpu)


# -- fallback policy and counters ---------------------------------------------------------------


def test_printing_works_under_deny_and_counts_no_op(dev):
    tensors = [t for t in (make() for make in CASES.values()) if holds(t.dtype)]
    on_device = [t.to(dev) for t in tensors]
    square = torch.eye(3).to(dev)
    accelkit.reset_stats()
    with accelkit.fallback_policy("deny"):
        for d, c in zip(on_device, tensors):
            assert_repr_is_cpu_repr_with_device(d, c)
        after_printing = accelkit.stats()
        # Formatting is not the program's work: nothing is counted, natively or as fallback.
        assert after_printing["totals"] == {"native": 0, "decomposed": 0, "fallback": 0}
        assert after_printing["ops"] == {}
        # The exemption ends with the print: a real fallback is still denied.
        # An LDL factorisation: an op no in-tree backend implements (ref, tpu and neuron
        # checked with `accelkit conformance coverage`), so it can only take the fallback.
        with pytest.raises(accelkit.FallbackDeniedError, match="ldl_factor"):
            torch.linalg.ldl_factor(square)


def test_printing_under_warn_policy_emits_no_fallback_warning(dev):
    device = _seeded(50, 50).to(dev)
    with accelkit.fallback_policy("warn"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text = repr(device)
    assert SUFFIX in text
    assert [str(w.message) for w in caught] == []
    assert accelkit.stats()["totals"]["fallback"] == 0


def test_program_ops_are_still_counted_around_a_print(dev):
    x = torch.ones(3, device=dev)
    y = x + x
    repr(y)
    z = y * 2
    ops = accelkit.stats()["ops"]
    assert ops["aten.add.Tensor"]["native"] == 1
    assert ops["aten.mul.Tensor"]["native"] == 1
    assert z.cpu().tolist() == [4.0, 4.0, 4.0]
