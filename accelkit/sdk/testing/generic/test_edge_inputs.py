"""Edge inputs on the device under test, checked against the CPU: empty contractions and
``beta=0`` in the matmul family, and 0-dim inputs of ``multi_margin_loss``.

Device-generic (``--accelkit-device tpu|neuron`` runs it on another backend). PyTorch's own
device-generic tests found each case on some backend (a kernel or a decomposition that
disagreed with the CPU); they are re-written here so that every backend is held to them.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from accelkit.sdk.testing import holds

NAN = float("nan")


def filled(shape: tuple[int, ...], value: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.full(shape, value, dtype=dtype)


def ramp(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Small integers (exact in every dtype and in any summation order)."""
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n) % 5 - 2).to(dtype).reshape(shape)


# -- the matmul family: empty contractions, beta = 0 -----------------------------------------

#: (case, inputs on the CPU, fn(*inputs)). CPU ignores ``input`` when beta is 0 (NaN in it does
#: not propagate), and an empty contraction (K = 0) is a zero product: the result is beta * input.
MATMUL_CASES = [
    ("mm K=0", lambda: [ramp((2, 0)), ramp((0, 3))], torch.mm),
    ("bmm K=0", lambda: [ramp((4, 2, 0)), ramp((4, 0, 3))], torch.bmm),
    ("addmm K=0", lambda: [ramp((2, 3)), ramp((2, 0)), ramp((0, 3))],
     lambda i, a, b: torch.addmm(i, a, b, beta=2)),
    ("addmm K=0, broadcast input", lambda: [ramp((3,)), ramp((2, 0)), ramp((0, 3))],
     lambda i, a, b: torch.addmm(i, a, b, beta=3)),
    ("addmm K=0, alpha", lambda: [ramp((2, 3)), ramp((2, 0)), ramp((0, 3))],
     lambda i, a, b: torch.addmm(i, a, b, beta=1, alpha=4)),
    ("addmm K=0, beta=0, NaN input", lambda: [filled((2, 3), NAN), ramp((2, 0)), ramp((0, 3))],
     lambda i, a, b: torch.addmm(i, a, b, beta=0)),
    ("addmm beta=0, NaN input", lambda: [filled((2, 3), NAN), ramp((2, 4)), ramp((4, 3))],
     lambda i, a, b: torch.addmm(i, a, b, beta=0)),
    ("addmm K=0, int64", lambda: [ramp((2, 3), torch.int64), ramp((2, 0), torch.int64), ramp((0, 3), torch.int64)],
     lambda i, a, b: torch.addmm(i, a, b, beta=2)),
    ("addmm_ K=0", lambda: [ramp((2, 3)), ramp((2, 0)), ramp((0, 3))],
     lambda i, a, b: i.clone().addmm_(a, b, beta=2)),
    ("addmm K=0, out=", lambda: [ramp((2, 3)), ramp((2, 0)), ramp((0, 3))],
     lambda i, a, b: torch.addmm(i, a, b, beta=2, out=torch.empty(0, device=i.device))),
    ("addmv K=0", lambda: [ramp((2,)), ramp((2, 0)), ramp((0,))],
     lambda i, m, v: torch.addmv(i, m, v, beta=2)),
    ("addmv beta=0, NaN input", lambda: [filled((2,), NAN), ramp((2, 3)), ramp((3,))],
     lambda i, m, v: torch.addmv(i, m, v, beta=0)),
    ("addbmm K=0", lambda: [ramp((2, 3)), ramp((4, 2, 0)), ramp((4, 0, 3))],
     lambda i, a, b: torch.addbmm(i, a, b, beta=2)),
    ("addbmm no batches", lambda: [ramp((2, 3)), ramp((0, 2, 5)), ramp((0, 5, 3))],
     lambda i, a, b: torch.addbmm(i, a, b, beta=2)),
    ("addbmm beta=0, NaN input", lambda: [filled((2, 3), NAN), ramp((4, 2, 5)), ramp((4, 5, 3))],
     lambda i, a, b: torch.addbmm(i, a, b, beta=0)),
    ("baddbmm K=0", lambda: [ramp((4, 2, 3)), ramp((4, 2, 0)), ramp((4, 0, 3))],
     lambda i, a, b: torch.baddbmm(i, a, b, beta=2)),
    ("baddbmm beta=0, NaN input", lambda: [filled((4, 2, 3), NAN), ramp((4, 2, 5)), ramp((4, 5, 3))],
     lambda i, a, b: torch.baddbmm(i, a, b, beta=0)),
    ("addr empty", lambda: [ramp((2, 0)), ramp((2,)), ramp((0,))],
     lambda i, u, v: torch.addr(i, u, v, beta=2)),
    ("addr beta=0, NaN input", lambda: [filled((2, 3), NAN), ramp((2,)), ramp((3,))],
     lambda i, u, v: torch.addr(i, u, v, beta=0)),
]


@pytest.mark.parametrize("make, fn", [c[1:] for c in MATMUL_CASES], ids=[c[0] for c in MATMUL_CASES])
def test_matmul_family_edge_inputs_match_cpu(dev, make, fn):
    inputs = make()
    if not all(holds(t.dtype) for t in inputs):
        pytest.skip(f"{dev.type} does not hold {inputs[0].dtype}")
    expected = fn(*inputs)
    got = fn(*[t.to(dev) for t in inputs])
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(got.cpu(), expected), (got.cpu(), expected)


# -- multi_margin_loss on 0-dim inputs -------------------------------------------------------

