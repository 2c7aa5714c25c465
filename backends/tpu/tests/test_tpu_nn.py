"""tpu neural-network ops — convolution, pooling, normalization, losses, embedding, attention —
compared with PyTorch on CPU, forward and backward.

Each check runs one functional call on CPU leaf tensors and on tpu copies, under
``fallback_policy("deny")``, compares the outputs, then back-propagates the same random
cotangent on both and compares every input gradient; it also asserts that the ops named ran as
tpu lowerings. float32 is compared at 1e-5 (XLA sums in another order than PyTorch's CPU
kernels: a few ulps), bfloat16 at bfloat16's resolution.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import accelkit

aten = torch.ops.aten
F32 = {"rtol": 1e-5, "atol": 1e-5}
BF16 = {"rtol": 2e-2, "atol": 2e-2}


def sample(shape, dtype=torch.float32, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def compare(dev, fn, inputs, native=(), differentiable=None, tol=F32, reference=None):
    """Run ``fn`` on CPU and tpu copies of ``inputs``; compare outputs and the gradients of the
    floating inputs listed in ``differentiable`` (all floating inputs by default).

    ``reference``: a dtype the CPU computes in instead of the inputs' (results rounded back),
    where CPU's own low-precision kernel depends on the machine (its bfloat16 convolution
    accumulates differently with and without AVX-512).
    """
    if differentiable is None:
        differentiable = [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    tpu = [t.detach().to(dev).requires_grad_(i in differentiable) if isinstance(t, torch.Tensor) else t
           for i, t in enumerate(inputs)]
    if reference is not None:
        inputs = [t.to(reference) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs]
    cpu = [t.clone().requires_grad_(i in differentiable) if isinstance(t, torch.Tensor) else t
           for i, t in enumerate(inputs)]
    accelkit.reset_stats()
    with accelkit.fallback_policy("deny"):
        expected, actual = fn(*cpu), fn(*tpu)
        expected = expected if isinstance(expected, tuple) else (expected,)
        actual = actual if isinstance(actual, tuple) else (actual,)
        rounded = (lambda e, like: e.to(like.dtype)) if reference is not None else (lambda e, like: e)
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a.cpu(), rounded(e, a), equal_nan=True, **tol)
        if differentiable:
            cotangent = sample(actual[0].shape, actual[0].dtype, seed=1)
            expected[0].backward(cotangent.to(expected[0].dtype))
            actual[0].backward(cotangent.to(dev))
            for i in differentiable:
                torch.testing.assert_close(tpu[i].grad.cpu(), rounded(cpu[i].grad, tpu[i]), **tol,
                                           msg=f"gradient of input {i}")
    counts = accelkit.stats()["ops"]
    for op in native:
        assert counts.get(op, {}).get("native", 0) > 0, f"{op} did not run natively: {counts.get(op)}"
    return tpu


# ---------------------------------------------------------------------------------------------
# Convolution
# ---------------------------------------------------------------------------------------------

CONV = ["aten.convolution_overrideable.default", "aten.convolution_backward_overrideable.default"]

CONVOLUTIONS = {
    "conv1d": (lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=2), (2, 3, 11), (4, 3, 3)),
    "conv2d_dilated_grouped": (lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, dilation=2, groups=2),
                               (2, 4, 9, 9), (6, 2, 3, 3)),
    "conv2d_same": (lambda x, w, b: F.conv2d(x, w, b, padding="same"), (2, 3, 7, 6), (5, 3, 3, 2)),
    "conv3d": (lambda x, w, b: F.conv3d(x, w, b, stride=(1, 2, 1), padding=(1, 0, 1)), (1, 2, 5, 6, 4),
               (3, 2, 2, 3, 3)),
    "conv_transpose1d": (lambda x, w, b: F.conv_transpose1d(x, w, b, stride=3, output_padding=2),
                         (2, 4, 5), (4, 3, 3)),
    "conv_transpose2d_grouped": (
        lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1, groups=2, dilation=2),
        (2, 4, 5, 5), (4, 3, 3, 3)),
    "conv_transpose3d": (lambda x, w, b: F.conv_transpose3d(x, w, b, stride=2, padding=1), (1, 2, 3, 4, 3),
                         (2, 3, 3, 3, 3)),
}


def _bias_size(name, weight_shape):
    groups = 2 if "grouped" in name else 1
    return weight_shape[1] * groups if "transpose" in name else weight_shape[0]


@pytest.mark.parametrize("name", list(CONVOLUTIONS))
def test_convolution(dev, name):
    fn, x, w = CONVOLUTIONS[name]
    compare(dev, fn, [sample(x), sample(w, seed=2), sample((_bias_size(name, w),), seed=3)], native=CONV)


def test_convolution_bfloat16_and_without_bias(dev):
    x, w = sample((2, 3, 8, 8), torch.bfloat16), sample((4, 3, 3, 3), torch.bfloat16, seed=2)
    compare(dev, lambda x, w: F.conv2d(x, w, padding=1), [x, w], native=CONV, tol=BF16, reference=torch.float32)


def test_convolution_backward_returns_only_requested_gradients(dev):
    """Only the input needs a gradient: the weight's is not computed (output_mask)."""
    x, w = sample((2, 3, 6, 6)), sample((4, 3, 3, 3), seed=2)
    compare(dev, lambda x, w: F.conv2d(x, w), [x, w], differentiable=[0], native=CONV)
    grads = aten.convolution_backward_overrideable(
        sample((2, 4, 4, 4)).to(dev), x.to(dev), w.to(dev), [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
        [False, True, False])
    assert grads[0] is None and grads[2] is None
    expected = aten.convolution_backward(sample((2, 4, 4, 4)), x, w, [4], [1, 1], [0, 0], [1, 1], False,
                                         [0, 0], 1, [False, True, False])[1]
    torch.testing.assert_close(grads[1].cpu(), expected, **F32)


# ---------------------------------------------------------------------------------------------
# Pooling
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("dims", [2, 3])
def test_max_pool_with_indices(dev, dims, ceil_mode):
    shape = (2, 3, 8, 9) if dims == 2 else (1, 2, 5, 6, 7)
    pool = F.max_pool2d if dims == 2 else F.max_pool3d
    compare(dev, lambda x: pool(x, 3, 2, 1, dilation=1 if dims == 3 else 2, ceil_mode=ceil_mode,
                                return_indices=True),
            [sample(shape)], native=[f"aten.max_pool{dims}d_with_indices.default",
                                     f"aten.max_pool{dims}d_with_indices_backward.default"])


def test_max_pool_ties_infinities_and_nan_follow_cpu(dev):
    """First maximum wins, NaN wins, and an all -inf window points at its first real element."""
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[[[1.0, 1.0, -inf, -inf], [1.0, nan, -inf, -inf], [2.0, 2.0, nan, 3.0],
                        [0.0, 0.0, 0.0, 0.0]]]])
    compare(dev, lambda x: F.max_pool2d(x, 2, 2, 1, return_indices=True), [x])


