"""Batched speculative decoding: several prompts, one drafter each, ONE target forward per step for all.

Owns the batch loop. Each active sequence drafts its own block (its own drafter, its own draft length when
it is near its end), then the target scores every active row in one forward: row b feeds
[last committed, *block_b] at its own absolute positions (input_pos [B, T]) and is right-padded to the
longest row. The acceptance rule (dfvg.acceptance.accept_block) then runs per row, so rows accept different
numbers of tokens and each stays exactly as lossless as single-sequence decoding.

Why the padding is harmless (dfvg/model.py semantics): K/V of a token is written at its position, and a query
at position p attends to positions <= p. A pad of row b sits after that row's last real token, at positions
no valid token of row b holds (they hold only stale drafts); nothing of row b attends to it in this forward
(every real query is earlier), and the next step feeds row b from its first uncommitted position on,
overwriting the pad before any query can reach it. The cache is sized so the pads stay inside it.

A finished sequence (EOS or max_new_tokens) leaves the batch: the cache rows of the remaining sequences are
compacted to the front, because the model maps input row i to cache row i. With no drafters (`None` per row)
the same loop is batched plain decoding, so plain and speculative compare at the same batch size.

Every rule that decides a row's step comes from the engine (`dfvg.generate`): the step length
(`step_length`), the cache size (`max_seq_len`), the step record (`GenerationResult.add_step`), the commit
with its EOS and length cut (`GenerationResult.commit`) and the drafter's rollback position. A row whose
drafter is guarded (`dfvg.engine.Engine.guard(d, fallbacks=False)`) survives its drafter's faults like a
single sequence: that row verifies no drafts from then on (its own generator untouched), the others go on.

Does not own: the single-sequence schedules (dfvg.host.pipeline), acceptance, the drafters.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dfvg.acceptance import accept_block
from dfvg.devices import synchronize
from dfvg.drafter import DraftBlock, Drafter
from dfvg.errors import UserError
from dfvg.fallback import take_faults
from dfvg.generate import GREEDY, GenerationResult, Outcome, check_lengths, max_seq_len, propose, step_length
from dfvg.host.timeline import Timeline
from dfvg.model import Transformer
from dfvg.sampling import SamplingParams
from dfvg.verifier import TorchVerifier


@dataclass
class Row:
    """One sequence of the batch."""

    index: int  # position in the caller's prompt list
    drafter: Drafter | None  # None: plain decoding of this row
    rng: torch.Generator
    seq: list[int]
    result: GenerationResult
    done: bool = False


def padded_inputs(rows: list[Row], blocks: list[DraftBlock], device: torch.device) -> tuple[torch.Tensor, ...]:
    """ids, positions [B, T] for one batched verify; row b = [seq[-1], *block_b] then pads.

    Example: seq lengths 10 and 7, blocks of 2 and 0 -> T = 3; row 0 feeds positions 9, 10, 11; row 1 feeds
    position 6 and pads at 7, 8 (beyond its last real token, overwritten when it gets there).
    """
    width = max(len(b.tokens) for b in blocks) + 1
    ids, positions = [], []
    for row, block in zip(rows, blocks, strict=True):
        real = [row.seq[-1], *block.tokens]
        ids.append(real + [real[-1]] * (width - len(real)))
        start = len(row.seq) - 1
        positions.append(list(range(start, start + width)))
    as_tensor = lambda values: torch.tensor(values, dtype=torch.long, device=device)  # noqa: E731
    return as_tensor(ids), as_tensor(positions)


def compact_cache(model: Transformer, keep: list[int]) -> None:
    """Move cache rows `keep` (in order) to rows 0..len(keep)-1 of every layer's K/V."""
    index = torch.tensor(keep, dtype=torch.long, device=model.tok_embeddings.weight.device)
    for layer in model.layers:
        cache = layer.attention.kv_cache
        cache.k[: len(keep)] = cache.k[index]  # advanced indexing copies first: no overlap hazard
        cache.v[: len(keep)] = cache.v[index]


@torch.inference_mode()
def batched_prefill(model: Transformer, prompts: list[list[int]]) -> None:
    """All prompts but their last token in one forward, right-padded (pads sit past each prompt)."""
    width = max(len(p) for p in prompts) - 1
    if width == 0:
        return
    device = model.tok_embeddings.weight.device
    ids = [p[:-1] + [p[0]] * (width - len(p) + 1) for p in prompts]
    ids_t = torch.tensor(ids, dtype=torch.long, device=device)
    positions = torch.arange(width, device=device).expand(len(prompts), width)
    model(ids_t, positions, last_only=True)


@torch.inference_mode()
def batched_verify(verifier: TorchVerifier, rows: list[Row], blocks: list[DraftBlock]) -> torch.Tensor:
    ids, positions = padded_inputs(rows, blocks, verifier.device)
    return verifier.model(ids, positions)  # [B, T, V]


