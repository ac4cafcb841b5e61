"""The host runtime's decoding loop: chain speculative decoding in `sync` or `overlap` schedule.

Owns: the schedule. `sync` is dfvg.generate's loop (draft block n, verify it, accept, commit; the drafter shares
the verifier's generator, so a seeded run gives generate's tokens). `overlap` really runs the two models at
the same time: while the target verifies block n on the main thread, a worker thread already drafts block
n+1 on the assumption that block n is fully accepted. The bonus token that would follow is unknown then, so
the worker drafts it too (PEARL-style): it proposes k+1 tokens after `committed + block n`, the first being
its guess of the bonus. When block n is fully accepted and the bonus equals the guess, the rest is block
n+1, ready at once; otherwise it is discarded (its time still spent) and the drafter is rolled back to the
positions that still match.

Lossless in both schedules: every token is decided by dfvg.generate.accept_block (the engine's rule), and a
pre-drafted block is drawn from the drafter's own generator (seeded from the run seed), independent of the
uniforms the verifier draws, so using or discarding it never biases the output distribution. Greedy output
equals plain decoding token for token.

Does not own: acceptance (dfvg.acceptance via dfvg.generate), the drafters, the adaptive policy
(dfvg.host.adaptive), projection onto a board (dfvg.host.projection).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import torch

from dfvg.devices import synchronize
from dfvg.drafter import DraftBlock, Drafter
from dfvg.errors import UserError
from dfvg.generate import GREEDY, GenerationResult, accept_block, check_lengths
from dfvg.host.adaptive import AdaptiveDraftLength, ConfidenceProbe, block_confidence
from dfvg.host.timeline import Timeline
from dfvg.sampling import SamplingParams
from dfvg.stats import StepRecord
from dfvg.verifier import TorchVerifier

MODES = ("sync", "overlap")
DRAFT_SEED_OFFSET = 0x9E3779B9  # the drafter's generator in overlap mode: a stream apart from the verifier's
EMPTY = DraftBlock(tokens=[], probs=None, elapsed_s=0.0)


@dataclass
class Drafted:
    """One drafter call: its block, per-token confidence (or None), and measured start/end on the timeline."""

    block: DraftBlock
    confidence: list[float] | None
    start: float
    end: float


@dataclass
class Run:
    """The state of one generation, shared by the schedule's steps (only the main thread mutates it)."""

    verifier: TorchVerifier
    drafter: Drafter
    sampling: SamplingParams
    rng: torch.Generator  # the verifier's uniforms (and, in sync mode, the drafter's too)
    draft_rng: torch.Generator
    timeline: Timeline
    k: int
    adaptive: AdaptiveDraftLength | None
    probe: ConfidenceProbe | None
    eos: set[int]
    max_new_tokens: int
    seq: list[int]
    result: GenerationResult
    draft_device: str
    verify_device: str
    fed: list[int] = field(default_factory=list)  # tokens whose K/V the drafter may hold, in order

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.result.tokens)

    @property
    def step(self) -> int:
        return len(self.result.steps)

    def planned_k(self) -> int:
        return self.adaptive.k if self.adaptive is not None else self.k

    def k_if_accepted(self, num_drafted: int) -> int:
        """The draft length the next step gets if this block of num_drafted is fully accepted."""
        return self.adaptive.after(num_drafted, num_drafted) if self.adaptive is not None else self.k


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def draft(run: Run, context: list[int], k: int, generator: torch.Generator) -> Drafted:
    """Roll the drafter back to what still matches `context`, then propose k tokens after it.

    Runs on the worker thread in overlap mode; the main thread touches the drafter only after joining it.
    """
    run.drafter.rollback(common_prefix(run.fed, context))
    if run.probe is not None:
        run.probe.clear()
    start = run.timeline.now()
    block = run.drafter.propose(context, k, run.sampling, generator)
    end = run.timeline.now()
    run.fed = context + block.tokens[:-1]  # a drafter never feeds its own last draft
    confidence = block_confidence(block, run.probe)
    return Drafted(block, confidence, start, end)


