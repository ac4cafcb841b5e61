"""The host pipeline: sync and overlap schedules are lossless, the overlap really runs both models at once,
and its timeline adds up."""

from __future__ import annotations

import itertools
import threading

import pytest
import torch

import dfvg.host.pipeline as pipeline_module
from dfvg.checkpoint import load_model
from dfvg.drafter import DraftBlock, TorchDrafter
from dfvg.errors import UserError
from dfvg.generate import generate
from dfvg.host.pipeline import run_pipeline
from dfvg.host.timeline import Timeline, overlapping
from dfvg.sampling import SamplingParams
from dfvg.verifier import TorchVerifier
from tests.conftest import EOS_ID
from tests.test_speculative import ScriptedDrafter

PROMPTS = {"short": [7], "long": list(range(2, 60))}


class CacheCheckingDrafter(ScriptedDrafter):
    """Proposes the target's own greedy continuation (corrupted at chosen absolute positions) and keeps a
    list of the tokens its 'cache' holds, so a wrong rollback from the engine fails loudly.

    corrupt=None agrees everywhere; "all" never agrees; a set corrupts those absolute positions.
    """

    def __init__(self, reference: list[int], corrupt=None, on_propose=None):
        super().__init__(reference, corrupt)
        self.on_propose = on_propose
        self.cache: list[int] = []
        self.calls = 0

    def prefill(self, prompt_ids, max_seq_len):
        self.cache = list(prompt_ids[:-1])
        self.cached_len = len(self.cache)

    def propose(self, context, k, sampling, generator):
        assert self.cache[: self.cached_len] == context[: self.cached_len], "stale draft cache was reused"
        self.calls += 1
        if self.on_propose is not None:
            self.on_propose()
        tokens = [self._token(len(context) + i) for i in range(k)]
        self.cache = list(context) + tokens[:-1]
        self.cached_len = len(self.cache)
        return DraftBlock(tokens, None, 0.0)


@pytest.fixture(scope="module")
def target(tiny_pair):
    return TorchVerifier(load_model(tiny_pair[0]))


def plain(target, prompt, n, eos=()):
    return generate(target, prompt, n, eos_ids=eos).tokens


@pytest.mark.parametrize("mode", ["sync", "overlap"])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("corrupt", [None, "all", {3, 4, 11, 12, 13, 20}])
def test_scripted_drafters_are_lossless(target, mode, k, corrupt):
    for prompt in PROMPTS.values():
        n = 23
        expected = plain(target, prompt, n)
        shifted = corrupt if corrupt in (None, "all") else {len(prompt) + p for p in corrupt}
        drafter = CacheCheckingDrafter(prompt + expected, shifted)
        result = run_pipeline(target, drafter, prompt, n, draft_length=k, mode=mode)
        assert result.tokens == expected
        if corrupt is None:
            assert result.stats()["acceptance_rate"] == 1.0
        elif corrupt == "all":
            assert result.stats()["num_accepted_tokens"] == 0


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_real_draft_model_is_lossless_in_both_modes(tiny_pair, target, k):
    drafter = TorchDrafter(load_model(tiny_pair[1]), target.vocab_size)
    for prompt in PROMPTS.values():
        expected = plain(target, prompt, 29, eos=(EOS_ID,))
        for mode in ("sync", "overlap"):
            result = run_pipeline(target, drafter, prompt, 29, eos_ids=(EOS_ID,), draft_length=k, mode=mode)
            assert result.tokens == expected, mode


def test_overlap_under_inference_mode(tiny_pair):
    """`dfvg generate` / `dfvg run` allocate caches under inference_mode; the draft thread must follow it."""
    with torch.inference_mode():
        target = TorchVerifier(load_model(tiny_pair[0]))
        drafter = TorchDrafter(load_model(tiny_pair[1]), target.vocab_size)
        expected = plain(target, PROMPTS["long"], 20)
        # sync first: the drafter's caches are then allocated by the main thread, in inference mode
        synced = run_pipeline(target, drafter, PROMPTS["long"], 20, draft_length=3, mode="sync")
        result = run_pipeline(target, drafter, PROMPTS["long"], 20, draft_length=3, mode="overlap")
    assert result.tokens == synced.tokens == expected


