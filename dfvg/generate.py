"""The one decoding engine: the speculative step and the one loop around it.

One step reads as the algorithm: propose k draft tokens -> verify k+1 positions in one target pass ->
accept a prefix and draw one more token -> commit, and tell the drafter which positions stay valid.
With no drafter the step proposes nothing and acceptance simply samples the target's next token, so plain
decoding and speculative decoding share every line that decides a token.

`decode` is the only decoding loop for one sequence. Every path runs through it: `dfvg generate`,
`dfvg run` (sync and overlap schedules), the benchmarks, distillation's end-to-end check. What differs per
device is the `Step` it is given (propose -> verify -> accept for one block, returning an `Outcome`):
- `HostStep` (here): any drafter (torch, CUDA graphs, the FPGA datapath, an XRT board) proposes on the host's
  behalf; the verifier's `verify` scores and accepts (eager torch, or a captured verify-and-accept graph);
- `dfvg.gpu.fast.DeviceStep`: greedy draft + verify + accept as one CUDA graph replay;
- `dfvg.host.pipeline.OverlapStep`: drafts block n+1 on a worker thread while block n verifies.
`dfvg.engine.make_step` picks one from the device config.

Generation ends at the first EOS token (which is kept in the output, as Hugging Face does) or after exactly
`max_new_tokens` tokens: a step drafts no more than the tokens still missing, minus its bonus token
(`step_length`), and a step that commits past the end is cut (`GenerationResult.commit`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch

from dfvg.devices import synchronize
from dfvg.drafter import DraftBlock, Drafter, device_label
from dfvg.errors import UserError
from dfvg.fallback import DraftFault, take_faults
from dfvg.host.timeline import Timeline
from dfvg.sampling import SamplingParams
from dfvg.stats import (
    StepRecord,
    acceptance_rate,
    accepted_length_histogram,
    mean_accepted_length,
    per_position_acceptance,
    tokens_without_draft,
)
from dfvg.verifier import Verifier

GREEDY = SamplingParams()


@dataclass
class GenerationResult:
    tokens: list[int]  # generated ids only (EOS included when it stopped generation)
    steps: list[StepRecord] = field(default_factory=list)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    stopped_by: str = "max_new_tokens"
    warmup_s: float = 0.0  # one-off graph capture / compilation of this process, never inside tok/s
    faults: list[DraftFault] = field(default_factory=list)  # drafting faults survived (dfvg.fallback)

    @property
    def hit_eos(self) -> bool:
        return self.stopped_by == "eos"

    def commit(self, committed: list[int], eos: set[int], max_new_tokens: int) -> list[int]:
        """Append a step's tokens up to the first EOS (kept; it ends generation) and at most up to
        max_new_tokens in all; returns what was appended."""
        committed = committed[: max_new_tokens - len(self.tokens)]
        stop = next((i for i, token in enumerate(committed) if token in eos), None)
        if stop is not None:
            committed = committed[: stop + 1]
            self.stopped_by = "eos"
        self.tokens += committed
        return committed

    def add_step(self, outcome: Outcome) -> None:
        """Record a step and the drafting faults it took, stamped with its index."""
        for fault in outcome.faults:
            fault.step = len(self.steps)
        self.steps.append(outcome.record())
        self.faults += outcome.faults

    def then(self, rest: GenerationResult) -> GenerationResult:
        """This generation continued by `rest` (decoded from this one's prompt and tokens) as one result;
        rest's prefill of that longer context counts as decode time, since it is inside the request, and
        rest's faults are stamped with their step and time within the whole generation."""
        elapsed = self.prefill_s + self.decode_s
        moved = [replace(f, step=f.step + len(self.steps), at_s=f.at_s + elapsed) for f in rest.faults]
        return GenerationResult(self.tokens + rest.tokens, self.steps + rest.steps, self.prefill_s,
                                self.decode_s + rest.prefill_s + rest.decode_s, rest.stopped_by,
                                self.warmup_s + rest.warmup_s, self.faults + moved)

    def fault_records(self) -> list[dict]:
        """Each fault with the tokens decoded without a draft from its step until the next fault (or the end)."""
        if not self.faults:
            return []
        ends = [f.step for f in self.faults[1:]] + [len(self.steps)]
        return [f.to_dict(tokens_without_draft(self.steps[f.step:end]))
                for f, end in zip(self.faults, ends, strict=True)]

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
            "warmup_s": self.warmup_s,
            "decode_s": self.decode_s,
            "draft_s": sum(s.draft_s for s in self.steps),
            "verify_s": sum(s.verify_s for s in self.steps),
            "modeled_draft_s": sum(modeled) if modeled else None,
            "per_position_acceptance": per_position_acceptance(self.steps),
            "accepted_length_histogram": accepted_length_histogram(self.steps),
            "stopped_by": self.stopped_by,
            "draft_faults": len(self.faults),
            "tokens_without_draft": tokens_without_draft(self.steps),
            "faults": self.fault_records(),
        }


