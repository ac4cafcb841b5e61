"""Speculative sampling: exact acceptance cases on hand-built distributions, determinism, and statistical
tests that the output distribution is the target's (and that the tests would catch a wrong rule)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import dfvg.acceptance as acceptance_module
from dfvg.acceptance import accept
from dfvg.drafter import TorchDrafter
from dfvg.generate import generate
from dfvg.sampling import SamplingParams, processed_probs, sample_from
from dfvg.verifier import TorchVerifier
from tests.stats_helpers import chi_square_p_value, samples_for_power, tilted, total_variation

ALPHA = 1e-3  # each statistical test below fails a correct sampler with probability <= ALPHA
TV, POWER = 0.03, 0.99  # ... and fails one biased by total variation >= TV with probability >= POWER
ENGINE_RUNS = samples_for_power(TV, 8, ALPHA / 2, POWER)  # 13,308: two tokens tested, 8 cells each


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


LEAK = 0.3  # the wrong acceptance threshold below: (1 + LEAK) p/q


def leaky_accept(draft_tokens, draft_probs, target_probs, uniforms):
    """A deliberately wrong rule with one term wrong: accept when u < (1 + LEAK) p/q instead of u < p/q."""
    scaled = torch.cat([uniforms[:-1] / (1 + LEAK), uniforms[-1:]])
    return accept(draft_tokens, draft_probs, target_probs, scaled)


def leaky_first_token_law(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The exact law of leaky_accept's first token (k=1): accepted drafts plus the residual on rejection."""
    accepted = q * torch.clamp((1 + LEAK) * p / q, max=1.0)
    residual = (p - q).clamp(min=0)
    return accepted + (1 - accepted.sum()) * residual / residual.sum()


P, Q = dist(5, 1, 1, 3, 10), dist(1, 6, 2, 1, 1)  # target and draft laws of the acceptance-rule test
RULE_DRAWS = samples_for_power(TV, 5, ALPHA, POWER)  # 11,152


def first_token_counts(rule) -> torch.Tensor:
    """Counts [5] of the first emitted token over RULE_DRAWS seeded trials of `rule` with k=1."""
    gen = torch.Generator().manual_seed(0)
    drafts = torch.multinomial(Q, RULE_DRAWS, replacement=True, generator=gen)
    uniforms = torch.rand(RULE_DRAWS, 2, generator=gen)
    target = torch.stack([P, dist(1, 1, 1, 1, 1)])
    tokens = []
    for d, u in zip(drafts.tolist(), uniforms, strict=True):
        n, nxt = rule(torch.tensor([d]), Q[None], target, u)
        tokens.append(d if n == 1 else nxt)
    return torch.bincount(torch.tensor(tokens), minlength=5)


def test_acceptance_rule_reproduces_the_target_distribution():
    """Pearson chi-square of the first token against P, level ALPHA = 1e-3 (a correct rule fails 1 run in
    1,000 seeds; the seed is fixed, so the outcome is deterministic). RULE_DRAWS = 11,152 draws over 5 cells
    reject any law at TV >= 0.03 from P with power >= 0.99 (stats_helpers: noncentrality
    lambda >= 4 n TV^2 = 40.1, the smallest giving power 0.99 at df = 4). The negative control, one term
    of the rule wrong, is a genuine TV ~0.03 bias, computed exactly, and must be rejected; so must draws from
    P tilted by TV 0.03 in the direction the test sees least (the sample size, not just this bias)."""
    assert chi_square_p_value(first_token_counts(accept), P) >= ALPHA
    leak_tv = total_variation(leaky_first_token_law(P, Q), P)
    assert 0.025 < leak_tv < 0.035
    assert chi_square_p_value(first_token_counts(leaky_accept), P) < ALPHA
    biased = torch.multinomial(tilted(P, TV).float(), RULE_DRAWS, replacement=True,
                               generator=torch.Generator().manual_seed(1))
    assert chi_square_p_value(torch.bincount(biased, minlength=5), P) < ALPHA