def test_max_pool_unbatched_and_bfloat16(dev):
    compare(dev, lambda x: F.max_pool2d(x, 2, return_indices=True), [sample((3, 8, 9))])
    compare(dev, lambda x: F.max_pool2d(x, 2, return_indices=True), [sample((2, 3, 8, 8), torch.bfloat16)],
            tol=BF16)


@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("ceil_mode", [False, True])
def test_avg_pool(dev, ceil_mode, count_include_pad):
    compare(dev, lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=ceil_mode, count_include_pad=count_include_pad),
            [sample((2, 3, 8, 9))], native=["aten.avg_pool2d.default", "aten.avg_pool2d_backward.default"])
    compare(dev, lambda x: F.avg_pool3d(x, (2, 3, 2), 2, (1, 1, 0), ceil_mode=ceil_mode,
                                        count_include_pad=count_include_pad),
            [sample((1, 2, 5, 6, 7))], native=["aten.avg_pool3d.default", "aten.avg_pool3d_backward.default"])


def test_avg_pool_divisor_override(dev):
    compare(dev, lambda x: F.avg_pool2d(x, 3, 2, 1, divisor_override=5), [sample((2, 3, 8, 9))])


@pytest.mark.parametrize("output_size", [(3, 4), (5, 7)])
def test_adaptive_avg_pool2d(dev, output_size):
    compare(dev, lambda x: F.adaptive_avg_pool2d(x, output_size), [sample((2, 3, 7, 5))],
            native=["aten._adaptive_avg_pool2d.default", "aten._adaptive_avg_pool2d_backward.default"])


def test_adaptive_avg_pool3d(dev):
    compare(dev, lambda x: F.adaptive_avg_pool3d(x, (2, 3, 4)), [sample((1, 2, 5, 6, 7))],
            native=["aten._adaptive_avg_pool3d.default", "aten._adaptive_avg_pool3d_backward.default"])


# ---------------------------------------------------------------------------------------------
# Normalization
# ---------------------------------------------------------------------------------------------

