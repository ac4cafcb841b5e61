"""Token trees drafted by a feature head (dfvg.tree_step.FeatureTreeDrafter) on the tiny target of
test_distill: lossless, the first-child path is the head's chain, the tree accepts at least what the chain
does, and the features the tree verify writes are the ones plain decoding would write."""

from __future__ import annotations

import copy

import pytest
import torch

from dfvg.checkpoint import load_model
from dfvg.engine import Engine, make_drafter
from dfvg.feature_head import FeatureDrafter, load_feature_head
from dfvg.generate import generate
from dfvg.sampling import SamplingParams
from dfvg.tree import parse_tree_spec
from dfvg.tree_step import FeatureTreeDrafter, tree_step
from dfvg.verifier import TorchVerifier
from tests.conftest import EOS_ID
from tests.test_distill import VOCAB
from tests.test_distill import setup as setup  # noqa: F401  (the tiny peaked target and its prompts)
from tests.test_feature_head import PROMPTS
from tests.test_feature_head import head_dir as head_dir  # noqa: F401  (a head trained on it)
from tests.test_feature_head import random_head as random_head  # noqa: F401  (a feature-sensitive pair)


def head_engine(head_dir, setup):  # noqa: F811
    verifier = TorchVerifier(load_model(setup / "target"))
    return Engine(verifier), make_drafter(head_dir[0], "cpu", torch.float32, VOCAB, fast=False, verifier=verifier)


def mean_accepted(results) -> float:
    steps = [s for r in results for s in r.steps]
    return sum(s.num_accepted for s in steps) / len(steps)


def test_greedy_head_trees_equal_plain_and_accept_more_than_the_chain(head_dir, setup):  # noqa: F811
    engine, drafter = head_engine(head_dir, setup)
    plain = [generate(TorchVerifier(load_model(setup / "target")), list(p), 30, eos_ids=[EOS_ID]) for p in PROMPTS]
    chain = [engine.decode(drafter, list(p), 30, k=3, eos_ids=[EOS_ID]) for p in PROMPTS]
    for spec in ("3,2,1", "dynamic:12"):
        trees = [engine.decode(drafter, list(p), 30, k=3, eos_ids=[EOS_ID], tree=parse_tree_spec(spec))
                 for p in PROMPTS]
        assert [t.tokens for t in trees] == [p.tokens for p in plain]
        assert mean_accepted(trees) >= mean_accepted(chain) > 0.5
    assert [c.tokens for c in chain] == [p.tokens for p in plain]
    assert trees[1].steps[0].num_drafted == 12  # the dynamic tree keeps its budget of nodes


@pytest.mark.parametrize("pair", ["trained", "random"])
def test_the_first_child_path_is_the_heads_chain_at_every_step(head_dir, setup, random_head, pair):  # noqa: F811
    """Lockstep from the same verified state: the tree's first children from the root down are the block the
    chain drafter proposes (same features, same positions), after a catch-up of any length. The random pair's
    drafts depend on every feature a node reads (a node fed its grandparent's f^ gives another token)."""
    head, root = (load_feature_head(head_dir[0]), setup) if pair == "trained" else random_head
    verifier = TorchVerifier(load_model(root / "target"))
    greedy = SamplingParams()
    step = tree_step(verifier, FeatureDrafter(head, verifier), parse_tree_spec("2,2,2"), greedy, 0, 3)
    assert isinstance(step.tree_drafter, FeatureTreeDrafter)
    chain = FeatureDrafter(copy.deepcopy(head), verifier)
    prompt = list(PROMPTS[1]) if pair == "trained" else [5, 17, 33, 8, 2, 41]  # the random pair has 96 ids
    step.prefill(prompt, 64)
    chain.prefill(prompt, 64)
    seq, compared = list(prompt), 0
    while len(seq) < len(prompt) + 20:
        want = chain.propose(seq, 3, greedy, None).tokens
        tree = step.tree_drafter.propose(seq, 3, greedy, None)
        node, path = -1, []
        for _ in range(3):
            node = tree.parents.index(node)  # a node's first child is created first
            path.append(tree.tokens[node])
        assert path == want
        compared += 1
        chain.rollback(len(seq))  # the step below runs the tree drafter and the verify on a fresh tree
        outcome = step(seq, 3)
        seq += outcome.block.tokens[: outcome.num_accepted] + [outcome.next_token]
    assert compared >= 4