@dataclass
class Outcome:
    """What one step decided: the block as verified, how many drafts the target accepted, its next token."""

    block: DraftBlock
    num_accepted: int
    next_token: int
    verify_s: float
    faults: list[DraftFault] = field(default_factory=list)  # drafting faults taken during this step

    @property
    def committed(self) -> list[int]:
        return self.block.tokens[: self.num_accepted] + [self.next_token]

    def record(self) -> StepRecord:
        b = self.block
        return StepRecord(len(b.tokens), self.num_accepted, b.elapsed_s, self.verify_s, b.modeled_s, b.without_draft)


class Step(Protocol):
    """One device implementation of propose -> verify -> accept (the loop commits). A step that drafts
    through a `dfvg.fallback.GuardedDrafter` hands the faults it took to the loop in its `Outcome`."""

    device: torch.device

    def prefill(self, prompt_ids: list[int], max_seq_len: int) -> None: ...

    def __call__(self, seq: list[int], k: int) -> Outcome: ...


EMPTY = DraftBlock(tokens=[], probs=None, elapsed_s=0.0)


def propose(
    drafter: Drafter | None, seq: list[int], k: int, sampling: SamplingParams, rng: torch.Generator
) -> DraftBlock:
    if drafter is None or k == 0:
        return EMPTY
    return drafter.propose(seq, k, sampling, rng)


class HostStep:
    """The step with the block on the host: the drafter proposes, the verifier verifies and accepts.

    Greedy verification on a graph verifier is one captured verify-and-accept replay fed with the drafts,
    whichever device drafted them (torch, FPGA datapath, board); otherwise target logits come back and
    `accept_block` decides. With a timeline, each stage is recorded as a measured event."""

    def __init__(self, verifier: Verifier, drafter: Drafter | None, sampling: SamplingParams,
                 rng: torch.Generator, timeline: Timeline | None = None,
                 shape: Callable[[DraftBlock], DraftBlock] | None = None):
        self.verifier, self.drafter, self.sampling, self.rng = verifier, drafter, sampling, rng
        self.shape = shape  # e.g. the adaptive policy's cut at low confidence (dfvg.host.pipeline)
        self.device = verifier.device
        self.timeline = timeline
        self.clock = timeline.now if timeline is not None else time.perf_counter
        self.steps = 0

    def prefill(self, prompt_ids: list[int], max_seq_len: int) -> None:
        self.steps = 0
        start = self.clock()
        self.verifier.prefill(prompt_ids, max_seq_len)
        synchronize(self.device)
        verified = self.clock()
        if self.drafter is not None:
            self.drafter.prefill(prompt_ids, max_seq_len)
            synchronize(self.drafter.device)
        if self.timeline is not None:
            self.timeline.record("prefill", str(self.device), start, verified, len(prompt_ids) - 1)
            if self.drafter is not None:
                self.timeline.record("prefill", device_label(self.drafter), verified, self.clock(), len(prompt_ids) - 1)

    def __call__(self, seq: list[int], k: int) -> Outcome:
        start = self.clock()
        block = propose(self.drafter, seq, k, self.sampling, self.rng)
        if self.shape is not None and block.tokens:
            block = self.shape(block)
        verify_start = self.clock()
        num_accepted, next_token = self.verifier.verify(seq, block, self.sampling, self.rng)
        end = self.clock()
        if self.drafter is not None:
            # Positions up to the last accepted draft stay valid; the new last token is not fed yet.
            self.drafter.rollback(len(seq) + num_accepted)
        if self.timeline is not None:
            self._record(start, verify_start, end, block, num_accepted)
        self.steps += 1
        return Outcome(block, num_accepted, next_token, end - verify_start, take_faults(self.drafter))

    def _record(self, start: float, verify_start: float, end: float, block: DraftBlock, num_accepted: int) -> None:
        if block.tokens:  # labelled when drafted: a guarded drafter's device changes after a fault
            self.timeline.record("draft", device_label(self.drafter), start, verify_start, len(block.tokens),
                                 self.steps, modeled_s=block.modeled_s)
        self.timeline.record("verify", str(self.device), verify_start, end, len(block.tokens) + 1, self.steps)


