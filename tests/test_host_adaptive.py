"""Adaptive draft length: the policy's arithmetic, the confidence cut, and losslessness in both schedules."""

from __future__ import annotations

import pytest
import torch

from dfvg.checkpoint import load_model
from dfvg.drafter import DraftBlock, TorchDrafter
from dfvg.errors import UserError
from dfvg.generate import generate
from dfvg.host.adaptive import AdaptiveDraftLength, ConfidenceProbe, block_confidence
from dfvg.host.device_config import AdaptiveConfig
from dfvg.host.pipeline import run_pipeline
from dfvg.sampling import SamplingParams
from dfvg.verifier import TorchVerifier
from tests.conftest import EOS_ID
from tests.test_host_pipeline import CacheCheckingDrafter

PROMPT = list(range(2, 60))


@pytest.fixture(scope="module")
def target(tiny_pair):
    return TorchVerifier(load_model(tiny_pair[0]))


def test_heuristic_grows_after_full_acceptance_and_shrinks_after_rejection():
    policy = AdaptiveDraftLength(4, k_min=2, k_max=7)
    assert policy.after(4, 4) == 6 and policy.after(4, 1) == 3 and policy.after(0, 0) == 4
    for drafted, accepted, expected in [(4, 4, 6), (6, 6, 7), (7, 7, 7), (7, 0, 6), (6, 5, 5), (5, 0, 4),
                                        (4, 0, 3), (3, 0, 2), (2, 0, 2)]:
        policy.update(drafted, accepted)
        assert policy.k == expected
    assert policy.history == [4, 6, 7, 7, 6, 5, 4, 3, 2]
    assert AdaptiveDraftLength(30, k_max=8).k == 8
    cfg = AdaptiveConfig(k_min=1, k_max=5, grow=1, shrink=2, threshold=0.5)
    from_cfg = AdaptiveDraftLength.from_config(3, cfg)
    assert (from_cfg.k, from_cfg.after(3, 3), from_cfg.after(3, 0), from_cfg.threshold) == (3, 4, 1, 0.5)
    with pytest.raises(UserError, match="k_min <= k_max"):
        AdaptiveDraftLength(4, k_min=5, k_max=3)
    with pytest.raises(UserError, match="threshold"):
        AdaptiveDraftLength(4, threshold=1.5)


def test_confidence_cut():
    policy = AdaptiveDraftLength(4, threshold=0.5)
    block = DraftBlock([5, 6, 7, 8], torch.eye(10)[[5, 6, 7, 8]], 0.1, 0.2)
    cut = policy.truncate(block, [0.9, 0.7, 0.3, 0.8])
    assert cut.tokens == [5, 6] and cut.probs.shape == (2, 10) and (cut.elapsed_s, cut.modeled_s) == (0.1, 0.2)
    assert policy.truncate(block, [0.1, 0.1, 0.1, 0.1]).tokens == [5]  # the first draft is always kept
    assert policy.truncate(block, None) is block
    assert AdaptiveDraftLength(4).truncate(block, [0.0] * 4) is block  # no threshold, no cut
    assert block_confidence(block, None) == [1.0] * 4


def test_probe_records_one_confidence_per_draft_and_cleans_up(tiny_pair):
    drafter = TorchDrafter(load_model(tiny_pair[1]), 96)
    drafter.prefill(PROMPT, 100)
    with ConfidenceProbe(drafter) as probe:
        block = drafter.propose(PROMPT, 5, SamplingParams(), None)
        values = block_confidence(block, probe)
    assert len(values) == 5 and all(0 < v <= 1 for v in values)
    assert not drafter.model._forward_hooks  # removed on exit


@pytest.mark.parametrize("mode", ["sync", "overlap"])
@pytest.mark.parametrize("corrupt", [None, "all", {2, 3, 9, 10, 11, 17, 25}])
def test_adaptive_length_is_lossless_with_scripted_drafters(target, mode, corrupt):
    expected = generate(target, PROMPT, 31).tokens
    shifted = corrupt if corrupt in (None, "all") else {len(PROMPT) + p for p in corrupt}
    policy = AdaptiveDraftLength(2, k_max=8)
    result = run_pipeline(target, CacheCheckingDrafter(PROMPT + expected, shifted), PROMPT, 31, mode=mode,
                          adaptive=policy)
    assert result.tokens == expected
    planned = policy.history
    if corrupt is None:
        assert planned[:4] == [2, 4, 6, 8]
    elif corrupt == "all":
        assert set(planned) == {1, 2}
    else:
        assert len(set(planned)) > 2


