"""Local assets TorchTitan's debug configs read, made here instead of downloaded.

TorchTitan's debug configs point at files of its source repository that its wheel does not
ship: ``hf_assets_path="./tests/assets/tokenizer"`` and the ``c4_test`` dataset at
``tests/assets/c4_test`` (llama3, qwen3), and for flux the ``cc12m-test`` webdataset at
``tests/assets/cc12m_test`` plus the T5 and CLIP encoders and tokenizers named by hub ids.
:func:`write_titan_tree` writes all of them under a directory laid out as TorchTitan's
repository is, so ``torchrun -m torchtitan.train --module llama3 --config llama3_debugmodel``
started in that directory finds them through the configs' own relative paths.

Everything is generated: the text from a seeded word generator, the tokenizer trained on it
with Hugging Face ``tokenizers``, the images drawn with Pillow, the encoders described by
small ``config.json`` files that TorchTitan instantiates with random weights
(``--encoder.random-init``). Same arguments, same bytes: two runs on two backends read
identical data. Nothing is fetched.
"""

from __future__ import annotations

import io
import json
import random
import tarfile
from dataclasses import dataclass
from pathlib import Path

# The special tokens TorchTitan's HuggingFaceTokenizer finds through tokenizer_config.json
# (bos_token / eos_token / pad_token and added_tokens_decoder), Llama 3's spelling.
BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = (BOS, EOS, PAD)

# The debug models of llama3 and qwen3 have 2048 embeddings: every id must stay below that.
DEBUG_MODEL_VOCAB = 2048
DEFAULT_VOCAB_SIZE = 2000

# Flux's debug model fixes the width of the text encoders' outputs it consumes:
# context_in_dim (the T5 encoder's d_model) and vec_in_dim (CLIP's pooled hidden size).
FLUX_T5_D_MODEL = 4096
FLUX_CLIP_HIDDEN = 768
FLUX_CLIP_MAX_LENGTH = 77  # FluxTokenizerContainer pads CLIP prompts to 77 tokens


@dataclass(frozen=True)
class TitanTree:
    """Where :func:`write_titan_tree` put each asset; ``root`` is the directory to run in."""

    root: Path
    tokenizer: Path
    c4_test: Path
    cc12m_test: Path | None = None
    t5_encoder: Path | None = None
    clip_encoder: Path | None = None


# ---------------------------------------------------------------------------------- text


def _word_list(rng: random.Random, n_words: int) -> list[str]:
    onsets = ["", "b", "c", "d", "f", "g", "h", "l", "m", "n", "p", "r", "s", "t", "v", "w",
              "br", "ch", "cl", "dr", "gr", "pl", "sh", "st", "th", "tr"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ee", "ou", "oo"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "st", "ck"]
    words: set[str] = set()
    while len(words) < n_words:
        syllables = rng.choice((1, 1, 2, 2, 2, 3))
        words.add("".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
                          for _ in range(syllables)))
    return sorted(words)


def documents(n_docs: int, *, seed: int = 0, words_per_doc: tuple[int, int] = (60, 400)) -> list[str]:
    """``n_docs`` deterministic English-like documents (Zipf-distributed words, sentences).

    Made for training a byte-level BPE tokenizer and for filling c4-style samples: frequent
    words repeat enough for merges to form, so the tokens per character resemble real text's.
    """
    if n_docs < 1:
        raise ValueError(f"documents: n_docs must be at least 1, got {n_docs}")
    rng = random.Random(seed)
    vocab = _word_list(rng, 3000)
    weights = [1.0 / (rank + 1) for rank in range(len(vocab))]
    lo, hi = words_per_doc
    docs = []
    for _ in range(n_docs):
        words = rng.choices(vocab, weights, k=rng.randint(lo, hi))
        sentences, start = [], 0
        while start < len(words):
            end = min(len(words), start + rng.randint(5, 18))
            sentence = " ".join(words[start:end])
            sentences.append(sentence[0].upper() + sentence[1:] + rng.choice(".....?!"))
            start = end
        paragraphs = [" ".join(sentences[i:i + 4]) for i in range(0, len(sentences), 4)]
        docs.append("\n".join(paragraphs))
    return docs


# ----------------------------------------------------------------------------- tokenizer