class PrefixModel:
    """A stand-in for dfvg.model.Transformer with the same cache contract and an enumerable law.

    The logits at position i are a fixed random function of the tokens cached at the last `context`
    positions up to i (all of them when context is None), read from its own position-indexed cache: a
    wrong position, a stale slot or an unfed one changes the law (or raises), as with real K/V. It costs
    microseconds per token, so a test can afford the ~10^4 seeded generations a chi-square test needs.
    """

    def __init__(self, vocab_size: int, seed: int, context: int | None = None, max_len: int = 64):
        self.config = SimpleNamespace(vocab_size=vocab_size, max_position_embeddings=max_len)
        self.tok_embeddings = SimpleNamespace(weight=torch.zeros(()))  # where TorchVerifier looks for the device
        self.seed, self.context, self.cache, self.rows = seed, context, [], {}

    def setup_cache(self, batch_size: int, max_seq_len: int) -> None:
        self.cache = [None] * max_seq_len

    def feed(self, tokens: list[int], start_pos: int, last_only: bool = False) -> torch.Tensor:
        """tokens at positions start_pos.. -> logits [T, V] ([1, V] with last_only)."""
        end = start_pos + len(tokens)
        self.cache[start_pos:end] = tokens
        return torch.stack([self.logits_at(i) for i in range(end - 1 if last_only else start_pos, end)])

    def logits_at(self, position: int) -> torch.Tensor:
        first = 0 if self.context is None else max(0, position + 1 - self.context)
        key = tuple(self.cache[first:position + 1])
        assert None not in key, f"position {position} read a cache slot that was never fed"
        if key not in self.rows:
            gen = torch.Generator().manual_seed(hash((self.seed, *key)) % 2**62)
            self.rows[key] = torch.randn(self.config.vocab_size, generator=gen)
        return self.rows[key]


V8 = 8


@pytest.fixture(scope="module")
def small_vocab_pair():
    """Target and draft over an 8-token vocabulary, so exact distributions can be enumerated."""
    return TorchVerifier(PrefixModel(V8, seed=5)), TorchDrafter(PrefixModel(V8, seed=6))


def _logits_after(verifier, ids):
    verifier.prefill(ids, len(ids) + 2)
    return verifier.score(ids[-1:], len(ids) - 1)[-1]


def exact_first_two_laws(target, prompt, params) -> torch.Tensor:
    """[2, V]: P(generated token 1 = y) and P(token 2 = y) under the target alone, enumerating token 1."""
    first = processed_probs(_logits_after(target, prompt), params)
    second = sum(first[x] * processed_probs(_logits_after(target, prompt + [x]), params) for x in range(V8))
    return torch.stack([first, second])


def first_two_counts(target, drafter, prompt, params, runs) -> torch.Tensor:
    """[2, V] counts of generated tokens 1 and 2 over seeds 0..runs-1 (k=3, so the step drafts 1 token)."""
    tokens = torch.tensor([generate(target, prompt, 2, sampling=params, seed=seed, drafter=drafter,
                                    draft_length=3).tokens for seed in range(runs)])  # [runs, 2]
    return torch.stack([torch.bincount(tokens[:, i], minlength=V8) for i in range(2)])


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7, top_k=5)])
def test_speculative_sampling_matches_target_distribution(small_vocab_pair, params, monkeypatch):
    """Pearson chi-square of tokens 1 and 2 against the enumerated target laws, each at level ALPHA / 2
    (Bonferroni: a correct sampler fails with probability <= ALPHA = 1e-3; seeds are fixed, so the outcome
    is deterministic). ENGINE_RUNS = 13,308 generations reject a law at TV >= 0.03 in either token with
    power >= 0.99 over up to 8 cells (stats_helpers.samples_for_power: lambda >= 4 n TV^2 = 47.9).

    Negative controls: (1) draws from the target law tilted by TV 0.03 in the direction the test sees least
    are rejected at the same n, so the test has the stated power; (2) the engine with a wrong rule
    patched in is rejected, so the counts really come from the engine's `accept`."""
    target, drafter = small_vocab_pair
    laws = exact_first_two_laws(target, [1, 2, 3], params)
    counts = first_two_counts(target, drafter, [1, 2, 3], params, ENGINE_RUNS)
    for i in range(2):
        assert chi_square_p_value(counts[i], laws[i]) >= ALPHA / 2, i
    gen = torch.Generator().manual_seed(1)
    for i in range(2):
        biased = torch.multinomial(tilted(laws[i], TV).float(), ENGINE_RUNS, replacement=True, generator=gen)
        assert chi_square_p_value(torch.bincount(biased, minlength=V8), laws[i]) < ALPHA / 2, i
    monkeypatch.setattr(acceptance_module, "accept", wrong_accept_always)
    wrong = first_two_counts(target, drafter, [1, 2, 3], params, 500)
    assert chi_square_p_value(wrong[0], laws[0]) < ALPHA / 2


def test_sampling_is_seeded(small_vocab_pair):
    target, drafter = small_vocab_pair
    params = SamplingParams(1.0)
    runs = [generate(target, [1, 2], 12, sampling=params, seed=s, drafter=drafter).tokens for s in (7, 7, 8)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
