"""The sharded target under the engine's one loop: `TensorParallelVerifier`, with rank 0 deciding every token.

Every rank runs the same `dfvg.generate.decode` loop and every forward of its shard in lockstep (same tokens,
same positions), so the ranks' KV caches are one cache split by heads. What crosses ranks per verify step:
1. the draft block's token ids, broadcast from rank 0, where the draft runs (`dfvg.parallel.drafts`);
2. two all-reduces per layer (`dfvg.parallel.shard.RowParallelLinear`);
3. the LM head's result. Greedy: each shard's row maxima and their token ids ([2, k+1] per rank) are
   all-gathered and merged into the unsharded argmax. Sampling: the full logits rows [k+1, V] are gathered,
   only then, because top-k, top-p and the inverse-CDF draw need the whole row;
4. rank 0's decision (drafts accepted, next token), broadcast.
Rank 0 decides with `accept_block`, the function a single-process run calls, on the same numbers and the same
generator: greedy target rows are one-hot at the unsharded argmax (exactly what `processed_probs` makes of the
full logits, lowest index on ties) and sampled rows are the full logits, so every draw is the unsharded draw.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from dfvg.acceptance import accept_block
from dfvg.checkpoint import load_model
from dfvg.drafter import DraftBlock
from dfvg.model import Transformer
from dfvg.parallel.group import TensorParallel
from dfvg.parallel.shard import shard_range, shard_transformer
from dfvg.sampling import SamplingParams
from dfvg.verifier import TorchVerifier


class TensorParallelVerifier(TorchVerifier):
    """This rank's shard of the target. `prefill` is TorchVerifier's: the shard's forward all-reduces itself."""

    def __init__(self, model: Transformer, tp: TensorParallel):
        super().__init__(model)  # vocab_size: the shard's config keeps the full vocabulary
        self.tp = tp
        self.vocab_start = shard_range(self.vocab_size, tp.rank, tp.size)[0]

    @classmethod
    def load(cls, target_dir: str | Path, tp: TensorParallel, dtype: torch.dtype) -> TensorParallelVerifier:
        """Read the checkpoint on the CPU and keep this rank's slices on its device.
        Each rank reads the whole checkpoint once: fine up to ~7B on one host (see README's limits)."""
        return cls(shard_transformer(load_model(target_dir, dtype=dtype, device="cpu"), tp), tp)

    @torch.inference_mode()
    def score(self, tokens: list[int], start_pos: int) -> Tensor:
        """Full logits [len(tokens), V] on every rank: the shard's forward, then an all-gather of the vocabulary."""
        return gather_vocab(self.model.feed(tokens, start_pos), self.vocab_size, self.tp)

    @torch.inference_mode()
    def verify(self, seq: list[int], block: DraftBlock, sampling: SamplingParams,
               rng: torch.Generator) -> tuple[int, int]:
        """Score [last committed, *drafts] on every rank; rank 0 accepts and broadcasts (accepted, next token)."""
        local = self.model.feed([seq[-1], *block.tokens], start_pos=len(seq) - 1)  # [k+1, V/N] this shard's rows
        if sampling.greedy:
            target_ids = sharded_argmax(local, self.vocab_start, self.tp)  # [k+1], on every rank
            target_logits = one_hot_rows(target_ids, self.vocab_size) if self.tp.leads else None
        else:
            target_logits = gather_vocab(local, self.vocab_size, self.tp)  # [k+1, V]
        decision = accept_block(block.tokens, block.probs, target_logits, sampling, rng) if self.tp.leads else None
        return broadcast_decision(decision, self.tp)


def merge_shard_maxima(values: Tensor, ids: Tensor) -> Tensor:
    """The unsharded argmax of each row from every shard's row maximum and its (first) token id.

    values, ids [N, R] (shard n's maximum of row r, and the token id where it first occurs) -> ids [R].
    Shards hold ascending, disjoint ranges of the vocabulary, so the first shard that reaches a row's maximum
    holds its first maximal token: ties resolve to the lowest id, as torch.argmax over the whole row does.
    Example: values [[3., 5.], [5., 5.]], ids [[1, 4], [7, 9]] -> [7, 4] (row 1 ties: shard 0's 4 wins).
    """
    first_best = values.argmax(dim=0, keepdim=True)  # [1, R]; argmax returns the first maximal shard
    return ids.gather(0, first_best).squeeze(0)


def sharded_argmax(local: Tensor, vocab_start: int, tp: TensorParallel) -> Tensor:
    """local [R, V/N] logits of this shard (first token id vocab_start) -> the full rows' argmax [R], everywhere."""
    values, index = local.max(dim=-1)  # the first maximal index of each row, like argmax
    mine = torch.stack([values.double(), (index + vocab_start).double()])  # [2, R]; ids < 2**53 exact in float64
    every = [torch.empty_like(mine) for _ in range(tp.size)]
    dist.all_gather(every, mine)
    stacked = torch.stack(every)  # [N, 2, R]
    return merge_shard_maxima(stacked[:, 0], stacked[:, 1].long())


def one_hot_rows(ids: Tensor, vocab_size: int) -> Tensor:
    """ids [R] -> float32 rows [R, V], 1 at each id: what `processed_probs` makes of greedy logits."""
    return torch.zeros(ids.shape[0], vocab_size, device=ids.device).scatter_(1, ids[:, None], 1.0)


def gather_vocab(local: Tensor, vocab_size: int, tp: TensorParallel) -> Tensor:
    """local [R, V/N] -> the full rows [R, V] on every rank (shards padded to one width for the collective).
    Example: V = 97 over 2 ranks: rank 1's 48 columns get one -inf column, which the concatenation drops."""
    width = -(-vocab_size // tp.size)
    padded = F.pad(local, (0, width - local.shape[-1]), value=float("-inf"))
    every = [torch.empty_like(padded) for _ in range(tp.size)]
    dist.all_gather(every, padded)
    spans = [shard_range(vocab_size, rank, tp.size) for rank in range(tp.size)]
    return torch.cat([part[:, :end - start] for part, (start, end) in zip(every, spans, strict=True)], dim=-1)


def broadcast_decision(decision: tuple[int, int] | None, tp: TensorParallel) -> tuple[int, int]:
    """Rank 0's (drafts accepted, next token) on every rank; the others pass None."""
    message = torch.tensor(decision or (0, 0), dtype=torch.long, device=tp.device)
    dist.broadcast(message, src=0)
    accepted, token = message.tolist()
    return accepted, token
