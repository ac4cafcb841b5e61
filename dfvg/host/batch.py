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

Two implementations of the batch's step (`BatchStep`): `HostBatchStep` (above: any drafter, any sampling,
eager batched forward) and `DeviceBatchStep` (greedy on graph models: the whole step of every row is one CUDA
graph replay of `dfvg.gpu.fast.DeviceRows`, the same body the single-sequence device step replays).

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
from typing import Protocol

import torch

from dfvg.acceptance import accept_block
from dfvg.devices import synchronize
from dfvg.drafter import DraftBlock, Drafter
from dfvg.errors import UserError
from dfvg.fallback import GuardedDrafter, take_faults
from dfvg.generate import GREEDY, GenerationResult, Outcome, check_lengths, max_seq_len, propose, step_length
from dfvg.gpu.fast import DeviceRows
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
    for store in model.kv_store:  # [2, B, S, kv_heads, hd] a layer: its K and V at once, a layer's worth of
        store[:, : len(keep)] = store[:, index]  # temporary (advanced indexing copies first: no overlap hazard)


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


class BatchStep(Protocol):
    """One implementation of a batch's step: every active row proposes, is verified and accepted."""

    device: torch.device

    def prefill(self, rows: list[Row], cache_len: int) -> None: ...

    def __call__(self, rows: list[Row], k: int, max_new_tokens: int, step: int) -> list[Outcome]: ...

    def leave(self, rows: list[Row], keep: list[int]) -> None: ...


class HostBatchStep:
    """Per-row drafters propose on the host; one eager batched target forward; `accept_block` per row.
    Any drafter and any sampling; finished rows leave by compacting the target's cache."""

    def __init__(self, verifier: TorchVerifier, sampling: SamplingParams, timeline: Timeline):
        self.verifier, self.sampling, self.timeline = verifier, sampling, timeline
        self.device = verifier.device

    def prefill(self, rows: list[Row], cache_len: int) -> None:
        real = [row.drafter for row in rows if row.drafter is not None]
        models = [getattr(d, "model", None) for d in real]  # a guarded drafter whose drafters all failed has none
        if len({id(d if m is None else m) for d, m in zip(real, models, strict=True)}) != len(real):
            raise UserError("run_batch drafters must not share a model (each keeps its own KV cache); "
                            "pass a drafter_factory that loads one model per sequence")
        self.verifier.model.setup_cache(len(rows), cache_len)
        batched_prefill(self.verifier.model, [row.seq for row in rows])
        for row in rows:
            if row.drafter is not None:
                row.drafter.prefill(row.seq, cache_len)

    def __call__(self, rows: list[Row], k: int, max_new_tokens: int, step: int) -> list[Outcome]:
        timeline, blocks = self.timeline, []
        for row in rows:
            start = timeline.now()
            row_k = step_length(k, len(row.result.tokens), max_new_tokens)
            blocks.append(propose(row.drafter, row.seq, row_k, self.sampling, row.rng))
            if blocks[-1].tokens:
                timeline.record("draft", str(row.drafter.device), start, timeline.now(), len(blocks[-1].tokens), step)
        start = timeline.now()
        logits = batched_verify(self.verifier, rows, blocks)  # [B, T, V]
        synchronize(self.device)
        scored = timeline.now()
        timeline.record("verify", str(self.device), start, scored, sum(len(b.tokens) + 1 for b in blocks), step)
        decided = [accept_block(b.tokens, b.probs, logits[i, : len(b.tokens) + 1], self.sampling, row.rng)
                   for i, (row, b) in enumerate(zip(rows, blocks, strict=True))]
        end = timeline.now()
        timeline.record("accept", str(self.device), scored, end, sum(a + 1 for a, _ in decided), step)
        return [Outcome(block, num, nxt, end - start, take_faults(row.drafter))
                for row, block, (num, nxt) in zip(rows, blocks, decided, strict=True)]

    def leave(self, rows: list[Row], keep: list[int]) -> None:
        compact_cache(self.verifier.model, keep)


