"""Speculative sampling: exact acceptance cases on hand-built distributions, determinism, and statistical
tests that the output distribution is the target's (and that the tests would catch a wrong rule)."""

from __future__ import annotations

import pytest
import torch

import dfvg.generate as generate_module
from dfvg.acceptance import accept
from dfvg.checkpoint import load_model
from dfvg.drafter import TorchDrafter
from dfvg.generate import generate
from dfvg.sampling import SamplingParams, processed_probs, sample_from
from dfvg.verifier import TorchVerifier
from tests.conftest import save_checkpoint


def dist(*values: float) -> torch.Tensor:
    t = torch.tensor(values, dtype=torch.float32)
    return t / t.sum()


def test_perfect_match_accepts_everything_and_draws_bonus():
    p = torch.stack([dist(1, 2, 3, 4), dist(4, 3, 2, 1), dist(0, 0, 0, 1)])
    draft_tokens = torch.tensor([2, 0])
    for u in ([0.0, 0.0, 0.5], [0.999, 0.999, 0.5]):
        n, nxt = accept(draft_tokens, p[:2].clone(), p, torch.tensor(u))
        assert (n, nxt) == (2, 3)  # bonus from the last row, which is one-hot at 3


def test_early_mismatch_draws_from_residual():
    target = torch.stack([dist(0, 1, 1, 0), dist(1, 1, 1, 1)])
    draft = dist(1, 0, 0, 1)[None]
    n, nxt = accept(torch.tensor([0]), draft, target, torch.tensor([0.0, 0.3]))
    assert n == 0  # target gives token 0 zero mass: always rejected
    assert nxt in (1, 2)  # residual max(0, p - q) has mass on 1 and 2 only


def test_empty_draft_samples_the_target():
    target = dist(0, 0, 1, 0)[None]
    n, nxt = accept(torch.tensor([], dtype=torch.long), None, target, torch.tensor([0.7]))
    assert (n, nxt) == (0, 2)


def test_greedy_is_the_same_rule_with_one_hot_distributions():
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 3.0], [0.0, 0.0, 9.0]])
    target = processed_probs(logits, SamplingParams())  # argmaxes 1, 0 (first of the tie), 2
    assert accept(torch.tensor([1, 0]), None, target, torch.rand(3)) == (2, 2)
    assert accept(torch.tensor([1, 2]), None, target, torch.rand(3)) == (1, 0)
    assert accept(torch.tensor([0, 0]), None, target, torch.rand(3)) == (0, 1)


def test_top_k_and_top_p_processing():
    logits = torch.log(dist(1, 2, 3, 4))
    assert torch.count_nonzero(processed_probs(logits, SamplingParams(1.0, top_k=2))) == 2
    probs = processed_probs(logits, SamplingParams(1.0, top_p=0.5))  # 0.4 + 0.3 reach 0.5
    torch.testing.assert_close(probs, torch.tensor([0.0, 0.0, 3 / 7, 4 / 7]))
    assert sample_from(dist(2, 0, 8), torch.tensor(0.2)).item() == 2  # zero mass never drawn


def wrong_accept_always(draft_tokens, draft_probs, target_probs, uniforms):
    """A deliberately wrong rule: keep every draft (the draft's distribution leaks into the output)."""
    k = draft_tokens.shape[0]
    return k, int(sample_from(target_probs[k], uniforms[k]))


def wrong_residual(draft_tokens, draft_probs, target_probs, uniforms):
    """A deliberately wrong rule: on rejection resample from p instead of max(0, p - q)."""
    n, _ = accept(draft_tokens, draft_probs, target_probs, uniforms)
    row = target_probs[n] if n < draft_tokens.shape[0] else target_probs[-1]
    return n, int(sample_from(row, uniforms[-1]))


def first_token_tv(rule, trials: int = 20000) -> float:
    """TV distance between the first emitted token's empirical law and the target's p (k=1)."""
    p, q = dist(5, 1, 1, 3, 10), dist(1, 6, 2, 1, 1)
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(5)
    drafts = torch.multinomial(q, trials, replacement=True, generator=gen)
    uniforms = torch.rand(trials, 2, generator=gen)
    target = torch.stack([p, dist(1, 1, 1, 1, 1)])
    for d, u in zip(drafts.tolist(), uniforms, strict=True):
        n, nxt = rule(torch.tensor([d]), q[None], target, u)
        counts[d if n == 1 else nxt] += 1
    return 0.5 * (counts / trials - p).abs().sum().item()


def test_acceptance_rule_reproduces_the_target_distribution():
    assert first_token_tv(accept) < 0.015
    assert first_token_tv(wrong_accept_always) > 0.1
    assert first_token_tv(wrong_residual) > 0.05


@pytest.fixture(scope="module")
def small_vocab_pair(tmp_path_factory):
    """Target and draft over an 8-token vocabulary, so exact distributions can be enumerated."""
    root = tmp_path_factory.mktemp("v8")
    save_checkpoint(root / "t", "llama", seed=5, vocab_size=8, initializer_range=0.5)
    save_checkpoint(root / "d", "llama", seed=6, vocab_size=8, initializer_range=0.5, num_hidden_layers=1)
    return TorchVerifier(load_model(root / "t")), TorchDrafter(load_model(root / "d"))


def exact_second_token_law(target, prompt, params) -> torch.Tensor:
    """P(second generated token = y) under the target alone, by enumerating the first token."""
    first = processed_probs(target.model_logits(prompt), params)
    return sum(first[x] * processed_probs(target.model_logits(prompt + [x]), params) for x in range(8))


def empirical_laws(target, drafter, prompt, params, runs=1500):
    counts = torch.zeros(2, 8)
    for seed in range(runs):
        tokens = generate(target, prompt, 2, sampling=params, seed=seed, drafter=drafter, draft_length=3).tokens
        counts[0, tokens[0]] += 1
        counts[1, tokens[1]] += 1
    return counts / runs


def _logits_after(verifier, ids):
    verifier.prefill(ids, len(ids) + 2)
    return verifier.score(ids[-1:], len(ids) - 1)[-1]


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7, top_k=5, top_p=0.9)])
def test_speculative_sampling_matches_target_distribution(small_vocab_pair, params, monkeypatch):
    target, drafter = small_vocab_pair
    target.model_logits = lambda ids: _logits_after(target, ids)
    prompt = [1, 2, 3]
    first = processed_probs(target.model_logits(prompt), params)
    second = exact_second_token_law(target, prompt, params)
    law = empirical_laws(target, drafter, prompt, params)
    assert 0.5 * (law[0] - first).abs().sum() < 0.06
    assert 0.5 * (law[1] - second).abs().sum() < 0.06
    monkeypatch.setattr(generate_module, "accept", wrong_accept_always)
    wrong = empirical_laws(target, drafter, prompt, params, runs=400)
    assert 0.5 * (wrong[0] - first).abs().sum() > 0.06


def test_sampling_is_seeded(small_vocab_pair):
    target, drafter = small_vocab_pair
    params = SamplingParams(1.0)
    runs = [generate(target, [1, 2], 12, sampling=params, seed=s, drafter=drafter).tokens for s in (7, 7, 8)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