def test_the_tree_verify_writes_the_features_plain_decoding_writes(head_dir, setup):  # noqa: F811
    engine, drafter = head_engine(head_dir, setup)
    prompt = list(PROMPTS[0])
    result = engine.decode(drafter, prompt, 20, k=3, tree=parse_tree_spec("2,2,1"))
    fresh = TorchVerifier(load_model(setup / "target"))
    fresh.keep_features = True
    fresh.prefill(prompt + result.tokens, 64)  # one pass over the committed sequence
    written = engine.verifier.features_end
    assert written >= len(prompt) + 15
    torch.testing.assert_close(engine.verifier.features[:written], fresh.features[:written], atol=1e-4, rtol=1e-4)


def test_sampled_head_trees_are_seeded(head_dir, setup):  # noqa: F811
    engine, drafter = head_engine(head_dir, setup)
    spec, params = parse_tree_spec("2,2,1"), SamplingParams(1.0)
    first = engine.decode(drafter, list(PROMPTS[0]), 12, k=3, tree=spec, sampling=params, seed=3)
    again = engine.decode(drafter, list(PROMPTS[0]), 12, k=3, tree=spec, sampling=params, seed=3)
    assert first.tokens == again.tokens and len(first.tokens) == 12
    assert first.steps[0].num_drafted == 10


@pytest.mark.parametrize("pair", ["trained", "random"])
@pytest.mark.parametrize("spec", ["2,2,1", "3,1,2", "dynamic:12"])
def test_head_trees_on_the_device_step_equal_plain_and_the_eager_trees(head_dir, setup, random_head, pair,  # noqa: F811
                                                                        spec):
    """The graph path (`DeviceTreeStep` with a `FeatureFeeder`; its bodies replay eagerly on a CPU): plain's
    tokens, and the eager head tree's accepted length at every step but the last (where the eager loop
    shortens its tree); the verify leaves the features plain decoding writes."""
    from dfvg.gpu.graph_head import GraphFeatureDrafter
    from dfvg.gpu.graphs import GraphVerifier
    from dfvg.gpu.tree_device import DeviceTreeStep

    head, root = (load_feature_head(head_dir[0]), setup) if pair == "trained" else random_head
    prompt = list(PROMPTS[1]) if pair == "trained" else [5, 17, 33, 8, 2, 41]
    verifier = GraphVerifier(load_model(root / "target"), compile_blocks=False, fused_layers=False, cache_len=128)
    drafter = GraphFeatureDrafter(head, verifier, verifier.vocab_size, compile_blocks=False, cache_len=128,
                                  fused_layers=False)
    engine = Engine(verifier)
    result = engine.decode(drafter, prompt, 24, k=3, tree=parse_tree_spec(spec))
    assert any(isinstance(s, DeviceTreeStep) for s in engine.device_steps.values())
    assert result.tokens == generate(TorchVerifier(load_model(root / "target")), prompt, 24).tokens
    eager_verifier = TorchVerifier(load_model(root / "target"))
    eager = FeatureDrafter(copy.deepcopy(head), eager_verifier)
    reference = Engine(eager_verifier).decode(eager, prompt, 24, k=3, tree=parse_tree_spec(spec))
    got, want = ([s.num_accepted for s in r.steps][:-1] for r in (result, reference))
    assert got == want
    written = len(prompt) + len(result.tokens) - 1
    fresh = TorchVerifier(load_model(root / "target"))
    fresh.keep_features = True
    fresh.prefill(prompt + result.tokens, 64)
    torch.testing.assert_close(verifier.features[:written], fresh.features[:written], atol=1e-4, rtol=1e-4)
    if pair == "trained":
        assert sum(got) > 0