@pytest.mark.parametrize("k", [1, 4])
def test_target_as_draft_uses_every_early_block(tiny_pair, target, k):
    """Agreeing everywhere, every block after the first was drafted ahead and none is discarded."""
    drafter = TorchDrafter(load_model(tiny_pair[0]), target.vocab_size)
    timeline = Timeline()
    result = run_pipeline(target, drafter, PROMPTS["long"], 40, draft_length=k, mode="overlap", timeline=timeline)
    assert result.tokens == plain(target, PROMPTS["long"], 40)
    drafts = [e for e in timeline.events if e.stage == "draft"]
    assert not any(e.discarded for e in drafts)
    assert sum(e.speculative for e in drafts) == len(result.steps) - 1 - (result.steps[-1].num_drafted == 0)


@pytest.mark.parametrize("k", [1, 3, 4])
def test_eos_inside_a_block_stops_like_plain_decoding(target, k):
    prompt = PROMPTS["long"]
    free_run = plain(target, prompt, 30)
    eos = free_run[13]
    expected = plain(target, prompt, 30, eos=(eos,))
    for mode in ("sync", "overlap"):
        drafter = CacheCheckingDrafter(prompt + free_run)
        result = run_pipeline(target, drafter, prompt, 30, eos_ids=(eos,), draft_length=k, mode=mode)
        assert result.tokens == expected and result.stopped_by == "eos"


def test_max_new_tokens_is_exact(tiny_pair, target):
    drafter = TorchDrafter(load_model(tiny_pair[0]), target.vocab_size)
    for n, mode in itertools.product((1, 2, 5, 9), ("sync", "overlap")):
        assert len(run_pipeline(target, drafter, [3, 4], n, draft_length=4, mode=mode).tokens) == n


def test_sync_mode_is_generate_under_sampling(tiny_pair, target):
    """Same seed, same generator use: the sync schedule reproduces dfvg.generate's sampled tokens."""
    drafter = TorchDrafter(load_model(tiny_pair[1]), target.vocab_size)
    params = SamplingParams(0.9, top_k=20)
    for seed in (0, 1):
        expected = generate(target, PROMPTS["long"], 20, sampling=params, seed=seed, drafter=drafter).tokens
        got = run_pipeline(target, drafter, PROMPTS["long"], 20, sampling=params, seed=seed, draft_length=4).tokens
        assert got == expected


def test_bad_mode_and_missing_drafter_are_user_errors(target):
    with pytest.raises(UserError, match="sync, overlap"):
        run_pipeline(target, CacheCheckingDrafter([7]), [7], 3, mode="parallel")
    with pytest.raises(UserError, match="needs a drafter"):
        run_pipeline(target, None, [7], 3)


class TickClock:
    """A fake clock: each reading is one tick later than the last, whichever thread reads it."""

    def __init__(self):
        self.ticks = itertools.count()
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            return float(next(self.ticks))


class Rendezvous:
    """Makes a verification and the draft running ahead of it wait for each other, so the test fails (by
    timeout) unless the two really run at the same time."""

    def __init__(self, monkeypatch, verifier):
        self.pair = None
        original_launch, original_score = pipeline_module.OverlapStep._launch_ahead, verifier.score

        def launch(step, seq, block):
            self.pair = (threading.Event(), threading.Event())  # (draft started, verify started)
            future = original_launch(step, seq, block)
            if future is None:
                self.pair = None
            return future

        def score(tokens, start_pos):
            pair = self.pair
            if pair is not None:
                pair[1].set()
                assert pair[0].wait(5), "the draft-ahead never started while the target verified"
                self.pair = None
            return original_score(tokens, start_pos)

        monkeypatch.setattr(pipeline_module.OverlapStep, "_launch_ahead", launch)
        monkeypatch.setattr(verifier, "score", score)

    def on_propose(self):
        pair = self.pair
        if pair is not None and threading.current_thread() is not threading.main_thread():
            pair[0].set()
            assert pair[1].wait(5), "the target never verified while the draft ran ahead"


