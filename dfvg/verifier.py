"""The target side of speculative decoding: prefill the prompt, then score k+1 positions per step.

`TorchVerifier` runs DFVG's own `Transformer` eagerly on any torch device. The target's cache holds every
committed token except the last one; each `score` call feeds that last token followed by the draft block,
at absolute positions, so a rejection needs no rollback call: the next `score` starts at the first
rejected position and overwrites it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dfvg.model import Transformer


class TorchVerifier:
    """Eager target model on one device."""

    def __init__(self, model: Transformer):
        self.model = model
        self.device = model.tok_embeddings.weight.device
        self.vocab_size = model.config.vocab_size

    def prefill(self, prompt_ids: list[int], max_seq_len: int) -> None:
        """Allocate the cache and process all prompt tokens but the last."""
        self.model.setup_cache(1, max_seq_len)
        if len(prompt_ids) > 1:
            self.model.feed(prompt_ids[:-1], 0, last_only=True)

    @torch.inference_mode()
    def score(self, tokens: list[int], start_pos: int) -> Tensor:
        """Logits [len(tokens), V] of the token after each of `tokens`."""
        return self.model.feed(tokens, start_pos)
