"""Ops the ref device runs through PyTorch's decompositions, checked against CPU torch.

``out=`` overloads run as their functional decomposition and the runtime stores the result;
these tests pin the cases where the ``out=`` decomposition itself, or the dispatcher's route to
the functional op, went wrong: a write into a float32 copy of a bfloat16 ``out=``, endless
re-entry for structured ops, an ``out=`` a decomposition does not accept.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import accelkit
from accelkit.sdk import default_decompositions

aten = torch.ops.aten


def counts(op: str) -> dict[str, int]:
    return accelkit.stats()["ops"].get(op, {"native": 0, "decomposed": 0, "fallback": 0})


def to(dev: torch.device, t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(dev).requires_grad_(t.requires_grad)


def assert_close(device_result: torch.Tensor, cpu_result: torch.Tensor, **tolerance) -> None:
    assert device_result.device.type == "ref"
    assert device_result.dtype == cpu_result.dtype
    torch.testing.assert_close(device_result.cpu(), cpu_result, **tolerance)


def grad_of(fn, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Gradients of ``fn(*inputs)`` with respect to its floating inputs, for a fixed cotangent."""
    wanted = [t for t in inputs if t.requires_grad]
    out = fn(*inputs)
    cotangent = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    return torch.autograd.grad(out, wanted, cotangent.to(out.device))


# -- bfloat16 out= -------------------------------------------------------------------------------

PADS = {
    "reflect_1d": (lambda x: F.pad(x, (2, 1), mode="reflect"), (2, 3, 5)),
    "reflect_2d": (lambda x: F.pad(x, (1, 2, 2, 0), mode="reflect"), (1, 2, 4, 5)),
    "replicate_1d": (lambda x: F.pad(x, (3, 1), mode="replicate"), (2, 3, 5)),
    "replicate_3d": (lambda x: F.pad(x, (1, 1, 0, 2, 1, 0), mode="replicate"), (1, 1, 2, 3, 4)),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("pad, shape", PADS.values(), ids=PADS.keys())
def test_reflection_and_replication_pad_match_cpu_in_low_precision(dev, pad, shape, dtype):
    x = torch.randn(shape).to(dtype)
    assert_close(pad(x.to(dev)), pad(x), rtol=0, atol=0)


def test_a_decomposed_bfloat16_out_receives_the_result(dev):
    x = torch.randn(2, 3, 5, dtype=torch.bfloat16)
    out = torch.full((2, 3, 9), 7.0, dtype=torch.bfloat16, device=dev)
    accelkit.reset_stats()
    aten.reflection_pad1d.out(x.to(dev), [2, 2], out=out)
    assert_close(out, F.pad(x, (2, 2), mode="reflect"), rtol=0, atol=0)
    assert counts("aten.reflection_pad1d.out") == {"native": 0, "decomposed": 1, "fallback": 0}


LOSSES = {"huber_loss": F.huber_loss, "smooth_l1_loss": F.smooth_l1_loss}


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("loss", LOSSES.values(), ids=LOSSES.keys())
def test_bfloat16_loss_gradients_match_cpu(dev, loss, reduction):
    x = (torch.randn(4, 5) * 2).bfloat16().requires_grad_()
    target = torch.randn(4, 5).bfloat16()

    def fn(a, b):
        return loss(a, b, reduction=reduction)

    (expected,) = grad_of(fn, x, target)
    (got,) = grad_of(fn, to(dev, x), target.to(dev))
    assert got.abs().sum() > 0
    assert_close(got, expected, rtol=0.016, atol=1e-3)  # CPU kernels compute in float32


# -- decompositions that re-entered their own op -------------------------------------------------

NEAREST = {
    "interpolate_1d_scale": (lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), (1, 2, 5)),
    "interpolate_1d_size": (lambda x: F.interpolate(x, size=7, mode="nearest"), (1, 2, 5)),
    "interpolate_2d_size": (lambda x: F.interpolate(x, size=(7, 9), mode="nearest"), (1, 2, 4, 5)),
    "interpolate_2d_scale": (lambda x: F.interpolate(x, scale_factor=(2, 1.5), mode="nearest"), (1, 2, 4, 5)),
    "interpolate_2d_integer_scale": (lambda x: F.interpolate(x, scale_factor=3), (2, 1, 3, 3)),
    "1d_vec": (lambda x: aten.upsample_nearest1d.vec(x, [11], None), (1, 2, 5)),
    "2d_vec_scales": (lambda x: aten.upsample_nearest2d.vec(x, None, [2.0, 1.5]), (1, 2, 4, 5)),
}


