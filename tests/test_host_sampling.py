"""Overlap mode under sampling: the output law is the target's, exactly computed by enumeration, with the
pre-drafted blocks both used and discarded along the way (and the test can tell a wrong rule apart)."""

from __future__ import annotations

import pytest
import torch

import dfvg.generate as generate_module
from dfvg.checkpoint import load_model
from dfvg.drafter import TorchDrafter
from dfvg.host.pipeline import run_pipeline
from dfvg.host.timeline import Timeline
from dfvg.sampling import SamplingParams, processed_probs
from dfvg.verifier import TorchVerifier
from tests.conftest import save_checkpoint
from tests.test_sampling import wrong_accept_always

V = 8
N_TOKENS = 4  # k=1: step 1 drafts 1 token while [bonus guess, block 2] is drafted ahead


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("v8host")
    save_checkpoint(root / "t", "llama", seed=5, vocab_size=V, initializer_range=0.1)  # flat laws
    save_checkpoint(root / "d", "llama", seed=6, vocab_size=V, initializer_range=0.1, num_hidden_layers=1)
    return TorchVerifier(load_model(root / "t")), TorchDrafter(load_model(root / "d"))


def next_law(target: TorchVerifier, ids: list[int], params: SamplingParams) -> torch.Tensor:
    target.prefill(ids, len(ids) + 2)
    return processed_probs(target.score(ids[-1:], len(ids) - 1)[-1], params)  # [V]


def exact_marginals(target, prompt, params, n) -> torch.Tensor:
    """[n, V]: P(token i = y) under the target alone, by enumerating every prefix."""
    marginals = torch.zeros(n, V)
    paths = {(): 1.0}
    for i in range(n):
        grown = {}
        for path, mass in paths.items():
            law = next_law(target, prompt + list(path), params)
            marginals[i] += mass * law
            for y in range(V):
                if law[y] > 0:
                    grown[path + (y,)] = mass * float(law[y])
        paths = grown
    return marginals


def empirical(target, drafter, prompt, params, runs):
    counts, used, discarded = torch.zeros(N_TOKENS, V), 0, 0
    for seed in range(runs):
        timeline = Timeline()
        tokens = run_pipeline(target, drafter, prompt, N_TOKENS, sampling=params, seed=seed, draft_length=1,
                              mode="overlap", timeline=timeline).tokens
        for i, token in enumerate(tokens):
            counts[i, token] += 1
        ahead = [e for e in timeline.events if e.stage == "draft" and e.speculative]
        used += sum(not e.discarded for e in ahead)
        discarded += sum(e.discarded for e in ahead)
    return counts / runs, used, discarded


def test_overlap_sampling_matches_target_distribution(pair, monkeypatch):
    """Seeds 0..999 are fixed, so this is deterministic; the margin is about 2x the sampling noise."""
    target, drafter = pair
    params = SamplingParams(0.9, top_k=6, top_p=0.95)
    prompt = [1, 2, 3]
    exact = exact_marginals(target, prompt, params, N_TOKENS)
    law, used, discarded = empirical(target, drafter, prompt, params, runs=1000)
    assert used > 50 and discarded > 50  # both paths of the overlap schedule were exercised
    for i in range(N_TOKENS):
        assert 0.5 * (law[i] - exact[i]).abs().sum() < 0.06, i
    monkeypatch.setattr(generate_module, "accept", wrong_accept_always)
    wrong, _, _ = empirical(target, drafter, prompt, params, runs=200)
    assert max(0.5 * (wrong[i] - exact[i]).abs().sum() for i in range(N_TOKENS)) > 0.06


def test_overlap_sampling_is_seeded(pair):
    target, drafter = pair
    params = SamplingParams(1.0)
    runs = [run_pipeline(target, drafter, [1, 2], 12, sampling=params, seed=s, mode="overlap").tokens
            for s in (7, 7, 8)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
