"""``F.scaled_dot_product_attention`` with both an ``attn_mask`` and ``is_causal=True``.

On the CPU (and CUDA) the fused kernels accept both and apply the mask together with the causal
one; on a PrivateUse1 device PyTorch 2.13 always takes the math path, which refuses the pair
("Explicit attn_mask should not be set when is_causal=True"). The runtime makes the pair the
single mask the CPU applies — a boolean mask and-ed with the causal triangle, a float mask with
``-inf`` above it, aligned top-left as ``is_causal`` is — and runs PyTorch's own composite on it,
so autograd, dropout and the backend's kernels are as for any other mask.
"""

from __future__ import annotations

from typing import Any

import torch

_SDPA = torch.ops.aten.scaled_dot_product_attention.default


def _with_causal(attn_mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    causal = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool, device=query.device).tril()
    if attn_mask.dtype == torch.bool:
        return attn_mask & causal
    return attn_mask.masked_fill(~causal, float("-inf"))


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, **kwargs: Any) -> torch.Tensor:
    if attn_mask is not None and is_causal:
        attn_mask, is_causal = _with_causal(attn_mask, query, key), False
    return _SDPA.decompose(query, key, value, attn_mask, dropout_p, is_causal, **kwargs)


def install_attention(kernels: Any) -> None:
    """Register the kernel above autograd (where PyTorch's composite runs) through ``kernels``."""
    kernels.impl(_SDPA, scaled_dot_product_attention, "AutogradPrivateUse1")