@pytest.mark.parametrize("fn, shape", NEAREST.values(), ids=NEAREST.keys())
def test_upsample_nearest_forward_and_backward_match_cpu(dev, fn, shape):
    x = torch.randn(shape, requires_grad=True)
    assert_close(fn(to(dev, x)), fn(x), rtol=0, atol=0)
    assert_close(grad_of(fn, to(dev, x))[0], grad_of(fn, x)[0])


def test_upsample_nearest_out_overload_matches_cpu(dev):
    x = torch.randn(1, 2, 4, 5)
    out = torch.empty(0, device=dev)
    aten.upsample_nearest2d.out(x.to(dev), [8, 7], out=out)
    assert_close(out, aten.upsample_nearest2d(x, [8, 7]), rtol=0, atol=0)


@pytest.mark.parametrize("eps", [None, 1e-2])
def test_logit_backward_matches_cpu(dev, eps):
    x = torch.rand(3, 4, requires_grad=True)
    x.data[0, 0] = 0.001  # inside the eps clamp

    def fn(t):
        return torch.logit(t, eps=eps)

    assert_close(grad_of(fn, to(dev, x))[0], grad_of(fn, x)[0])


# -- reflection pad backward ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("padding, shape", [((2, 3), (2, 3, 6)), ((1, 2, 2, 1), (1, 2, 4, 5))])
def test_reflection_pad_backward_matches_cpu(dev, padding, shape, dtype):
    x = torch.randn(shape).to(dtype).requires_grad_()

    def fn(t):
        return F.pad(t, padding, mode="reflect")

    assert_close(grad_of(fn, to(dev, x))[0], grad_of(fn, x)[0], rtol=0.016, atol=1e-2)


def test_reflection_pad_backward_grad_input_overload_matches_cpu(dev):
    grad, x = torch.randn(2, 3, 9), torch.randn(2, 3, 6)
    out = torch.empty(0, device=dev)
    aten.reflection_pad1d_backward.grad_input(grad.to(dev), x.to(dev), [1, 2], grad_input=out)
    assert_close(out, aten.reflection_pad1d_backward(grad, x, [1, 2]))


def test_stft_backward_matches_cpu(dev):
    x = torch.randn(40, requires_grad=True)
    window = torch.hann_window(8)

    def fn(t):
        return torch.stft(t, 8, window=window.to(t.device), return_complex=True).abs()

    assert_close(grad_of(fn, to(dev, x))[0], grad_of(fn, x)[0], rtol=1e-4, atol=1e-5)


# -- inputs the runtime keeps away from a decomposition ------------------------------------------

LINSPACES = [(4.3, -3, 50), (0, 49, 50), (-5.5, 103.2, 33), (46.78, -14.2, 29), (7, 7, 5), (2, 9, 1), (1, 2, 0)]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.int8])
@pytest.mark.parametrize("start, end, steps", LINSPACES)
def test_integer_linspace_matches_cpu_exactly(dev, start, end, steps, dtype):
    if dtype == torch.uint8:
        start, end = abs(start), abs(end)
    expected = torch.linspace(start, end, steps, dtype=dtype)
    assert torch.equal(torch.linspace(start, end, steps, dtype=dtype, device=dev).cpu(), expected)
    from_tensors = torch.linspace(torch.tensor(start, device=dev), torch.tensor(end), steps, dtype=dtype, device=dev)
    assert torch.equal(from_tensors.cpu(), torch.linspace(torch.tensor(start), torch.tensor(end), steps, dtype=dtype))
    out = torch.empty(0, dtype=dtype, device=dev)
    torch.linspace(start, end, steps, out=out)
    assert torch.equal(out.cpu(), expected)


