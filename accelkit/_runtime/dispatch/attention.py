"""``F.scaled_dot_product_attention`` on the device: PyTorch's math path, with what its fused
kernels accept beside it.

- **both an ``attn_mask`` and ``is_causal=True``**: on the CPU (and CUDA) the fused kernels
  accept both and apply the mask together with the causal one; on a PrivateUse1 device PyTorch
  2.13 always takes the math path, which refuses the pair ("Explicit attn_mask should not be set
  when is_causal=True"). The runtime makes the pair the single mask the CPU applies — a boolean
  mask and-ed with the causal triangle, a float mask with ``-inf`` above it, aligned top-left as
  ``is_causal`` is — and runs PyTorch's own composite on it, so autograd, dropout and the
  backend's kernels are as for any other mask;
- **DTensor inputs** (tensor parallelism shards attention by heads): DTensor gives the fused
  kernels a sharding rule — shards of the batch or of the heads attend within themselves — but
  the math path builds its causal mask as a plain tensor beside the DTensors, which DTensor
  refuses. The runtime applies that rule itself: each rank attends over its local shards and the
  result is a DTensor of the query's placements. Attention over a sharded sequence (context
  parallelism) needs its ring algorithm and is refused with that reason.
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


def _on_local_shards(query: Any, key: Any, value: Any, attn_mask: Any, dropout_p: float, is_causal: bool,
                     **kwargs: Any) -> Any:
    from torch.distributed.tensor import DTensor

    placements = query.placements
    operands = [t for t in (query, key, value, attn_mask) if t is not None]
    if not all(isinstance(t, DTensor) and t.placements == placements and t.device_mesh == query.device_mesh
               for t in operands):
        raise ValueError(
            "scaled_dot_product_attention on DTensors: query, key, value (and a mask) must share one mesh and "
            f"placements; got {[getattr(t, 'placements', 'a plain tensor') for t in operands]}. Redistribute them "
            "to the query's placements first.")
    for placement in placements:
        if placement.is_partial() or (placement.is_shard() and placement.dim % query.ndim >= query.ndim - 2):
            raise ValueError(
                f"scaled_dot_product_attention on DTensors placed {placements}: only shards of the batch or the "
                "heads attend on their own; a sharded sequence (context parallelism) needs ring attention, and "
                "partial values must be reduced first")
    local = scaled_dot_product_attention(
        query.to_local(), key.to_local(), value.to_local(), None if attn_mask is None else attn_mask.to_local(),
        dropout_p, is_causal, **kwargs)
    return DTensor.from_local(local, query.device_mesh, placements, run_check=False)


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, **kwargs: Any) -> torch.Tensor:
    if type(query) is not torch.Tensor and type(query).__name__ == "DTensor":
        return _on_local_shards(query, key, value, attn_mask, dropout_p, is_causal, **kwargs)
    if attn_mask is not None and is_causal:
        attn_mask, is_causal = _with_causal(attn_mask, query, key), False
    return _SDPA.decompose(query, key, value, attn_mask, dropout_p, is_causal, **kwargs)


def install_attention(kernels: Any) -> None:
    """Register the kernel above autograd (where PyTorch's composite runs) through ``kernels``."""
    kernels.impl(_SDPA, scaled_dot_product_attention, "AutogradPrivateUse1")
