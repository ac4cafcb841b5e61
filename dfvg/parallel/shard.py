"""Splitting a loaded `Transformer` over the ranks of a tensor-parallel group (Megatron-LM's layout).

Per layer, rank r of N keeps:
- attention: query heads [r·H/N, (r+1)·H/N) and their KV heads (its 1/N of them, or, with more ranks than KV
  heads, the one KV head its query heads share, replicated) in the fused q/k/v matrix (column-parallel: no
  communication), and the matching input columns of the o projection (row-parallel: a partial sum);
- MLP: its 1/N of the gate and up rows (column-parallel) and the matching input columns of the down
  projection (row-parallel);
- the LM head: its 1/N of the vocabulary rows; `dfvg.parallel.verifier` merges the shards' logits.
Each row-parallel projection ends in the sublayer's one all-reduce (`RowParallelLinear`), so a layer costs
two all-reduces. Norms, q/k-norm weights and the input embedding are replicated: an embedding lookup reads
one row per token, so splitting it would save memory but cost a third all-reduce per forward.

The shard is an ordinary `Transformer` whose config has the local head and MLP sizes, so the model code,
its KV cache (local KV heads only) and RoPE run unchanged; only three kinds of module are swapped.
Does not own: process groups (`group`), deciding tokens from sharded logits (`verifier`).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from dfvg.model import ModelConfig, Transformer
from dfvg.parallel.group import TensorParallel


def shard_range(total: int, rank: int, size: int) -> tuple[int, int]:
    """[start, end) of rank's share of `total` items split as evenly as possible, lower ranks larger.
    Example: 97 vocabulary rows over 2 ranks -> rank 0 (0, 49), rank 1 (49, 97)."""
    base, extra = divmod(total, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def kv_head_range(cfg: ModelConfig, rank: int, size: int) -> tuple[int, int]:
    """The KV heads rank keeps: its 1/N share, or the one KV head its query heads read (N a multiple of KV).
    Example: 12 query heads, 2 KV heads, N = 4: rank 2 has query heads 6-8, all in group 1 -> (1, 2)."""
    if cfg.num_kv_heads % size == 0:
        return shard_range(cfg.num_kv_heads, rank, size)
    head = rank // (size // cfg.num_kv_heads)
    return head, head + 1


class RowParallelLinear(nn.Linear):
    """A projection whose input features are split over the ranks: each rank's product is a partial sum and
    one all-reduce completes it (the sublayer's one collective). The replicated bias is added once, after."""

    def forward(self, x: Tensor) -> Tensor:
        out = F.linear(x, self.weight)
        dist.all_reduce(out)
        return out if self.bias is None else out + self.bias


def local_config(cfg: ModelConfig, rank: int, size: int) -> ModelConfig:
    """The shard's shapes: local heads, KV heads and MLP width; the head is swapped after construction."""
    kv0, kv1 = kv_head_range(cfg, rank, size)
    i0, i1 = shard_range(cfg.intermediate_size, rank, size)
    return dataclasses.replace(cfg, num_heads=cfg.num_heads // size, num_kv_heads=kv1 - kv0,
                               intermediate_size=i1 - i0, tie_word_embeddings=False)


def shard_state(state: dict[str, Tensor], cfg: ModelConfig, rank: int, size: int) -> dict[str, Tensor]:
    """The full model's state dict -> rank's slices (copies, so the full weights can be freed)."""
    hd, heads, kv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    q0, q1 = shard_range(heads, rank, size)
    kv0, kv1 = kv_head_range(cfg, rank, size)
    i0, i1 = shard_range(cfg.intermediate_size, rank, size)
    v0, v1 = shard_range(cfg.vocab_size, rank, size)
    # wqkv rows: H query heads, then KV key heads, then KV value heads, head_dim rows each
    qkv_rows = torch.cat([torch.arange(q0 * hd, q1 * hd), torch.arange((heads + kv0) * hd, (heads + kv1) * hd),
                          torch.arange((heads + kv + kv0) * hd, (heads + kv + kv1) * hd)])
    inter = cfg.intermediate_size
    cut = {
        "attention.wqkv.weight": lambda t: t[qkv_rows],
        "attention.wqkv.bias": lambda t: t[qkv_rows],
        "attention.wo.weight": lambda t: t[:, q0 * hd:q1 * hd],
        "feed_forward.w13.weight": lambda t: torch.cat([t[i0:i1], t[inter + i0:inter + i1]]),
        "feed_forward.w2.weight": lambda t: t[:, i0:i1],
    }
    out = {}
    for name, tensor in state.items():
        suffix = name.split(".", 2)[-1] if name.startswith("layers.") else name
        if name == "output.weight":
            tensor = tensor[v0:v1]
        elif suffix in cut:
            tensor = cut[suffix](tensor)
        out[name] = tensor.clone(memory_format=torch.contiguous_format)
    return out


def shard_transformer(full: Transformer, tp: TensorParallel) -> Transformer:
    """Rank tp.rank's shard of `full` on tp.device, ready to run in lockstep with the other ranks."""
    cfg = full.config
    local = local_config(cfg, tp.rank, tp.size)
    v0, v1 = shard_range(cfg.vocab_size, tp.rank, tp.size)
    with torch.device("meta"):
        model = Transformer(local)
        model.output = nn.Linear(cfg.hidden_size, v1 - v0, bias=False)  # this rank's vocabulary rows
        for layer in model.layers:
            layer.attention.wo = RowParallelLinear(local.num_heads * cfg.head_dim, cfg.hidden_size,
                                                   bias=cfg.output_bias)
            layer.feed_forward.w2 = RowParallelLinear(local.intermediate_size, cfg.hidden_size, bias=False)
    model.load_state_dict(shard_state(full.state_dict(), cfg, tp.rank, tp.size), strict=True, assign=True)
    return model.to(tp.device).eval().requires_grad_(False)
