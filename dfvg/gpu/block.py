"""One transformer block over plain tensors, for B rows at their own positions: the compiled graph body.

Why a functional copy of `dfvg.model.TransformerBlock`: `torch.compile` of one function whose weights are
arguments (not module constants) gives one compiled block shared by every layer, and CUDA graphs replay it
over static buffers. The same function serves one sequence (B = 1, the graph verifier and drafter) and a
batch (B rows, each reading and writing its own cache row at its own positions: `dfvg.gpu.fast`'s batched
step), so a batch runs exactly the arithmetic a single sequence runs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from dfvg.model import apply_rope


def rms(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def block_forward(x: Tensor, cos: Tensor, sin: Tensor, pos: Tensor, mask: Tensor, kc: Tensor, vc: Tensor,
                  w: tuple, dims: tuple) -> Tensor:
    """One transformer block on x [B, T, D] at positions pos [B, T]; writes K/V into rows 0..B-1 of kc/vc
    [>=B, S, KV, hd]. cos/sin [B, T, 1, hd]; mask [B, T, S] (query t of row b sees slot s).

    Same arithmetic as `dfvg.model.TransformerBlock`. GQA attention folds the query heads of a kv head into
    rows (no K/V expansion), with float32 scores and softmax. w = (attn_norm, wqkv, wqkv_b, wo, wo_b, q_norm,
    k_norm, ffn_norm, w13, w2); dims = (heads, kv_heads, head_dim, intermediate, eps).
    """
    attn_norm, wqkv, wqkv_b, wo, wo_b, q_norm, k_norm, ffn_norm, w13, w2 = w
    heads, kv_heads, hd, inter, eps = dims
    b, t = x.shape[:2]
    group = heads // kv_heads
    h = rms(x, attn_norm, eps)
    q, k, v = F.linear(h, wqkv, wqkv_b).split([heads * hd, kv_heads * hd, kv_heads * hd], dim=-1)
    q, k, v = q.view(b, t, heads, hd), k.view(b, t, kv_heads, hd), v.view(b, t, kv_heads, hd)
    if q_norm is not None:
        q, k = rms(q, q_norm, eps), rms(k, k_norm, eps)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    slots = kc.shape[1]
    flat = (pos + torch.arange(b, device=pos.device)[:, None] * slots).reshape(-1)  # row b's slot p -> b*S + p
    kc[:b].view(b * slots, kv_heads, hd).index_copy_(0, flat, k.reshape(b * t, kv_heads, hd))
    vc[:b].view(b * slots, kv_heads, hd).index_copy_(0, flat, v.reshape(b * t, kv_heads, hd))
    keys, values = kc[:b].transpose(1, 2), vc[:b].transpose(1, 2)  # [B, KV, S, hd]
    qg = q.view(b, t, kv_heads, group, hd).permute(0, 2, 3, 1, 4).reshape(b, kv_heads, group * t, hd)
    scores = torch.matmul(qg.float(), keys.float().transpose(2, 3)) * (1.0 / math.sqrt(hd))  # [B, KV, G*T, S]
    scores = scores.view(b, kv_heads, group, t, -1).masked_fill(~mask[:, None, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).view(b, kv_heads, group * t, -1)
    out = torch.matmul(probs, values.float()).to(x.dtype)  # [B, KV, G*T, hd]
    out = out.view(b, kv_heads, group, t, hd).permute(0, 3, 1, 2, 4).reshape(b, t, heads * hd)
    x = x + F.linear(out, wo, wo_b)
    gate, up = F.linear(rms(x, ffn_norm, eps), w13).split(inter, dim=-1)
    return x + F.linear(F.silu(gate) * up, w2)


def layer_weights(layer) -> tuple:
    """A `TransformerBlock`'s tensors in `block_forward`'s order (q/k norm None for Llama and Qwen2)."""
    att, ffn = layer.attention, layer.feed_forward
    q_norm = att.q_norm.weight if hasattr(att, "q_norm") else None
    k_norm = att.k_norm.weight if hasattr(att, "k_norm") else None
    return (layer.attention_norm.weight, att.wqkv.weight, att.wqkv.bias, att.wo.weight, att.wo.bias,
            q_norm, k_norm, layer.ffn_norm.weight, ffn.w13.weight, ffn.w2.weight)


def raise_recompile_limit() -> None:
    """Every input shape (B, T) and each model size is one compiled variant of the block; allow them all."""
    import torch._dynamo.config as dynamo_config  # noqa: I001 - torch's private config, only when compiling
    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, max(64, getattr(dynamo_config, name)))