@pytest.mark.parametrize("mode", ["sync", "overlap"])
def test_confidence_threshold_cuts_blocks_and_stays_lossless(tiny_pair, target, mode):
    drafter = TorchDrafter(load_model(tiny_pair[1]), target.vocab_size)
    expected = generate(target, PROMPT, 40, eos_ids=(EOS_ID,)).tokens
    policy = AdaptiveDraftLength(6, k_max=6, grow=0, shrink=0, threshold=0.2)
    result = run_pipeline(target, drafter, PROMPT, 40, eos_ids=(EOS_ID,), mode=mode, adaptive=policy)
    assert result.tokens == expected
    drafted = [s.num_drafted for s in result.steps[:-1]]
    assert min(drafted) < 6  # some block was cut at a low-confidence draft
    assert not drafter.model._forward_hooks


@pytest.mark.parametrize("mode", ["sync", "overlap"])
def test_a_graph_drafters_blocks_carry_the_confidence_the_cut_reads(tiny_pair, target, mode):
    """A graph drafter's replay runs no forward hook, so the probe alone saw nothing and the threshold cut did
    nothing on the GPU's graph path. Under the probe its blocks carry their drafts' top probabilities (here a CPU
    replay of the same graph body), so it cuts the blocks the eager drafter cuts, losslessly; after the run the
    drafter replays its graphs without the extra softmax."""
    from dfvg.gpu.graph_drafter import GraphDrafter

    graph = GraphDrafter(load_model(tiny_pair[1]), target.vocab_size, compile_blocks=False, fused_layers=False)
    graph.prepare(7, confidence=True)  # the warm-up of a run with a threshold (`Engine.warm_up`): k_max + 1
    captured = set(graph.gm.graphs)
    eager = TorchDrafter(load_model(tiny_pair[1]), target.vocab_size)
    expected = generate(target, PROMPT, 40, eos_ids=(EOS_ID,)).tokens
    drafted = {}
    for name, drafter in (("graph", graph), ("eager", eager)):
        policy = AdaptiveDraftLength(6, k_max=6, grow=0, shrink=0, threshold=0.2)
        result = run_pipeline(target, drafter, PROMPT, 40, eos_ids=(EOS_ID,), mode=mode, adaptive=policy)
        assert result.tokens == expected
        drafted[name] = [s.num_drafted for s in result.steps]
    assert drafted["graph"] == drafted["eager"] and min(drafted["graph"][:-1]) < 6
    assert not graph.confidence_wanted and set(graph.gm.graphs) == captured  # none captured inside the run


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_a_graph_drafters_blocks_carry_the_eager_confidence(tiny_pair):
    """The captured graph's softmax gives the eager drafter's top probabilities (float32 on CUDA), beside the same
    drafts; with the flag off its blocks carry none (the plain graph)."""
    from dfvg.engine import make_drafter
    from dfvg.gpu.graph_drafter import GraphDrafter

    vocab = load_model(tiny_pair[0]).config.vocab_size
    graph = make_drafter(tiny_pair[1], "cuda", torch.float32, vocab)
    assert isinstance(graph, GraphDrafter)
    eager = TorchDrafter(load_model(tiny_pair[1], device="cuda"), vocab)
    for drafter in (graph, eager):
        drafter.prefill(PROMPT, 128)
    graph.confidence_wanted = True
    got = graph.propose(PROMPT, 4, SamplingParams(), None)
    with ConfidenceProbe(eager) as probe:
        want = eager.propose(PROMPT, 4, SamplingParams(), None)
    assert got.tokens == want.tokens and got.confidence == pytest.approx(block_confidence(want, probe), abs=1e-3)
    graph.confidence_wanted = False
    graph.rollback(len(PROMPT))
    assert graph.propose(PROMPT, 4, SamplingParams(), None).confidence is None