def test_float_linspace_still_decomposes(dev):
    accelkit.reset_stats()
    assert_close(torch.linspace(-2, 3, 11, device=dev), torch.linspace(-2, 3, 11))
    assert counts("aten.linspace.out") == {"native": 0, "decomposed": 1, "fallback": 0}


@pytest.mark.parametrize("shape", [(0, 6), (0, 6, 3), (2, 6, 0), (0, 6, 0), (2, 6, 0, 4)])
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_of_an_empty_input_matches_cpu_forward_and_backward(dev, shape, affine):
    x = torch.randn(shape, requires_grad=True)
    weight = torch.randn(6, requires_grad=True) if affine else None
    bias = torch.randn(6, requires_grad=True) if affine else None

    def run(*tensors):
        inputs = [t for t in tensors if t is not None]
        out = F.group_norm(tensors[0], 3, *tensors[1:])
        grads = torch.autograd.grad(out.sum(), inputs)
        return [out, *grads]

    got = run(*(to(dev, t) if t is not None else None for t in (x, weight, bias)))
    for g, e in zip(got, run(x, weight, bias), strict=True):
        assert_close(g, e, equal_nan=True)


@pytest.mark.parametrize("dtype", [None, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("memory_format", [torch.preserve_format, torch.channels_last])
def test_gradient_of_a_device_to_host_copy_reaches_the_device_input(dev, dtype, memory_format):
    x = torch.randn(2, 3, 4, 5, requires_grad=True)
    weights = torch.randn(2, 3, 4, 5, dtype=dtype or torch.float32)
    expected = torch.autograd.grad((x.to("cpu", dtype, memory_format=memory_format) * weights).sum(), x)[0]
    xd = to(dev, x)
    moved = xd.to("cpu", dtype, memory_format=memory_format)
    assert moved.device.type == "cpu"
    (grad,) = torch.autograd.grad((moved * weights).sum(), xd)
    assert_close(grad, expected)


@pytest.mark.parametrize("op, args", [(aten.fill_.Scalar, (3.0,)), (aten.zero_.default, ())], ids=["fill_", "zero_"])
def test_broadcast_writes_decompose_for_an_expanded_self_as_cpu_writes(dev, op, args):
    """A backend without a fill kernel decomposes fill_/zero_, which store through copy_; an
    expanded self (stride 0) is valid for them, as on the CPU, and only its memory is written."""
    from accelkit._runtime.dispatch.decomp_guards import guard_decompositions

    decomposition = guard_decompositions(default_decompositions())[op]
    cpu = torch.arange(1.0, 7.0).reshape(2, 3)
    device = cpu.to(dev)
    op(cpu[0, 1:2].expand(4), *args)
    assert decomposition(device[0, 1:2].expand(4), *args).shape == (4,)
    assert torch.equal(device.cpu(), cpu)
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        device[0, 1:2].expand(4).copy_(torch.ones(4, device=dev))  # copy_ itself still refuses


@pytest.mark.parametrize("shape", [(4,), (2, 4)])
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_multilabel_margin_loss_matches_cpu_when_a_sample_has_fewer_labels_than_classes(dev, shape, reduction):
    # PyTorch's decomposition counted the slots after a -1 as labels of class 0 (other values),
    # and gave a 1-d input's unreduced loss shape (1,) where CPU gives ().
    x = torch.linspace(-2, 2, 8)[: torch.Size(shape).numel()].reshape(shape)
    target = torch.tensor([3, 0, -1, 1, 1, -1, 0, 0][: x.numel()]).reshape(shape)
    want = F.multilabel_margin_loss(x, target, reduction=reduction)
    got = F.multilabel_margin_loss(x.to(dev), target.to(dev), reduction=reduction)
    assert got.shape == want.shape
    assert_close(got, want)
    assert counts("aten.multilabel_margin_loss_forward.default")["decomposed"] >= 1
