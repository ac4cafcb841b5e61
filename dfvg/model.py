"""The transformer DFVG runs: Llama, Qwen2 and Qwen3 in one compact module, with a static KV cache.

What this module owns: the model's shapes (`ModelConfig`), its forward pass and its KV cache. What it does
not own: reading checkpoints (`checkpoint.py`), sampling (`sampling.py`), anything about FPGAs (the
quantizer is a function from this model to integer weights, in `dfvg/fpga/`).

The three architectures differ only by flags: Qwen2 adds a bias to the q/k/v projections, Qwen3 normalises
each head of q and k (qk-norm) before RoPE, Llama-3 rescales the RoPE frequencies. GQA is the general
case (`num_kv_heads <= num_heads`).

The KV cache is position-indexed: K/V of a token fed at absolute position p are written at slot p, and a
query at position p attends to slots `<= p`. A rejected draft therefore needs no cache surgery: the next
forward simply starts at the first rejected position and overwrites it. q/k/v and gate/up projections are
fused into one matrix each, so a decode step launches fewer kernels (it is launch-bound on a GPU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and architecture flags, read from a checkpoint's config.json (never repeated in YAML)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v projections (Qwen2; Llama with attention_bias)
    output_bias: bool = False  # bias on the o projection (Llama with attention_bias only)
    qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE (Qwen3)
    max_position_embeddings: int = 32768
    head_vocab_size: int | None = None  # LM head over a token subset (docs/distill.md); None = all vocab_size
    embed_rows: bool = False  # input embedding over the head's tokens too, via a token -> row table
    block_size: int | None = None  # a block drafter (dfvg.block_draft): drafts this many tokens in one pass

    @property
    def mask_ids(self) -> list[int]:
        """A block drafter's mask tokens, one per offset 1..block_size-1: ids past the vocabulary, which
        `Transformer.embed` maps to the drafter's own learned mask vectors."""
        return [self.vocab_size + j for j in range((self.block_size or 1) - 1)]

    @property
    def embed_vocab_size(self) -> int:
        """Rows of the input embedding: the head's with `embed_rows`, else the full vocabulary."""
        return self.head_vocab_size if self.embed_rows and self.head_vocab_size else self.vocab_size

    @property
    def qkv_size(self) -> int:
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim


def rope_inverse_frequencies(config: ModelConfig) -> Tensor:
    """Per-pair rotation frequencies [head_dim/2], with Llama-3 or linear scaling when configured."""
    exponents = torch.arange(0, config.head_dim, 2, dtype=torch.int64).float() / config.head_dim
    inv_freq = 1.0 / (config.rope_theta**exponents)
    scaling = config.rope_scaling or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type != "llama3":
        return inv_freq
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths (low frequencies) are slowed by `factor`, short ones kept, the band between blended.
    scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_context / high) & (wavelen <= old_context / low)
    return torch.where(is_medium, blended, scaled)


