"""Rank 0's draft blocks reaching the other ranks of a tensor-parallel run.

The draft runs on rank 0 only, on its own device (the FPGA datapath or a board, a CPU, one GPU): a board
cannot be shared by N processes, N copies of a GPU draft would take memory on every rank's GPU, and sampled
drafts would have to draw identically everywhere. Only its token ids cross: `SentDrafts` wraps rank 0's
drafter and broadcasts each block it proposes; `ReceivedDrafts` stands in for the drafter on every other rank
and receives it. Both sides call `propose` at the same point of the same loop with the same k (the loop
derives k from decisions every rank shares), so one fixed-size message of k + 1 ids pairs them: the count,
then the tokens. Draft probabilities stay on rank 0, which alone decides acceptance.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from dfvg.drafter import DraftBlock, Drafter
from dfvg.parallel.group import TensorParallel
from dfvg.parallel.verifier import TensorParallelVerifier
from dfvg.sampling import SamplingParams


def exchange_block(tokens: list[int] | None, k: int, tp: TensorParallel) -> list[int]:
    """Rank 0's block tokens (at most k) on every rank; the other ranks pass None.
    Example: rank 0 drafted [5, 7] with k = 3 -> message [2, 5, 7, 0] -> [5, 7] everywhere."""
    message = torch.zeros(k + 1, dtype=torch.long)
    if tokens is not None:
        message[0] = len(tokens)
        message[1:1 + len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    message = message.to(tp.device)
    dist.broadcast(message, src=0)
    count, *ids = message.tolist()
    return ids[:count]


class SentDrafts:
    """Rank 0's drafter, unchanged, plus the broadcast of each block's tokens to the other ranks."""

    def __init__(self, inner: Drafter, tp: TensorParallel):
        self.inner, self.tp = inner, tp
        self.device = inner.device

    @property
    def cached_len(self) -> int:
        return self.inner.cached_len

    def prefill(self, prompt_ids: list[int], max_seq_len: int) -> None:
        self.inner.prefill(prompt_ids, max_seq_len)

    def propose(self, context: list[int], k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> DraftBlock:
        block = self.inner.propose(context, k, sampling, generator)
        exchange_block(block.tokens, k, self.tp)
        return block

    def rollback(self, num_valid: int) -> None:
        self.inner.rollback(num_valid)


class ReceivedDrafts:
    """The drafter of a rank other than 0: it loads no draft model and proposes what rank 0 drafted."""

    cached_len = 0  # it keeps no cache of its own

    def __init__(self, tp: TensorParallel):
        self.tp = tp
        self.device = torch.device("cpu")  # nothing runs here to synchronize with

    def prefill(self, prompt_ids: list[int], max_seq_len: int) -> None:
        pass

    def propose(self, context: list[int], k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> DraftBlock:
        start = time.perf_counter()
        tokens = exchange_block(None, k, self.tp)
        return DraftBlock(tokens, None, time.perf_counter() - start)  # probs stay on rank 0, which decides

    def rollback(self, num_valid: int) -> None:
        pass


def share_drafts(verifier: object, drafter: Drafter | None) -> Drafter | None:
    """The drafter the engine's step uses: rank 0's own wrapped in `SentDrafts` under a tensor-parallel target;
    any other drafter (and a `ReceivedDrafts`, which already receives) unchanged."""
    if drafter is None or isinstance(drafter, ReceivedDrafts) or not isinstance(verifier, TensorParallelVerifier):
        return drafter
    return SentDrafts(drafter, verifier.tp)
