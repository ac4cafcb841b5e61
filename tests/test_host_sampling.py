"""Overlap mode under sampling: the output law is the target's, with the pre-drafted blocks both used and
discarded along the way, and a chi-square test of stated level and power that can tell a wrong rule apart."""

from __future__ import annotations

import math

import torch

import dfvg.acceptance as acceptance_module
from dfvg.drafter import TorchDrafter
from dfvg.host.pipeline import run_pipeline
from dfvg.host.timeline import Timeline
from dfvg.sampling import SamplingParams, processed_probs
from dfvg.verifier import TorchVerifier
from tests.stats_helpers import chi_square_p_value, samples_for_power, tilted
from tests.test_sampling import ALPHA, POWER, TV, PrefixModel, wrong_accept_always

V = 8
TOKENS = samples_for_power(TV, V, ALPHA, POWER)  # 12,607
RUN_TOKENS = 500  # tokens per run_pipeline call; short enough that per-step list copies stay cheap
PARAMS = SamplingParams(1.0)


def pair() -> tuple[TorchVerifier, TorchDrafter]:
    """A target whose law ignores the context (so every output token is an independent draw from one law)
    and a drafter that looks at the last two tokens (so its q changes at every position, and a pre-drafted
    block scored with the wrong q rows, or drawn with the verifier's uniforms, biases the output)."""
    target = PrefixModel(V, seed=5, context=0, max_len=RUN_TOKENS + 16)
    drafter = PrefixModel(V, seed=6, context=2, max_len=RUN_TOKENS + 16)
    return TorchVerifier(target), TorchDrafter(drafter)


def overlap_counts(target, drafter, tokens: int) -> tuple[torch.Tensor, int, int]:
    """Counts [V] of the first `tokens` overlap-mode tokens over seeded runs (k=1), and how many pre-drafted
    blocks were used and discarded."""
    out, used, discarded = [], 0, 0
    for seed in range(math.ceil(tokens / RUN_TOKENS)):
        timeline = Timeline()
        out += run_pipeline(target, drafter, [1, 2, 3], RUN_TOKENS, sampling=PARAMS, seed=seed, draft_length=1,
                            mode="overlap", timeline=timeline).tokens
        ahead = [e for e in timeline.events if e.stage == "draft" and e.speculative]
        used += sum(not e.discarded for e in ahead)
        discarded += sum(e.discarded for e in ahead)
    return torch.bincount(torch.tensor(out[:tokens]), minlength=V), used, discarded


def test_overlap_sampling_matches_target_distribution(monkeypatch):
    """Pearson chi-square of the overlap schedule's tokens against the target's law, level ALPHA = 1e-3 (a
    correct sampler fails 1 seed set in 1,000; the seeds are fixed, so the outcome is deterministic).
    TOKENS = 12,607 independent tokens over 8 cells reject a law at TV >= 0.03 with power >= 0.99
    (stats_helpers.samples_for_power: noncentrality lambda >= 4 n TV^2 = 45.4 at df = 7).

    Why a context-free target: its tokens are i.i.d. under a lossless sampler, so one 500-token run gives
    500 draws; a run per draw costs ~4 ms here (a thread pool per run), a minute for 12,607 draws. How the
    target is fed in overlap mode is pinned token for token by the greedy tests in test_host_pipeline.py.

    Negative controls: draws from the target's law tilted by TV 0.03 in the direction the test sees least
    are rejected at the same n (the test has the stated power), and the pipeline with a wrong rule patched
    in is rejected (the counts really come from the engine's `accept`)."""
    target, drafter = pair()
    target.prefill([1, 2, 3], 8)
    law = processed_probs(target.score([3], 2)[-1], PARAMS)  # [V], the same after any context
    counts, used, discarded = overlap_counts(target, drafter, TOKENS)
    assert used > 50 and discarded > 50  # both paths of the overlap schedule were exercised
    assert chi_square_p_value(counts, law) >= ALPHA
    gen = torch.Generator().manual_seed(1)
    biased = torch.multinomial(tilted(law, TV).float(), TOKENS, replacement=True, generator=gen)
    assert chi_square_p_value(torch.bincount(biased, minlength=V), law) < ALPHA
    monkeypatch.setattr(acceptance_module, "accept", wrong_accept_always)
    wrong, _, _ = overlap_counts(target, drafter, RUN_TOKENS)
    assert chi_square_p_value(wrong, law) < ALPHA


def test_overlap_sampling_is_seeded():
    target, drafter = pair()
    params = SamplingParams(1.0)
    runs = [run_pipeline(target, drafter, [1, 2], 12, sampling=params, seed=s, mode="overlap").tokens
            for s in (7, 7, 8)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
