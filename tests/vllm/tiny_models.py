"""Tiny random-weight models for the vLLM tests, written to a directory (no hub access).

`make_tiny_llama(path)` (and `make_tiny_qwen3(path)`) writes a Hugging Face checkpoint (float32 safetensors, a byte-level
BPE tokenizer trained here) that vLLM loads with `LLM(model=path)`. The weights come from a fixed
seed, so two calls write the same model.
"""

from __future__ import annotations

import os
from pathlib import Path

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A paged key value cache keeps the attention state of every request in fixed size blocks.",
    "Serving large language models needs continuous batching, prefill and decode.",
    "Tensor processing units run XLA programs; NeuronCores run tile programs.",
    "Hello world! Numbers 0 1 2 3 4 5 6 7 8 9 and punctuation , . ; : ? !",
    "In the beginning was the word, and the word was tokenized into bytes and merges.",
] * 20


def _corpus():
    """The fixed sentences plus deterministic pseudo-words, enough for about 1000 merges."""
    import random

    rng = random.Random(1234)
    syllables = [c + v for c in "bcdfghklmnprstvwz" for v in "aeiou"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    lines = [" ".join(words[i : i + 12]) for i in range(0, len(words), 12)]
    return _CORPUS + lines


def make_tokenizer(path: Path, vocab_size: int = 1000):
    """Trains a byte-level BPE tokenizer on a fixed corpus and saves it as a fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.save_pretrained(path)
    return fast


def _write_model(path: str | os.PathLike, config_class, model_class, *, num_kv_heads: int, seed: int,
                 tie_word_embeddings: bool, norms_matter: bool) -> Path:
    """A 2-layer model of ``model_class`` (hidden 256, 4 query heads of 64, ``num_kv_heads``
    key/value heads) with the tokenizer of :func:`make_tokenizer`, saved in ``path``.

    Weights are drawn wider than the default init (std 0.08) so that greedy choices are well
    separated (ties between two platforms' float rounding would make comparisons flaky);
    ``norms_matter`` also draws the norms' weights away from 1.
    """
    import torch

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(path)
    config = config_class(
        vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=num_kv_heads, head_dim=64, max_position_embeddings=256,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        tie_word_embeddings=tie_word_embeddings, torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = model_class(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
            elif norms_matter and "norm" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(path, safe_serialization=True)
    return path


def make_tiny_llama(path: str | os.PathLike, *, num_kv_heads: int = 2, seed: int = 0) -> Path:
    """Writes a 2-layer Llama (hidden 256, 4 query heads of 64, `num_kv_heads` key/value heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return _write_model(path, LlamaConfig, LlamaForCausalLM, num_kv_heads=num_kv_heads, seed=seed,
                        tie_word_embeddings=False, norms_matter=False)


def make_tiny_qwen3(path: str | os.PathLike, *, num_kv_heads: int = 2, seed: int = 0) -> Path:
    """Writes a 2-layer Qwen3 (hidden 256, 4 query heads of 64, `num_kv_heads` key/value heads,
    RMS-normed queries and keys per head, tied embeddings as in the small Qwen3 models); the q/k
    and layer norms away from 1, so that they matter."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return _write_model(path, Qwen3Config, Qwen3ForCausalLM, num_kv_heads=num_kv_heads, seed=seed,
                        tie_word_embeddings=True, norms_matter=True)