def record_draft(run: Run, drafted: Drafted, step: int, speculative: bool = False, discarded: bool = False):
    run.timeline.record("draft", run.draft_device, drafted.start, drafted.end, len(drafted.block.tokens), step,
                        modeled_s=drafted.block.modeled_s, speculative=speculative, discarded=discarded)


def shaped(run: Run, drafted: Drafted) -> DraftBlock:
    """The block as verified: cut at low confidence when the adaptive policy says so."""
    if run.adaptive is None:
        return drafted.block
    return run.adaptive.truncate(drafted.block, drafted.confidence)


def fresh_block(run: Run, k: int, generator: torch.Generator) -> DraftBlock:
    if k < 1:
        return EMPTY
    drafted = draft(run, run.seq, k, generator)
    record_draft(run, drafted, run.step)
    return shaped(run, drafted)


def verify(run: Run, block: DraftBlock) -> tuple[int, int, float]:
    """Target pass over [last committed, *drafts] and the acceptance rule; (accepted, next token, verify_s)."""
    tl, seq, step = run.timeline, run.seq, run.step
    device = run.verifier.device
    if block.probs is not None and block.probs.device != device:
        start = tl.now()
        block = replace(block, probs=block.probs.to(device))
        synchronize(device)
        tl.record("transfer", f"{run.draft_device}->{run.verify_device}", start, tl.now(), len(block.tokens), step)
    start = tl.now()
    target_logits = run.verifier.score([seq[-1], *block.tokens], start_pos=len(seq) - 1)  # [k+1, V]
    synchronize(device)
    scored = tl.now()
    tl.record("verify", run.verify_device, start, scored, len(block.tokens) + 1, step)
    num_accepted, next_token = accept_block(block, target_logits, run.sampling, run.rng)
    end = tl.now()
    tl.record("accept", run.verify_device, scored, end, num_accepted + 1, step)
    return num_accepted, next_token, end - start


def commit(run: Run, block: DraftBlock, num_accepted: int, next_token: int, verify_s: float) -> bool:
    """Append the step's tokens (cut after EOS); True when generation is over."""
    committed = block.tokens[:num_accepted] + [next_token]
    run.result.steps.append(StepRecord(len(block.tokens), num_accepted, block.elapsed_s, verify_s, block.modeled_s))
    if run.adaptive is not None:
        run.adaptive.update(len(block.tokens), num_accepted)
    run.seq += run.result.commit(committed, run.eos)
    return run.result.hit_eos or run.remaining <= 0


def sync_loop(run: Run) -> None:
    while True:
        block = fresh_block(run, min(run.planned_k(), run.remaining - 1), run.rng)
        if commit(run, block, *verify(run, block)):
            return


def in_callers_mode(fn):
    """fn, to run on the worker under the caller's inference/grad mode.

    Both modes are thread-local in torch: KV caches allocated under `inference_mode` (as `dfvg generate`
    and `dfvg run` do) can only be updated in place by a thread that is in inference mode too.
    """
    inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()

    def call(*args):
        with torch.inference_mode(inference), torch.set_grad_enabled(grad and not inference):
            return fn(*args)

    return call


def launch_ahead(run: Run, pool: ThreadPoolExecutor, block: DraftBlock) -> Future | None:
    """Start drafting [bonus guess, *block n+1] after committed + block n, or None when it cannot pay off."""
    left = run.remaining - len(block.tokens) - 1  # tokens still missing if block n is fully accepted
    k_next = min(run.k_if_accepted(len(block.tokens)), left - 1)
    if k_next < 1 or any(token in run.eos for token in block.tokens):
        return None
    return pool.submit(in_callers_mode(draft), run, run.seq + block.tokens, k_next + 1, run.draft_rng)


