"""FlexAttention on the device: ``flex_attention`` with a ``score_mod``, a ``mask_mod`` and a
``BlockMask`` (causal, sliding window, TorchTitan's document masking), forward and backward,
eagerly and under ``torch.compile``, against dense attention with the same mask on the CPU.

PyTorch refuses FlexAttention on devices other than CUDA, CPU, XPU, HPU and MPS; accelkit lifts
that check for its device (``accelkit/_runtime/patches.py``). Compiled, the higher-order ops
become aten ops of the backend's own program (``accelkit/_runtime/compile/flex_attention.py``): nothing
runs outside it.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import accelkit

B, H, S, D = 2, 2, 32, 8
DOCUMENTS = torch.tensor([0] * 7 + [1] * 13 + [2] * 12)  # three packed documents


def _causal(b, h, q, kv):
    return q >= kv


def _sliding(b, h, q, kv):
    return (q >= kv) & (q - kv < 5)


def _documents(ids):
    def mask(b, h, q, kv):
        return (q >= kv) & (ids[q] == ids[kv])

    return mask


def _relative_bias(score, b, h, q, kv):
    return score + (kv - q) * 0.05 * (h + 1)


MASKS = {"causal": lambda ids: _causal, "sliding_window": lambda ids: _sliding, "documents": _documents}


def _dense(q, k, v, mask, score_mod=None):
    """Attention by its definition on the CPU: scores, modification, mask, softmax."""
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    b, h, qi, ki = torch.meshgrid(torch.arange(B), torch.arange(H), torch.arange(S), torch.arange(S), indexing="ij")
    if score_mod is not None:
        scores = score_mod(scores, b, h, qi, ki)
    scores = scores.masked_fill(~mask(b, h, qi, ki), float("-inf"))
    return scores.softmax(-1) @ v


def _inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, S, D, generator=g) for _ in range(3)]


def _run(fn, dev, tensors):
    leaves = [t.to(dev).requires_grad_() for t in tensors]
    out = fn(*leaves)
    (out * torch.linspace(-1, 1, D, device=dev)).sum().backward()
    return out.detach().cpu(), [t.grad.cpu() for t in leaves]


@pytest.mark.parametrize("mask_name", MASKS)
@pytest.mark.parametrize("modified", [False, True], ids=["plain", "score_mod"])
def test_eager_flex_attention_equals_dense_attention_on_the_cpu(dev, mask_name, modified):
    mask_cpu = MASKS[mask_name](DOCUMENTS)
    mask_dev = MASKS[mask_name](DOCUMENTS.to(dev))
    score_mod = _relative_bias if modified else None
    block_mask = create_block_mask(mask_dev, B, H, S, S, device=dev, BLOCK_SIZE=16)
    q, k, v = _inputs()
    got, got_grads = _run(lambda q, k, v: flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask), dev,
                          (q, k, v))
    want, want_grads = _run(lambda q, k, v: _dense(q, k, v, mask_cpu, score_mod), "cpu", (q, k, v))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mask_name", ["causal", "documents"])
def test_compiled_flex_attention_equals_eager_and_stays_in_the_program(dev, mask_name):
    torch._dynamo.reset()
    mask = MASKS[mask_name](DOCUMENTS.to(dev))
    block_mask = create_block_mask(mask, B, H, S, S, device=dev, BLOCK_SIZE=16)

    def attend(q, k, v):
        return flex_attention(q, k, v, score_mod=_relative_bias, block_mask=block_mask)

    backend = dev.type if dev.type in torch._dynamo.list_backends(exclude_tags=()) else "aot_eager"
    accelkit.reset_stats()
    got, got_grads = _run(torch.compile(attend, backend=backend), dev, _inputs())
    compiled = accelkit.stats()["compile"]
    want, want_grads = _run(attend, dev, _inputs())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    if compiled.get("program_calls"):  # a backend compiler built programs: attention is inside
        assert compiled["eager_nodes"] == {}, compiled["eager_nodes"]


def test_flex_attention_elsewhere_keeps_pytorch_s_device_rules(dev):
    q = torch.randn(1, 1, 16, 8, requires_grad=True)
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        flex_attention(q, q, q)  # PyTorch's check still stands for the CPU