BATCH_NORM = ["aten.native_batch_norm.default", "aten.native_batch_norm_backward.default"]


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_updates_running_statistics_in_place(dev, training):
    cpu_stats = [sample((4,), seed=5), sample((4,), seed=6).abs() + 0.5]
    tpu_stats = [s.to(dev) for s in cpu_stats]

    def batch_norm(x, w, b):
        mean, var = cpu_stats if x.device.type == "cpu" else tpu_stats
        return F.batch_norm(x, mean, var, w, b, training=training, momentum=0.3, eps=1e-3)

    compare(dev, batch_norm, [sample((3, 4, 5, 6)), sample((4,), seed=2), sample((4,), seed=3)],
            native=BATCH_NORM)
    for device_stat, cpu_stat in zip(tpu_stats, cpu_stats):
        torch.testing.assert_close(device_stat.cpu(), cpu_stat, **F32)
    if training:
        assert not torch.equal(cpu_stats[0], sample((4,), seed=5))  # the update happened


def test_batch_norm_module_training_then_eval(dev):
    torch.manual_seed(0)
    cpu_norm = nn.BatchNorm1d(5)
    tpu_norm = nn.BatchNorm1d(5).to(dev)
    for seed in range(3):
        x = sample((8, 5, 3), seed=seed)
        compare(dev, lambda x: (cpu_norm if x.device.type == "cpu" else tpu_norm)(x), [x], native=BATCH_NORM)
    cpu_norm.eval()
    tpu_norm.eval()
    compare(dev, lambda x: (cpu_norm if x.device.type == "cpu" else tpu_norm)(x), [sample((4, 5, 3), seed=9)])
    for name, value in cpu_norm.state_dict().items():
        torch.testing.assert_close(tpu_norm.state_dict()[name].cpu(), value, **F32, msg=name)


def test_batch_norm_without_running_statistics_and_bfloat16(dev):
    compare(dev, lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
            [sample((3, 4, 5)), sample((4,), seed=2), sample((4,), seed=3)], native=BATCH_NORM)
    compare(dev, lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
            [sample((3, 4, 5), torch.bfloat16), sample((4,), torch.bfloat16, 2), sample((4,), torch.bfloat16, 3)],
            tol=BF16)


def test_native_batch_norm_out_variant_updates_running_statistics(dev):
    x = sample((3, 4, 5))
    cpu_stats = [sample((4,), seed=5), sample((4,), seed=6).abs()]
    tpu_stats = [s.to(dev) for s in cpu_stats]
    cpu_outs = [torch.empty(0) for _ in range(3)]
    tpu_outs = [o.to(dev) for o in cpu_outs]
    with accelkit.fallback_policy("deny"):
        for x_, stats, outs in ((x, cpu_stats, cpu_outs), (x.to(dev), tpu_stats, tpu_outs)):
            aten.native_batch_norm.out(x_, None, None, *stats, True, 0.1, 1e-5, out=outs[0], save_mean=outs[1],
                                       save_invstd=outs[2])
    for actual, expected in zip(tpu_outs + tpu_stats, cpu_outs + cpu_stats):
        torch.testing.assert_close(actual.cpu(), expected, **F32)


def test_batch_norm_legit_functional_variants(dev):
    """The traced-graph forms return the running statistics instead of writing them."""
    x, mean, var = sample((3, 4, 5)), sample((4,), seed=5), sample((4,), seed=6).abs()
    args = (None, None, mean, var)
    expected = aten._native_batch_norm_legit_functional(x, *args, True, 0.1, 1e-5)
    actual = aten._native_batch_norm_legit_functional(x.to(dev), None, None, mean.to(dev), var.to(dev), True,
                                                      0.1, 1e-5)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.cpu(), e, **F32)
    expected = aten._native_batch_norm_legit.no_stats(x, None, None, True, 0.1, 1e-5)
    actual = aten._native_batch_norm_legit.no_stats(x.to(dev), None, None, True, 0.1, 1e-5)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.cpu(), e, **F32)
    expected = aten._native_batch_norm_legit_no_training(x, *args, 0.1, 1e-5)[0]
    actual = aten._native_batch_norm_legit_no_training(x.to(dev), None, None, mean.to(dev), var.to(dev), 0.1,
                                                       1e-5)[0]
    torch.testing.assert_close(actual.cpu(), expected, **F32)


LAYER_NORM = ["aten.native_layer_norm.default", "aten.native_layer_norm_backward.default"]