def write_tokenizer(directory: str | Path, *, vocab_size: int = DEFAULT_VOCAB_SIZE, seed: int = 0,
                    n_docs: int = 400) -> Path:
    """Train a byte-level BPE tokenizer on generated text and save it as TorchTitan reads it.

    Writes ``tokenizer.json`` (the ``tokenizers`` serialisation, TorchTitan's preferred
    format) and ``tokenizer_config.json`` naming ``bos_token``, ``eos_token`` and
    ``pad_token`` with their ids in ``added_tokens_decoder`` (how TorchTitan's
    ``HuggingFaceTokenizer`` learns which ids to add around each document). ``vocab_size``
    counts the special tokens and must stay below the debug models' 2048 embeddings.
    Returns the directory (pass it as ``--hf-assets-path``, or lay it out with
    :func:`write_titan_tree`).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if not len(SPECIAL_TOKENS) + 256 < vocab_size <= DEBUG_MODEL_VOCAB:
        raise ValueError(
            f"write_tokenizer: vocab_size={vocab_size} must exceed the 256 bytes and "
            f"{len(SPECIAL_TOKENS)} special tokens and be at most {DEBUG_MODEL_VOCAB} "
            "(the debug models' embedding rows)")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(documents(n_docs, seed=seed), trainer=trainer)
    tokenizer.save(str(directory / "tokenizer.json"))

    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    config = {
        "added_tokens_decoder": {
            str(ids[token]): {"content": token, "lstrip": False, "normalized": False,
                              "rstrip": False, "single_word": False, "special": True}
            for token in SPECIAL_TOKENS
        },
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


# ------------------------------------------------------------------------------- c4 text


def write_c4_test(directory: str | Path, *, n_docs: int = 600, seed: int = 1) -> Path:
    """A c4-style dataset: ``data.json``, one JSON object a line (``text``, ``timestamp``, ``url``).

    TorchTitan's ``c4_test`` entry loads its path with ``datasets.load_dataset(path,
    split="train")``; a directory holding one JSON Lines file is read by the ``json``
    builder as the ``train`` split. ``--dataloader.dataset c4_test --dataloader.dataset-path
    DIR`` points any directory at it. 600 documents are about 430k tokens with the default
    tokenizer: llama3's debug config (8 x 2048 tokens a step) loops over it after ~27 steps,
    which TorchTitan's dataloader does by default (``infinite``).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "data.json", "w") as f:
        for i, text in enumerate(documents(n_docs, seed=seed)):
            row = {"text": text, "timestamp": f"2019-04-{1 + i % 28:02d}T00:00:00Z",
                   "url": f"https://example.invalid/doc/{i}"}
            f.write(json.dumps(row) + "\n")
    return directory


def write_equal_samples(directory: str | Path, tokenizer: str | Path, *, seq_len: int, distinct: int = 4,
                        repeats: int = 9, seed: int = 3) -> Path:
    """A c4-style dataset on which every data-parallel split sees the same global batches.

    Each document tokenizes (with TorchTitan's begin and end tokens) to exactly ``seq_len + 1``
    tokens, so it is exactly one sample. The ``distinct`` documents repeat ``repeats`` times in
    order; with ``repeats`` odd, TorchTitan's dataloader (``split_dataset_by_node``: rank r
    reads the r-th contiguous half) gives two ranks of batch ``distinct // 2`` the same
    ``distinct`` samples at every step as one rank of batch ``distinct``. So 2-rank FSDP and 1
    rank see identical global batches, and their losses may be compared.
    """
    from tokenizers import Tokenizer

    if repeats % 2 == 0 or distinct % 2:
        raise ValueError("write_equal_samples: repeats must be odd and distinct even (two ranks)")
    encoder = Tokenizer.from_file(str(Path(tokenizer) / "tokenizer.json"))
    rng = random.Random(seed)
    single = [w for w in _word_list(rng, 3000) if len(encoder.encode(" " + w).ids) == 1]
    if len(single) < 50:
        raise RuntimeError("write_equal_samples: the tokenizer has too few one-token words")
    texts = []
    for _ in range(distinct):
        words = [rng.choice(single) for _ in range(seq_len - 1)]  # + begin and end tokens
        text = " " + " ".join(words)
        if len(encoder.encode(text).ids) != seq_len - 1:
            raise RuntimeError("write_equal_samples: a document did not tokenize to one token a word")
        texts.append(text)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "data.json", "w") as f:
        for i in range(distinct * repeats):
            f.write(json.dumps({"text": texts[i % distinct], "timestamp": "2019-04-01T00:00:00Z",
                                "url": f"https://example.invalid/equal/{i}"}) + "\n")
    return directory


# ---------------------------------------------------------------------------------- flux


def write_cc12m_test(directory: str | Path, *, n_samples: int = 32, img_size: int = 256,
                     seed: int = 2) -> Path:
    """A cc12m-style webdataset shard: ``cc12m-train-0000.tar`` of ``KEY.jpg`` + ``KEY.txt``.

    TorchTitan's ``cc12m-test`` entry loads ``*.tar`` from its path with
    ``datasets.load_dataset(..., streaming=True)`` (the ``webdataset`` builder: files sharing
    a key are one sample, ``jpg`` decoded to a PIL image, ``txt`` to a string) and drops
    images smaller than ``--dataloader.img-size`` on either side. Images are smooth colour
    gradients plus noise, larger than ``img_size`` so they are cropped as real ones are.
    """
    import numpy as np
    from PIL import Image

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    captions = documents(n_samples, seed=seed, words_per_doc=(6, 20))
    with tarfile.open(directory / "cc12m-train-0000.tar", "w") as tar:
        for i in range(n_samples):
            height, width = img_size + int(rng.integers(0, 64)), img_size + int(rng.integers(0, 64))
            y, x = np.mgrid[0:height, 0:width]
            base = rng.uniform(0, 255, size=3)
            slope = rng.uniform(-0.5, 0.5, size=(3, 2))
            pixels = np.stack([base[c] + slope[c, 0] * y + slope[c, 1] * x for c in range(3)], axis=-1)
            pixels = np.clip(pixels + rng.normal(0, 12, size=pixels.shape), 0, 255).astype(np.uint8)
            jpg = io.BytesIO()
            Image.fromarray(pixels, "RGB").save(jpg, format="JPEG", quality=90)
            caption = captions[i].replace("\n", " ").encode()
            for suffix, payload in (("jpg", jpg.getvalue()), ("txt", caption)):
                info = tarfile.TarInfo(f"{i:06d}.{suffix}")
                info.size = len(payload)
                info.mtime = 0
                tar.addfile(info, io.BytesIO(payload))
    return directory


