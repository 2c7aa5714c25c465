"""A small CNN trains on neuron with no CPU fallback and matches the same training on CPU.

The model (conv → batch norm → relu → max pool, twice, then a linear head) runs forward, backward
and several optimizer steps (SGD with momentum, AdamW) on neuron under ``fallback_policy("deny")``,
and the counters confirm that no op fell back. A CPU copy with the same initial weights takes the
same steps on the same data; the losses agree after every step, and at the end so do the
parameters, batch norm's running statistics (and its batch counter) and an evaluation-mode
forward, which normalises with the running statistics.

Tolerances. Everything is float32. The simulated Tensor engine multiplies fp32 operands in fp32
(the hardware's fp32 matmul path, at a quarter of the bf16 rate) and accumulates in fp32 PSUM, so
neuron and CPU differ only in the order of floating-point sums: a convolution here is a sum over
taps and channel tiles in PSUM, batch-norm statistics are fp32 per-partition reductions (CPU
accumulates them in double), and the CPU's oneDNN/MKL kernels associate differently again. One
reordering moves a result by a few float32 ulps (~1e-7 relative). Training compounds that over
the steps, and AdamW's ``m / (sqrt(v) + eps)`` turns tiny gradient differences into larger
parameter differences where gradients are near zero. Measured after four steps: losses within
2.4e-7, parameters and statistics within 1.4e-7 (both optimizers). Hence rtol = atol = 1e-5:
about fifty times the observed spread and two orders of magnitude above float32's resolution,
yet far below any real error (a wrong gradient, a missed running-statistics update or a broken
optimizer step moves values by 1e-2 or more at these learning rates).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_native
from torch import nn

import accelkit
from accelkit.sdk.testing.parity import assert_training_parity, train_steps

aten = torch.ops.aten

STEPS = 4
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
INPUT_SHAPE, CLASSES = (4, 3, 8, 8), 10


class SmallCNN(nn.Module):
    """conv → batch norm → relu → max pool, twice, then a linear classifier.

    The convolutions have no bias, as usual before batch norm: the normalisation cancels a bias,
    so its gradient is rounding noise, which AdamW would scale up to full-size steps of
    different noise on each device.
    """

    def __init__(self, classes: int = CLASSES):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.norm1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=1, padding=1, bias=False)
        self.norm2 = nn.BatchNorm2d(16)
        self.head = nn.Linear(16 * 2 * 2, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.norm1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.norm2(self.conv2(x))), 2)
        return self.head(x.flatten(1))


OPTIMIZERS = {
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01),
}


def _batches(seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(INPUT_SHAPE, generator=g), torch.randint(0, CLASSES, (INPUT_SHAPE[0],), generator=g))
            for _ in range(STEPS)]


@pytest.mark.parametrize("optimizer_name", list(OPTIMIZERS))
def test_cnn_training_matches_cpu_without_fallback(dev, optimizer_name):
    torch.manual_seed(0)
    with accelkit.fallback_policy("deny"):
        # Losses per step; parameters, running statistics and batch counters; an eval-mode
        # forward of the first batch.
        result = assert_training_parity(SmallCNN(), _batches(), dev, OPTIMIZERS[optimizer_name], **TOLERANCE)

    stats = accelkit.stats()
    assert stats["totals"]["fallback"] == 0, {k: v for k, v in stats["ops"].items() if v["fallback"]}
    cpu_losses, cpu_state = result.reference.losses, result.reference.state
    assert not torch.equal(cpu_losses[0], cpu_losses[-1])  # training moved the model
    assert not torch.equal(cpu_state["norm1.running_var"], torch.ones(8))  # statistics were updated


def test_cnn_layers_run_as_tile_programs(dev):
    """The layers' own ops are neuron kernels, not decompositions or CPU work."""
    torch.manual_seed(0)
    model = SmallCNN().to(dev)
    with accelkit.fallback_policy("deny"):
        train_steps(model, torch.optim.SGD(model.parameters(), lr=0.1), _batches()[:1])
    assert_native("aten.convolution_overrideable.default", "aten.convolution_backward_overrideable.default",
                  "aten.native_batch_norm.default", "aten.native_batch_norm_backward.default",
                  "aten.max_pool2d_with_indices.default", "aten.max_pool2d_with_indices_backward.default")
    # The implicit im2col does exactly the convolutions' multiply-adds on the Tensor engine:
    # batch x output positions x out channels x in channels x taps, for both layers.
    batch = INPUT_SHAPE[0]
    expected = 2 * batch * 9 * (8 * 8 * 8 * 3 + 4 * 4 * 16 * 8)
    assert accelkit.stats()["neuron"]["estimate"]["per_op"]["convolution_overrideable.default"]["flops"] == expected


