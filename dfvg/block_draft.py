"""The block drafter: a draft that emits all k tokens of a block in one forward pass (PARD-style mask tokens).

Why: a chain draft runs k forward passes per block, one per token, each waiting on the last one's argmax;
on a GPU those are k launch-bound passes, on an FPGA k round trips through the datapath. A block drafter
feeds the committed tokens it has not seen, then k - 1 mask tokens (`ModelConfig.mask_ids`: ids past the
vocabulary, each mapped to its own learned vector by `Transformer.embed`) at the next k - 1 positions, and
reads k distributions from that one pass: the last real token's row predicts the next token as a chain draft
does, mask j's row predicts the token j places after it, without seeing the drafts before it. Training
(`dfvg.distill.block`) teaches mask rows exactly that, under the attention a real pass gives them: every
committed token, and the masks before them.

The masks' cache slots lie past the committed tokens (`cached_len` counts committed tokens only), so the next
pass overwrites them before any row attends to them: rollback needs nothing. Lossless either way: greedy
verification keeps only drafts equal to the target's tokens, and under sampling each draft is drawn from
the distribution the acceptance rule is given (a mask row's, which depends on the committed tokens only).
"""

from __future__ import annotations

import time

import torch

from dfvg.devices import synchronize
from dfvg.drafter import DraftBlock, TorchDrafter, fit_vocab, sample_block
from dfvg.model import Transformer
from dfvg.sampling import SamplingParams


def is_block_draft(model: Transformer) -> bool:
    return bool(model.config.block_size)


class BlockDrafter(TorchDrafter):
    """A block draft model on a torch device: one forward pass per block of up to `block_size` tokens."""

    def __init__(self, model: Transformer, target_vocab_size: int | None = None):
        if not is_block_draft(model):
            raise ValueError("BlockDrafter needs a block draft (config.json's dfvg_block_size)")
        super().__init__(model, target_vocab_size)
        self.block_size = model.config.block_size

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> DraftBlock:
        """Up to min(k, block_size) tokens from one pass (a shorter block is verified as any short block)."""
        start = time.perf_counter()
        k = min(k, self.block_size)
        if k < 1:
            return DraftBlock([], None, time.perf_counter() - start)
        fed_from = min(self.cached_len, len(context) - 1)  # always feed at least the last token
        if fed_from < len(context) - 1:  # a catch-up (a drafter taking over mid-generation): its rows' logits
            self._next_logits(context[fed_from:-1], fed_from)  # unread, so only the last row's are computed
        fed = context[-1:] + self.model.config.mask_ids[: k - 1]
        logits = fit_vocab(self.model.feed(fed, len(context) - 1), self.vocab_size)  # [k, V]
        self.cached_len = len(context)
        return block_of_rows(logits, sampling, generator, self.device, start)


def block_of_rows(logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None,
                  device: torch.device, start: float) -> DraftBlock:
    """A one-pass block from its k rows' logits [k, V] (the last real row's, then each mask row's): each draft drawn
    from (greedy: the argmax of) its own row, whatever the drafts before it, so the acceptance rule is given each
    draft's true distribution; timed from `start`. Each draft's top probability rides along for the adaptive draft
    length (dfvg.host.adaptive.block_confidence): its forward-hook probe sees one pass per block, not one a draft."""
    later_rows = iter(logits[1:])
    tokens, probs = sample_block(logits[0], logits.shape[0], sampling, generator, lambda _token: next(later_rows))
    synchronize(device)
    block = DraftBlock(tokens, probs, time.perf_counter() - start)
    block.confidence = torch.softmax(logits.float(), dim=-1).max(dim=-1).values.tolist()
    return block
