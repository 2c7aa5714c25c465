"""An MLP and a small transformer encoder train on neuron with no CPU fallback and match CPU.

Each model runs forward, backward and several optimizer steps (SGD with momentum, AdamW) on
the simulated NeuronCore under ``fallback_policy("deny")``, and the counters confirm that no op
fell back. A CPU copy of the model, with the same initial weights, takes the same steps on the
same data; after every step the losses agree, and at the end so do the parameters and an
inference-mode forward (for the transformer, PyTorch's fused fast path). A bfloat16 MLP forward
is compared with CPU bfloat16.

Tolerances (float32). The simulator computes every engine instruction in float32 numpy, and
matmuls are true fp32 products accumulated in fp32 PSUM, so the two runs differ only in the
order of floating-point sums: numpy/BLAS dot products per 128-row K tile plus PSUM
accumulation across tiles, row sums split into chunks and partitions and finished across
partitions by a ones-vector matmul, against oneDNN/MKL and PyTorch's vectorised reductions on
the CPU. One reordering moves a result by a few ulps (~1e-7 relative); training compounds
that over the steps, and AdamW's ``m / (sqrt(v) + eps)`` can turn tiny gradient differences
into larger parameter differences where gradients are near zero (the parameters whose gradient
is exactly zero are left out, see ``NOISE_ONLY``). Measured here, losses and parameters differ
by at most ~2.5e-7 after the steps. Hence rtol = atol = 1e-5: forty times that, to absorb a
different BLAS or CPU kernel summing in another order, and still far below any real error — a
wrong gradient term, a dropped row in a reduction or a broken optimizer step moves values by
1e-3 or more at these learning rates.

Tolerance (bfloat16 forward). Both sides round every layer's output to bfloat16 (8 bits of
mantissa, a relative step of 2**-8 ≈ 3.9e-3) after fp32 accumulation; a sum that lands near a
rounding boundary can round the other way, so a layer may differ by one bf16 ulp and three
layers compound it. rtol = 1.6e-2 (PyTorch's bfloat16 default, about four ulps) with
atol = 4e-3 (one ulp at magnitude 1) for outputs that are small differences of larger terms.
(Measured here: identical logits.)
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import accelkit
from accelkit.sdk.testing.parity import assert_training_parity, train_steps
from conftest import assert_native

STEPS = 3
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
BF16_TOLERANCE = {"rtol": 1.6e-2, "atol": 4e-3}


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
        # Losses per step, parameters, and an eval-mode forward of the first batch (the
        # transformer's fused fast path).
        result = assert_training_parity(make(), _batches(input_shape, classes), dev, OPTIMIZERS[optimizer_name],
                                        **TOLERANCE, ignore=NOISE_ONLY)

    stats = accelkit.stats()
    assert stats["totals"]["fallback"] == 0, {k: v for k, v in stats["ops"].items() if v["fallback"]}
    cpu_losses = result.reference.losses
    assert not torch.equal(cpu_losses[0], cpu_losses[-1])  # training moved the model


def test_models_run_their_layers_as_tile_programs(dev):
    """The layers' reductions, softmax, layer norm and loss run as neuron tile programs, not as
    decompositions into many small programs."""
    expected = {
        "mlp": ["aten._log_softmax.default", "aten._log_softmax_backward_data.default",
                "aten.nll_loss_forward.default", "aten.nll_loss_backward.default",
                "aten.sum.dim_IntList"],
        "transformer": ["aten._safe_softmax.default", "aten._softmax_backward_data.default",
                        "aten.native_layer_norm.default", "aten.native_layer_norm_backward.default",
                        "aten.mean.dim", "aten.sum.dim_IntList", "aten.bmm.default"],
    }
    for name, ops in expected.items():
        make, input_shape, classes = MODELS[name]
        torch.manual_seed(0)
        model = make().to(dev)
        accelkit.reset_stats()
        with accelkit.fallback_policy("deny"):
            train_steps(model, torch.optim.SGD(model.parameters(), lr=0.1), _batches(input_shape, classes)[:1])
        counts = accelkit.stats()["ops"]
        for op in ops:
            assert counts.get(op, {}).get("native", 0) > 0, (name, op, counts.get(op))
        decomposed = {op for op, v in counts.items() if v["decomposed"]}
        assert not decomposed & {
            "aten._softmax_backward_data.default", "aten._log_softmax_backward_data.default",
            "aten.native_layer_norm_backward.default", "aten.nll_loss_forward.default",
            "aten.nll_loss_backward.default", "aten._safe_softmax.default",
        }, (name, decomposed)


def test_bfloat16_mlp_forward_matches_cpu_bfloat16(dev):
    torch.manual_seed(0)
    cpu_model = _mlp().to(torch.bfloat16)
    neuron_model = copy.deepcopy(cpu_model).to(dev)
    x = torch.randn(16, 12).to(torch.bfloat16)
    target = torch.randint(0, 5, (16,))
    with accelkit.fallback_policy("deny"), torch.no_grad():
        neuron_logits = neuron_model(x.to(dev))
        neuron_loss = F.cross_entropy(neuron_logits, target.to(dev))
    cpu_logits = cpu_model(x)
    cpu_loss = F.cross_entropy(cpu_logits, target)
    assert neuron_logits.dtype == torch.bfloat16
    torch.testing.assert_close(neuron_logits.cpu(), cpu_logits.detach(), **BF16_TOLERANCE)
    torch.testing.assert_close(neuron_loss.cpu(), cpu_loss.detach(), **BF16_TOLERANCE)
    assert accelkit.stats()["totals"]["fallback"] == 0


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_inference_fast_path_is_one_native_program(dev, norm_first):
    """Eval-mode ``TransformerEncoderLayer`` calls ``_transformer_encoder_layer_fwd``; with a
    key-padding mask and a causal mask (float masks: making them from booleans needs
    masked_fill, which is not this test's subject) it matches CPU."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=norm_first,
                                       activation="gelu").eval()
    neuron_layer = copy.deepcopy(layer).to(dev)
    x = torch.randn(3, 6, 16)
    padded = torch.tensor([[False] * 6, [False] * 4 + [True] * 2, [False] * 5 + [True]])
    masks = {
        "none": {},
        "key_padding": {"src_key_padding_mask": torch.zeros(3, 6).masked_fill(padded, -math.inf)},
        "causal": {"src_mask": nn.Transformer.generate_square_subsequent_mask(6)},
    }
    results = {}
    for name, kwargs in masks.items():
        accelkit.reset_stats()
        with torch.no_grad(), accelkit.fallback_policy("deny"):
            result = neuron_layer(x.to(dev), **{k: v.to(dev) for k, v in kwargs.items()}).cpu()
            expected = layer(x, **kwargs)
        assert_native("aten._transformer_encoder_layer_fwd.default")
        torch.testing.assert_close(result, expected, **TOLERANCE)
        results[name] = result
    assert not torch.allclose(results["none"], results["key_padding"])  # the masks took effect
    assert not torch.allclose(results["none"], results["causal"])