class DeviceBatchStep:
    """Greedy batch on the device: `DeviceRows` drafts, verifies and accepts every row in one graph replay.

    Rows keep their slot (their index in the batch) for the whole batch; a finished row is retired in place
    (it stops advancing) rather than compacted, because the captured graph has one shape. The replay is a
    proposal of the guarded drafter (`dfvg.fallback`): when it raises or misses the watchdog's deadline, the
    rows still decoding are compacted to the front of the target's cache and the rest of the batch runs on
    `HostBatchStep` with the target alone (greedy, so every row keeps plain decoding's tokens)."""

    def __init__(self, rows: DeviceRows, timeline: Timeline, guard: GuardedDrafter | None = None):
        self.rows, self.timeline, self.guard, self.device = rows, timeline, guard, rows.device
        self.host: HostBatchStep | None = None  # after a fault: the rest of this batch

    def prefill(self, rows: list[Row], cache_len: int) -> None:
        prompts = [row.seq for row in rows]
        self.host = None
        if self.guard is not None:  # watched: a draft device that fails to start is a fault like any other
            self.guard.prefill(prompts[0], cache_len)
        for holder in self.rows.holders():
            holder.gm.ensure_cache(max(cache_len, holder.min_cache_len), len(rows))
            batched_prefill(holder.model, prompts)
        self.rows.start(prompts)
        if self.guard is not None and self.guard.live is not self.rows.drafter:
            self._to_host(rows)

    def __call__(self, rows: list[Row], k: int, max_new_tokens: int, step: int) -> list[Outcome]:
        if self.host is None:
            start = self.timeline.now()
            ok, records = self.guard.run(self.rows.replay) if self.guard is not None else (True, self.rows.replay())
            if ok:
                end = self.timeline.now()
                self.timeline.record("verify", str(self.device), start, end, len(rows) * (self.rows.k + 1), step)
                faults = take_faults(self.guard)  # charged to the first row, so each is counted once
                return [Outcome(DraftBlock(drafts, None, 0.0), num, nxt, end - start, faults if i == 0 else [])
                        for i, (num, nxt, *drafts) in enumerate(records[row.index] for row in rows)]
            self._to_host(rows)
        outcomes = self.host(rows, k, max_new_tokens, step)
        outcomes[0].faults = outcomes[0].faults + take_faults(self.guard)
        return outcomes

    def _to_host(self, rows: list[Row]) -> None:
        """The remaining rows go to the host step with no drafter: their cache rows move to the front."""
        compact_cache(self.rows.verifier.model, [row.index for row in rows])
        for row in rows:
            row.drafter = None
        self.host = HostBatchStep(self.rows.verifier, GREEDY, self.timeline)

    def leave(self, rows: list[Row], keep: list[int]) -> None:
        if self.host is not None:
            self.host.leave(rows, keep)
            return
        for i, row in enumerate(rows):
            if i not in keep:
                self.rows.retire(row.index)


def make_rows(drafters: Sequence[Drafter | None] | Callable[[], Drafter], prompts: list[list[int]],
              seed: int) -> list[Row]:
    chosen = [drafters() for _ in prompts] if callable(drafters) else list(drafters)
    if len(chosen) != len(prompts):
        raise UserError(f"run_batch needs one drafter per prompt: {len(chosen)} drafters for {len(prompts)} prompts")
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
    device_rows: DeviceRows | None = None,
    guard: GuardedDrafter | None = None,
) -> list[GenerationResult]:
    """Speculative decoding of several prompts at once; one GenerationResult per prompt, in prompt order.

    `drafters`: one drafter per prompt (None for all: batched plain decoding), or a factory called once per
    prompt. Sequence i samples with seed + i. With `device_rows` (greedy, graph models; chosen by
    `dfvg.engine.Engine.decode_batch`) every step is one graph replay; the rows then draft with its drafter.
    prefill_s / decode_s of each result are the batch's (shared) wall-clock times.
    """
    if not prompts:
        raise UserError("run_batch needs at least one prompt")
    for prompt in prompts:
        check_lengths(prompt, max_new_tokens, draft_length, verifier.model.config.max_position_embeddings)
    timeline = timeline if timeline is not None else Timeline()
    rows = make_rows(drafters, prompts, seed)
    k = draft_length if any(row.drafter is not None for row in rows) else 0
    batch = DeviceBatchStep(device_rows, timeline, guard) if device_rows is not None else \
        HostBatchStep(verifier, sampling, timeline)
    start = time.perf_counter()
    t0 = timeline.now()
    batch.prefill(rows, max_seq_len(max(len(p) for p in prompts), max_new_tokens, k))
    synchronize(verifier.device)
    timeline.record("prefill", str(verifier.device), t0, timeline.now(), sum(len(p) - 1 for p in prompts))
    prefill_s, decode_start = time.perf_counter() - start, time.perf_counter()
    active, step, eos = rows, 0, set(eos_ids)
    while active:
        for row, outcome in zip(active, batch(active, k, max_new_tokens, step), strict=True):
            commit_row(row, outcome, eos, max_new_tokens)
        keep = [i for i, row in enumerate(active) if not row.done]
        if len(keep) < len(active) and keep:
            batch.leave(active, keep)
        active, step = [active[i] for i in keep], step + 1
    decode_s = time.perf_counter() - decode_start
    for row in rows:
        row.result.prefill_s, row.result.decode_s = prefill_s, decode_s
    return [row.result for row in rows]
