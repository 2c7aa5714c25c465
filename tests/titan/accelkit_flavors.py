"""Small flavors of TorchTitan's own model families, registered through TorchTitan's extension
point (``--experimental.custom_import accelkit_flavors``, this directory on ``PYTHONPATH``).

TorchTitan's debug flavors are its smallest (llama3 ``debugmodel``: 6 layers of width 256;
qwen3 ``debugmodel_moe``: 8 layers, 64 experts, 316M parameters); on a simulated NeuronCore, and
in CI on two cores, a step of them takes long. These are the same model classes, parallelisms
and training code with fewer and narrower layers — TorchTitan's code is not changed, only a
flavor is added beside its own:

- ``llama3 tiny``: 2 layers, width 64, 4 heads (head_dim 16), SDPA;
- ``llama3 tiny_flex``: the same with FlexAttention and TorchTitan's document masking
  (``attn_mask_type="block_causal"``: attention stays within each packed document);
- ``qwen3 tiny_moe``: 2 layers, width 64, 8 experts of width 64, top-2 routing;
- ``flux tiny``: one double and one single block of width 96, and an autoencoder of width 32
  that takes 64-pixel images to a 16x16 latent (flux-debug's text encoders' widths).
"""

from __future__ import annotations

import dataclasses

from torchtitan.models.llama3 import llama3_args
from torchtitan.models.llama3.model.args import TransformerModelArgs
from torchtitan.models.qwen3 import qwen3_args

_TINY_LLAMA = TransformerModelArgs(dim=64, n_layers=2, n_heads=4, vocab_size=2048, multiple_of=32,
                                   rope_theta=500000)

llama3_args.setdefault("tiny", _TINY_LLAMA)
llama3_args.setdefault("tiny_flex", dataclasses.replace(_TINY_LLAMA, attn_type="flex",
                                                        attn_mask_type="block_causal"))

_MOE = qwen3_args["debugmodel_moe"]
qwen3_args.setdefault("tiny_moe", dataclasses.replace(
    _MOE, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=128, moe_inter_dim=64,
    moe_args=dataclasses.replace(_MOE.moe_args, num_experts=8, top_k=2)))

from torchtitan.models.flux import flux_args  # noqa: E402
from torchtitan.models.flux.model.autoencoder import AutoEncoderParams  # noqa: E402

_FLUX = flux_args["flux-debug"]
flux_args.setdefault("tiny", dataclasses.replace(
    _FLUX, hidden_size=96, mlp_ratio=2.0, num_heads=2, depth=1, depth_single_blocks=1, axes_dim=(8, 20, 20),
    autoencoder_params=AutoEncoderParams(resolution=64, ch=32, ch_mult=(1, 2, 2), num_res_blocks=1)))
