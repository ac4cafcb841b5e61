"""Batched speculative decoding: every sequence equals its own plain greedy decoding, whatever the others do."""

from __future__ import annotations

import pytest
import torch

from dfvg.checkpoint import load_model
from dfvg.drafter import TorchDrafter
from dfvg.errors import UserError
from dfvg.generate import generate
from dfvg.host.batch import padded_inputs, run_batch
from dfvg.host.timeline import Timeline
from dfvg.sampling import SamplingParams
from dfvg.verifier import TorchVerifier
from tests.conftest import EOS_ID
from tests.test_host_pipeline import CacheCheckingDrafter

PROMPTS = [list(range(2, 60)), [7], [11, 5, 9, 30, 2, 2, 8], list(range(40, 12, -1))]


@pytest.fixture(scope="module")
def target(tiny_pair):
    return TorchVerifier(load_model(tiny_pair[0]))


def plain(target, prompt, n, eos=()):
    return generate(target, prompt, n, eos_ids=eos).tokens


@pytest.mark.parametrize("k", [1, 3, 4])
def test_batch_with_mixed_drafters_is_lossless(target, k):
    n = 21
    expected = [plain(target, p, n) for p in PROMPTS]
    corrupt = [None, "all", {len(PROMPTS[2]) + p for p in (1, 2, 7)}, {len(PROMPTS[3]) + 5}]
    drafters = [CacheCheckingDrafter(p + e, c) for p, e, c in zip(PROMPTS, expected, corrupt, strict=True)]
    results = run_batch(target, drafters, PROMPTS, n, draft_length=k)
    assert [r.tokens for r in results] == expected
    accepted = [r.stats()["acceptance_rate"] for r in results]
    assert accepted[0] == 1.0 and accepted[1] == 0.0 and 0 < accepted[2] < 1
    assert len({len(r.steps) for r in results}) > 1  # rows accepted different numbers of tokens per step


def test_batch_without_drafters_is_batched_plain_decoding(target):
    """None per row: one target forward per step for every row, each row equal to its own plain decoding,
    one token per step (the baseline that speculative batches are compared with)."""
    eos = plain(target, PROMPTS[2], 30)[6]
    expected = [plain(target, p, 17, eos=(eos,)) for p in PROMPTS]
    results = run_batch(target, [None] * len(PROMPTS), PROMPTS, 17, eos_ids=(eos,), draft_length=4)
    assert [r.tokens for r in results] == expected
    assert all(len(r.steps) == len(r.tokens) and r.stats()["num_draft_tokens"] == 0 for r in results)


def test_finished_sequences_leave_the_batch(tiny_pair, target):
    """EOS ends some rows early; the others keep decoding correctly after the cache is compacted."""
    free = [plain(target, p, 30) for p in PROMPTS]
    eos = free[1][4]  # row 1 stops after 5 tokens; other rows may stop wherever this id appears
    expected = [plain(target, p, 30, eos=(eos,)) for p in PROMPTS]
    assert len(expected[1]) == 5 and any(len(e) == 30 for e in expected)
    factory = lambda: TorchDrafter(load_model(tiny_pair[1]), target.vocab_size)  # noqa: E731
    timeline = Timeline()
    results = run_batch(target, factory, PROMPTS, 30, eos_ids=(eos,), draft_length=4, timeline=timeline)
    assert [r.tokens for r in results] == expected
    assert results[1].stopped_by == "eos"
    verify_tokens = [e.tokens for e in timeline.events if e.stage == "verify"]
    assert verify_tokens[-1] < verify_tokens[0]  # fewer rows at the end


def test_real_drafters_with_eos_are_lossless(tiny_pair, target):
    expected = [plain(target, p, 25, eos=(EOS_ID,)) for p in PROMPTS]
    drafters = [TorchDrafter(load_model(tiny_pair[1]), target.vocab_size) for _ in PROMPTS]
    results = run_batch(target, drafters, PROMPTS, 25, eos_ids=(EOS_ID,), draft_length=2)
    assert [r.tokens for r in results] == expected


def test_batch_of_one_is_generate_under_sampling(tiny_pair, target):
    params = SamplingParams(0.8, top_p=0.9)
    drafter = TorchDrafter(load_model(tiny_pair[1]), target.vocab_size)
    expected = generate(target, PROMPTS[0], 15, sampling=params, seed=3, drafter=drafter, draft_length=3).tokens
    got = run_batch(target, [drafter], PROMPTS[:1], 15, sampling=params, seed=3, draft_length=3)[0].tokens
    assert got == expected


def test_padding_sits_past_each_row():
    class R:
        def __init__(self, seq):
            self.seq = seq

    class B:
        def __init__(self, tokens):
            self.tokens = tokens

    ids, positions = padded_inputs([R(list(range(10))), R(list(range(7)))], [B([5, 6]), B([])], torch.device("cpu"))
    assert ids.tolist() == [[9, 5, 6], [6, 6, 6]]
    assert positions.tolist() == [[9, 10, 11], [6, 7, 8]]


def test_shared_drafter_is_refused(tiny_pair, target):
    drafter = TorchDrafter(load_model(tiny_pair[1]), target.vocab_size)
    with pytest.raises(UserError, match="must not share a model"):
        run_batch(target, [drafter, drafter], PROMPTS[:2], 4)
    with pytest.raises(UserError, match="one drafter per prompt"):
        run_batch(target, [drafter], PROMPTS[:2], 4)
