"""The host runtime's schedules around the engine's step: `sync` and `overlap`.

Owns the schedule, not the loop: both run through `dfvg.generate.decode`. `sync` is the engine's `HostStep`
with a timeline (draft block n, verify it, accept; the drafter shares the verifier's generator, so a seeded
run gives `generate`'s tokens). `overlap` is `OverlapStep`: while the target verifies block n on the main
thread, a worker thread already drafts block n+1 on the assumption that block n is fully accepted. The bonus
token that would follow is unknown then, so the worker drafts it too (PEARL-style): it proposes k+1 tokens
after `committed + block n`, the first being its guess of the bonus. When block n is fully accepted and the
bonus equals the guess, the rest is block n+1, ready at once; otherwise it is discarded (its time still
spent) and the drafter is rolled back to the positions that still match.

Lossless in both schedules: every token is decided by the verifier's `verify` (the engine's rule), and a
pre-drafted block is drawn from the drafter's own generator (seeded from the run seed), independent of the
uniforms the verifier draws, so using or discarding it never biases the output distribution. Greedy output
equals plain decoding token for token. A drafter that fails (a guarded one returns an empty block,
`dfvg.fallback`) leaves a step with nothing drafted ahead: that step verifies no drafts.

Does not own: the loop and acceptance (dfvg.generate, dfvg.acceptance), the drafters, the adaptive policy
(dfvg.host.adaptive), projection onto a board (dfvg.host.projection).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from dfvg.devices import synchronize
from dfvg.drafter import DraftBlock, Drafter, device_label
from dfvg.errors import UserError
from dfvg.fallback import take_faults
from dfvg.generate import EMPTY, GREEDY, GenerationResult, HostStep, Outcome, decode
from dfvg.host.adaptive import AdaptiveDraftLength, ConfidenceProbe, block_confidence
from dfvg.host.timeline import Timeline
from dfvg.sampling import SamplingParams
from dfvg.verifier import Verifier
from dfvg.watchdog import in_callers_mode

MODES = ("sync", "overlap")
DRAFT_SEED_OFFSET = 0x9E3779B9  # the drafter's generator in overlap mode: a stream apart from the verifier's


@dataclass
class Drafted:
    """One drafter call: its block, per-token confidence (or None), and measured start/end on the timeline."""

    block: DraftBlock
    confidence: list[float] | None
    start: float
    end: float
    label: str = ""  # the device that drafted it (a guarded drafter's changes after a fault)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


class OverlapStep:
    """The engine's step with block n+1 drafted on a worker thread while block n verifies."""

    def __init__(self, verifier: Verifier, drafter: Drafter, sampling: SamplingParams, rng: torch.Generator,
                 draft_rng: torch.Generator, timeline: Timeline, pool: ThreadPoolExecutor, k: int,
                 max_new_tokens: int, eos: set[int], adaptive: AdaptiveDraftLength | None,
                 probe: ConfidenceProbe | None):
        self.verifier, self.drafter, self.sampling, self.rng = verifier, drafter, sampling, rng
        self.draft_rng, self.timeline, self.pool = draft_rng, timeline, pool
        self.k, self.max_new_tokens, self.eos = k, max_new_tokens, eos
        self.adaptive, self.probe = adaptive, probe
        self.device = verifier.device
        self.verify_label = str(verifier.device)
        self.fed: list[int] = []  # tokens whose K/V the drafter may hold, in order
        self.ready: DraftBlock | None = None  # block n+1, drafted during step n
        self.prompt_len = self.steps = 0

    def prefill(self, prompt_ids: list[int], max_seq_len: int) -> None:
        """Both models take the prompt at once: the drafter on the worker, the target here."""
        tl = self.timeline

        def draft_prefill() -> tuple[float, float]:
            start = tl.now()
            self.drafter.prefill(prompt_ids, max_seq_len)
            synchronize(torch.device(self.drafter.device))
            return start, tl.now()

        self.prompt_len, self.steps, self.ready = len(prompt_ids), 0, None
        begin = tl.now()
        future = self.pool.submit(in_callers_mode(draft_prefill))
        self.verifier.prefill(prompt_ids, max_seq_len)
        synchronize(self.device)
        tl.record("prefill", self.verify_label, begin, tl.now(), len(prompt_ids) - 1)
        draft_start, draft_end = future.result()
        tl.record("prefill", device_label(self.drafter), draft_start, draft_end, len(prompt_ids) - 1)
        self.fed = list(prompt_ids[:-1])

    def __call__(self, seq: list[int], k: int) -> Outcome:
        block = self.ready or self._fresh(seq, k)
        future = self._launch_ahead(seq, block)
        start = self.timeline.now()
        num_accepted, next_token = self.verifier.verify(seq, block, self.sampling, self.rng)
        end = self.timeline.now()  # on failure, the pool joins the worker
        self.timeline.record("verify", self.verify_label, start, end, len(block.tokens) + 1, self.steps)
        self.ready = self._resolve_ahead(future, block, num_accepted, next_token)
        self.steps += 1
        return Outcome(block, num_accepted, next_token, end - start, take_faults(self.drafter))

    def _draft(self, context: list[int], k: int, generator: torch.Generator) -> Drafted:
        """Roll the drafter back to what still matches `context`, then propose k tokens after it.
        Runs on the worker for drafts ahead; the main thread touches the drafter only after joining it."""
        self.drafter.rollback(common_prefix(self.fed, context))
        if self.probe is not None:
            self.probe.clear()
        start, label = self.timeline.now(), device_label(self.drafter)
        block = self.drafter.propose(context, k, self.sampling, generator)
        end = self.timeline.now()
        self.fed = context + block.tokens[:-1]  # a drafter never feeds its own last draft
        return Drafted(block, block_confidence(block, self.probe), start, end, label)

    def _record(self, drafted: Drafted, step: int, speculative: bool = False, discarded: bool = False) -> None:
        if not drafted.block.tokens:  # the drafter failed (dfvg.fallback): the fault has its own event
            return
        self.timeline.record("draft", drafted.label, drafted.start, drafted.end, len(drafted.block.tokens),
                             step, modeled_s=drafted.block.modeled_s, speculative=speculative, discarded=discarded)

    def _shaped(self, drafted: Drafted) -> DraftBlock:
        return drafted.block if self.adaptive is None else self.adaptive.truncate(drafted.block, drafted.confidence)

    def _fresh(self, seq: list[int], k: int) -> DraftBlock:
        if k < 1:
            return EMPTY
        drafted = self._draft(seq, k, self.draft_rng)
        self._record(drafted, self.steps)
        return self._shaped(drafted)

    def _launch_ahead(self, seq: list[int], block: DraftBlock) -> Future | None:
        """Start drafting [bonus guess, *block n+1] after seq + block n, or None when it cannot pay off."""
        remaining = self.max_new_tokens - (len(seq) - self.prompt_len)
        left = remaining - len(block.tokens) - 1  # tokens still missing if block n is fully accepted
        planned = self.adaptive.after(len(block.tokens), len(block.tokens)) if self.adaptive else self.k
        k_next = min(planned, left - 1)
        if k_next < 1 or any(token in self.eos for token in block.tokens):
            return None
        return self.pool.submit(in_callers_mode(self._draft), seq + block.tokens, k_next + 1, self.draft_rng)

    def _resolve_ahead(self, future: Future | None, block: DraftBlock, num_accepted: int,
                       next_token: int) -> DraftBlock | None:
        """Join the worker; block n+1 when block n was fully accepted and the bonus was guessed, else None."""
        if future is None:
            return None
        drafted = future.result()
        if not drafted.block.tokens:  # the drafter failed (dfvg.fallback): nothing was drafted ahead
            return None
        guess, ahead = drafted.block.tokens[0], drafted.block
        hit = num_accepted == len(block.tokens) and next_token == guess
        self._record(drafted, self.steps + 1, speculative=True, discarded=not hit)
        if not hit:
            return None
        rest = DraftBlock(ahead.tokens[1:], None if ahead.probs is None else ahead.probs[1:], ahead.elapsed_s,
                          ahead.modeled_s)
        confidence = None if drafted.confidence is None else drafted.confidence[1:]
        return self._shaped(Drafted(rest, confidence, drafted.start, drafted.end, drafted.label))


