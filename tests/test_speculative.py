"""Lossless greedy speculative decoding: output equals the target's plain greedy output token for token."""

from __future__ import annotations

import pytest
import torch

from dfvg.checkpoint import load_model
from dfvg.drafter import DraftBlock, TorchDrafter
from dfvg.generate import generate
from dfvg.verifier import TorchVerifier
from tests.conftest import EOS_ID, VOCAB


class ScriptedDrafter:
    """Replays the target's own greedy continuation, corrupting chosen absolute positions.

    corrupt=None corrupts nothing (always agrees); corrupt="all" never agrees.
    """

    def __init__(self, reference: list[int], corrupt=None):
        self.reference = reference  # prompt + target greedy continuation
        self.corrupt = corrupt
        self.device = torch.device("cpu")
        self.cached_len = 0
        self.calls: list[tuple[int, int]] = []

    def prefill(self, prompt_ids, max_seq_len):
        self.cached_len = max(len(prompt_ids) - 1, 0)

    def rollback(self, num_valid):
        self.cached_len = min(self.cached_len, num_valid)

    def _token(self, position: int) -> int:
        true = self.reference[position] if position < len(self.reference) else 0
        if self.corrupt == "all" or (self.corrupt and position in self.corrupt):
            return (true + 1) % VOCAB
        return true

    def propose(self, context, k, sampling, generator):
        assert context == self.reference[: len(context)], "the engine committed a token the target did not"
        self.calls.append((len(context), self.cached_len))
        self.cached_len = len(context) + k - 1
        return DraftBlock([self._token(len(context) + i) for i in range(k)], None, 0.0)


@pytest.fixture(scope="module")
def target(tiny_pair):
    return TorchVerifier(load_model(tiny_pair[0]))


def plain(target, prompt, n, eos=()):
    return generate(target, prompt, n, eos_ids=eos).tokens


PROMPTS = {"short": [7], "long": list(range(2, 60))}


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("prompt_name", sorted(PROMPTS))
@pytest.mark.parametrize("corrupt", [None, "all", {3, 4, 11, 12, 13, 20}])
def test_scripted_drafters_are_lossless(target, k, prompt_name, corrupt):
    prompt = PROMPTS[prompt_name]
    n = 23  # not a multiple of k + 1
    expected = plain(target, prompt, n)
    shifted = None if corrupt in (None, "all") else {len(prompt) + p for p in corrupt}
    drafter = ScriptedDrafter(prompt + expected, corrupt if corrupt == "all" else shifted)
    result = generate(target, prompt, n, drafter=drafter, draft_length=k)
    assert result.tokens == expected
    stats = result.stats()
    if corrupt is None:
        assert stats["acceptance_rate"] == 1.0
    elif corrupt == "all":
        assert stats["num_accepted_tokens"] == 0 and stats["num_verify_steps"] == n
    else:
        assert 0 < stats["acceptance_rate"] < 1


@pytest.mark.parametrize("k", [1, 3, 4])
def test_eos_inside_a_block_stops_like_plain_decoding(target, k):
    prompt = PROMPTS["long"]
    free_run = plain(target, prompt, 30)
    eos = free_run[13]  # pretend this token is EOS: plain decoding stops at its first occurrence
    expected = plain(target, prompt, 30, eos=(eos,))
    assert expected[-1] == eos and len(expected) <= 14
    drafter = ScriptedDrafter(prompt + free_run)
    result = generate(target, prompt, 30, eos_ids=(eos,), drafter=drafter, draft_length=k)
    assert result.tokens == expected and result.stopped_by == "eos"


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_real_draft_model_is_lossless(tiny_pair, target, k):
    drafter = TorchDrafter(load_model(tiny_pair[1]), target.vocab_size)
    for prompt in PROMPTS.values():
        expected = plain(target, prompt, 29, eos=(EOS_ID,))
        assert generate(target, prompt, 29, eos_ids=(EOS_ID,), drafter=drafter, draft_length=k).tokens == expected


@pytest.mark.parametrize("k", [1, 4, 8])
def test_target_as_its_own_draft_accepts_everything(tiny_pair, target, k):
    """Catches the classic cache bug: after a fully accepted block the draft must catch up two tokens."""
    drafter = TorchDrafter(load_model(tiny_pair[0]), target.vocab_size)
    result = generate(target, PROMPTS["long"], 45, drafter=drafter, draft_length=k)
    assert result.tokens == plain(target, PROMPTS["long"], 45)
    assert result.stats()["acceptance_rate"] == 1.0
    assert result.stats()["mean_accepted_length"] > k  # bonus token counted


def test_draft_cache_keeps_its_own_length(target):
    prompt = PROMPTS["long"]
    expected = plain(target, prompt, 20)
    drafter = ScriptedDrafter(prompt + expected)
    generate(target, prompt, 20, drafter=drafter, draft_length=4)
    (first_len, _), (second_len, second_cached) = drafter.calls[:2]
    assert second_len == first_len + 5  # 4 accepted + bonus
    assert second_cached == first_len + 3  # the draft never fed its 4th draft nor the bonus token


def test_plain_greedy_matches_transformers_generate(tiny_pair, target):
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(tiny_pair[0], dtype=torch.float32).eval()
    prompt = PROMPTS["long"]
    with torch.no_grad():
        out = reference.generate(torch.tensor([prompt]), max_new_tokens=25, do_sample=False, eos_token_id=None,
                                 pad_token_id=0)
    assert plain(target, prompt, 25) == out[0, len(prompt):].tolist()


def test_max_new_tokens_is_exact(tiny_pair, target):
    drafter = TorchDrafter(load_model(tiny_pair[0]), target.vocab_size)
    for n in (1, 2, 5, 9):
        assert len(generate(target, [3, 4], n, drafter=drafter, draft_length=4).tokens) == n
