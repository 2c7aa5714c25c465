"""A number that does not fit the tensor it is used with: the device refuses it exactly where
the CPU does, with the CPU's error, before anything is written — and takes it where the CPU
takes it, with the CPU's result (uint8's -1, an int tensor clamped by a float bound).

Device-generic: runs on ref, and on tpu and neuron through ``--accelkit-device``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from accelkit.sdk import UnsupportedDtypeError
from accelkit.sdk.testing import device_under_test, holds

DEVICE = device_under_test()

Case = Callable[[torch.device], object]


def outcome(case: Case, device: torch.device) -> object:
    """What ``case`` gives on ``device``: (exception type, message), or its result on the host."""
    try:
        result = case(device)
    except Exception as error:  # noqa: BLE001 - the exception is the outcome compared
        return type(error), str(error)
    return result.cpu() if isinstance(result, torch.Tensor) else result


def assert_same_outcome(case: Case) -> object:
    """The device's outcome is the CPU's; a dtype the device does not hold skips the test
    (that refusal is its backend's own test)."""
    expected, actual = outcome(case, torch.device("cpu")), outcome(case, DEVICE)
    if isinstance(actual, tuple) and actual[0] is UnsupportedDtypeError:
        pytest.skip(actual[1])
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), actual
        assert actual.dtype == expected.dtype
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)
    else:
        assert actual == expected
    return expected


def i8(device, values=(1, 2, 3)):
    return torch.tensor(values, dtype=torch.int8).to(device)


def mask(device):
    return torch.tensor([True, False, True]).to(device)


OVERFLOWING: dict[str, Case] = {
    "full": lambda d: torch.full((2,), 1000, dtype=torch.int8, device=d),
    "full with a 0-dim tensor": lambda d: torch.full((2,), torch.tensor(1000).to(d), dtype=torch.int8, device=d),
    "fill_": lambda d: i8(d).fill_(1000),
    "new_full": lambda d: i8(d).new_full((2,), 1000),
    "full_like": lambda d: torch.full_like(i8(d), 1000),
    "new_full uint8 -256": lambda d: i8(d).to(torch.uint8).new_full((2,), -256),
    "masked_fill": lambda d: i8(d).masked_fill(mask(d), 1000),
    "masked_fill, nothing masked": lambda d: i8(d).masked_fill(~mask(d) & mask(d), 1000),
    "masked_fill with a 0-dim tensor": lambda d: i8(d).masked_fill(mask(d), torch.tensor(1000).to(d)),
    "masked_fill with a host 0-dim tensor": lambda d: i8(d).masked_fill(mask(d), torch.tensor(1000)),
    "masked_fill half -1e9": lambda d: torch.zeros(3, dtype=torch.float16).to(d).masked_fill(mask(d), -1e9),
    "index_fill": lambda d: i8(d).index_fill(0, torch.tensor([0]).to(d), 1000),
    "index_fill with a 0-dim tensor": lambda d: i8(d).index_fill(0, torch.tensor([0]).to(d), torch.tensor(1000).to(d)),
    "scatter value": lambda d: i8(d).scatter(0, torch.tensor([0]).to(d), 1000),
    "clamp min": lambda d: i8(d).clamp(min=1000),
    "clamp max": lambda d: i8(d).clamp(max=-1000),
    "clamp_min": lambda d: torch.clamp_min(i8(d), 1000),
    "where": lambda d: torch.where(mask(d), i8(d), 1000),
    "pow": lambda d: i8(d) ** 1000,
    "addcmul": lambda d: torch.addcmul(i8(d), i8(d), i8(d), value=1000),
    "add alpha": lambda d: torch.add(i8(d), i8(d), alpha=1000),
    "sub alpha": lambda d: torch.sub(i8(d), i8(d), alpha=-1000),
    "pad": lambda d: F.pad(i8(d), (1, 1), value=1000),
    "threshold value": lambda d: torch.threshold(i8(d), 0, 1000),
    "hardtanh": lambda d: F.hardtanh(torch.zeros(3, dtype=torch.float16).to(d), -1e6, 1e6),
    "int8 fill 127.5": lambda d: i8(d).fill_(127.5),
    "uint8 fill -1.0": lambda d: i8(d).to(torch.uint8).fill_(-1.0),
    "uint8 fill 256": lambda d: i8(d).to(torch.uint8).fill_(256),
    "int32 fill nan": lambda d: torch.zeros(3, dtype=torch.int32).to(d).fill_(math.nan),
    "int32 fill inf": lambda d: torch.zeros(3, dtype=torch.int32).to(d).fill_(math.inf),
    "float32 fill 1e300": lambda d: torch.zeros(3).to(d).fill_(1e300),
    "bfloat16 fill 1e300": lambda d: torch.zeros(3, dtype=torch.bfloat16).to(d).fill_(1e300),
    "float16 fill 70000": lambda d: torch.zeros(3, dtype=torch.float16).to(d).fill_(70000),
    "leaky_relu slope": lambda d: F.leaky_relu(torch.ones(3).to(d), 1e300),
    "elu alpha": lambda d: F.elu(-torch.ones(3).to(d), alpha=1e300),
    "lerp weight": lambda d: torch.lerp(torch.ones(3).to(d), torch.zeros(3).to(d), 1e300),
    "empty fill": lambda d: torch.empty(0, dtype=torch.int8).to(d).fill_(1000),
}

