"""The decoder stack on the fused launches (`dfvg.gpu.fused`): every layer over chunks of `fused.MAX_ROWS` rows, what
one layer's last launch hands the next (`fused.FACTORED_QKV_NORM`), and the LM head.

Why its own file: `GraphModel` (`dfvg.gpu.graphs`) captures and replays passes; how the fused layers chain into a
pass is the kernels' business. With the factored norm, a layer's down launch stores the next RMSNorm's input
already times its g, with each row's sums of squares per block, and the next QKV launch (or the LM head) reads those
instead of normalizing the rows itself; so the stack carries them between layers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from dfvg.gpu import fused
from dfvg.gpu.tree_rows import TreeRows

# What a layer hands the next RMSNorm's launch with `fused.FACTORED_QKV_NORM`: the rows times that norm's g (bf16)
# and their sums of squares per producer block [T, B]; None without it.
Scaled = tuple[Tensor, Tensor] | None


def scaled_rows(scaled: Scaled, a: int, b: int) -> Scaled:
    """Rows a..b-1 of what a layer hands the next norm's launch (None stays None)."""
    return None if scaled is None else (scaled[0][a:b], scaled[1][a:b])


def row_chunks(rows: int) -> list[tuple[int, int]]:
    """[a, b) row ranges of at most `fused.MAX_ROWS` rows (one fused launch each)."""
    return [(a, min(a + fused.MAX_ROWS, rows)) for a in range(0, rows, fused.MAX_ROWS)]


def by_chunks(chunks: list[tuple[int, int]], run: Callable[[int, int], Tensor | tuple]) -> Tensor | tuple:
    """run(a, b) for each row chunk, concatenated (one chunk: its output as it is, with no copy); a run that returns
    a tuple of row tensors has each concatenated."""
    outs = [run(a, b) for a, b in chunks]
    if len(outs) == 1:
        return outs[0]
    if isinstance(outs[0], tuple):
        return tuple(torch.cat(parts) for parts in zip(*outs, strict=True))
    return torch.cat(outs)


def stack_forward(model, weights: list[tuple], dims: tuple, x: Tensor, pos: Tensor, counters: Tensor,
                  tree: TreeRows | None = None) -> tuple[Tensor, Scaled]:
    """The decoder layers on input rows x [T, D] at positions pos [T] -> (the last layer's rows [T, D], before the
    final norm; and with `fused.FACTORED_QKV_NORM` those rows scaled for the LM head, else None). Each layer runs
    chunk after chunk: a tree's rows come parents first, so a chunk's ancestors wrote their K/V in this layer before
    it attends. Layer 0's QKV normalizes its own input (the embedding has no producer launch)."""
    chunks, scaled = row_chunks(x.shape[0]), None
    for i, (layer, w) in enumerate(zip(model.layers, weights, strict=True)):
        next_norm = None
        if fused.FACTORED_QKV_NORM:  # the next layer's attention norm, or after the last layer the final norm
            next_norm = weights[i + 1][0] if i + 1 < len(weights) else model.norm.weight
        cache = layer.attention.kv_cache

        def one(a: int, b: int, x=x, scaled=scaled, k=cache.k[0], v=cache.v[0], w=w, next_norm=next_norm):
            return fused.layer_forward(x[a:b], pos[a:b], model.rope_cos, model.rope_sin, k, v, w, dims, counters,
                                       tree.rows(a, b) if tree is not None else None, scaled_rows(scaled, a, b),
                                       next_norm)

        out = by_chunks(chunks, one)
        x, scaled = (out, None) if next_norm is None else (out[0], (out[1], out[2]))
    return x, scaled


def last_rows(x: Tensor, scaled: Scaled) -> tuple[Tensor, Scaled]:
    """The last row of a pass's rows and of what it hands the LM head (a `last_only` pass)."""
    return x[-1:].contiguous(), None if scaled is None else (scaled[0][-1:].contiguous(), scaled[1][-1:].contiguous())


def head_logits(model, x: Tensor, counters: Tensor | None = None, given: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """Final RMSNorm + LM head on x [T, D] -> float32 logits [T, V], rounded to bf16 first as
    `Transformer.logits` rounds; a row-invariant launch, unlike cuBLAS, whose kernel choice depends on T. given:
    the last layer's (x times the final norm's g, block sums) (`FACTORED_QKV_NORM`), streamed instead of x."""
    eps = model.config.rms_norm_eps
    if given is None:
        out = fused.fused_linear(x, model.output.weight, norm=model.norm.weight, eps=eps, counters=counters).float()
    else:
        out = fused.fused_linear(given[0], model.output.weight, eps=eps, counters=counters, row_sums=given[1]).float()
    if model.config.head_vocab_size:
        full = out.new_full((out.shape[0], model.config.vocab_size), float("-inf"))
        out = full.index_copy_(-1, model.head_token_ids, out)
    return out


def stack_logits(model, x: Tensor, counters: Tensor, scaled: Scaled = None) -> Tensor:
    """The head as a row-invariant launch too (`head_logits`), by row chunks; from `scaled` where the last layer
    handed it the final norm's input."""
    def head(a: int, b: int) -> Tensor:
        return head_logits(model, x[a:b], counters, scaled_rows(scaled, a, b))

    return by_chunks(row_chunks(x.shape[0]), head)