def test_bfloat16_cnn_forward_tracks_float32(dev):
    """In bfloat16 the Tensor engine takes bf16 operands and accumulates in fp32 PSUM; the
    forward stays within a few steps of bf16's resolution (2^-8 ≈ 4e-3 relative) of the float32
    CPU result: measured 6.4e-3 on outputs up to 1.25, asserted at 2e-2."""
    torch.manual_seed(0)
    model = SmallCNN()
    x = torch.randn(INPUT_SHAPE)
    expected = model(x).detach()
    on_device = copy.deepcopy(model).to(dev, torch.bfloat16)
    with accelkit.fallback_policy("deny"):
        got = on_device(x.to(dev, torch.bfloat16)).float().cpu()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)
    assert not torch.equal(got, expected)  # bf16 really rounded


def test_bfloat16_cnn_training_tracks_float32(dev):
    """The same SGD training in bfloat16 on neuron (parameters, activations and gradients bf16;
    matmuls accumulate in fp32 PSUM, statistics in fp32) follows the float32 CPU losses within
    bf16 rounding: each stored value carries up to 2^-9 relative error and a step compounds a
    few of them. Measured within 0.006 (relative 2e-3) over four steps; asserted at 2e-2."""
    torch.manual_seed(0)
    model = SmallCNN()
    on_device = copy.deepcopy(model).to(dev, torch.bfloat16)
    batches = _batches()
    expected = train_steps(model, OPTIMIZERS["sgd_momentum"](model.parameters()), batches)
    with accelkit.fallback_policy("deny"):
        got = train_steps(on_device, OPTIMIZERS["sgd_momentum"](on_device.parameters()),
                          [(x.bfloat16(), y) for x, y in batches])
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, rtol=2e-2, atol=2e-2)
    assert not torch.equal(got.float(), expected)  # bf16 really rounded


# ---------------------------------------------------------------------------------------------
# The layers' programs one by one, forward and backward, against CPU autograd
# ---------------------------------------------------------------------------------------------

#: Single ops: one reordered fp32 sum, so a few ulps of the largest partial sums.
OP_TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


def _grads_match(dev, fn, *inputs: torch.Tensor, **kwargs) -> None:
    """``fn(*inputs)`` and the gradients of every input agree between CPU and neuron."""
    cpu_inputs = [t.clone().requires_grad_() if t.is_floating_point() else t for t in inputs]
    expected = fn(*cpu_inputs, **kwargs)
    seed = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1))
    expected.backward(seed)
    neuron_inputs = [t.to(dev).requires_grad_() if t.is_floating_point() else t.to(dev) for t in inputs]
    got = fn(*neuron_inputs, **kwargs)
    got.backward(seed.to(dev))
    torch.testing.assert_close(got.cpu(), expected.detach(), **OP_TOLERANCE)
    for cpu_t, neuron_t in zip(cpu_inputs, neuron_inputs):
        if cpu_t.requires_grad:
            torch.testing.assert_close(neuron_t.grad.cpu(), cpu_t.grad, **OP_TOLERANCE)