FITTING: dict[str, Case] = {
    "uint8 fill -1 wraps as on the cpu": lambda d: i8(d).to(torch.uint8).fill_(-1),
    "uint8 fill -255": lambda d: i8(d).to(torch.uint8).fill_(-255),
    "int8 fill -0.9 truncates": lambda d: i8(d).fill_(-0.9),
    "int8 fill -128": lambda d: i8(d).fill_(-128),
    "bool fill 2": lambda d: torch.zeros(3, dtype=torch.bool).to(d).fill_(2),
    "bool fill nan": lambda d: torch.zeros(3, dtype=torch.bool).to(d).fill_(math.nan),
    "half masked_fill -inf": lambda d: torch.zeros(3, dtype=torch.float16).to(d).masked_fill(mask(d), -math.inf),
    "half masked_fill finfo.min": lambda d: torch.zeros(3, dtype=torch.float16).to(d).masked_fill(
        mask(d), torch.finfo(torch.float16).min),
    "float32 masked_fill -1e9": lambda d: torch.zeros(3).to(d).masked_fill(mask(d), -1e9),
    "float32 masked_fill with a float32 0-dim tensor": lambda d: torch.zeros(3).to(d).masked_fill(
        mask(d), torch.tensor(-1e30).to(d)),
    "clamp int8 by a float bound promotes": lambda d: i8(d).clamp(min=1000.5),
    "where int8 or a float promotes": lambda d: torch.where(mask(d), i8(d), 0.5),
    "fill_ with a 0-dim tensor copies and wraps as on the cpu": lambda d: i8(d).fill_(torch.tensor(1000).to(d)),
    "fill_ with a host 0-dim tensor as on the cpu": lambda d: i8(d).fill_(torch.tensor(1000)),
    "arange int8 wraps as on the cpu": lambda d: torch.arange(0, 1000, 100, dtype=torch.int8, device=d),
    "add int8 + 1000 wraps as on the cpu": lambda d: i8(d) + 1000,
    "add alpha -128": lambda d: torch.add(i8(d), i8(d), alpha=-128),
    "half fill 65504": lambda d: torch.zeros(3, dtype=torch.float16).to(d).fill_(65504),
    "half fill inf": lambda d: torch.zeros(3, dtype=torch.float16).to(d).fill_(math.inf),
    "lerp half weight 1e5 (float32 arithmetic)": lambda d: torch.lerp(
        torch.ones(3, dtype=torch.float16).to(d), torch.zeros(3, dtype=torch.float16).to(d), 1e5),
}


