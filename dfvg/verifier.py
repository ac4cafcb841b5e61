"""The target side of speculative decoding: prefill the prompt, then verify a draft block per step.

`Verifier` is the interface the engine's step calls; `TorchVerifier` runs DFVG's own `Transformer` eagerly
on any torch device (`dfvg.gpu.graphs.GraphVerifier` is the CUDA-graph implementation). The target's cache holds every
committed token except the last one; each `score` call feeds that last token followed by the draft block,
at absolute positions, so a rejection needs no rollback call: the next `score` starts at the first
rejected position and overwrites it.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from dfvg.acceptance import accept_block
from dfvg.devices import synchronize
from dfvg.drafter import DraftBlock
from dfvg.model import Transformer
from dfvg.sampling import SamplingParams


class Verifier(Protocol):
    model: Transformer
    device: torch.device
    vocab_size: int

    def prefill(self, prompt_ids: list[int], max_seq_len: int) -> None: ...

    def score(self, tokens: list[int], start_pos: int) -> Tensor: ...

    def verify(self, seq: list[int], block: DraftBlock, sampling: SamplingParams,
               rng: torch.Generator) -> tuple[int, int]: ...


class TorchVerifier:
    """Eager target model on one device."""

    def __init__(self, model: Transformer):
        self.model = model
        self.device = model.tok_embeddings.weight.device
        self.vocab_size = model.config.vocab_size
        # Set by a feature-level drafter (dfvg.feature_head): then every pass also writes its final-norm
        # outputs into `features` [max_seq_len, D] by position. Like the KV cache, positions below the
        # committed length hold the committed tokens' values (a rejected row is overwritten by the next pass).
        self.keep_features = False
        self.features: Tensor | None = None
        self.features_end = 0  # one past the last position written

    def prefill(self, prompt_ids: list[int], max_seq_len: int) -> None:
        """Allocate the cache and process all prompt tokens but the last."""
        self.model.setup_cache(1, max_seq_len)
        if self.keep_features:
            width = self.model.config.hidden_size
            if self.features is None or self.features.shape[0] < max_seq_len:
                self.features = torch.zeros(max_seq_len, width, dtype=self.model.norm.weight.dtype, device=self.device)
            self.features_end = 0
        if len(prompt_ids) > 1 and self.keep_features:
            self._hidden(prompt_ids[:-1], 0)
        elif len(prompt_ids) > 1:
            self.model.feed(prompt_ids[:-1], 0, last_only=True)

    @torch.inference_mode()
    def score(self, tokens: list[int], start_pos: int) -> Tensor:
        """Logits [len(tokens), V] of the token after each of `tokens`."""
        if not self.keep_features:
            return self.model.feed(tokens, start_pos)
        return self.model.logits(self._hidden(tokens, start_pos))

    def _hidden(self, tokens: list[int], start_pos: int) -> Tensor:
        """The last layer's outputs [T, D] for tokens at start_pos..; writes their final-norm values (the
        features a feature head reads: what the LM head reads) at their positions."""
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        positions = torch.arange(start_pos, start_pos + len(tokens), device=self.device)[None]
        hidden = self.model.run_layers(self.model.embed(ids), positions)[0]
        self.store_features(hidden, start_pos)
        return hidden

    def store_features(self, hidden: Tensor, start_pos: int) -> None:
        """The final-norm values of last-layer rows hidden [T, D] as the features of positions start_pos..
        (a tree verify stores its root's and accepted path's rows so, dfvg.tree_step)."""
        self.features[start_pos: start_pos + hidden.shape[0]] = self.model.norm(hidden)
        self.features_end = start_pos + hidden.shape[0]

    def verify(self, seq: list[int], block: DraftBlock, sampling: SamplingParams,
               rng: torch.Generator) -> tuple[int, int]:
        """Score [last committed, *drafts] at their positions and accept: (drafts accepted, next token)."""
        return verify_on_host(self, seq, block, sampling, rng)


def verify_on_host(verifier: Verifier, seq: list[int], block: DraftBlock, sampling: SamplingParams,
                   rng: torch.Generator) -> tuple[int, int]:
    """The general verify: target logits [k+1, V] come back and `accept_block` decides (any sampling)."""
    target_logits = verifier.score([seq[-1], *block.tokens], start_pos=len(seq) - 1)  # [k+1, V]
    outcome = accept_block(block.tokens, block.probs, target_logits, sampling, rng)
    synchronize(verifier.device)
    return outcome