def adaptive_shape(adaptive: AdaptiveDraftLength | None, probe: ConfidenceProbe | None):
    """The sync schedule's cut of a block at low draft confidence (None without an adaptive policy)."""
    if adaptive is None:
        return None

    def shape(block: DraftBlock) -> DraftBlock:
        confidence = block_confidence(block, probe)
        if probe is not None:
            probe.clear()
        return adaptive.truncate(block, confidence)

    return shape


def run_pipeline(
    verifier: Verifier,
    drafter: Drafter,
    prompt_ids: list[int],
    max_new_tokens: int,
    *,
    eos_ids: tuple[int, ...] | list[int] = (),
    sampling: SamplingParams = GREEDY,
    seed: int = 0,
    draft_length: int = 4,
    mode: str = "sync",
    adaptive: AdaptiveDraftLength | None = None,
    timeline: Timeline | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> GenerationResult:
    """Speculative generation in the `sync` or `overlap` schedule; events go to `timeline` when given.

    `clock` times a run without a timeline; a given timeline brings its own clock. With `adaptive`, the
    draft length follows the policy (starting from its own k) instead of the fixed `draft_length`.
    """
    if mode not in MODES:
        raise UserError(f"pipeline mode must be one of {', '.join(MODES)}, got {mode!r}")
    if drafter is None:
        raise UserError("run_pipeline needs a drafter; use dfvg.generate.generate for plain decoding")
    if draft_length < 1 and adaptive is None:
        raise UserError(f"draft_length must be >= 1 for speculative decoding, got {draft_length}")
    k_max = adaptive.k_max if adaptive is not None else draft_length
    timeline = timeline if timeline is not None else Timeline(clock)
    rng = torch.Generator().manual_seed(seed)
    probe = ConfidenceProbe(drafter) if adaptive is not None and adaptive.threshold is not None else None
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dfvg-draft") as pool, probe or nullcontext():
        if mode == "sync":
            step = HostStep(verifier, drafter, sampling, rng, timeline, adaptive_shape(adaptive, probe))
        else:
            draft_rng = torch.Generator().manual_seed(seed + DRAFT_SEED_OFFSET)
            step = OverlapStep(verifier, drafter, sampling, rng, draft_rng, timeline, pool, draft_length,
                               max_new_tokens, set(eos_ids), adaptive, probe)
        return decode(step, prompt_ids, max_new_tokens, k=k_max, eos_ids=eos_ids,
                      context_limit=verifier.model.config.max_position_embeddings, next_k=adaptive)
