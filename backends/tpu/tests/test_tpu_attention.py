"""tpu attention (kernels/attention.py) compared with PyTorch on CPU: scaled dot-product
attention, which reaches a PrivateUse1 device as its math decomposition (``_safe_softmax``
between two batched products), forward and backward — plain, causal, boolean and float masks, a
given scale, fully masked rows (zeros, finite gradients), bfloat16 — and inference through
``nn.TransformerEncoderLayer``, which takes PyTorch's fused fast path
(``_transformer_encoder_layer_fwd``).

The forward-and-backward checks are ``harness_nn.compare``; float32 is compared at 1e-5
(XLA sums in another order than PyTorch's CPU kernels: a few ulps), bfloat16 at its resolution.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import accelkit
from harness_nn import BF16, F32, compare, sample


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