def step_length(k: int, produced: int, max_new_tokens: int) -> int:
    """Drafts for the next step: k, but never more than the tokens still missing minus the bonus token."""
    return max(0, min(k, max_new_tokens - produced - 1))


def max_seq_len(prompt_len: int, max_new_tokens: int, k: int) -> int:
    """Cache positions one generation needs: the last verify may feed k tokens past the end."""
    return prompt_len + max_new_tokens + k + 1


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


def decode(
    step: Step,
    prompt_ids: list[int],
    max_new_tokens: int,
    *,
    k: int,
    eos_ids: tuple[int, ...] | list[int] = (),
    context_limit: int,
    next_k: object = None,
) -> GenerationResult:
    """The decoding loop: prefill, then steps of at most k drafts until EOS or max_new_tokens.

    `next_k` (optional) is an adaptive policy with `.k` and `.update(num_drafted, num_accepted)`: the next
    step's draft length follows it instead of the fixed k (which is then its upper bound)."""
    check_lengths(prompt_ids, max_new_tokens, k, context_limit)
    start = time.perf_counter()
    step.prefill(prompt_ids, max_seq_len(len(prompt_ids), max_new_tokens, k))
    synchronize(step.device)
    result = GenerationResult(tokens=[], prefill_s=time.perf_counter() - start)
    seq, eos = list(prompt_ids), set(eos_ids)
    decode_start = time.perf_counter()
    while len(result.tokens) < max_new_tokens and not result.hit_eos:
        planned = min(next_k.k, k) if next_k is not None else k
        outcome = step(seq, step_length(planned, len(result.tokens), max_new_tokens))
        result.add_step(outcome)
        if next_k is not None:
            next_k.update(len(outcome.block.tokens), outcome.num_accepted)
        seq += result.commit(outcome.committed, eos, max_new_tokens)
    result.decode_s = time.perf_counter() - decode_start
    return result


def generate(
    verifier: Verifier,
    prompt_ids: list[int],
    max_new_tokens: int,
    *,
    eos_ids: tuple[int, ...] | list[int] = (),
    sampling: SamplingParams = GREEDY,
    seed: int = 0,
    drafter: Drafter | None = None,
    draft_length: int = 4,
) -> GenerationResult:
    """Generate up to max_new_tokens after prompt_ids on the host step; speculative when a drafter is given."""
    k = draft_length if drafter is not None else 0
    step = HostStep(verifier, drafter, sampling, torch.Generator().manual_seed(seed))
    return decode(step, prompt_ids, max_new_tokens, k=k, eos_ids=eos_ids,
                  context_limit=verifier.model.config.max_position_embeddings)