def test_layer_norm(dev):
    compare(dev, lambda x, w, b: F.layer_norm(x, (5, 6), w, b, 1e-5),
            [sample((3, 4, 5, 6)), sample((5, 6), seed=2), sample((5, 6), seed=3)], native=LAYER_NORM)
    compare(dev, lambda x: F.layer_norm(x, (6,)), [sample((3, 4, 6))], native=LAYER_NORM)
    compare(dev, lambda x, w, b: F.layer_norm(x, (8,), w, b),
            [sample((3, 8), torch.bfloat16), sample((8,), torch.bfloat16, 2), sample((8,), torch.bfloat16, 3)],
            tol=BF16)


GROUP_NORM = ["aten.native_group_norm.default", "aten.native_group_norm_backward.default"]


@pytest.mark.parametrize("shape,groups", [((3, 4, 5, 6), 2), ((3, 6, 4), 3), ((2, 4, 7), 4)])
def test_group_norm(dev, shape, groups):
    channels = shape[1]
    compare(dev, lambda x, w, b: F.group_norm(x, groups, w, b),
            [sample(shape), sample((channels,), seed=2), sample((channels,), seed=3)], native=GROUP_NORM)


def test_group_norm_without_affine(dev):
    compare(dev, lambda x: F.group_norm(x, 2), [sample((3, 4, 5))], native=GROUP_NORM)


# ---------------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------------

REDUCTIONS = ["none", "mean", "sum"]


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_loss(dev, reduction):
    x, target, weight = sample((6, 5)), torch.tensor([0, 1, 4, 2, 2, 3]), sample((5,), seed=2).abs()
    native = ["aten.nll_loss_forward.default", "aten.nll_loss_backward.default"]
    compare(dev, lambda x, t: F.nll_loss(x, t, reduction=reduction, ignore_index=2), [x, target], native=native)
    compare(dev, lambda x, t, w: F.nll_loss(x, t, w, reduction=reduction, ignore_index=2), [x, target, weight],
            differentiable=[0], native=native)
    compare(dev, lambda x, t: F.nll_loss(x, t, reduction=reduction), [sample((5,)), torch.tensor(3)])


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_loss2d(dev, reduction):
    compare(dev, lambda x, t: F.nll_loss(x, t, reduction=reduction, ignore_index=1),
            [sample((2, 4, 3, 5)), torch.randint(0, 4, (2, 3, 5), generator=torch.Generator().manual_seed(0))],
            native=["aten.nll_loss2d_forward.default", "aten.nll_loss2d_backward.default"])


def test_cross_entropy_with_label_smoothing(dev):
    compare(dev, lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1),
            [sample((6, 5)), torch.tensor([0, 1, 4, 2, 2, 3])], native=["aten.nll_loss_forward.default"])


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_regression_losses(dev, reduction):
    x, y = sample((4, 5)), sample((4, 5), seed=2)
    compare(dev, lambda a, b: F.mse_loss(a, b, reduction=reduction), [x, y],
            native=["aten.mse_loss.default", "aten.mse_loss_backward.default"])
    for beta in (0.5, 2.0):
        compare(dev, lambda a, b, beta=beta: F.smooth_l1_loss(a, b, reduction=reduction, beta=beta), [x, y],
                native=["aten.smooth_l1_loss.default", "aten.smooth_l1_loss_backward.default"])
        compare(dev, lambda a, b, beta=beta: F.huber_loss(a, b, reduction=reduction, delta=beta), [x, y],
                native=["aten.huber_loss.default", "aten.huber_loss_backward.default"])


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_cross_entropy(dev, reduction):
    g = torch.Generator().manual_seed(0)
    p, target, weight = torch.rand(4, 5, generator=g), torch.rand(4, 5, generator=g), torch.rand(5, generator=g)
    p[0, 0], p[0, 1] = 0.0, 1.0  # log is clamped at -100, as on CPU
    native = ["aten.binary_cross_entropy.default", "aten.binary_cross_entropy_backward.default"]
    compare(dev, lambda a, b: F.binary_cross_entropy(a, b, reduction=reduction), [p, target],
            differentiable=[0], native=native)
    compare(dev, lambda a, b, w: F.binary_cross_entropy(a, b, w, reduction=reduction), [p, target, weight],
            differentiable=[0], native=native)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_cross_entropy_with_logits(dev, reduction):
    g = torch.Generator().manual_seed(0)
    target, weight, pos_weight = torch.rand(4, 5, generator=g), torch.rand(5, generator=g), torch.rand(5, generator=g)
    logits = sample((4, 5)) * 30  # large logits: the overflow-free form is needed
    native = ["aten.binary_cross_entropy_with_logits.default"]
    compare(dev, lambda a, b: F.binary_cross_entropy_with_logits(a, b, reduction=reduction), [logits, target],
            differentiable=[0], native=native)
    compare(dev, lambda a, b, w, pw: F.binary_cross_entropy_with_logits(a, b, w, pos_weight=pw, reduction=reduction),
            [sample((4, 5)), target, weight, pos_weight], differentiable=[0], native=native)


