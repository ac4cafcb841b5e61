"""Reading Hugging Face checkpoint directories into DFVG's `Transformer`.

What this module owns: turning `config.json` into a `ModelConfig`, finding the safetensors file(s), checking
every tensor's name and shape against the config, and fusing HF's separate q/k/v and gate/up matrices into
the model's fused ones. Anything it cannot load exactly it refuses with a `UserError` that says why: another
`model_type`, a pickle (`.bin`) checkpoint, an unsupported RoPE scaling, a tensor of the wrong shape.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from dfvg.errors import UserError
from dfvg.model import SUPPORTED_MODEL_TYPES, ModelConfig, Transformer

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
POSITIVE_INT_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
OPTIONAL_POSITIVE_INT_KEYS = ("num_key_value_heads", "head_dim", "max_position_embeddings")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


REFETCH = "re-download or re-convert the checkpoint"


def read_json(path: Path, what: str, fix: str = "fix or regenerate it") -> dict:
    """Parse a JSON object file, turning a missing or broken file into one clear line ending in `fix`."""
    if not path.is_file():
        raise UserError(f"{what} not found: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise UserError(f"{path} is not valid JSON ({err.msg} at line {err.lineno}); {fix}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"cannot read {path} ({err}); {fix}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} must hold a JSON object, got a JSON {type(data).__name__}; {fix}")
    return data


def checkpoint_dir(path: str | Path) -> Path:
    directory = Path(path)
    if not directory.is_dir():
        raise UserError(f"checkpoint directory not found: {directory} (pass a folder holding config.json)")
    return directory


def _rope_settings(raw: dict) -> tuple[float, dict | None]:
    """rope_theta and scaling from either the classic keys or transformers-5 `rope_parameters`."""
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    theta = float(raw.get("rope_theta", params.get("rope_theta", 10000.0)))
    if scaling:
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise UserError(
                f"rope scaling type {rope_type!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
            )
        if rope_type == "default":
            scaling = None
    return theta, scaling


def _check_shapes(raw: dict) -> None:
    """The shape keys are positive integers (a string or a 0 would fail deep inside the model)."""
    for key in POSITIVE_INT_KEYS + OPTIONAL_POSITIVE_INT_KEYS:
        value = raw.get(key)
        if value is None and key in OPTIONAL_POSITIVE_INT_KEYS:
            continue
        if key not in raw:
            raise KeyError(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"config.json: {key} must be a positive integer, got {value!r}; {REFETCH}")
    if raw["hidden_size"] % raw["num_attention_heads"] and not raw.get("head_dim"):
        raise UserError(f"config.json: hidden_size {raw['hidden_size']} is not a multiple of num_attention_heads "
                        f"{raw['num_attention_heads']} and no head_dim is given")


def config_from_dict(raw: dict) -> ModelConfig:
    """Map an HF config dict to ModelConfig, refusing architectures DFVG does not implement."""
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UserError(
            f"model_type {model_type!r} is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    _check_shapes(raw)
    if raw.get("mlp_bias"):
        raise UserError("mlp_bias=true is not supported (DFVG's SwiGLU MLP has no bias)")
    theta, scaling = _rope_settings(raw)
    heads = raw["num_attention_heads"]
    # Qwen2 always biases q/k/v (not o); Llama and Qwen3 bias all four projections when attention_bias.
    all_bias = model_type != "qwen2" and bool(raw.get("attention_bias", False))
    return ModelConfig(
        model_type=model_type,
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_layers=raw["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=model_type == "qwen2" or all_bias,
        output_bias=all_bias,
        qk_norm=model_type == "qwen3",
        max_position_embeddings=raw.get("max_position_embeddings", 32768),
        head_vocab_size=_head_vocab(raw),
        embed_rows=_embed_rows(raw),
        block_size=_block_size(raw),
    )


def _head_vocab(raw: dict) -> int | None:
    """`dfvg_head_vocab`: a distilled draft whose LM head covers only that many token ids (docs/distill.md)."""
    head = raw.get("dfvg_head_vocab")
    if head is None:
        return None
    if not isinstance(head, int) or not 0 < head <= raw["vocab_size"]:
        raise UserError(f"dfvg_head_vocab must be an int in [1, vocab_size={raw['vocab_size']}], got {head!r}")
    if raw.get("tie_word_embeddings") and not raw.get("dfvg_embed_rows"):
        raise UserError("dfvg_head_vocab with tie_word_embeddings needs dfvg_embed_rows: true (the input "
                        "embedding must have the head's rows to be tied to it)")
    return head


def _embed_rows(raw: dict) -> bool:
    """`dfvg_embed_rows`: the input embedding has the head's rows too, with a token -> row table."""
    flag = raw.get("dfvg_embed_rows", False)
    if not isinstance(flag, bool) or (flag and raw.get("dfvg_head_vocab") is None):
        raise UserError(f"dfvg_embed_rows must be true or false and needs dfvg_head_vocab, got {flag!r}")
    return flag


