"""A feature head inside the fused device step (dfvg.gpu.fast.feature_step_body), on the CPU where the
captured bodies replay eagerly: the engine picks it for a graph verifier and a graph head, its output equals
plain decoding, and each step accepts what the host step with the same head accepts (its fixed k + 1
catch-up refeeds the target's features, so the drafts do not depend on how the head caught up)."""

from __future__ import annotations

import copy

import pytest

from dfvg.checkpoint import load_model
from dfvg.engine import Engine
from dfvg.fallback import FaultInjection
from dfvg.feature_head import FeatureDrafter, load_feature_head
from dfvg.generate import generate
from dfvg.gpu.fast import DeviceStep
from dfvg.gpu.graph_head import GraphFeatureDrafter
from dfvg.gpu.graphs import GraphVerifier
from dfvg.sampling import SamplingParams
from dfvg.verifier import TorchVerifier
from tests.test_distill import setup as setup  # noqa: F401  (the tiny peaked target and its prompts)
from tests.test_feature_head import PROMPTS
from tests.test_feature_head import head_dir as head_dir  # noqa: F401  (a head trained on it)
from tests.test_feature_head import random_head as random_head  # noqa: F401  (a feature-sensitive pair)


def graph_pair(head, root):
    verifier = GraphVerifier(load_model(root / "target"), compile_blocks=False, fused_layers=False, cache_len=96)
    drafter = GraphFeatureDrafter(head, verifier, verifier.vocab_size, compile_blocks=False, cache_len=96,
                                  fused_layers=False)
    return verifier, drafter


@pytest.mark.parametrize("pair", ["trained", "random"])
@pytest.mark.parametrize("k", [1, 3, 4])
def test_the_device_step_drafts_with_the_head_and_equals_plain(head_dir, setup, random_head, pair, k):  # noqa: F811
    head, root = (load_feature_head(head_dir[0]), setup) if pair == "trained" else random_head
    prompts = [p for p in PROMPTS if len(p) >= k + 2] if pair == "trained" else ([5, 17, 33, 8, 2, 41],)
    verifier, drafter = graph_pair(head, root)
    engine = Engine(verifier)
    host_verifier = TorchVerifier(load_model(root / "target"))
    host = FeatureDrafter(load_feature_head(head_dir[0]) if pair == "trained" else head, host_verifier)
    for prompt in prompts:
        fused = engine.decode(drafter, list(prompt), 24, k=k)
        plain = generate(TorchVerifier(load_model(root / "target")), list(prompt), 24)
        on_host = generate(host_verifier, list(prompt), 24, drafter=host, draft_length=k)
        assert fused.tokens == plain.tokens == on_host.tokens
        full = [i for i, s in enumerate(on_host.steps) if s.num_drafted == k]  # the host shortens the last
        assert len(full) >= len(on_host.steps) - k
        assert [fused.steps[i].num_accepted for i in full] == [on_host.steps[i].num_accepted for i in full]
    steps = [s for s in engine.device_steps.values() if isinstance(s, DeviceStep)]
    assert steps and all(s.rows.drafter is drafter and s.host is None for s in steps)
    if pair == "trained":
        assert sum(s.num_accepted for s in fused.steps) > 0


def test_a_prompt_shorter_than_the_catch_up_takes_the_host_step(head_dir, setup):  # noqa: F811
    verifier, drafter = graph_pair(load_feature_head(head_dir[0]), setup)
    engine = Engine(verifier)
    prompt = [5, 17, 99]  # 3 < k + 2
    result = engine.decode(drafter, prompt, 16, k=3)
    assert result.tokens == generate(TorchVerifier(load_model(setup / "target")), prompt, 16).tokens
    assert not any(isinstance(s, DeviceStep) for s in engine.device_steps.values())
    assert len(result.tokens) == 16


def test_a_fault_in_the_heads_device_step_continues_on_the_host_step(head_dir, setup):  # noqa: F811
    """The 4th replay fails after running: the rest of the generation runs on the host step (the guard's
    next drafter, here none) and stays lossless."""
    verifier, drafter = graph_pair(load_feature_head(head_dir[0]), setup)
    engine = Engine(verifier)
    engine.injection = FaultInjection(fail_after=4, hang_s=5.0)
    prompt = list(PROMPTS[1])
    result = engine.decode(drafter, prompt, 30, k=3)
    assert result.tokens == generate(TorchVerifier(load_model(setup / "target")), prompt, 30).tokens
    assert len(result.faults) == 1


def test_after_device_steps_the_head_drafts_on_the_host_as_a_fresh_head_would(head_dir, setup):  # noqa: F811
    """What a host step after a failed replay relies on: the head catches up from where its host-side state
    stopped (the prompt) on the features the device steps' verifies wrote, and proposes what a head that
    followed the same sequence on the host proposes."""
    verifier, drafter = graph_pair(load_feature_head(head_dir[0]), setup)
    prompt = list(PROMPTS[1])
    seq = prompt + Engine(verifier).decode(drafter, prompt, 12, k=3).tokens
    assert verifier.features_end >= len(seq) - 1
    fresh_verifier = TorchVerifier(load_model(setup / "target"))
    fresh = FeatureDrafter(load_feature_head(head_dir[0]), fresh_verifier)
    fresh_verifier.prefill(seq, 64)
    fresh.prefill(seq, 64)
    greedy = SamplingParams()
    assert drafter.propose(seq, 3, greedy, None).tokens == fresh.propose(seq, 3, greedy, None).tokens


def test_every_device_step_drafts_what_the_host_head_drafts_there(random_head):  # noqa: F811
    """Lockstep on the feature-sensitive random pair (it accepts almost nothing, so accepted counts alone
    would say little): each replay's drafts are the block a host head proposes after the same sequence."""
    head, root = random_head
    verifier, drafter = graph_pair(copy.deepcopy(head), root)
    step = DeviceStep(verifier, drafter, 3)
    prompt = [5, 17, 33, 8, 2, 41]
    step.prefill(prompt, 64)
    fresh = TorchVerifier(load_model(root / "target"))
    host = FeatureDrafter(head, fresh)
    seq = list(prompt)
    while len(seq) < len(prompt) + 16:
        outcome = step(seq, 3)
        fresh.prefill(seq, 64)
        host.prefill(seq, 64)
        assert outcome.block.tokens == host.propose(seq, 3, SamplingParams(), None).tokens
        seq += outcome.block.tokens[: outcome.num_accepted] + [outcome.next_token]