# ---------------------------------------------------------------------------------------------
# Embedding
# ---------------------------------------------------------------------------------------------

EMBEDDING = ["aten.embedding.default", "aten.embedding_dense_backward.default"]
INDICES = torch.tensor([[1, 2, 1], [9, 0, 1]])


@pytest.mark.parametrize("options", [{}, {"padding_idx": 1}, {"scale_grad_by_freq": True}],
                         ids=["plain", "padding_idx", "scale_grad_by_freq"])
def test_embedding(dev, options):
    compare(dev, lambda w, i: F.embedding(i, w, **options), [sample((10, 4)), INDICES], native=EMBEDDING)


def test_embedding_bfloat16(dev):
    compare(dev, lambda w, i: F.embedding(i, w), [sample((10, 4), torch.bfloat16), INDICES], native=EMBEDDING,
            tol=BF16)


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------

ATTENTION = ["aten._safe_softmax.default", "aten.bmm.default", "aten._softmax_backward_data.default"]


@pytest.mark.parametrize("variant", ["plain", "causal", "bool_mask", "float_mask", "scale"])
def test_scaled_dot_product_attention_math_path_is_native(dev, variant):
    """SDPA reaches a PrivateUse1 device as its math decomposition; every piece is a lowering."""
    q, k, v = sample((2, 3, 5, 8)), sample((2, 3, 7, 8), seed=2), sample((2, 3, 7, 4), seed=3)
    mask = sample((5, 7), seed=4) > 0
    mask[:, 0] = True  # no query is fully masked
    options = {
        "plain": {}, "causal": {"is_causal": True}, "scale": {"scale": 0.3},
        "bool_mask": {"attn_mask": mask},
        "float_mask": {"attn_mask": sample((5, 7), seed=4)},
    }[variant]

    def attention(q, k, v):
        moved = {n: (m.to(q.device) if isinstance(m, torch.Tensor) else m) for n, m in options.items()}
        return F.scaled_dot_product_attention(q, k, v, **moved)

    compare(dev, attention, [q, k, v], native=ATTENTION)


def test_scaled_dot_product_attention_fully_masked_rows_give_zeros(dev):
    q, k, v = sample((1, 2, 3, 4)), sample((1, 2, 3, 4), seed=2), sample((1, 2, 3, 4), seed=3)
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask[1] = False  # query 1 may attend to nothing
    tpu = compare(dev, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.device)),
                  [q, k, v])
    assert torch.isfinite(tpu[0].grad.cpu()).all()


def test_scaled_dot_product_attention_bfloat16(dev):
    q, k, v = (sample((2, 2, 4, 8), torch.bfloat16, seed=s) for s in range(3))
    compare(dev, F.scaled_dot_product_attention, [q, k, v], native=ATTENTION, tol=BF16)


MASKS = {
    "none": lambda padding, causal: {},
    "padding": lambda padding, causal: {"src_key_padding_mask": padding},
    "causal_and_padding": lambda padding, causal: {"src_mask": causal, "src_key_padding_mask": padding},
}


@pytest.mark.parametrize("norm_first,activation,masks", [
    (False, "relu", "none"), (False, "relu", "causal_and_padding"), (True, "gelu", "padding"),
])
def test_transformer_encoder_layer_fast_path(dev, norm_first, activation, masks):
    """Inference through ``nn.TransformerEncoderLayer`` takes PyTorch's fused fast path."""
    torch.manual_seed(0)
    layers = [nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=norm_first,
                                         activation=activation).eval() for _ in range(2)]
    cpu_layer, tpu_layer = layers[0], layers[1].to(dev)
    tpu_layer.load_state_dict(cpu_layer.state_dict())
    x = sample((3, 6, 16))
    padding = torch.zeros(3, 6, dtype=torch.bool)
    padding[0, 4:] = True
    chosen = MASKS[masks](padding, nn.Transformer.generate_square_subsequent_mask(6))
    accelkit.reset_stats()
    with torch.no_grad(), accelkit.fallback_policy("deny"):
        actual = tpu_layer(x.to(dev), **{n: m.to(dev) for n, m in chosen.items()})
    torch.testing.assert_close(actual.cpu(), cpu_layer(x, **chosen), **F32)
    assert accelkit.stats()["ops"]["aten._transformer_encoder_layer_fwd.default"]["native"] == 1
