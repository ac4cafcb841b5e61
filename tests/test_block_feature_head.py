"""The block feature head (dfvg.feature_head.BlockFeatureDrafter, dfvg.distill.block's feature loss): a feature head
whose body is a block drafter, so a block is one pass (its committed rows read the target's features, its mask rows
read none), trained on a tiny peaked target on CPU.

- it trains: the loss falls, validation acceptance rises and its mask rows learn;
- its logged acceptance is exact: the teacher-forced replay (`block.block_matches` with the target's features)
  equals real `generate` runs with the drafter, step for step;
- decoding with it is lossless at every draft length, one head pass per block, through the CLI too;
- its CUDA-graph drafter and the fused device step (CPU replays of their bodies) draft the eager head's blocks, and
  the output equals plain; so does the emulated FPGA datapath, one integer pass a block.
"""

from __future__ import annotations

import pytest
import torch

from dfvg.checkpoint import load_config, load_model
from dfvg.distill import block, evaluate, teacher
from dfvg.distill.pipeline import run
from dfvg.engine import make_drafter
from dfvg.errors import UserError
from dfvg.feature_head import BlockFeatureDrafter, load_feature_head
from dfvg.generate import generate
from dfvg.sampling import SamplingParams
from dfvg.verifier import TorchVerifier
from tests.test_block_draft import PROMPTS, SIZE, assert_cli_drafts_equal_no_draft
from tests.test_block_draft import setup as setup  # noqa: F401  (the tiny peaked target and its prompts)
from tests.test_distill import VOCAB, options


@pytest.fixture(scope="module")
def trained(setup):  # noqa: F811
    summary = run(options(setup, "block-head", feature_head=True, block_size=SIZE, eval_ks=(2, 4), layers=2,
                          hidden=64, steps=150, lr=1e-2), log=lambda line: None)
    return setup / "block-head", summary


def drafter_for(path, setup, verifier=None):
    verifier = verifier or TorchVerifier(load_model(setup / "target"))
    return verifier, make_drafter(path, "cpu", torch.float32, VOCAB, verifier=verifier)


def test_the_block_head_trains_and_its_masks_learn(trained):
    path, summary = trained
    losses = summary["losses"]
    assert sum(losses[-10:]) / 10 < 0.7 * sum(losses[:10]) / 10
    before, after = summary["acceptance_before"][4], summary["acceptance_after"][4]
    assert after["mean_accepted_length"] > before["mean_accepted_length"] + 0.3
    assert after["per_position_acceptance"][1] > 0.05  # the first mask's token: 0 before training
    assert load_config(path).block_size == SIZE and summary["feature_head"]["feature_bytes_per_token_bf16"] > 0


def test_exact_acceptance_equals_real_block_steps(trained, setup):
    """The replay reads the target's teacher-forced features; the drafter reads what the verifier wrote. Mask rows
    read no predicted features, so the two see the same rows: the steps must agree exactly (a leak of a later
    feature, a mask row reading a prediction, or a wrong position breaks this)."""
    target_model = load_model(setup / "target")
    seqs = teacher.generate_all(target_model, list(PROMPTS), 20, set(), 8, SamplingParams(), 0, 3,
                                log=lambda line: None)
    matches = block.block_matches(load_feature_head(trained[0]), seqs, target=target_model)
    verifier, drafter = drafter_for(trained[0], setup, TorchVerifier(target_model))
    assert isinstance(drafter, BlockFeatureDrafter)
    accepted = 0
    for prompt, match in zip(PROMPTS, matches, strict=True):
        for k in (2, 4):
            real = generate(verifier, prompt, 20, drafter=drafter, draft_length=k).steps
            replayed = evaluate.steps_over(match, k, 20)
            assert [(s.num_drafted, s.num_accepted) for s in real] == \
                [(s.num_drafted, s.num_accepted) for s in replayed]
            accepted += sum(s.num_accepted for s in real)
    assert accepted > 0


@pytest.mark.parametrize("k", [1, 3, 4, 6])
def test_greedy_output_equals_plain_with_one_head_pass_per_block(trained, setup, k):
    verifier, drafter = drafter_for(trained[0], setup)
    calls, forward = [], drafter.head.forward
    drafter.head.forward = lambda *args, **kwargs: (calls.append(1), forward(*args, **kwargs))[1]
    for prompt in PROMPTS:
        plain = generate(verifier, prompt, 30)
        calls.clear()
        spec = generate(verifier, prompt, 30, drafter=drafter, draft_length=k)
        assert spec.tokens == plain.tokens and spec.stats()["num_accepted_tokens"] > 0
        assert max(s.num_drafted for s in spec.steps) == min(k, SIZE)
        assert len(calls) == 1 + sum(s.num_drafted > 0 for s in spec.steps)  # the prompt, then one pass a block


def test_the_cli_drafts_with_it_on_cpu_and_the_fpga_datapath(trained, setup, capsys):
    assert_cli_drafts_equal_no_draft(setup, capsys, trained[0])


