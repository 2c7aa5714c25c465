"""Paged attention for vLLM written with plain torch ops, so it runs on any accelkit device.

KV cache (one tensor per layer, a view vLLM makes of its one int8 allocation, on the device):
``[num_blocks, num_kv_heads, block_size, 2 * head_size]``; a token's key is ``[..., :head_size]``
and its value ``[..., head_size:]`` at (``slot // block_size``, head, ``slot % block_size``).

- :meth:`AccelkitAttentionImpl.do_kv_cache_update` writes the step's keys and values into their
  slots in place (one ``scatter_`` per layer); padding tokens (slot -1) write back what slot 0
  of vLLM's null block holds, so the cache is unchanged for them.
- :meth:`AccelkitAttentionImpl.forward` gathers each request's blocks (bucketed shapes, see
  :mod:`.buckets`), pads the step's queries
  per request (``[num_reqs, max_query_len]``) and attends with a mask: causal over absolute
  positions and bounded by each request's length. One code path serves prefill, decode, chunked
  prefill and mixed batches, one program per bucket. Grouped-query attention groups the query heads of each key/value
  head (no repeat of the cache). Scores and softmax are in float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.kv_cache_layout import KVCacheLayout

from .buckets import MIN_TOKENS, bucket


class AccelkitAttentionBackend(AttentionBackend):
    forward_includes_kv_cache_update: bool = False
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto"]

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MultipleOf(1)]

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return []  # any

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        return head_size > 0

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        return (KVCacheLayout.LBHNC,)

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @staticmethod
    def get_impl_cls() -> type[AccelkitAttentionImpl]:
        return AccelkitAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[AccelkitMetadataBuilder]:
        return AccelkitMetadataBuilder


@dataclass
class AccelkitAttentionMetadata:
    """One step's batch, shared by every layer of a KV cache group (device tensors but sizes).

    Every shape is a bucket (:mod:`.buckets`): ``R`` requests (the real ones first, then padding
    with no queries and no context), ``Q`` queries per request, ``T`` query rows (the step's
    tokens, then padding), ``NB`` blocks per request.
    """

    token_index: torch.Tensor  # [R, Q] row of each (request, query) in the step's tokens (padding: 0)
    out_index: torch.Tensor  # [T] flat index (r * Q + q) of each token row (padding rows: 0)
    query_pos: torch.Tensor  # [R, Q] absolute position of each query
    seq_lens: torch.Tensor  # [R] tokens in each request's cache after this step (padding: 0)
    blocks: torch.Tensor  # [R, NB] block table cut to the bucket above the longest request


class AccelkitMetadataBuilder(AttentionMetadataBuilder[AccelkitAttentionMetadata]):
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size
        self.max_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.max_blocks = -(-vllm_config.model_config.max_model_len // self.block_size)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False):
        m = common_attn_metadata
        # The runner pads the requests (AccelkitModelRunner._build_attention_metadata): the
        # rows past the real ones have no queries and a zero sequence length.
        num_reqs = m.num_reqs
        qsl = m.query_start_loc_cpu[: num_reqs + 1].to(torch.long)
        seq_lens_cpu = m.seq_lens_cpu_upper_bound
        if seq_lens_cpu is None:
            seq_lens_cpu = m.seq_lens[:num_reqs].cpu()
        seq_lens_cpu = seq_lens_cpu[:num_reqs].to(torch.long)
        query_lens = qsl[1:] - qsl[:-1]
        num_tokens = int(qsl[-1])
        t_pad = bucket(max(num_tokens, m.num_actual_tokens), MIN_TOKENS, self.max_tokens)
        # Decode-only steps attend one query per request; any other step up to the whole token
        # bucket (few shapes rather than one per query-length bucket).
        q_pad = 1 if int(query_lens.max()) <= 1 else t_pad
        max_seq = int(seq_lens_cpu.max()) if num_reqs else 0
        nb_pad = bucket(max(-(-max_seq // self.block_size), 1), 1, max(self.max_blocks, 1))
        offsets = torch.arange(q_pad, dtype=torch.long)
        token_valid = offsets[None, :] < query_lens[:, None]
        token_index = torch.where(token_valid, qsl[:-1, None] + offsets[None, :], 0)
        query_pos = (seq_lens_cpu - query_lens)[:, None] + offsets[None, :]
        out_index = torch.zeros(t_pad, dtype=torch.long)
        out_index[:num_tokens] = token_valid.reshape(-1).nonzero().reshape(-1)
        dev = self.device
        return AccelkitAttentionMetadata(
            token_index=token_index.to(dev),
            out_index=out_index.to(dev),
            query_pos=query_pos.to(dev),
            seq_lens=seq_lens_cpu.to(dev),
            blocks=m.block_table_tensor[:num_reqs, :nb_pad].to(torch.long),
        )


class AccelkitAttentionImpl(AttentionImpl):
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        unsupported = [
            what
            for what, present in (
                ("ALiBi", alibi_slopes is not None),
                ("sliding windows", sliding_window is not None),
                ("logit soft-capping", bool(logits_soft_cap)),
                ("attention sinks", sinks is not None),
                (f"KV cache dtype {kv_cache_dtype}", kv_cache_dtype != "auto"),
                (f"attention type {attn_type}", attn_type != AttentionType.DECODER),
            )
            if present
        ]
        if unsupported:
            raise NotImplementedError("accelkit attention does not support " + ", ".join(unsupported) + " yet")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.attn_type = attn_type

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        """Writes the step's keys and values (``[tokens, kv_heads, head_size]``) into their slots.

        One ``scatter_`` into the cache seen as rows of ``2 * head_size`` (a row per slot and
        head), which every backend compiles into its program (``index_put`` would be a host
        step on tpu, cut out of a compiled graph). Padding tokens (slot < 0) leave the cache as
        it was: they are pointed at slot 0 (in vLLM's null block 0, which no request owns) and
        write back what it holds.
        """
        n = slot_mapping.shape[0]
        num_blocks, hkv, block_size, width = kv_cache.shape
        slots = slot_mapping.to(torch.long)
        valid = slots >= 0
        slots = torch.where(valid, slots, 0)
        heads = torch.arange(hkv, device=slots.device)
        # row of (slot, head) in the [num_blocks * hkv * block_size, width] view of the cache
        rows = (((slots // block_size)[:, None] * hkv + heads[None, :]) * block_size + (slots % block_size)[:, None])
        rows = rows.reshape(n * hkv)
        flat = kv_cache.view(num_blocks * hkv * block_size, width)
        kv = torch.cat([key[:n], value[:n]], dim=-1).to(kv_cache.dtype).reshape(n * hkv, width)
        keep = valid[:, None].expand(n, hkv).reshape(n * hkv, 1)
        kv = torch.where(keep, kv, flat.index_select(0, rows))
        flat.scatter_(0, rows[:, None].expand(n * hkv, width), kv)

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None, output_block_scale=None):
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("accelkit attention: fused output quantization is not supported")
        if attn_metadata is None:  # profiling run
            return output
        md: AccelkitAttentionMetadata = attn_metadata
        d = self.head_size
        num_reqs, max_q = md.token_index.shape
        hkv = self.num_kv_heads
        group = self.num_heads // hkv
        # [R, nb, Hkv, B, 2D] -> [R, Hkv, nb*B, 2D]
        ctx = kv_cache[md.blocks].permute(0, 2, 1, 3, 4)
        ctx = ctx.reshape(num_reqs, hkv, -1, 2 * d)
        keys, values = ctx[..., :d], ctx[..., d:]
        ctx_len = keys.shape[2]
        if query.shape[0] != md.out_index.shape[0]:
            raise RuntimeError(f"accelkit attention: {query.shape[0]} query rows for a {md.out_index.shape[0]}-token bucket")
        q = query.view(-1, self.num_heads, d)[md.token_index]  # [R, Q, H, D]
        q = q.view(num_reqs, max_q, hkv, group, d).permute(0, 2, 3, 1, 4)  # [R, Hkv, G, Q, D]
        scores = torch.matmul(q.float(), keys.float().unsqueeze(2).transpose(-1, -2)) * self.scale  # [R,Hkv,G,Q,L]
        kpos = torch.arange(ctx_len, device=query.device)
        allowed = (kpos[None, None, :] <= md.query_pos[:, :, None]) & (kpos[None, None, :] < md.seq_lens[:, None, None])
        scores = scores.masked_fill(~allowed[:, None, None, :, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        probs = torch.nan_to_num(probs, nan=0.0)  # padded query rows have no allowed key
        out = torch.matmul(probs, values.float().unsqueeze(2))  # [R, Hkv, G, Q, D]
        out = out.permute(0, 3, 1, 2, 4).reshape(num_reqs, max_q, self.num_heads, d).to(output.dtype)
        flat = out.reshape(num_reqs * max_q, self.num_heads * d).index_select(0, md.out_index)
        output.copy_(flat.view(output.shape))
        return output
