"""Whole models train on tpu with no CPU fallback and match the same training on CPU.

Three models — an MLP, a small CNN (conv2d, batch norm, max pool) and a transformer encoder
layer (scaled dot-product attention, batch_first) — each run forward, backward and several
optimizer steps (SGD with momentum, AdamW) on tpu under ``fallback_policy("deny")``, and the
counters confirm that no op fell back. A CPU copy of the model, with the same initial weights,
takes the same steps on the same data; after every step the losses agree, and at the end so do
the parameters, the batch-norm running statistics and an inference-mode forward (which for the
transformer is PyTorch's fused fast path, ``_transformer_encoder_layer_fwd``).

Tolerances. Everything is float32, and tpu matmuls and convolutions run at XLA's HIGHEST
precision (true float32, not bfloat16 passes), so the two runs differ only in the order of
floating-point sums: XLA's reductions, dot products and convolutions associate differently from
PyTorch's CPU kernels (oneDNN, MKL). One such reordering moves a result by a few float32 ulps
(~1e-7 relative); training compounds it over steps, and AdamW's update ``m / (sqrt(v) + eps)``
turns tiny gradient differences into parameter differences of up to ~lr * 1e-4 for parameters
whose gradients are near zero. Hence rtol = atol = 1e-4 for losses and parameters after a few
steps: four orders of magnitude above float32's resolution, far below any real error (a wrong
gradient, a missed running-statistics update or a broken optimizer step moves values by 1e-2 or
more at these learning rates).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import accelkit
from accelkit.sdk.testing.parity import assert_training_parity, train_steps

STEPS = 4
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}


class SmallCNN(nn.Module):
    """conv → batch norm → relu → max pool, twice, then a linear classifier.

    The convolutions have no bias, as usual before batch norm: the normalisation cancels a bias,
    so its gradient is rounding noise, which AdamW would scale up to full-size steps of
    different noise on each device.
    """

    def __init__(self, classes: int = 10):
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


class SmallTransformer(nn.Module):
    """One encoder layer (self-attention through scaled dot-product attention) and a classifier
    on the mean of the sequence."""

    WIDTH = 16

    def __init__(self, width: int = WIDTH, heads: int = 4, classes: int = 5):
        super().__init__()
        self.encoder = nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0, batch_first=True)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        return self.head(self.encoder(x).mean(dim=1))


#: Parameter elements whose gradient is zero in exact arithmetic, so both devices train them on
#: rounding noise (which AdamW normalises to full-size steps): they are not compared. The key
#: projection's bias adds the same ``q . b`` to every score of a query, which softmax cancels.
NOISE_ONLY = {"encoder.self_attn.in_proj_bias": slice(SmallTransformer.WIDTH, 2 * SmallTransformer.WIDTH)}


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 5))


MODELS = {
    "mlp": (_mlp, (16, 12), 5),
    "cnn": (SmallCNN, (4, 3, 8, 8), 10),
    "transformer": (SmallTransformer, (3, 6, 16), 5),
}

OPTIMIZERS = {
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01),
}


def _batches(input_shape, classes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(input_shape, generator=g), torch.randint(0, classes, (input_shape[0],), generator=g))
        for _ in range(STEPS)
    ]


@pytest.mark.parametrize("optimizer_name", list(OPTIMIZERS))
@pytest.mark.parametrize("model_name", list(MODELS))
def test_training_matches_cpu_without_fallback(dev, model_name, optimizer_name):
    make, input_shape, classes = MODELS[model_name]
    torch.manual_seed(0)
    with accelkit.fallback_policy("deny"):
        # Losses per step, parameters with batch norm's running statistics, and an eval-mode
        # forward of the first batch (the transformer's fused fast path).
        result = assert_training_parity(make(), _batches(input_shape, classes), dev, OPTIMIZERS[optimizer_name],
                                        **TOLERANCE, ignore=NOISE_ONLY)

    stats = accelkit.stats()
    assert stats["totals"]["fallback"] == 0, {k: v for k, v in stats["ops"].items() if v["fallback"]}
    cpu_losses = result.reference.losses
    assert not torch.equal(cpu_losses[0], cpu_losses[-1])  # training moved the model


def test_models_run_their_layers_natively(dev):
    """The layers' own ops are lowerings, not decompositions into many small programs."""
    torch.manual_seed(0)
    expected = {
        "cnn": ["aten.convolution_overrideable.default", "aten.convolution_backward_overrideable.default",
                "aten.native_batch_norm.default", "aten.native_batch_norm_backward.default",
                "aten.max_pool2d_with_indices.default", "aten.max_pool2d_with_indices_backward.default"],
        "transformer": ["aten._safe_softmax.default", "aten.bmm.default",
                        "aten.native_layer_norm.default", "aten.native_layer_norm_backward.default"],
    }
    for name, ops in expected.items():
        make, input_shape, classes = MODELS[name]
        model = make().to(dev)
        accelkit.reset_stats()
        with accelkit.fallback_policy("deny"):
            train_steps(model, torch.optim.SGD(model.parameters(), lr=0.1), _batches(input_shape, classes)[:1])
        counts = accelkit.stats()["ops"]
        for op in ops:
            assert counts.get(op, {}).get("native", 0) > 0, (name, op)
        assert not any(v["decomposed"] for v in counts.values()), name
