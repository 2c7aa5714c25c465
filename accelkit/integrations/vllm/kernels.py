"""Plain-torch stand-ins for the Triton kernels vLLM's model runner launches (no Triton driver
exists for accelkit devices); registered through vLLM's kernel dispatcher by
:meth:`.platform.AccelkitPlatform.register_triton_kernel_overrides`."""

from __future__ import annotations

import torch

from .buckets import MIN_TOKENS, bucket


def _widen(t: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` elements of the 1-D buffer ``t`` is a prefix view of (vLLM slices its
    persistent buffers to the step's size), so that shapes stay those of the bucket; ``t``
    itself when its storage is shorter."""
    room = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()
    if t.dim() != 1 or t.stride(0) != 1 or room < n:
        return t
    return t.as_strided((n,), (1,), t.storage_offset())


def compute_slot_mapping(
    num_tokens: int,
    max_num_tokens: int,
    query_start_loc: torch.Tensor,  # [num_reqs + 1], a prefix of a [max_num_reqs + 1] buffer
    positions: torch.Tensor,  # [num_tokens], a prefix of a [max_num_tokens] buffer
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
    """Each token's cache slot: ``block_table[req, pos // bs] * bs + pos % bs``; PAD_ID for the
    rest of the token bucket (:mod:`.buckets`).

    Shapes are the bucket's, never the step's: the token rows are ``bucket(num_tokens)`` of the
    positions buffer, the requests all of ``query_start_loc``'s buffer (vLLM repeats the last
    offset past the real requests, so those have no tokens). Entries past the bucket are left
    as they are; vLLM's runner reads only the bucket.
    """
    if TOTAL_CP_WORLD_SIZE != 1:
        raise NotImplementedError("accelkit: context parallelism is not supported")
    bs = KV_CACHE_BLOCK_SIZE
    n = bucket(num_tokens, MIN_TOKENS, max_num_tokens) if num_tokens else 0
    if n == 0:
        return
    qsl = _widen(query_start_loc, block_table.shape[0] + 1).to(torch.long)
    pos = _widen(positions, n).to(torch.long)
    n = pos.shape[0]  # the step's size when the buffer could not be widened
    tokens = torch.arange(n, device=pos.device)
    # The request of each token: how many requests end at or before it (a comparison and a
    # sum, which every backend has natively; searchsorted is not native on neuron).
    ends = qsl[1:]
    reqs = (tokens[:, None] >= ends[None, :]).sum(dim=1).clamp(max=block_table.shape[0] - 1)
    valid = tokens < ends[-1:]
    pos = torch.where(valid, pos, 0)  # padding rows hold stale positions
    blocks = block_table[reqs, (pos // bs).clamp(max=block_table.shape[1] - 1)].to(torch.long)
    slot_mapping[:n] = torch.where(valid, blocks * bs + pos % bs, PAD_ID)