def test_a_prompt_too_short_for_the_heads_device_tree_decodes_plainly_until_it_fits(random_head):  # noqa: F811
    """A head's device tree needs the tree's depth + 2 tokens (its catch-up reads the feature before its first
    row): a shorter greedy prompt is decoded plainly that far, then the device tree takes over; plain's tokens."""
    from dfvg.gpu.graph_head import GraphFeatureDrafter
    from dfvg.gpu.graphs import GraphVerifier
    from dfvg.gpu.tree_device import DeviceTreeStep

    head, root = random_head
    verifier = GraphVerifier(load_model(root / "target"), compile_blocks=False, fused_layers=False, cache_len=128)
    drafter = GraphFeatureDrafter(head, verifier, verifier.vocab_size, compile_blocks=False, cache_len=128,
                                  fused_layers=False)
    spec, prompt, engine = parse_tree_spec("2,2,1"), [5, 17], Engine(verifier)
    result = engine.decode(drafter, prompt, 16, k=3, tree=spec)
    assert result.tokens == generate(TorchVerifier(load_model(root / "target")), prompt, 16).tokens
    lead = 3 + 2 - len(prompt)
    assert [s.num_drafted for s in result.steps[: lead + 1]] == [0] * lead + [result.steps[lead].num_drafted]
    assert result.steps[lead].num_drafted > 0
    assert any(isinstance(s, DeviceTreeStep) for s in engine.device_steps.values())


@pytest.mark.parametrize("spec", ["2,2,1", "dynamic:12"])
def test_every_device_tree_is_the_eager_head_tree_there(random_head, spec):  # noqa: F811
    """Lockstep on the feature-sensitive random pair: each replay's tree holds the tokens the eager
    `FeatureTreeDrafter` grows after the same sequence (a node fed any feature but its parent's differs)."""
    from dfvg.gpu.graph_head import GraphFeatureDrafter
    from dfvg.gpu.graphs import GraphVerifier
    from dfvg.gpu.tree_device import DeviceTreeStep

    head, root = random_head
    verifier = GraphVerifier(load_model(root / "target"), compile_blocks=False, fused_layers=False, cache_len=128)
    drafter = GraphFeatureDrafter(copy.deepcopy(head), verifier, verifier.vocab_size, compile_blocks=False,
                                  cache_len=128, fused_layers=False)
    tree = parse_tree_spec(spec)
    step = DeviceTreeStep(verifier, drafter, tree, 3)
    prompt = [5, 17, 33, 8, 2, 41]
    step.prefill(prompt, 64)
    fresh = TorchVerifier(load_model(root / "target"))
    eager = FeatureTreeDrafter(FeatureDrafter(head, fresh), tree)
    seq = list(prompt)
    while len(seq) < len(prompt) + 12:
        outcome = step(seq, 3)
        fresh.prefill(seq, 96)
        eager.drafter.prefill(seq, 96)
        want = eager.propose(seq, step.depth, SamplingParams(), None)
        assert sorted(outcome.block.tokens) == sorted(want.tokens)
        seq += outcome.block.tokens[: outcome.num_accepted] + [outcome.next_token]


def test_after_warm_up_a_prompt_too_short_for_the_tree_captures_nothing(random_head, monkeypatch):  # noqa: F811
    """Warmed up on a prompt long enough for the device tree, a run still captures its plain lead's graphs then
    (plain decoding without the feature write): a short prompt later in the run does not pay a capture inside
    its own time (on the H100, ~100 ms of one ShareGPT prompt's prefill; benchmarks/RESULTS.md 2026-12-05 17:48)."""
    from dfvg.gpu.graph_head import GraphFeatureDrafter
    from dfvg.gpu.graphs import GraphModel, GraphVerifier

    head, root = random_head
    verifier = GraphVerifier(load_model(root / "target"), compile_blocks=False, fused_layers=False, cache_len=128)
    drafter = GraphFeatureDrafter(head, verifier, verifier.vocab_size, compile_blocks=False, cache_len=128,
                                  fused_layers=False)
    spec, engine = parse_tree_spec("dynamic:6"), Engine(verifier)
    engine.warm_up([drafter], [5, 17, 33, 8, 2, 41, 7, 9, 11, 13, 21, 3], [3], 16, tree=spec)
    captured, capture = [], GraphModel.capture

    def counted(gm, key, *args, **kwargs):
        captured.append(key)
        return capture(gm, key, *args, **kwargs)

    monkeypatch.setattr(GraphModel, "capture", counted)
    result = engine.decode(drafter, [5, 17], 16, k=3, tree=spec)
    assert result.steps[0].num_drafted == 0 and result.steps[-1].num_drafted > 0  # the plain lead, then the tree
    assert result.tokens == generate(TorchVerifier(load_model(root / "target")), [5, 17], 16).tokens
    engine.decode(drafter, [5], 16, k=3, tree=spec)  # one token: its lead verifies on the host step
    assert captured == []
