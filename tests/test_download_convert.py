"""End-to-end GGUF -> HF conversion on a tiny qwen2 GGUF written by `gguf.GGUFWriter`.

The file has real structure (F32 tensors under llama.cpp names, a byte-level gpt2-style tokenizer with
Qwen's special tokens), so the test runs the same child-process conversion as the real models and then
checks the directory against the arrays that went in.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from dfvg import download
from dfvg.chat import find_chat_template, render_chat
from dfvg.pins import GgufPin

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

D, FFN, HEADS, KV_HEADS, HEAD_DIM = 32, 64, 4, 2, 8
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _byte_tokens() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return list(bytes_to_unicode().values())


def _tensors(vocab: int) -> dict[str, np.ndarray]:
    """llama.cpp tensor names with numpy (= torch) shapes, one layer."""
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    return {
        "token_embd.weight": w(vocab, D), "output_norm.weight": 1 + w(D), "output.weight": w(vocab, D),
        "blk.0.attn_norm.weight": 1 + w(D), "blk.0.ffn_norm.weight": 1 + w(D),
        "blk.0.attn_q.weight": w(q, D), "blk.0.attn_q.bias": w(q),
        "blk.0.attn_k.weight": w(kv, D), "blk.0.attn_k.bias": w(kv),
        "blk.0.attn_v.weight": w(kv, D), "blk.0.attn_v.bias": w(kv),
        "blk.0.attn_output.weight": w(D, q),
        "blk.0.ffn_gate.weight": w(FFN, D), "blk.0.ffn_up.weight": w(FFN, D), "blk.0.ffn_down.weight": w(D, FFN),
    }


def _write_tiny_gguf(path: Path) -> dict[str, np.ndarray]:
    tokens = _byte_tokens() + ["he"] + SPECIALS
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_context_length(128)
    writer.add_embedding_length(D)
    writer.add_block_count(1)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - 3) + [3, 3, 3])
    writer.add_token_merges(["h e"])
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_chat_template(CHAT_TEMPLATE)
    arrays = _tensors(len(tokens))
    for name, array in arrays.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return arrays


def test_tiny_qwen2_gguf_converts_end_to_end(tmp_path):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = tmp_path / "gguf" / "tiny.gguf"
    gguf_path.parent.mkdir()
    arrays = _write_tiny_gguf(gguf_path)
    data = gguf_path.read_bytes()
    pin = GgufPin(name="tiny", role="draft", upstream="test", packages=("none==0",), size=len(data),
                  sha256=hashlib.sha256(data).hexdigest())
    out = download.convert_gguf(pin, gguf_path, tmp_path / "models" / "tiny")

    assert download.converted_ok(pin, out)
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # temp dir renamed away
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["hidden_size"], config["num_key_value_heads"]) == ("qwen2", D, 2)
    assert config["rms_norm_eps"] == 1e-6 and config["tie_word_embeddings"] is False
    assert "quantization_config" not in config
    generation = json.loads((out / "generation_config.json").read_text())
    eos = len(_byte_tokens()) + 1 + SPECIALS.index("<|im_end|>")
    assert generation["eos_token_id"] == [eos, eos - 2]  # <|im_end|>, then <|endoftext|>

    weights = load_file(str(out / "model.safetensors"))
    assert all(t.dtype == torch.float32 for t in weights.values())
    np.testing.assert_array_equal(weights["model.embed_tokens.weight"].numpy(), arrays["token_embd.weight"])
    np.testing.assert_array_equal(weights["model.layers.0.self_attn.k_proj.bias"].numpy(),
                                  arrays["blk.0.attn_k.bias"])
    np.testing.assert_array_equal(weights["lm_head.weight"].numpy(), arrays["output.weight"])

    template = find_chat_template(out)  # the GGUF's tokenizer.chat_template survives the conversion
    assert template is not None and template.source == CHAT_TEMPLATE
    assert render_chat(template, "he") == "<|im_start|>user\nhe<|im_end|>\n<|im_start|>assistant\n"

    tokenizer = AutoTokenizer.from_pretrained(str(out))
    ids = tokenizer.encode("hello<|im_end|>")
    assert tokenizer.decode(ids) == "hello<|im_end|>" and ids[-1] == eos
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    logits = model(torch.tensor([ids])).logits  # [1, T, vocab]
    assert logits.shape == (1, len(ids), len(arrays["token_embd.weight"])) and torch.isfinite(logits).all()
