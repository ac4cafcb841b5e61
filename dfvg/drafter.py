"""The `Drafter` protocol and the torch drafter (the factory that picks one by device is `dfvg.engine`).

Every drafter honours one contract (docs/ARCHITECTURE.md): `prefill` resets it on a prompt, `propose`
feeds whatever committed tokens it has not seen yet and drafts k tokens, `rollback(n)` declares positions
>= n invalid. The engine calls `rollback(len(committed) - 1)` after every step; because the drafter's cache
then keeps a *different* length than the target's (after a fully accepted block the drafter has never fed
its own last draft nor the bonus token), the drafter tracks `cached_len` itself and catches up on the next
`propose`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from dfvg.devices import synchronize
from dfvg.model import Transformer
from dfvg.sampling import SamplingParams, processed_probs, sample_from


@dataclass
class DraftBlock:
    """k proposed tokens; probs [k, V] are the processed distributions they were drawn from (None = one-hot)."""

    tokens: list[int]
    probs: Tensor | None
    elapsed_s: float
    modeled_s: float | None = None
    without_draft: bool = False  # empty because the drafter failed (dfvg.fallback): the target decoded alone


class Drafter(Protocol):
    device: torch.device
    cached_len: int

    def prefill(self, prompt_ids: list[int], max_seq_len: int) -> None: ...

    def propose(
        self, context: list[int], k: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> DraftBlock: ...

    def rollback(self, num_valid: int) -> None: ...


def device_label(drafter: Drafter) -> str:
    """`fpga` for a board-backed drafter (it has a `board`), else its torch device: timelines and faults."""
    return "fpga" if getattr(drafter, "board", None) is not None else str(drafter.device)


class TorchDrafter:
    """A float draft model (DFVG's Transformer) on a torch device: cpu or cuda:N."""

    def __init__(self, model: Transformer, target_vocab_size: int | None = None):
        self.model = model
        self.device = model.tok_embeddings.weight.device
        self.vocab_size = target_vocab_size or model.config.vocab_size
        self.cached_len = 0

    def prefill(self, prompt_ids: list[int], max_seq_len: int) -> None:
        self.model.setup_cache(1, max_seq_len)
        self.cached_len = 0
        if len(prompt_ids) > 1:
            self._next_logits(prompt_ids[:-1], 0)
            self.cached_len = len(prompt_ids) - 1

    def rollback(self, num_valid: int) -> None:
        self.cached_len = min(self.cached_len, num_valid)

    @torch.inference_mode()
    def propose(
        self, context: list[int], k: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> DraftBlock:
        start = time.perf_counter()
        fed_from = min(self.cached_len, len(context) - 1)  # always feed at least the last token
        logits = self._next_logits(context[fed_from:], fed_from)
        self.cached_len = len(context)

        def feed_next(token: int) -> Tensor:
            next_logits = self._next_logits([token], self.cached_len)
            self.cached_len += 1
            return next_logits

        tokens, block_probs = sample_block(logits, k, sampling, generator, feed_next)
        synchronize(self.device)
        return DraftBlock(tokens, block_probs, time.perf_counter() - start)

    def _next_logits(self, tokens: list[int], start_pos: int) -> Tensor:
        """Feed tokens at start_pos.. and return the logits [V] after the last one, in the target's vocab."""
        return fit_vocab(self.model.feed(tokens, start_pos, last_only=True)[-1], self.vocab_size)


def sample_block(logits: Tensor, k: int, sampling: SamplingParams, generator: torch.Generator | None,
                 feed_next: Callable[[int], Tensor]) -> tuple[list[int], Tensor | None]:
    """Draw a block of k tokens: the first from `logits` [V], each next one from `feed_next(previous token)`;
    returns the tokens and the processed distributions [k, V] they were drawn from (None when greedy)."""
    tokens, probs = [], []
    for i in range(k):
        dist = processed_probs(logits, sampling)  # [V]
        uniform = torch.zeros(()) if sampling.greedy else torch.rand((), generator=generator)
        tokens.append(int(sample_from(dist, uniform)))
        probs.append(dist)
        if i < k - 1:
            logits = feed_next(tokens[-1])
    return tokens, None if sampling.greedy or not probs else torch.stack(probs)


def fit_vocab(logits: Tensor, vocab_size: int) -> Tensor:
    """Cut or pad (with -inf) the draft's logits [..., Vd] to the target's vocabulary size.

    Same-tokenizer pairs can still differ in embedding rows (padding to a multiple of 64 or 128); ids past
    the tokenizer's vocabulary are never real tokens, so dropping or forbidding them changes nothing.
    """
    extra = vocab_size - logits.shape[-1]
    if extra < 0:
        return logits[..., :vocab_size]
    if extra > 0:
        return torch.nn.functional.pad(logits, (0, extra), value=float("-inf"))
    return logits
