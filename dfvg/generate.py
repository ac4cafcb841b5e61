"""Decoding: chain speculative decoding, and plain autoregressive decoding as its k = 0 case.

One step reads as the algorithm: propose k draft tokens -> verify k+1 positions in one target pass ->
accept a prefix and draw one more token -> commit, and tell the drafter which positions stay valid.
With no drafter the step proposes nothing and `accept` simply samples the target's next token, so plain
decoding and speculative decoding share every line that decides a token.

Generation ends at the first EOS token (which is kept in the output, as Hugging Face does) or after exactly
`max_new_tokens` tokens: the last step drafts no more than the tokens still missing, minus its bonus token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from dfvg.acceptance import accept
from dfvg.devices import synchronize
from dfvg.drafter import DraftBlock, Drafter
from dfvg.errors import UserError
from dfvg.sampling import SamplingParams, processed_probs
from dfvg.stats import (
    StepRecord,
    acceptance_rate,
    accepted_length_histogram,
    mean_accepted_length,
    per_position_acceptance,
)
from dfvg.verifier import TorchVerifier

GREEDY = SamplingParams()


@dataclass
class GenerationResult:
    tokens: list[int]  # generated ids only (EOS included when it stopped generation)
    steps: list[StepRecord] = field(default_factory=list)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    stopped_by: str = "max_new_tokens"

    @property
    def hit_eos(self) -> bool:
        return self.stopped_by == "eos"

    def commit(self, committed: list[int], eos: set[int]) -> list[int]:
        """Append a step's tokens up to and including the first EOS (which ends generation); returns them."""
        stop = next((i for i, token in enumerate(committed) if token in eos), None)
        if stop is not None:
            committed = committed[: stop + 1]
            self.stopped_by = "eos"
        self.tokens += committed
        return committed

    def stats(self) -> dict:
        """The canonical metrics of this generation (see dfvg/stats.py for definitions)."""
        total_s = self.prefill_s + self.decode_s
        modeled = [s.modeled_draft_s for s in self.steps if s.modeled_draft_s is not None]
        return {
            "acceptance_rate": acceptance_rate(self.steps),
            "mean_accepted_length": mean_accepted_length(self.steps),
            "mean_accepted_length_counts_bonus": True,
            "num_verify_steps": len(self.steps),
            "num_draft_tokens": sum(s.num_drafted for s in self.steps),
            "num_accepted_tokens": sum(s.num_accepted for s in self.steps),
            "num_new_tokens": len(self.tokens),
            "tokens_per_second": len(self.tokens) / total_s if total_s > 0 else 0.0,
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            "draft_s": sum(s.draft_s for s in self.steps),
            "verify_s": sum(s.verify_s for s in self.steps),
            "modeled_draft_s": sum(modeled) if modeled else None,
            "per_position_acceptance": per_position_acceptance(self.steps),
            "accepted_length_histogram": accepted_length_histogram(self.steps),
            "stopped_by": self.stopped_by,
        }


def propose(
    drafter: Drafter | None, seq: list[int], k: int, sampling: SamplingParams, rng: torch.Generator
) -> DraftBlock:
    if drafter is None or k == 0:
        return DraftBlock(tokens=[], probs=None, elapsed_s=0.0)
    return drafter.propose(seq, k, sampling, rng)


def accept_block(
    block: DraftBlock, target_logits: torch.Tensor, sampling: SamplingParams, rng: torch.Generator
) -> tuple[int, int]:
    """Accept a prefix of the block against the target's logits [k+1, V]; draws k+1 uniforms from rng."""
    target_probs = processed_probs(target_logits, sampling)
    draft_probs = None if block.probs is None else block.probs.to(target_probs.device)
    uniforms = torch.rand(len(block.tokens) + 1, generator=rng)
    draft_tokens = torch.tensor(block.tokens, dtype=torch.long)
    return accept(draft_tokens, draft_probs, target_probs, uniforms)


def speculative_step(
    verifier: TorchVerifier,
    drafter: Drafter | None,
    seq: list[int],
    k: int,
    sampling: SamplingParams,
    rng: torch.Generator,
) -> tuple[list[int], StepRecord]:
    """One propose -> verify -> accept -> commit step; returns the committed tokens and its record."""
    block = propose(drafter, seq, k, sampling, rng)
    verify_start = time.perf_counter()
    target_logits = verifier.score([seq[-1], *block.tokens], start_pos=len(seq) - 1)  # [k+1, V]
    num_accepted, next_token = accept_block(block, target_logits, sampling, rng)
    synchronize(verifier.device)
    verify_s = time.perf_counter() - verify_start
    committed = block.tokens[:num_accepted] + [next_token]
    if drafter is not None:
        # Positions up to the last accepted draft stay valid; the new last token is not fed yet.
        drafter.rollback(len(seq) + num_accepted)
    record = StepRecord(len(block.tokens), num_accepted, block.elapsed_s, verify_s, block.modeled_s)
    return committed, record


def check_lengths(prompt_ids: list[int], max_new_tokens: int, draft_length: int, limit: int) -> None:
    if not prompt_ids:
        raise UserError("the prompt is empty; give at least one token")
    if max_new_tokens < 1:
        raise UserError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if draft_length < 0:
        raise UserError(f"draft_length must be >= 0, got {draft_length}")
    if len(prompt_ids) + max_new_tokens > limit:
        raise UserError(
            f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's "
            f"context of {limit} positions; shorten the prompt or lower max_new_tokens"
        )


def generate(
    verifier: TorchVerifier,
    prompt_ids: list[int],
    max_new_tokens: int,
    *,
    eos_ids: tuple[int, ...] | list[int] = (),
    sampling: SamplingParams = GREEDY,
    seed: int = 0,
    drafter: Drafter | None = None,
    draft_length: int = 4,
) -> GenerationResult:
    """Generate up to max_new_tokens after prompt_ids; speculative when a drafter is given."""
    k = draft_length if drafter is not None else 0
    check_lengths(prompt_ids, max_new_tokens, k, verifier.model.config.max_position_embeddings)
    rng = torch.Generator().manual_seed(seed)
    max_seq_len = len(prompt_ids) + max_new_tokens + k + 1  # the last verify may feed k tokens past the end
    start = time.perf_counter()
    verifier.prefill(prompt_ids, max_seq_len)
    if drafter is not None:
        drafter.prefill(prompt_ids, max_seq_len)
    synchronize(verifier.device)
    result = GenerationResult(tokens=[], prefill_s=time.perf_counter() - start)
    seq, eos = list(prompt_ids), set(eos_ids)
    decode_start = time.perf_counter()
    while len(result.tokens) < max_new_tokens:
        step_k = min(k, max_new_tokens - len(result.tokens) - 1)
        committed, record = speculative_step(verifier, drafter, seq, step_k, sampling, rng)
        result.steps.append(record)
        seq += result.commit(committed, eos)
        if result.hit_eos:
            break
    result.decode_s = time.perf_counter() - decode_start
    return result
