"""Shared fixtures: tiny real checkpoints built with transformers config classes + save_pretrained, and a
small word-level tokenizer built with `tokenizers`, so every test runs the real loading path offline."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

VOCAB = 96
EOS_ID = 1


def build_tokenizer(vocab_size: int = VOCAB, shuffle: bool = False) -> Tokenizer:
    """Word-level tokenizer: <unk>=0, <eos>=1, then w2..w{V-1} (optionally with shuffled ids)."""
    words = ["<unk>", "<eos>"] + [f"w{i}" for i in range(2, vocab_size)]
    if shuffle:
        words = words[:2] + list(reversed(words[2:]))
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


def hf_config(arch: str, **overrides):
    """A tiny transformers config of one of the three supported architectures."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, initializer_range=0.3,
        eos_token_id=EOS_ID, bos_token_id=None, pad_token_id=None, tie_word_embeddings=False,
    )
    common.update(overrides)
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "qwen2":
        return Qwen2Config(**common)
    if arch == "qwen3":
        return Qwen3Config(**{"head_dim": 24, **common})
    raise ValueError(arch)


def save_checkpoint(directory: Path, arch: str, seed: int = 0, tokenizer: Tokenizer | None = None, **overrides):
    """Random-weight HF model + tokenizer saved as a real checkpoint directory; returns the HF model."""
    from transformers import AutoModelForCausalLM

    shard = overrides.pop("max_shard_size", None)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(arch, **overrides), dtype=torch.float32).eval()
    model.save_pretrained(directory, **({"max_shard_size": shard} if shard else {}))
    (tokenizer or build_tokenizer()).save(str(directory / "tokenizer.json"))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": EOS_ID}))
    return model


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> tuple[Path, Path]:
    """(target_dir, draft_dir): a qwen2 target and a smaller qwen2 draft sharing the tokenizer."""
    root = tmp_path_factory.mktemp("pair")
    save_checkpoint(root / "target", "qwen2", seed=1)
    save_checkpoint(root / "draft", "qwen2", seed=2, num_hidden_layers=1, hidden_size=32, intermediate_size=48)
    return root / "target", root / "draft"


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    """Tiny models run fastest single-threaded; on a busy 2-core box extra threads spin and cost 50x."""
    if os.environ.get("DFVG_SLOW") != "1":
        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _block_size_tables_restored():
    """Every test leaves `dfvg.gpu.block_sizes` as it found it: a table a test applies (a sweep's, a benchmark
    mode's) or a GPU's rows that a launch adopted would otherwise change the launches of every later test."""
    from dfvg.gpu import block_sizes

    saved = dict(block_sizes.TUNED), set(block_sizes._GIVEN), set(block_sizes._ADOPTED)
    yield
    for live, kept in zip((block_sizes.TUNED, block_sizes._GIVEN, block_sizes._ADOPTED), saved, strict=True):
        live.clear()
        live.update(kept)