def check_timeline(timeline, result, mode):
    events = timeline.events
    assert [e.start for e in events] == sorted(e.start for e in events)
    assert all(e.provenance == "measured" and e.end >= e.start for e in events)
    by_stage = {s: [e for e in events if e.stage == s] for s in ("prefill", "draft", "verify")}
    assert len(by_stage["prefill"]) == 2
    assert len(by_stage["verify"]) == len(result.steps)  # a verify event spans scoring and acceptance
    assert sum(e.tokens for e in by_stage["verify"]) == sum(s.num_drafted + 1 for s in result.steps)
    assert [e.step for e in by_stage["verify"]] == list(range(len(result.steps)))
    used = [e for e in by_stage["draft"] if not e.discarded]
    assert sum(e.tokens - e.speculative for e in used) == sum(s.num_drafted for s in result.steps)
    verifies = by_stage["verify"]
    for verify, following in zip(verifies, verifies[1:], strict=False):
        assert verify.end <= following.start
    pairs = [(d, v) for d in by_stage["draft"] for v in by_stage["verify"] if overlapping(d, v)]
    return pairs


@pytest.mark.parametrize("k", [1, 2, 4])
def test_overlap_really_overlaps_and_sync_does_not(target, monkeypatch, k):
    prompt = PROMPTS["long"]
    expected = plain(target, prompt, 23)
    corrupt = {len(prompt) + p for p in (3, 11, 12)}
    rendezvous = Rendezvous(monkeypatch, target)
    drafter = CacheCheckingDrafter(prompt + expected, corrupt, on_propose=rendezvous.on_propose)
    timelines = {}
    for mode in ("sync", "overlap"):
        timeline = Timeline(TickClock())
        result = run_pipeline(target, drafter, prompt, 23, draft_length=k, mode=mode, timeline=timeline)
        assert result.tokens == expected
        timelines[mode] = (timeline, check_timeline(timeline, result, mode))
    assert timelines["sync"][1] == []
    timeline, pairs = timelines["overlap"]
    ahead = [e for e in timeline.events if e.stage == "draft" and e.speculative]
    assert ahead and all(any(d is a for d, _ in pairs) for a in ahead)  # each ran during a verification
    assert any(e.discarded for e in ahead) and any(not e.discarded for e in ahead)
    prefills = [e for e in timeline.events if e.stage == "prefill"]
    assert all(e.step == -1 for e in prefills)


def test_timeline_round_trips_through_json(target):
    prompt = PROMPTS["short"]
    expected = plain(target, prompt, 9)
    timeline = Timeline(TickClock())
    run_pipeline(target, CacheCheckingDrafter(prompt + expected, {3}), prompt, 9, mode="overlap", timeline=timeline)
    import json

    again = Timeline.from_dict(json.loads(timeline.to_json()))
    assert again.events == timeline.events and again.span_s() == timeline.span_s()


def test_overlap_saves_wall_clock_when_both_sides_release_the_gil(target, monkeypatch):
    """Drafter and verifier each sleep 30 ms per call (as torch ops release the GIL): with every block accepted,
    overlap hides the drafting behind the verification."""
    import time

    prompt = PROMPTS["long"]
    expected = plain(target, prompt, 24)
    original_score = target.score

    def slow_score(tokens, start_pos):
        time.sleep(0.03)
        return original_score(tokens, start_pos)

    monkeypatch.setattr(target, "score", slow_score)
    drafter = CacheCheckingDrafter(prompt + expected, on_propose=lambda: time.sleep(0.03))
    totals = {}
    for mode in ("sync", "overlap"):
        start = time.perf_counter()
        assert run_pipeline(target, drafter, prompt, 24, draft_length=3, mode=mode).tokens == expected
        totals[mode] = time.perf_counter() - start
    assert totals["overlap"] < 0.75 * totals["sync"], totals