def rope_table(config: ModelConfig, max_seq_len: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """cos and sin tables [max_seq_len, head_dim] in float32, half-split layout (rotate_half)."""
    inv_freq = rope_inverse_frequencies(config).to(device)
    positions = torch.arange(max_seq_len, device=device, dtype=torch.float32)
    freqs = positions[:, None] * inv_freq[None, :]  # [S, hd/2]
    angles = torch.cat([freqs, freqs], dim=-1)  # [S, hd]
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x [B, T, heads, hd] by cos/sin [B, T, 1, hd] (HF Llama/Qwen convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 and cast back, exactly as the HF reference does."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class KVCache:
    """Static K/V storage [B, S, kv_heads, hd] of one layer, written at absolute positions. k and v are views
    into the model's one `kv_store` [layers, 2, B, S, kv_heads, hd], so moving cache slots of every layer at
    once is one gather and one scatter (`dfvg.tree.move_slots`), not two per layer: the captured tree step
    compacts with 2 kernels instead of 4 per layer. The views are taken at each use (a view kept across
    in-place writes of its base is fragile under autograd)."""

    def __init__(self, store: Tensor, layer: int):
        self.store, self.layer = store, layer

    @property
    def k(self) -> Tensor:
        return self.store[self.layer, 0]

    @property
    def v(self) -> Tensor:
        return self.store[self.layer, 1]

    def update(self, input_pos: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k/v [B, T, kv, hd] at input_pos [B, T]; return the cache of those B rows [B, S, kv, hd].

        Where gradients flow into k/v (distillation: one pass over whole sequences on a fresh cache), the rows
        are returned with k/v put in out of place and the store is left as it is: every layer's views share
        the store's version counter, so one layer's in-place write would invalidate what the layer before it
        saved for backward."""
        batch = k.shape[0]
        rows = torch.arange(batch, device=k.device)[:, None]
        if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
            return self.k[:batch].index_put((rows, input_pos), k), self.v[:batch].index_put((rows, input_pos), v)
        self.k[rows, input_pos] = k
        self.v[rows, input_pos] = v
        return self.k[:batch], self.v[:batch]


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.wqkv = nn.Linear(config.hidden_size, config.qkv_size, bias=config.attention_bias)
        self.wo = nn.Linear(config.num_heads * config.head_dim, config.hidden_size, bias=config.output_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        self.kv_cache: KVCache | None = None

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, input_pos: Tensor, mask: Tensor | None) -> Tensor:
        cfg = self.config
        batch, seq, _ = x.shape
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        q, k, v = self.wqkv(x).split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(batch, seq, cfg.num_heads, cfg.head_dim)
        k = k.view(batch, seq, cfg.num_kv_heads, cfg.head_dim)
        v = v.view(batch, seq, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        keys, values = self.kv_cache.update(input_pos, k, v)  # [B, S, kv, hd]
        if mask is None:  # `run_layers(causal_prefix=True)`: rows 0..T-1 in slots 0..T-1, causal among themselves
            keys, values = keys[:, :seq], values[:, :seq]
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            keys.transpose(1, 2),
            values.transpose(1, 2),
            attn_mask=mask,
            is_causal=mask is None,
            enable_gqa=cfg.num_kv_heads != cfg.num_heads,
        )  # [B, H, T, hd]
        return self.wo(out.transpose(1, 2).reshape(batch, seq, q_size))


class FeedForward(nn.Module):
    """SwiGLU MLP; w13 holds gate rows then up rows."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.intermediate = config.intermediate_size
        self.w13 = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.w2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w13(x).split(self.intermediate, dim=-1)
        return self.w2(F.silu(gate) * up)


class TransformerBlock(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attention_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, input_pos: Tensor, mask: Tensor | None) -> Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin, input_pos, mask)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    """Decoder-only LM. Call `setup_cache` once, then `forward(input_ids, input_pos)`."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.embed_vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.output = nn.Linear(config.hidden_size, config.head_vocab_size or config.vocab_size, bias=False)
        if config.head_vocab_size:
            # A distilled FPGA-sized draft's head has one row per token of `head_token_ids` [Vh] (ascending
            # ids); forward scatters its logits into the full vocabulary, so a token outside is never drafted.
            self.register_buffer("head_token_ids", torch.zeros(config.head_vocab_size, dtype=torch.long))
        if config.embed_rows:
            # ...and its input embedding too: token id -> row (its own for head tokens, the nearest head
            # token's for the rest), so embedding and head can be one tied [Vh, D] table (docs/distill.md).
            self.register_buffer("token_rows", torch.zeros(config.vocab_size, dtype=torch.long))
        if config.tie_word_embeddings:
            self.output.weight = self.tok_embeddings.weight
        if config.block_size:  # one learned input vector per mask offset (dfvg.block_draft)
            self.block_masks = nn.Parameter(torch.zeros(config.block_size - 1, config.hidden_size))
        self.max_seq_len = 0
        self.max_batch = 0
        self.register_buffer("kv_store", None, persistent=False)  # every layer's K/V (setup_cache; KVCache)

    def setup_cache(self, batch_size: int, max_seq_len: int) -> None:
        """Allocate K/V and the RoPE table once; reuse them when the request already fits."""
        if batch_size <= self.max_batch and max_seq_len <= self.max_seq_len:
            return
        weight = self.tok_embeddings.weight
        cfg = self.config
        for layer in self.layers:  # the old store is freed before the new one is allocated
            layer.attention.kv_cache = None
        self.kv_store = None
        shape = (len(self.layers), 2, batch_size, max_seq_len, cfg.num_kv_heads, cfg.head_dim)
        self.kv_store = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
        for i, layer in enumerate(self.layers):
            layer.attention.kv_cache = KVCache(self.kv_store, i)
        cos, sin = rope_table(cfg, max_seq_len, weight.device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.max_batch, self.max_seq_len = batch_size, max_seq_len

    def _apply(self, fn, recurse: bool = True):
        """`.to()` / `.half()` after setup_cache make a new `kv_store`: the layers' caches follow it."""
        super()._apply(fn, recurse)
        if self.kv_store is not None:
            for i, layer in enumerate(self.layers):
                layer.attention.kv_cache = KVCache(self.kv_store, i)
        return self

    def feed(self, tokens: list[int], start_pos: int, last_only: bool = False) -> Tensor:
        """Batch-1 convenience: tokens at positions start_pos.. -> logits [T, V] ([1, V] with last_only)."""
        device = self.tok_embeddings.weight.device
        ids = torch.tensor([tokens], dtype=torch.long, device=device)
        positions = torch.arange(start_pos, start_pos + len(tokens), device=device)[None]
        return self(ids, positions, last_only=last_only)[0]

    def forward(self, input_ids: Tensor, input_pos: Tensor, last_only: bool = False,
                slots: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        """input_ids, input_pos [B, T] -> float32 logits [B, T, V] (or [B, 1, V] with last_only).

        Positions must lie below the cache length given to `setup_cache`; the callers check that with host
        integers, because reading `input_pos` here would force a device sync (and break CUDA graph capture).
        A token tree (dfvg.tree) passes its own cache `slots` [B, T] (nodes of one depth share a position
        but not a slot) and attention `mask` [B, 1, T, S]; by default slot = position, causal by position.
        """
        x = self.run_layers(self.embed(input_ids), input_pos, slots, mask)
        if last_only:
            x = x[:, -1:]
        return self.logits(x)

    def run_layers(self, x: Tensor, input_pos: Tensor, slots: Tensor | None = None,
                   mask: Tensor | None = None, causal_prefix: bool = False) -> Tensor:
        """The decoder layers on input vectors x [B, T, D] (`forward`'s embeddings, or a feature head's fused
        inputs, dfvg.feature_head) -> the last layer's output [B, T, D], before the final norm.

        causal_prefix: the rows are positions 0..T-1 (a prompt from its start), so attention reads only the
        first T cache slots, causally, instead of the whole cache under a mask: a long prompt then takes a
        fused (flash) attention kernel and its arithmetic does not depend on the cache's size."""
        dtype = x.dtype
        cos = self.rope_cos[input_pos].to(dtype).unsqueeze(2)  # [B, T, 1, hd]
        sin = self.rope_sin[input_pos].to(dtype).unsqueeze(2)
        if mask is None and not causal_prefix:
            cache_slots = torch.arange(self.max_seq_len, device=input_pos.device)
            mask = (cache_slots[None, None, :] <= input_pos[:, :, None]).unsqueeze(1)  # [B, 1, T, S]
        write_at = input_pos if slots is None else slots
        for layer in self.layers:
            x = layer(x, cos, sin, write_at, mask)
        return x

    def embed(self, input_ids: Tensor) -> Tensor:
        """Token ids [...] -> embeddings [..., D]; shared with the CUDA-graph forward like `logits`. A block
        drafter's mask ids (`ModelConfig.mask_ids`, past the vocabulary) take its mask vectors, without a
        branch on the ids' values (graph-safe)."""
        cfg = self.config
        ids = input_ids.clamp(max=cfg.vocab_size - 1) if cfg.block_size else input_ids
        x = self.tok_embeddings(self.token_rows[ids] if cfg.embed_rows else ids)
        if not cfg.block_size:
            return x
        offset = (input_ids - cfg.vocab_size).clamp(0, cfg.block_size - 2)
        return torch.where((input_ids >= cfg.vocab_size)[..., None], self.block_masks[offset].to(x.dtype), x)

    def head_logits(self, hidden: Tensor) -> Tensor:
        """Final norm + LM head: hidden [..., D] -> float32 logits over the head's own rows [..., Vh] (the full
        vocabulary [..., V] without a head vocabulary). Distillation's loss reads these: for a 32k head of a
        152k vocabulary, the full-vocabulary logits of a training batch were ~5x the bytes (7.4 GB of float32
        for 32 x 383 positions, and as much again for their softmax and gradient)."""
        return self.output(self.norm(hidden)).float()

    def logits(self, hidden: Tensor) -> Tensor:
        """`head_logits` over the full vocabulary [..., V], -inf where the head has no row.

        Shared by `forward` and the CUDA-graph forward (dfvg.gpu.graphs), so a head-vocabulary draft's
        rows are mapped back to token ids on every path."""
        logits = self.head_logits(hidden)
        if self.config.head_vocab_size:
            full = logits.new_full((*logits.shape[:-1], self.config.vocab_size), float("-inf"))
            logits = full.index_copy_(-1, self.head_token_ids, logits)  # [..., Vh] -> [..., V]
        return logits