def _block_size(raw: dict) -> int | None:
    """`dfvg_block_size`: a block drafter (dfvg.block_draft) that drafts up to that many tokens in one pass."""
    size = raw.get("dfvg_block_size")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or not 2 <= size <= 32):
        raise UserError(f"dfvg_block_size must be an int in [2, 32] (tokens drafted in one pass), got {size!r}")
    return size


def load_config(path: str | Path) -> ModelConfig:
    """ModelConfig of a checkpoint directory."""
    raw = read_json(checkpoint_dir(path) / "config.json", "config.json", REFETCH)
    try:
        return config_from_dict(raw)
    except KeyError as err:
        raise UserError(f"{Path(path) / 'config.json'} lacks the key {err.args[0]!r}; {REFETCH}") from None


def safetensors_files(directory: Path) -> list[Path]:
    """The weight files of a checkpoint: one model.safetensors, or the shards an index names."""
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        weight_map = read_json(index, "safetensors index").get("weight_map", {})
        shards = [directory / name for name in sorted(set(weight_map.values()))]
        missing = [shard.name for shard in shards if not shard.is_file()]
        if missing:
            raise UserError(f"{index} names shards that are missing: {', '.join(missing)}")
        return shards
    if list(directory.glob("*.bin")) or list(directory.glob("*.pt")):
        raise UserError(
            f"{directory} holds only a pickle (.bin) checkpoint; DFVG loads safetensors only "
            "(re-save it with transformers: model.save_pretrained(dir, safe_serialization=True))"
        )
    raise UserError(f"no model.safetensors or model.safetensors.index.json in {directory}")


def _open_weights(file: Path):
    """safe_open, turning a truncated or corrupt file (the Rust reader's SafetensorError) into one line."""
    try:
        return safe_open(str(file), framework="pt")
    except (SafetensorError, OSError) as err:
        raise UserError(f"{file} is not a readable safetensors file ({err}); it is truncated or corrupt: "
                        f"{REFETCH}") from None


def check_weights(directory: Path) -> list[Path]:
    """The weight files, each with a readable header that covers the whole file; returns them."""
    files = safetensors_files(directory)
    for file in files:
        with _open_weights(file) as handle:
            handle.keys()
    return files


def read_tensors(directory: Path, dtype: torch.dtype) -> dict[str, Tensor]:
    """All tensors of the checkpoint, cast to dtype one at a time (keeps peak memory low)."""
    tensors: dict[str, Tensor] = {}
    for file in safetensors_files(directory):
        with _open_weights(file) as handle:
            for name in handle.keys():
                tensor = handle.get_tensor(name)  # integer tensors (a head's token ids) keep their dtype
                tensors[name] = tensor.to(dtype) if tensor.is_floating_point() else tensor
    return tensors


def _take(tensors: dict[str, Tensor], name: str, shape: tuple[int, ...]) -> Tensor:
    if name not in tensors:
        raise UserError(f"checkpoint lacks tensor {name!r}")
    tensor = tensors.pop(name)
    if tuple(tensor.shape) != shape:
        raise UserError(f"tensor {name!r} has shape {tuple(tensor.shape)}, config.json implies {shape}")
    return tensor


def _layer_state(tensors: dict[str, Tensor], cfg: ModelConfig, i: int) -> dict[str, Tensor]:
    """Our fused tensors for layer i, from HF's per-projection names."""
    hf, ours = f"model.layers.{i}.", f"layers.{i}."
    d, hd, ffn = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q_rows, kv_rows = cfg.num_heads * hd, cfg.num_kv_heads * hd
    proj = [("q_proj", q_rows), ("k_proj", kv_rows), ("v_proj", kv_rows)]
    state = {
        ours + "attention_norm.weight": _take(tensors, hf + "input_layernorm.weight", (d,)),
        ours + "ffn_norm.weight": _take(tensors, hf + "post_attention_layernorm.weight", (d,)),
        ours + "attention.wqkv.weight": torch.cat(
            [_take(tensors, f"{hf}self_attn.{p}.weight", (rows, d)) for p, rows in proj]
        ),
        ours + "attention.wo.weight": _take(tensors, hf + "self_attn.o_proj.weight", (d, q_rows)),
        ours + "feed_forward.w13.weight": torch.cat(
            [_take(tensors, f"{hf}mlp.{p}.weight", (ffn, d)) for p in ("gate_proj", "up_proj")]
        ),
        ours + "feed_forward.w2.weight": _take(tensors, hf + "mlp.down_proj.weight", (d, ffn)),
    }
    if cfg.attention_bias:
        state[ours + "attention.wqkv.bias"] = torch.cat(
            [_take(tensors, f"{hf}self_attn.{p}.bias", (rows,)) for p, rows in proj]
        )
    if cfg.output_bias:
        state[ours + "attention.wo.bias"] = _take(tensors, hf + "self_attn.o_proj.bias", (d,))
    if cfg.qk_norm:
        state[ours + "attention.q_norm.weight"] = _take(tensors, hf + "self_attn.q_norm.weight", (hd,))
        state[ours + "attention.k_norm.weight"] = _take(tensors, hf + "self_attn.k_norm.weight", (hd,))
    return state


