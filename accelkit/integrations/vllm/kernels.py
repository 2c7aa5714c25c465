"""Plain-torch stand-ins for the Triton kernels vLLM's model runner launches (no Triton driver
exists for accelkit devices); registered through vLLM's kernel dispatcher by
:meth:`.platform.AccelkitPlatform.register_triton_kernel_overrides`."""

from __future__ import annotations

import torch


def compute_slot_mapping(
    num_tokens: int,
    max_num_tokens: int,
    query_start_loc: torch.Tensor,  # [num_reqs + 1]
    positions: torch.Tensor,  # [num_tokens]
    block_table: torch.Tensor,  # [max_num_reqs, max_blocks_per_req]
    block_table_stride: int,
    slot_mapping: torch.Tensor,  # [max_num_tokens], written in place
    KV_CACHE_BLOCK_SIZE: int,
    TOTAL_CP_WORLD_SIZE: int = 1,
    TOTAL_CP_RANK: int = 0,
    CP_KV_CACHE_INTERLEAVE_SIZE: int = 1,
    PAD_ID: int = -1,
    BLOCK_SIZE: int = 1024,
) -> None:
    """Each token's cache slot: ``block_table[req, pos // bs] * bs + pos % bs``; the rest PAD_ID."""
    if TOTAL_CP_WORLD_SIZE != 1:
        raise NotImplementedError("accelkit: context parallelism is not supported")
    bs = KV_CACHE_BLOCK_SIZE
    tokens = torch.arange(num_tokens, device=positions.device)
    # The request of each token: how many requests end at or before it (a comparison and a
    # sum, which every backend has natively; searchsorted is not native on neuron).
    ends = query_start_loc[1:].to(torch.long)
    reqs = (tokens[:, None] >= ends[None, :]).sum(dim=1)
    pos = positions[:num_tokens].to(torch.long)
    blocks = block_table[reqs, pos // bs].to(torch.long)
    slot_mapping[:num_tokens] = blocks * bs + pos % bs
    if max_num_tokens > num_tokens:
        slot_mapping[num_tokens:max_num_tokens] = PAD_ID