#: (input, target): 0-dim input and target, a 1-d input with a 0-dim target, batches of one.
MARGIN_INPUTS = [
    (lambda: torch.tensor(0.5), lambda: torch.tensor(0)),
    (lambda: torch.tensor([0.5, -0.25, 1.0]), lambda: torch.tensor(2)),
    (lambda: torch.tensor([[0.5, -0.25, 1.0]]), lambda: torch.tensor(1)),
    (lambda: torch.tensor([[0.5, -0.25, 1.0]]), lambda: torch.tensor([1])),
]


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("make_input, make_target", MARGIN_INPUTS,
                         ids=["0-dim", "1-d input, 0-dim target", "batch of one, 0-dim target", "batch of one"])
def test_multi_margin_loss_has_the_cpu_shape_values_and_gradient(dev, make_input, make_target, p, reduction):
    x, target = make_input().requires_grad_(), make_target()
    expected = F.multi_margin_loss(x, target, p=p, reduction=reduction)
    expected.sum().backward()
    xd = make_input().to(dev).requires_grad_()
    got = F.multi_margin_loss(xd, target.to(dev), p=p, reduction=reduction)
    assert got.shape == expected.shape
    torch.testing.assert_close(got.detach().cpu(), expected.detach())
    got.sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), x.grad)


def test_multi_margin_loss_out_has_the_cpu_shape(dev):
    x, target = torch.tensor(0.5), torch.tensor(0)
    expected = torch.ops.aten.multi_margin_loss.out(x, target, 1, 1, None, 0, out=torch.empty(0))
    out = torch.empty(0, device=dev)
    torch.ops.aten.multi_margin_loss.out(x.to(dev), target.to(dev), 1, 1, None, 0, out=out)
    assert out.shape == expected.shape == torch.Size([])
    torch.testing.assert_close(out.cpu(), expected)


SIGNED_ZERO_OPS = {
    "maximum": (torch.maximum, (torch.float32, torch.bfloat16)),
    "minimum": (torch.minimum, (torch.float32, torch.bfloat16)),
    "clamp_min": (lambda a, b: torch.clamp(a, min=b), (torch.float32, torch.bfloat16)),
    "clamp_max": (lambda a, b: torch.clamp(a, max=b), (torch.float32, torch.bfloat16)),
    # bfloat16's fmax/fmin on the CPU go through float and keep no rule for ties.
    "fmax": (torch.fmax, (torch.float32,)),
    "fmin": (torch.fmin, (torch.float32,)),
}


@pytest.mark.parametrize("name", SIGNED_ZERO_OPS)
def test_signed_zeros_and_nans_of_max_and_min_match_cpu(dev, name):
    # -0.0 == +0.0, so which one is kept is the kernel's rule: the CPU keeps the first operand.
    fn, dtypes = SIGNED_ZERO_OPS[name]
    nan = float("nan")
    a = torch.tensor([-0.0, 0.0, -0.0, 0.0, nan, 1.0, nan, -2.0])
    b = torch.tensor([0.0, -0.0, -0.0, 0.0, 1.0, nan, nan, 3.0])
    for dtype in dtypes:
        want = fn(a.to(dtype), b.to(dtype))
        got = fn(a.to(dtype).to(dev), b.to(dtype).to(dev)).cpu()
        assert got.dtype == want.dtype
        assert torch.equal(got.isnan(), want.isnan()), (dtype, got, want)
        real = ~want.isnan()
        assert torch.equal(got[real], want[real]) and torch.equal(got[real].signbit(), want[real].signbit()), (dtype, got, want)


@pytest.mark.parametrize("fn", [torch.relu, F.relu6, F.hardtanh, lambda x: torch.clamp(x, 0.0, 1.0)],
                         ids=["relu", "relu6", "hardtanh", "clamp"])
def test_activations_keep_the_sign_of_zero_as_on_cpu(dev, fn):
    x = torch.tensor([-0.0, 0.0, -1.0, 0.5, NAN])
    want, got = fn(x), fn(x.to(dev)).cpu()
    assert torch.equal(got.isnan(), want.isnan())
    real = ~want.isnan()
    assert torch.equal(got[real], want[real]) and torch.equal(got[real].signbit(), want[real].signbit()), (got, want)


@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_attention_with_a_mask_and_is_causal_matches_cpu(dev, mask_kind):
    # The CPU applies both (the mask and the causal triangle, aligned top-left); PyTorch's math
    # path, the only one on a PrivateUse1 device, would refuse the pair.
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(1, 2, 4, 8, generator=gen, requires_grad=True)
    key, value = torch.randn(1, 2, 6, 8, generator=gen), torch.randn(1, 2, 6, 8, generator=gen)
    if mask_kind == "bool":
        mask = torch.rand(4, 6, generator=gen) > 0.3
        mask[:, 0] = True
    else:
        mask = torch.randn(4, 6, generator=gen)
    query_dev = query.detach().to(dev).requires_grad_()
    want = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, is_causal=True)
    got = F.scaled_dot_product_attention(query_dev, key.to(dev), value.to(dev), attn_mask=mask.to(dev), is_causal=True)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
    want.square().sum().backward()
    got.square().sum().backward()
    torch.testing.assert_close(query_dev.grad.cpu(), query.grad)  # float32's defaults (atol 1e-5)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_histc_counts_integers_as_cuda_does(dev, dtype):
    # The CPU kernel takes floating point only; CUDA's takes integers too (MoE routers count
    # the tokens per expert this way) and returns counts in the input's dtype.
    experts = torch.tensor([0, 3, 3, 7, 1, 3, 7, 2], dtype=dtype)
    got = torch.histc(experts.to(dev), bins=8, min=0, max=8)
    want = torch.histc(experts.double(), bins=8, min=0, max=8).to(dtype)
    assert got.dtype == dtype and torch.equal(got.cpu(), want)
    out = torch.empty(3, dtype=dtype, device=dev)
    torch.histc(experts.to(dev), bins=8, min=0, max=8, out=out)
    assert torch.equal(out.cpu(), want)