def commit_row(row: Row, outcome: Outcome, eos: set[int], max_new_tokens: int) -> None:
    if row.drafter is not None:
        row.drafter.rollback(len(row.seq) + outcome.num_accepted)  # the engine's contract, as in HostStep
    row.result.add_step(outcome)
    row.seq += row.result.commit(outcome.committed, eos, max_new_tokens)
    row.done = row.result.hit_eos or len(row.result.tokens) >= max_new_tokens


def batch_step(verifier: TorchVerifier, rows: list[Row], k: int, sampling: SamplingParams, eos: set[int],
               max_new_tokens: int, timeline: Timeline, step: int) -> None:
    """Propose per row, verify all rows in one forward, accept and commit per row."""
    blocks = []
    for row in rows:
        start = timeline.now()
        row_k = step_length(k, len(row.result.tokens), max_new_tokens)
        blocks.append(propose(row.drafter, row.seq, row_k, sampling, row.rng))
        if blocks[-1].tokens:
            timeline.record("draft", str(row.drafter.device), start, timeline.now(), len(blocks[-1].tokens), step)
    start = timeline.now()
    logits = batched_verify(verifier, rows, blocks)  # [B, T, V]
    synchronize(verifier.device)
    scored = timeline.now()
    timeline.record("verify", str(verifier.device), start, scored, sum(len(b.tokens) + 1 for b in blocks), step)
    outcomes = [accept_block(b.tokens, b.probs, logits[i, : len(b.tokens) + 1], sampling, row.rng)
                for i, (row, b) in enumerate(zip(rows, blocks, strict=True))]
    end = timeline.now()
    timeline.record("accept", str(verifier.device), scored, end, sum(a + 1 for a, _ in outcomes), step)
    for row, block, (num_accepted, next_token) in zip(rows, blocks, outcomes, strict=True):
        commit_row(row, Outcome(block, num_accepted, next_token, end - start, take_faults(row.drafter)), eos,
                   max_new_tokens)


def make_rows(drafters: Sequence[Drafter | None] | Callable[[], Drafter], prompts: list[list[int]],
              seed: int) -> list[Row]:
    chosen = [drafters() for _ in prompts] if callable(drafters) else list(drafters)
    if len(chosen) != len(prompts):
        raise UserError(f"run_batch needs one drafter per prompt: {len(chosen)} drafters for {len(prompts)} prompts")
    real = [d for d in chosen if d is not None]
    models = [getattr(d, "model", None) for d in real]  # a guarded drafter whose drafters all failed has none
    if len({id(d if m is None else m) for d, m in zip(real, models, strict=True)}) != len(real):
        raise UserError("run_batch drafters must not share a model (each keeps its own KV cache); "
                        "pass a drafter_factory that loads one model per sequence")
    return [Row(i, d, torch.Generator().manual_seed(seed + i), list(p), GenerationResult(tokens=[]))
            for i, (d, p) in enumerate(zip(chosen, prompts, strict=True))]


def run_batch(
    verifier: TorchVerifier,
    drafters: Sequence[Drafter | None] | Callable[[], Drafter],
    prompts: list[list[int]],
    max_new_tokens: int,
    *,
    eos_ids: tuple[int, ...] | list[int] = (),
    sampling: SamplingParams = GREEDY,
    seed: int = 0,
    draft_length: int = 4,
    timeline: Timeline | None = None,
) -> list[GenerationResult]:
    """Speculative decoding of several prompts at once; one GenerationResult per prompt, in prompt order.

    `drafters`: one drafter per prompt (None for all: batched plain decoding), or a factory called once per
    prompt. Sequence i samples with seed + i.
    prefill_s / decode_s of each result are the batch's (shared) wall-clock times.
    """
    if not prompts:
        raise UserError("run_batch needs at least one prompt")
    for prompt in prompts:
        check_lengths(prompt, max_new_tokens, draft_length, verifier.model.config.max_position_embeddings)
    timeline = timeline if timeline is not None else Timeline()
    rows = make_rows(drafters, prompts, seed)
    k = draft_length if any(row.drafter is not None for row in rows) else 0
    cache_len = max_seq_len(max(len(p) for p in prompts), max_new_tokens, k)
    start = time.perf_counter()
    verifier.model.setup_cache(len(prompts), cache_len)
    t0 = timeline.now()
    batched_prefill(verifier.model, prompts)
    for row in rows:
        if row.drafter is not None:
            row.drafter.prefill(row.seq, cache_len)
    synchronize(verifier.device)
    timeline.record("prefill", str(verifier.device), t0, timeline.now(), sum(len(p) - 1 for p in prompts))
    prefill_s, decode_start = time.perf_counter() - start, time.perf_counter()
    active, step = rows, 0
    while active:
        batch_step(verifier, active, k, sampling, set(eos_ids), max_new_tokens, timeline, step)
        keep = [i for i, row in enumerate(active) if not row.done]
        if len(keep) < len(active) and keep:
            compact_cache(verifier.model, keep)
        active, step = [active[i] for i in keep], step + 1
    decode_s = time.perf_counter() - decode_start
    for row in rows:
        row.result.prefill_s, row.result.decode_s = prefill_s, decode_s
    return [row.result for row in rows]