def write_flux_encoders(directory: str | Path, *, vocab_size: int = DEBUG_MODEL_VOCAB + 8) -> tuple[Path, Path]:
    """Small T5 and CLIP text-encoder configs for flux's debug model, to use with random weights.

    ``--encoder.random-init`` makes TorchTitan build ``T5EncoderModel`` and ``CLIPTextModel``
    from ``<dir>/config.json`` instead of loading weights (``--encoder.t5-encoder DIR``,
    ``--encoder.clip-encoder DIR``). The widths flux consumes are fixed by its debug model
    (T5 ``d_model`` 4096, CLIP ``hidden_size`` 768); everything else is shrunk to one layer,
    so the pair has about 20M parameters instead of xxl's 4.7B. ``vocab_size`` must exceed
    the ids of the tokenizer given to ``--tokenizer.test-mode`` (:func:`write_tokenizer`).
    The CLIP directory's name contains "clip": TorchTitan tells the two encoders apart by it.
    Returns ``(t5_dir, clip_dir)``.
    """
    directory = Path(directory)
    t5_dir, clip_dir = directory / "t5-encoder-debug", directory / "clip-text-debug"
    t5 = {
        "model_type": "t5", "architectures": ["T5EncoderModel"],
        "d_model": FLUX_T5_D_MODEL, "d_kv": 64, "num_heads": 4, "d_ff": 256,
        "num_layers": 1, "num_decoder_layers": 1, "feed_forward_proj": "gated-gelu",
        "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
        "vocab_size": vocab_size, "pad_token_id": 0, "eos_token_id": 1,
        "decoder_start_token_id": 0, "dropout_rate": 0.0, "layer_norm_epsilon": 1e-6,
        "tie_word_embeddings": False, "is_encoder_decoder": True,
    }
    clip = {
        "model_type": "clip_text_model", "architectures": ["CLIPTextModel"],
        "hidden_size": FLUX_CLIP_HIDDEN, "intermediate_size": 256, "num_attention_heads": 4,
        "num_hidden_layers": 1, "max_position_embeddings": FLUX_CLIP_MAX_LENGTH,
        "vocab_size": vocab_size, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5,
        "projection_dim": FLUX_CLIP_HIDDEN, "pad_token_id": 0, "bos_token_id": 0,
        "eos_token_id": 1, "attention_dropout": 0.0,
    }
    for path, config in ((t5_dir, t5), (clip_dir, clip)):
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return t5_dir, clip_dir


# ---------------------------------------------------------------------------------- tree


def write_titan_tree(root: str | Path, *, flux: bool = False, c4_docs: int = 600,
                     vocab_size: int = DEFAULT_VOCAB_SIZE) -> TitanTree:
    """Lay out ``root/tests/assets/...`` as TorchTitan's repository does, generated.

    ``tests/assets/tokenizer`` and ``tests/assets/c4_test`` are the paths llama3's and
    qwen3's debug configs name, so a run started in ``root`` needs no path flag. With
    ``flux=True`` also ``tests/assets/cc12m_test`` (the path of flux's ``cc12m-test``) and
    the two encoder configs under ``tests/assets/flux_encoders`` (named in flux's
    configuration by ``launch.py``).
    """
    root = Path(root)
    assets = root / "tests" / "assets"
    tree = TitanTree(
        root=root,
        tokenizer=write_tokenizer(assets / "tokenizer", vocab_size=vocab_size),
        c4_test=write_c4_test(assets / "c4_test", n_docs=c4_docs),
    )
    if not flux:
        return tree
    t5_dir, clip_dir = write_flux_encoders(assets / "flux_encoders")
    return TitanTree(root=tree.root, tokenizer=tree.tokenizer, c4_test=tree.c4_test,
                     cc12m_test=write_cc12m_test(assets / "cc12m_test"),
                     t5_encoder=t5_dir, clip_encoder=clip_dir)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="directory to lay TorchTitan's tests/assets out in")
    parser.add_argument("--flux", action="store_true", help="also write flux's dataset and encoder configs")
    args = parser.parse_args()
    print(write_titan_tree(args.root, flux=args.flux))