def _r(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("conv, x_shape, w_shape, kwargs", [
    (F.conv2d, (2, 3, 8, 8), (4, 3, 3, 3), {"padding": 1}),
    (F.conv2d, (2, 4, 7, 9), (6, 2, 3, 2), {"stride": 2, "padding": (1, 0), "dilation": (1, 2), "groups": 2}),
    (F.conv2d, (1, 130, 3, 3), (3, 130, 1, 1), {}),                # channels over one partition tile
    (F.conv2d, (1, 2, 24, 24), (5, 2, 3, 3), {"padding": 1}),       # 576 positions: several PSUM blocks
    (F.conv1d, (2, 3, 12), (5, 3, 4), {"stride": 3, "padding": 2}),
    (F.conv_transpose2d, (2, 4, 5, 5), (4, 3, 3, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
    (F.conv_transpose1d, (1, 6, 7), (6, 2, 3), {"groups": 3, "dilation": 2}),
])
def test_convolution_matches_cpu(dev, conv, x_shape, w_shape, kwargs):
    transposed = conv in (F.conv_transpose1d, F.conv_transpose2d)
    channels_out = w_shape[1] * kwargs.get("groups", 1) if transposed else w_shape[0]
    _grads_match(dev, conv, _r(*x_shape), _r(*w_shape, seed=1), _r(channels_out, seed=2), **kwargs)
    assert_native("aten.convolution_overrideable.default", "aten.convolution_backward_overrideable.default")


def test_convolution_in_bfloat16_rounds_once(dev):
    x, w = _r(1, 8, 6, 6).bfloat16(), _r(4, 8, 3, 3, seed=1).bfloat16()
    got = F.conv2d(x.to(dev), w.to(dev), padding=1).cpu()
    exact = F.conv2d(x.float(), w.float(), padding=1)  # bf16 products are exact in fp32
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), exact.bfloat16().float(), rtol=2 ** -7, atol=1e-5)


@pytest.mark.parametrize("conv", [F.conv2d, F.conv_transpose2d])
def test_convolution_in_bfloat16_adds_the_bias_before_rounding(dev, conv):
    """The Scalar engine adds the bias to the fp32 accumulator while evacuating PSUM, then
    rounds once: 3.296875 * 3.296875 - 10 = 0.869384765625 rounds to 0.87109375. Rounding the
    product to bfloat16 first (10.875) and then adding the bias gives 0.875."""
    x = torch.full((1, 2, 3, 3), 3.296875, dtype=torch.bfloat16)
    w = torch.zeros(2, 2, 1, 1, dtype=torch.bfloat16)
    w[0, 0], w[1, 1] = 3.296875, 1.0
    bias = torch.tensor([-10.0, 0.5], dtype=torch.bfloat16)
    got = conv(x.to(dev), w.to(dev), bias.to(dev)).cpu()
    exact = conv(x.float(), w.float(), bias.float()).bfloat16()
    assert got[0, 0, 0, 0].item() == 0.87109375
    assert torch.equal(got, exact)


@pytest.mark.parametrize("x_shape, kwargs", [
    ((2, 3, 8, 8), {"kernel_size": 2}),
    ((2, 3, 9, 7), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
    ((3, 10, 11), {"kernel_size": (2, 3), "stride": (1, 2), "dilation": 2}),
    ((1, 130, 4, 4), {"kernel_size": 3, "stride": 1, "padding": 1}),   # overlapping windows, >128 planes
])
def test_max_pool_matches_cpu_with_indices(dev, x_shape, kwargs):
    x = _r(*x_shape)
    _grads_match(dev, F.max_pool2d, x, **kwargs)
    _, expected = F.max_pool2d(x, return_indices=True, **kwargs)
    _, got = F.max_pool2d(x.to(dev), return_indices=True, **kwargs)
    assert got.dtype == torch.int64
    assert torch.equal(got.cpu(), expected)
    assert_native("aten.max_pool2d_with_indices.default", "aten.max_pool2d_with_indices_backward.default")


def test_max_pool_nan_and_infinity_follow_cpu(dev):
    x = torch.tensor([[[[float("-inf"), 1.0, float("-inf")], [float("nan"), 2.0, float("-inf")],
                        [float("-inf"), float("-inf"), float("-inf")]]]])
    for kwargs in ({"kernel_size": 2}, {"kernel_size": 2, "stride": 1, "padding": 1}):
        expected = F.max_pool2d(x, return_indices=True, **kwargs)
        got = F.max_pool2d(x.to(dev), return_indices=True, **kwargs)
        torch.testing.assert_close(got[0].cpu(), expected[0], equal_nan=True)
        assert torch.equal(got[1].cpu(), expected[1])


@pytest.mark.parametrize("kwargs", [
    {"kernel_size": 2},
    {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
    {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True, "count_include_pad": False},
    {"kernel_size": 3, "stride": 2, "padding": 1, "divisor_override": 5},
])
def test_avg_pool_matches_cpu(dev, kwargs):
    _grads_match(dev, F.avg_pool2d, _r(2, 3, 9, 7), **kwargs)
    assert_native("aten.avg_pool2d.default", "aten.avg_pool2d_backward.default")


@pytest.mark.parametrize("shape, training, affine", [
    ((4, 3, 5, 5), True, True),
    ((6, 5), True, False),           # BatchNorm1d without affine parameters
    ((2, 130, 3), True, True),       # channels over one partition tile
    ((4, 3, 5, 5), False, True),     # evaluation: running statistics, left unchanged
])
def test_batch_norm_matches_cpu(dev, shape, training, affine):
    channels = shape[1]
    x = _r(*shape) * 3 + 1
    running = (_r(channels, seed=3), torch.rand(channels, generator=torch.Generator().manual_seed(4)) + 0.5)
    params = (_r(channels, seed=5), _r(channels, seed=6)) if affine else ()
    cpu_stats = [t.clone() for t in running]
    neuron_stats = [t.to(dev) for t in running]

    def norm(x, *params, stats):
        weight, bias = params if params else (None, None)
        return F.batch_norm(x, *stats, weight, bias, training=training, momentum=0.2, eps=1e-4)

    expected = norm(x, *params, stats=cpu_stats)
    got = norm(x.to(dev), *(p.to(dev) for p in params), stats=neuron_stats)
    torch.testing.assert_close(got.cpu(), expected, **OP_TOLERANCE)
    for cpu_t, neuron_t, before in zip(cpu_stats, neuron_stats, running):
        torch.testing.assert_close(neuron_t.cpu(), cpu_t, **OP_TOLERANCE)
        assert torch.equal(cpu_t, before) != training  # updated exactly when training
    fresh = [t.clone() for t in running]
    _grads_match(dev, lambda x, *p: norm(x, *p, stats=fresh if x.device.type == "cpu" else [t.to(dev) for t in running]),
                 x, *params)
    assert_native("aten.native_batch_norm.default", "aten.native_batch_norm_backward.default")


BATCH_NORM_FORMS = {
    "legit_training": (lambda x, w, b, rm, rv: aten._native_batch_norm_legit(x, w, b, rm, rv, True, 0.2, 1e-4),
                       "aten._native_batch_norm_legit.default"),
    "legit_evaluating": (lambda x, w, b, rm, rv: aten._native_batch_norm_legit(x, w, b, rm, rv, False, 0.2, 1e-4),
                         "aten._native_batch_norm_legit.default"),
    "legit_no_stats": (lambda x, w, b, rm, rv: aten._native_batch_norm_legit(x, w, b, True, 0.2, 1e-4),
                       "aten._native_batch_norm_legit.no_stats"),
    "with_update": (lambda x, w, b, rm, rv: aten._batch_norm_with_update(x, w, b, rm, rv, 0.2, 1e-4),
                    "aten._batch_norm_with_update.default"),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("form", BATCH_NORM_FORMS, ids=str)
def test_batch_norm_forms_of_exported_programs_match_cpu(dev, form, dtype):
    """The batch norm ops torch.export and torch.compile produce: results (values, dtypes and
    shapes: the CPU's saved statistics are in a bfloat16 input's dtype, and empty evaluating)
    and the running statistics they update, as on the CPU."""
    fn, op = BATCH_NORM_FORMS[form]
    tensors = [(_r(4, 3, 5, 5) * 3 + 1).to(dtype), _r(3, seed=5).to(dtype), _r(3, seed=6).to(dtype),
               _r(3, seed=3).to(dtype), (torch.rand(3, generator=torch.Generator().manual_seed(4)) + 0.5).to(dtype)]
    on_device = [t.to(dev) for t in tensors]
    expected, got = fn(*tensors), fn(*on_device)
    # bfloat16: an output near zero after centring carries the absolute error of its larger
    # terms (inputs around 1-7): up to two bfloat16 ulps of 1.
    tolerance = OP_TOLERANCE if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 8e-3}
    for e, g in zip(expected, got):
        assert (g.dtype, g.shape) == (e.dtype, e.shape)
        torch.testing.assert_close(g.cpu(), e, **tolerance)
    for e, g in zip(tensors[3:], on_device[3:]):  # the running statistics
        torch.testing.assert_close(g.cpu(), e, **tolerance)
    assert_native(op)


@pytest.mark.parametrize("x_shape, output_size", [
    ((2, 3, 6, 6), (4, 3)),      # overlapping, uneven windows
    ((3, 7, 5), (3, 2)),
    ((1, 130, 5, 9), (2, 4)),    # more than 128 planes
    ((2, 3, 4, 4), (8, 8)),      # upsampling: windows of one element, repeated
])
def test_adaptive_avg_pool_matches_cpu(dev, x_shape, output_size):
    _grads_match(dev, F.adaptive_avg_pool2d, _r(*x_shape), output_size=output_size)
    assert_native("aten._adaptive_avg_pool2d.default", "aten._adaptive_avg_pool2d_backward.default")


@pytest.mark.parametrize("dtype", [torch.int64, torch.bfloat16])
def test_max_pool_of_integers_and_bfloat16_is_exact(dev, dtype):
    """Max pooling only compares: integers (computed as int32) and bf16 come back unrounded."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-10**9, 10**9, (2, 3, 7, 6), generator=g).to(dtype) if dtype == torch.int64 \
        else torch.randn(2, 3, 7, 6, generator=g).to(dtype)
    expected = F.max_pool2d(x, 3, 2, 1, ceil_mode=True, return_indices=True)
    got = F.max_pool2d(x.to(dev), 3, 2, 1, ceil_mode=True, return_indices=True)
    assert got[0].dtype == dtype
    assert torch.equal(got[0].cpu(), expected[0])
    assert torch.equal(got[1].cpu(), expected[1])


@pytest.mark.parametrize("x_shape, output_size", [((2, 3, 6, 6), (4, 3)), ((1, 130, 5, 9), (2, 4)), ((2, 3, 4, 4), (8, 8))])
def test_adaptive_max_pool_matches_cpu(dev, x_shape, output_size):
    x = _r(*x_shape)
    _grads_match(dev, F.adaptive_max_pool2d, x, output_size=output_size)
    expected = F.adaptive_max_pool2d(x, output_size, return_indices=True)[1]
    assert torch.equal(F.adaptive_max_pool2d(x.to(dev), output_size, return_indices=True)[1].cpu(), expected)
    assert_native("aten.adaptive_max_pool2d.default", "aten.adaptive_max_pool2d_backward.default")


def test_convolution_in_row_bands_matches_cpu(dev, monkeypatch):
    """Large images are processed in bands of rows (so a plane never has to fit SBUF whole):
    with a tiny band budget every band holds one output row, and the halos between bands
    (stride 1, a 3-row kernel, padding) must still add up to the CPU's result."""
    from accelkit_backends.neuron.kernels import conv

    monkeypatch.setattr(conv, "BAND_BYTES", 256)
    _grads_match(dev, F.conv2d, _r(2, 3, 9, 7), _r(4, 3, 3, 3, seed=1), _r(4, seed=2), padding=1)
    _grads_match(dev, F.conv_transpose2d, _r(1, 4, 5, 5), _r(4, 2, 3, 3, seed=1), stride=2, padding=1)


def test_a_3d_convolution_is_declined_to_its_depth_tap_sums(dev):
    """The 2-d programs decline a 3-d call; the backend's decomposition for declined calls runs
    it as 2-d convolutions on the device (the CPU fallback denied)."""
    x, w = torch.randn(1, 2, 4, 4, 4), torch.randn(3, 2, 2, 2, 2)
    accelkit.reset_stats()
    with accelkit.fallback_policy("deny"):
        out = torch.nn.functional.conv3d(x.to(dev), w.to(dev)).cpu()
    torch.testing.assert_close(out, torch.nn.functional.conv3d(x, w), rtol=1e-5, atol=1e-5)
    counts = accelkit.stats()["ops"]["aten.convolution_overrideable.default"]
    assert counts["decomposed"] == 1 and counts["fallback"] == 0