def resolve_ahead(run: Run, future: Future | None, block: DraftBlock, num_accepted: int,
                  next_token: int) -> DraftBlock | None:
    """Join the worker; block n+1 when block n was fully accepted and the bonus was guessed, else None."""
    if future is None:
        return None
    drafted = future.result()
    guess, ahead = drafted.block.tokens[0], drafted.block
    hit = num_accepted == len(block.tokens) and next_token == guess
    record_draft(run, drafted, run.step + 1, speculative=True, discarded=not hit)
    if not hit:
        return None
    rest = DraftBlock(ahead.tokens[1:], None if ahead.probs is None else ahead.probs[1:], ahead.elapsed_s,
                      ahead.modeled_s)
    confidence = None if drafted.confidence is None else drafted.confidence[1:]
    return shaped(run, Drafted(rest, confidence, drafted.start, drafted.end))


def overlap_loop(run: Run, pool: ThreadPoolExecutor) -> None:
    ready: DraftBlock | None = None  # block n+1, drafted during step n
    while True:
        block = ready or fresh_block(run, min(run.planned_k(), run.remaining - 1), run.draft_rng)
        future = launch_ahead(run, pool, block)
        num_accepted, next_token, verify_s = verify(run, block)  # on failure, the pool joins the worker
        ready = resolve_ahead(run, future, block, num_accepted, next_token)
        if commit(run, block, num_accepted, next_token, verify_s):
            return


def prefill(run: Run, prompt_ids: list[int], max_seq_len: int, pool: ThreadPoolExecutor | None) -> None:
    """Both models take the prompt; concurrently (drafter on the worker) when a pool is given."""
    tl = run.timeline

    def draft_prefill() -> tuple[float, float]:
        start = tl.now()
        run.drafter.prefill(prompt_ids, max_seq_len)
        synchronize(torch.device(run.drafter.device))
        return start, tl.now()

    begin = tl.now()
    future = pool.submit(in_callers_mode(draft_prefill)) if pool is not None else None
    run.verifier.prefill(prompt_ids, max_seq_len)
    synchronize(run.verifier.device)
    tl.record("prefill", run.verify_device, begin, tl.now(), len(prompt_ids) - 1)
    draft_start, draft_end = future.result() if future is not None else draft_prefill()
    tl.record("prefill", run.draft_device, draft_start, draft_end, len(prompt_ids) - 1)
    run.fed = list(prompt_ids[:-1])
    run.result.prefill_s = tl.now() - begin


def device_label(drafter: Drafter) -> str:
    """`fpga` for a board-backed drafter (it has a `board`), else its torch device."""
    return "fpga" if getattr(drafter, "board", None) is not None else str(drafter.device)


def run_pipeline(
    verifier: TorchVerifier,
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
    check_lengths(prompt_ids, max_new_tokens, k_max, verifier.model.config.max_position_embeddings)
    timeline = timeline if timeline is not None else Timeline(clock)
    rng = torch.Generator().manual_seed(seed)
    draft_rng = rng if mode == "sync" else torch.Generator().manual_seed(seed + DRAFT_SEED_OFFSET)
    probe = ConfidenceProbe(drafter) if adaptive is not None and adaptive.threshold is not None else None
    run = Run(verifier, drafter, sampling, rng, draft_rng, timeline, draft_length, adaptive, probe, set(eos_ids),
              max_new_tokens, list(prompt_ids), GenerationResult(tokens=[]), device_label(drafter),
              str(verifier.device))
    max_seq_len = len(prompt_ids) + max_new_tokens + k_max + 1  # the last verify may feed k past the end
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dfvg-draft") as pool, probe or nullcontext():
        prefill(run, prompt_ids, max_seq_len, pool if mode == "overlap" else None)
        begin = timeline.now()
        if mode == "sync":
            sync_loop(run)
        else:
            overlap_loop(run, pool)
        run.result.decode_s = timeline.now() - begin
    return run.result