BLOCK_MASKS_TENSOR = "model.dfvg_block_masks"  # a block drafter's mask vectors [block_size - 1, hidden]


def convert_state_dict(tensors: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    """HF tensor names -> Transformer's state dict, checking every shape. Consumes `tensors`."""
    embed = _take(tensors, "model.embed_tokens.weight", (cfg.embed_vocab_size, cfg.hidden_size))
    state = {"tok_embeddings.weight": embed, "norm.weight": _take(tensors, "model.norm.weight", (cfg.hidden_size,))}
    for i in range(cfg.num_layers):
        state.update(_layer_state(tensors, cfg, i))
    if cfg.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
        state["output.weight"] = embed
    else:
        rows = cfg.head_vocab_size or cfg.vocab_size
        state["output.weight"] = _take(tensors, "lm_head.weight", (rows, cfg.hidden_size))
    if cfg.head_vocab_size:
        state["head_token_ids"] = _head_token_ids(_take(tensors, "lm_head.token_ids", (cfg.head_vocab_size,)), cfg)
    if cfg.embed_rows:
        state["token_rows"] = _token_rows(_take(tensors, "model.embed_tokens.token_rows", (cfg.vocab_size,)), cfg)
    if cfg.block_size:
        state["block_masks"] = _take(tensors, BLOCK_MASKS_TENSOR, (cfg.block_size - 1, cfg.hidden_size))
    leftovers = sorted(name for name in tensors if "rotary_emb" not in name)
    if leftovers:
        raise UserError(f"checkpoint has tensors this architecture does not use: {', '.join(leftovers[:5])}")
    return state


def _head_token_ids(ids: Tensor, cfg: ModelConfig) -> Tensor:
    """The head's token ids: integers, strictly ascending (so argmax ties resolve as over the full vocab)."""
    if ids.is_floating_point() or (ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size)):
        raise UserError(f"lm_head.token_ids must be integer ids in [0, {cfg.vocab_size})")
    if bool((ids[1:] <= ids[:-1]).any()):
        raise UserError("lm_head.token_ids must be strictly ascending (re-save the draft with dfvg.distill)")
    return ids.long()


def _token_rows(rows: Tensor, cfg: ModelConfig) -> Tensor:
    """The token -> embedding-row table: integers in [0, head_vocab_size)."""
    if rows.is_floating_point() or int(rows.min()) < 0 or int(rows.max()) >= cfg.embed_vocab_size:
        raise UserError(f"model.embed_tokens.token_rows must be integer rows in [0, {cfg.embed_vocab_size})")
    return rows.long()


def resolve_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise UserError(f"dtype {name!r} is not supported (choose one of: {', '.join(DTYPES)})")
    return DTYPES[name]


FEATURE_HEAD_FILE = "feature_head.json"  # marks a feature head's folder (dfvg.feature_head)


def is_feature_head(path: str | Path) -> bool:
    """Whether a draft folder holds a feature head (which loads and drafts differently from a plain draft)."""
    return (Path(path) / FEATURE_HEAD_FILE).is_file()


def load_model(path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu",
               feature_head_body: bool = False) -> Transformer:
    """A ready-to-run Transformer from a checkpoint directory, in eval mode on `device`.

    A feature head's folder holds an ordinary draft checkpoint (its body), but the body alone drafts
    nonsense: it is refused unless `feature_head_body` (dfvg.feature_head loads it so)."""
    directory = checkpoint_dir(path)
    if not feature_head_body and is_feature_head(directory):
        raise UserError(f"{directory} is a feature head (it drafts from the target's hidden states), which this "
                        "tool cannot run as a standalone draft; use it with dfvg generate --draft")
    cfg = load_config(directory)
    state = convert_state_dict(read_tensors(directory, dtype), cfg)
    with torch.device("meta"):
        model = Transformer(cfg)
    model.load_state_dict(state, strict=True, assign=True)
    if cfg.tie_word_embeddings:
        model.output.weight = model.tok_embeddings.weight
    model.checkpoint_dir = directory  # what a quantizer calibrating on this model's outputs records and reloads
    return model.to(device).eval().requires_grad_(False)
