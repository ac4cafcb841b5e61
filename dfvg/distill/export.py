"""The distilled draft as a checkpoint every part of DFVG loads: config.json + model.safetensors + tokenizer.

What this module owns: the draft's shape (`DraftShape`) and its Hugging Face `config.json`, the inverse of
`dfvg.checkpoint.convert_state_dict` (our fused q/k/v and gate/up matrices back to HF's per-projection
names), and the checkpoint folder: weights, the target's tokenizer files (so `check_compatible` passes),
and `distill_recipe.json` (every flag, the split, the data and the loss history).

A head-vocabulary draft stores `lm_head.token_ids` [Vh] (int64, ascending) with `"dfvg_head_vocab": Vh` in
config.json; `vocab_size` stays the target's. Its input embedding either keeps all rows (`--embed full`:
untied, `lm_head.weight` [Vh, D]) or has the head's rows only (`--embed head`, the default:
`"dfvg_embed_rows": true`, tied, one [Vh, D] table plus `model.embed_tokens.token_rows` [V] mapping every
token id to a row; docs/distill.md says why). Hugging Face transformers cannot load either; DFVG's loader can.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor

from dfvg.checkpoint import BLOCK_MASKS_TENSOR
from dfvg.errors import UserError
from dfvg.model import ModelConfig, Transformer

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja",
                   "special_tokens_map.json", "vocab.json", "merges.txt")
RECIPE_FILE = "distill_recipe.json"


@dataclass(frozen=True)
class DraftShape:
    """The draft's size. heads = hidden // 64 (at least 1), kv_heads = heads // 4 (at least 1),
    intermediate = 3 x hidden unless given; head_vocab None = a full-vocabulary head."""

    layers: int
    hidden: int
    heads: int = 0
    kv_heads: int = 0
    intermediate: int = 0
    head_vocab: int | None = None
    embed_rows: bool = False  # input embedding over the head's rows, tied to the head
    block_size: int | None = None  # a block drafter: mask vectors for offsets 1..block_size-1 (dfvg.block_draft)

    def resolved(self) -> DraftShape:
        heads = self.heads or max(1, self.hidden // 64)
        kv = self.kv_heads or max(1, heads // 4)
        shape = DraftShape(self.layers, self.hidden, heads, kv, self.intermediate or 3 * self.hidden, self.head_vocab,
                           self.embed_rows, self.block_size)
        shape.check()
        return shape

    def check(self) -> None:
        if not 1 <= self.layers <= 64 or self.hidden < 8:
            raise UserError(f"--layers must be in [1, 64] and --hidden >= 8, got {self.layers} / {self.hidden}")
        if self.hidden % self.heads or self.heads % self.kv_heads or (self.hidden // self.heads) % 2:
            raise UserError(f"--hidden {self.hidden} must split into {self.heads} heads of an even size, and the "
                            f"heads into {self.kv_heads} KV groups; pick --hidden a multiple of 64")
        if self.embed_rows and not self.head_vocab:
            raise UserError("--embed head needs --vocab-top > 0 (the embedding takes the head's rows)")
        if self.block_size is not None and not 2 <= self.block_size <= 32:
            raise UserError(f"--block-size must be in [2, 32] (tokens drafted in one pass), got {self.block_size}")


def draft_hf_config(target: ModelConfig, target_raw: dict, shape: DraftShape) -> dict:
    """config.json of the draft: qwen2 (the FPGA datapath's architecture), the target's vocab, RoPE, eps."""
    config = {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": target.vocab_size,
        "hidden_size": shape.hidden, "intermediate_size": shape.intermediate, "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.hidden // shape.heads, "hidden_act": "silu", "rms_norm_eps": target.rms_norm_eps,
        "rope_theta": target.rope_theta, "max_position_embeddings": target.max_position_embeddings,
        "tie_word_embeddings": False, "torch_dtype": "float32", "use_sliding_window": False,
    }
    if target.rope_scaling:
        config["rope_scaling"] = target.rope_scaling
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if key in target_raw:
            config[key] = target_raw[key]
    if shape.head_vocab:
        config["dfvg_head_vocab"] = shape.head_vocab
    if shape.embed_rows:
        config["dfvg_embed_rows"] = True
        config["tie_word_embeddings"] = True
    if shape.block_size:
        config["dfvg_block_size"] = shape.block_size
    return config


def hf_state_dict(model: Transformer) -> dict[str, Tensor]:
    """Our state dict -> HF names (inverse of checkpoint.convert_state_dict), contiguous CPU copies."""
    cfg = model.config
    q_rows, kv_rows = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    out = {"model.embed_tokens.weight": model.tok_embeddings.weight, "model.norm.weight": model.norm.weight}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = model.output.weight
    if cfg.head_vocab_size:
        out["lm_head.token_ids"] = model.head_token_ids
    if cfg.embed_rows:
        out["model.embed_tokens.token_rows"] = model.token_rows
    if cfg.block_size:
        out[BLOCK_MASKS_TENSOR] = model.block_masks
    for i, layer in enumerate(model.layers):
        p, att, ffn = f"model.layers.{i}.", layer.attention, layer.feed_forward
        out[p + "input_layernorm.weight"] = layer.attention_norm.weight
        out[p + "post_attention_layernorm.weight"] = layer.ffn_norm.weight
        for name, part in zip(("q", "k", "v"), att.wqkv.weight.split([q_rows, kv_rows, kv_rows]), strict=True):
            out[f"{p}self_attn.{name}_proj.weight"] = part
        if cfg.attention_bias:
            for name, part in zip(("q", "k", "v"), att.wqkv.bias.split([q_rows, kv_rows, kv_rows]), strict=True):
                out[f"{p}self_attn.{name}_proj.bias"] = part
        out[p + "self_attn.o_proj.weight"] = att.wo.weight
        gate, up = ffn.w13.weight.split(cfg.intermediate_size)
        out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = gate, up
        out[p + "mlp.down_proj.weight"] = ffn.w2.weight
    return {name: t.detach().cpu().contiguous().clone() for name, t in out.items()}


def save_draft(model: Transformer, directory: Path, hf_config: dict, target_dir: Path, recipe: dict,
               dtype: torch.dtype = torch.float32) -> None:
    """Write the checkpoint folder: config.json, model.safetensors, tokenizer files, distill_recipe.json.

    Float tensors are stored in `dtype` (bfloat16 halves the file: the shipped draft must stay under 64 MB,
    and the FPGA quantizer rounds to int8/int4 anyway); integer tables keep theirs."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {n: t.to(dtype) if t.is_floating_point() else t for n, t in hf_state_dict(model).items()}
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps({**hf_config, "torch_dtype": str(dtype).split(".")[-1]},
                                                      indent=1))
    for name in TOKENIZER_FILES:
        if (target_dir / name).is_file():
            shutil.copyfile(target_dir / name, directory / name)
    (directory / RECIPE_FILE).write_text(json.dumps(recipe, indent=1))


def shape_dict(shape: DraftShape) -> dict:
    return asdict(shape)