@pytest.mark.parametrize("bits", [8, 4])
def test_the_fpga_datapath_drafts_the_heads_block_in_one_integer_pass(trained, setup, tmp_path, bits):
    """The emulated datapath (int8, or int4 layers): each block is ONE integer pass (committed rows on the target's
    int8 features, mask rows on zeros), equal to a fresh datapath's single pass over the whole context (a stale mask
    slot, a mask row reading a feature or a wrong position breaks this); output equals plain; the integer head
    accepts within 3 % of the float head's mean accepted length."""
    from dfvg.fpga.datapath.feature_drafter import FpgaFeatureDrafter
    from dfvg.stats import mean_accepted_length

    verifier = TorchVerifier(load_model(setup / "target"))
    fpga, fresh = (FpgaFeatureDrafter.from_checkpoint(trained[0], verifier, setup / "target", VOCAB, bits=bits,
                                                      group_size=16, artifact_dir=tmp_path / "a") for _ in range(2))
    passes, step, propose = [], fpga.model.step, fpga.propose
    fpga.model.step = lambda *args, **kwargs: passes.append(1) or step(*args, **kwargs)

    def checked(context, k, sampling, generator):
        before = len(passes)
        block = propose(context, k, sampling, generator)
        assert len(passes) == before + 1 and block.modeled_s > 0
        n = len(block.tokens)  # a fresh datapath's single pass: f_{p-1} for each committed row, zeros for the masks
        fresh.model.setup_cache(len(context) + SIZE)
        features = fresh._true_features(0, len(context))
        ids = torch.tensor(list(context) + load_config(trained[0]).mask_ids[: n - 1])
        logits, _ = fresh.model.step(ids, torch.cat([features, features.new_zeros(n - 1, features.shape[1])]), 0,
                                     rows=torch.arange(len(ids) - n, len(ids)))
        assert fresh.model.tokens(logits, VOCAB).tolist() == block.tokens
        return block

    fpga.propose = checked
    steps = {}
    float_head = BlockFeatureDrafter(load_feature_head(trained[0]), verifier, VOCAB)
    for name, drafter in (("fpga", fpga), ("float", float_head)):
        steps[name] = []
        for prompt in PROMPTS:
            result = generate(verifier, list(prompt), 30, drafter=drafter, draft_length=4)
            assert result.tokens == generate(verifier, list(prompt), 30).tokens
            steps[name] += result.steps
    accepted = {name: mean_accepted_length(taken) for name, taken in steps.items()}
    assert accepted["fpga"] == pytest.approx(accepted["float"], rel=0.03) and accepted["float"] > 1.3
    with pytest.raises(UserError, match="--eval-k <= --block-size"):
        options(setup, "bad", feature_head=True, block_size=2, eval_ks=(2, 4)).check()


@pytest.mark.parametrize("k", [2, 4])
def test_the_graph_drafter_and_device_step_draft_the_eager_heads_blocks(trained, setup, k):
    """GraphBlockFeatureDrafter's one-pass graph and the fused device step (CPU replays of the CUDA-graph bodies) give
    the eager head's steps, every accepted count through the same (c, k) graphs; the output equals plain's."""
    from dfvg.engine import Engine
    from dfvg.gpu.fast import DeviceStep
    from dfvg.gpu.graph_head import GraphBlockFeatureDrafter
    from dfvg.gpu.graphs import GraphVerifier

    head = load_feature_head(trained[0])
    verifier = GraphVerifier(load_model(setup / "target"), compile_blocks=False, fused_layers=False, cache_len=96)
    graphs = GraphBlockFeatureDrafter(head, verifier, VOCAB, compile_blocks=False, cache_len=96, fused_layers=False)
    host_verifier = TorchVerifier(load_model(setup / "target"))
    eager = BlockFeatureDrafter(load_feature_head(trained[0]), host_verifier, VOCAB)
    engine, accepted = Engine(verifier), 0
    for prompt in PROMPTS:
        want = generate(host_verifier, list(prompt), 24, drafter=eager, draft_length=k)
        got = generate(verifier, list(prompt), 24, drafter=graphs, draft_length=k)
        fast = engine.decode(graphs, list(prompt), 24, k=k)
        assert got.tokens == fast.tokens == want.tokens == generate(host_verifier, list(prompt), 24).tokens
        assert [(s.num_drafted, s.num_accepted) for s in got.steps] == \
            [(s.num_drafted, s.num_accepted) for s in want.steps]
        full = [i for i, s in enumerate(want.steps) if s.num_drafted == k]  # the host shortens the last
        assert [fast.steps[i].num_accepted for i in full] == [want.steps[i].num_accepted for i in full]
        accepted += sum(s.num_accepted for s in fast.steps)
    assert accepted > 0 and any(isinstance(s, DeviceStep) for s in engine.device_steps.values())
    used = {key[2] for key in graphs.gm.graphs if key[0] == "feature-draft"}
    assert k in used and max(used) == k  # blocks of k (shorter near the end), one pass each


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_block_head_changes_no_token(trained, setup):
    """bf16 on CUDA, fused layers, captured graphs: the device step with the block feature head (one head pass per
    block, `feature_block_pass`) and its host-step graph blocks give plain decoding's tokens."""
    from dfvg.engine import Engine
    from dfvg.gpu.fast import DeviceStep
    from dfvg.gpu.graph_head import GraphBlockFeatureDrafter
    from dfvg.gpu.graphs import GraphVerifier

    engine = Engine(GraphVerifier(load_model(setup / "target", torch.bfloat16, "cuda"), cache_len=128))
    drafter = make_drafter(trained[0], "cuda", torch.bfloat16, VOCAB, verifier=engine.verifier)
    assert isinstance(drafter, GraphBlockFeatureDrafter)
    accepted = 0
    for prompt in PROMPTS:
        plain = engine.decode(None, list(prompt), 40, k=0).tokens
        fast = engine.decode(drafter, list(prompt), 40, k=4)
        host = generate(engine.verifier, list(prompt), 40, drafter=drafter, draft_length=4)
        assert fast.tokens == plain and host.tokens == plain
        accepted += fast.stats()["num_accepted_tokens"]
    assert accepted > 0 and any(isinstance(step, DeviceStep) for step in engine.device_steps.values())
