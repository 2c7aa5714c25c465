"""tpu matrix products (kernels/linalg.py: mm, bmm, addmm, baddbmm, addbmm, mv, addmv, dot, vdot)
compared with PyTorch on CPU: float32, bfloat16 and int64 operands, non-contiguous and broadcast
(``matmul``, ``linear``), ``beta`` and ``alpha``, ``beta=0`` ignoring NaN in the input, and
bfloat16 products accumulated in float32. (Factorizations and solvers are in
``test_tpu_factorizations.py``.)

Every check runs the same call on CPU tensors and on their tpu copies (often non-contiguous views,
made on the device), compares values and dtypes, and asserts the op ran natively.
"""

from __future__ import annotations

import pytest
import torch

from conftest import assert_native
from harness_reductions import compare, sample, transposed


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Matmul family
# ---------------------------------------------------------------------------------------------

MATMULS = {
    "mm": (lambda a, b: a.mm(b.T), "aten.mm.default"),
    "bmm": (lambda a, b: torch.bmm(a.expand(2, 5, 6), b.T.expand(2, 6, 4)), "aten.bmm.default"),
    "addmm": (lambda a, b: torch.addmm(a[:, :4], a, b.T, beta=0.5, alpha=2), "aten.addmm.default"),
    "addmm_row_bias": (lambda a, b: torch.addmm(b[0, :4], a, b.T), "aten.addmm.default"),
    "baddbmm": (lambda a, b: torch.baddbmm(a[None, :, :4], a.expand(3, 5, 6), b.T.expand(3, 6, 4), alpha=-1),
                "aten.baddbmm.default"),
    "addbmm": (lambda a, b: torch.addbmm(a[:, :4], a.expand(2, 5, 6), b.T.expand(2, 6, 4), beta=2),
               "aten.addbmm.default"),
    "mv": (lambda a, b: a.mv(b[0]), "aten.mv.default"),
    "addmv": (lambda a, b: torch.addmv(a[:, 0], a, b[1], alpha=3), "aten.addmv.default"),
    "dot": (lambda a, b: torch.dot(a[1], b[2]), "aten.dot.default"),
    "vdot": (lambda a, b: torch.vdot(a[:4, 1], b[:, 2]), "aten.vdot.default"),
    "matmul_broadcast": (lambda a, b: a.expand(3, 5, 6) @ b.T, "aten.bmm.default"),
    "linear": (lambda a, b: torch.nn.functional.linear(a, b, b[0, :4]), "aten.addmm.default"),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
@pytest.mark.parametrize("case", sorted(MATMULS))
def test_matmul_family_matches_cpu(dev, dtype, case):
    fn, op = MATMULS[case]
    if dtype == torch.int64 and case not in ("mm", "bmm", "baddbmm", "addbmm", "mv", "dot"):
        pytest.skip("integer products are covered by the other cases")
    a = transposed((5, 6), dtype)  # non-contiguous operands
    b = sample((4, 6), dtype, seed=1)
    compare(dev, fn, a, b)
    assert_native(op)


def test_beta_zero_ignores_nan_in_the_input(dev):
    a, b = sample((3, 4), torch.float32), sample((4, 2), torch.float32, seed=1)
    bias = torch.full((3, 2), float("nan"))
    for beta in (0, 0.0):  # a static int and a run-time float
        compare(dev, lambda s, m1, m2, beta=beta: (
            torch.addmm(s, m1, m2, beta=beta),
            torch.baddbmm(s[None], m1[None], m2[None], beta=beta),
            torch.addmv(s[:, 0], m1, m2[:, 0], beta=beta),
        ), bias, a, b)


def test_bfloat16_matmul_accumulates_in_float32(dev):
    # 512 products of 1 + 1/128: exact in float32 then rounded once; bf16 accumulation drifts.
    a = torch.full((1, 512), 1 + 1 / 128, dtype=torch.bfloat16)
    b = torch.ones(512, 1, dtype=torch.bfloat16)
    compare(dev, lambda x, y, c: (x @ y, torch.addmm(c, x, y)), a, b, torch.ones(1, 1, dtype=torch.bfloat16))


ADDR_SCALARS = {
    torch.float32: {"beta": 0.6, "alpha": 0.2},
    torch.bfloat16: {"beta": 0.6, "alpha": 0.2},
    torch.int64: {"beta": 2, "alpha": -3},
    torch.bool: {"beta": False, "alpha": True},
}


@pytest.mark.parametrize("dtype", list(ADDR_SCALARS), ids=str)
def test_addr_matches_cpu(dev, dtype):
    bias, v1, v2 = sample((5, 4), dtype), sample((5,), dtype, seed=1), sample((4,), dtype, seed=2)
    tol = {"atol": 0.01, "rtol": 0.016} if dtype == torch.bfloat16 else {}
    compare(dev, lambda s, a, b: (torch.addr(s, a, b), torch.addr(s, a, b, **ADDR_SCALARS[dtype]),
                                  torch.addr(s[0], a, b)), bias, v1, v2, **tol)
    assert_native("aten.addr.default")


def test_addr_bfloat16_computes_in_float32_and_rounds_once(dev):
    """(1 + 1/128) * (1 + 3/128) - 1 is 0.0314331 in float32, rounded once to 0.0314941; rounding
    the product to bfloat16 first (1.03125), as the decomposition run op by op did, gives 0.03125."""
    v1 = torch.tensor([1 + 1 / 128], dtype=torch.bfloat16)
    v2 = torch.tensor([1 + 3 / 128], dtype=torch.bfloat16)
    bias = torch.tensor([[-1.0]], dtype=torch.bfloat16)
    got = torch.addr(bias.to(dev), v1.to(dev), v2.to(dev)).cpu()
    want = torch.addr(bias.float(), v1.float(), v2.float()).bfloat16()
    assert got.item() == want.item() == 0.031494140625
    assert_native("aten.addr.default")