@pytest.mark.parametrize("case", OVERFLOWING)
def test_a_number_that_does_not_fit_raises_the_cpu_error(case):
    expected = assert_same_outcome(OVERFLOWING[case])
    assert isinstance(expected, tuple) and expected[0] is RuntimeError
    assert "without overflow" in expected[1]


@pytest.mark.parametrize("case", FITTING)
def test_a_number_that_fits_gives_the_cpu_result(case):
    assert isinstance(assert_same_outcome(FITTING[case]), torch.Tensor)


#: In-place and out= forms: (name, call(tensor, mask, index) -> writes the tensor or out).
WRITERS: dict[str, Callable] = {
    "fill_": lambda x, m, i, out: x.fill_(1000),
    "masked_fill_": lambda x, m, i, out: x.masked_fill_(m, 1000),
    "index_fill_": lambda x, m, i, out: x.index_fill_(0, i, 1000),
    "clamp_": lambda x, m, i, out: x.clamp_(min=1000),
    "add_ alpha": lambda x, m, i, out: x.add_(x, alpha=1000),
    "threshold_": lambda x, m, i, out: torch.threshold_(x, 0, 1000),
    "pow_": lambda x, m, i, out: x.pow_(1000),
    "scatter_": lambda x, m, i, out: x.scatter_(0, i, 1000),
    "clamp out=": lambda x, m, i, out: torch.clamp(x, min=1000, out=out),
    "add out=": lambda x, m, i, out: torch.add(x, x, alpha=1000, out=out),
    "full out=": lambda x, m, i, out: torch.full((3,), 1000, out=out),
    "masked_fill out=": lambda x, m, i, out: torch.ops.aten.masked_fill.Scalar_out(x, m, 1000, out=out),
}


@pytest.mark.parametrize("writer", WRITERS)
def test_a_failed_in_place_or_out_form_writes_nothing(writer):
    original = torch.tensor([1, -2, 3], dtype=torch.int8)
    x, out = original.to(DEVICE), torch.full((3,), 7, dtype=torch.int8).to(DEVICE)
    m, i = mask(DEVICE), torch.tensor([0]).to(DEVICE)
    with pytest.raises(RuntimeError, match="value cannot be converted to type int8_t without overflow"):
        WRITERS[writer](x, m, i, out)
    torch.testing.assert_close(x.cpu(), original, rtol=0, atol=0)
    torch.testing.assert_close(out.cpu(), torch.full((3,), 7, dtype=torch.int8), rtol=0, atol=0)
    assert x.clone().fill_(5).cpu().tolist() == [5, 5, 5]  # and the device keeps working


GRID_OPS: dict[str, Callable] = {
    "fill_": lambda x, v: x.fill_(v),
    "masked_fill": lambda x, v: x.masked_fill(torch.ones(x.shape, dtype=torch.bool).to(x.device), v),
    "clamp": lambda x, v: x.clamp(max=v),
    "index_fill": lambda x, v: x.index_fill(0, torch.tensor([1]).to(x.device), v),
    "pad": lambda x, v: F.pad(x, (1, 0), value=v),
}
GRID_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.bool, torch.float16,
               torch.bfloat16, torch.float32)
GRID_VALUES = (1000, -1, 255, 256, -256, 127.5, -0.5, 70000, 1e300, -math.inf, math.nan, -1e9, True)


@pytest.mark.parametrize("dtype", GRID_DTYPES, ids=str)
@pytest.mark.parametrize("op", GRID_OPS)
def test_every_number_and_dtype_gives_the_cpu_outcome(op, dtype):
    """A grid of numbers, in and out of each dtype's range: the device's outcome (error or
    result) is the CPU's for every one."""
    if not holds(dtype):
        pytest.skip(f"{DEVICE.type} does not hold {dtype}")
    if op == "clamp" and dtype == torch.bool:
        pytest.skip("clamp is not defined for bool on the CPU; that tpu and neuron take it is not "
                    "a number conversion (reported separately)")
    for value in GRID_VALUES:
        assert_same_outcome(lambda d, value=value: GRID_OPS[op](torch.tensor([1, 2, 3]).to(dtype).to(d), value))
