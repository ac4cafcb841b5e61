"""The feature-level draft head (dfvg/feature_head.py, dfvg/distill/feature.py) on tiny checkpoints, on CPU.

- a distilled head (scripts' pipeline with --feature-head) learns: loss falls, validation acceptance rises
  well above the untrained head's;
- decoding with it is lossless (greedy equals plain; sampled runs equal plain's distribution is
  `accept_block`'s, checked elsewhere: here a sampled run must at least use the drafts' probabilities);
- the replay of its greedy steps (`rollouts`, `feature_steps`) equals what `dfvg.generate` does with the real drafter,
  step for step, and a head that ignores the features replays differently;
- the CUDA-graph verifier (its CPU replay here) hands out the same features: same steps as the eager one;
- a drafter that takes over in the middle of a generation (a fallback, a retry) catches up from the
  verifier's features alone and drafts what the drafter that followed the whole generation drafts;
- bad folders, unsupported schedules and tensor parallelism are refused in one line, and a tool that
  loads drafts as standalone models refuses a head's folder instead of drafting with its body.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from dfvg.checkpoint import is_feature_head, load_model
from dfvg.distill import feature, teacher
from dfvg.distill.pipeline import run
from dfvg.distill.train import make_batch
from dfvg.engine import Engine, make_drafter
from dfvg.errors import UserError
from dfvg.feature_head import FeatureDrafter, FeatureHead, load_feature_head
from dfvg.generate import HostStep, generate
from dfvg.parallel import group
from dfvg.sampling import SamplingParams
from dfvg.tree import TreeSpec
from dfvg.verifier import TorchVerifier
from tests.conftest import EOS_ID, save_checkpoint
from tests.test_distill import VOCAB, options
from tests.test_distill import distilled as distilled  # noqa: F401  (a standalone draft of the same data)
from tests.test_distill import setup as setup  # noqa: F401  (the tiny peaked target and its prompts)

PROMPTS = ([5, 17, 99], [150, 3, 42, 42, 7, 60], [9])


@pytest.fixture(scope="module")
def head_dir(setup):  # noqa: F811
    summary = run(options(setup, "feature-head", feature_head=True, steps=100), log=lambda line: None)
    return setup / "feature-head", summary


def drafter_for(head_dir, setup, verifier=None):  # noqa: F811
    verifier = verifier or TorchVerifier(load_model(setup / "target"))
    return verifier, make_drafter(head_dir, "cpu", torch.float32, VOCAB, fast=False, verifier=verifier)


def test_feature_head_learns(head_dir):
    path, summary = head_dir
    losses = summary["losses"]
    assert sum(losses[-10:]) / 10 < 0.7 * sum(losses[:10]) / 10
    before, after = summary["acceptance_before"][4], summary["acceptance_after"][4]
    assert after["acceptance_rate"] > 0.15 and after["acceptance_rate"] > 3 * before["acceptance_rate"]
    assert summary["feature_head"]["target_hidden_size"] == 64
    assert is_feature_head(path) and json.loads((path / "distill_recipe.json").read_text())["options"]["feature_head"]


@pytest.mark.parametrize("k", [1, 4])
def test_greedy_decoding_with_the_head_equals_plain(head_dir, setup, k):  # noqa: F811
    verifier, drafter = drafter_for(head_dir[0], setup)
    assert isinstance(drafter, FeatureDrafter)
    accepted = 0
    for prompt in PROMPTS:
        plain = generate(TorchVerifier(load_model(setup / "target")), prompt, 30, eos_ids=[EOS_ID])
        spec = generate(verifier, prompt, 30, eos_ids=[EOS_ID], drafter=drafter, draft_length=k)
        assert spec.tokens == plain.tokens
        accepted += spec.stats()["num_accepted_tokens"]
    assert accepted > 0


def test_sampled_blocks_carry_the_heads_distributions(head_dir, setup):  # noqa: F811
    verifier, drafter = drafter_for(head_dir[0], setup)
    sampling = SamplingParams(temperature=0.8)
    verifier.prefill(list(PROMPTS[1]), 64)
    drafter.prefill(list(PROMPTS[1]), 64)
    block = drafter.propose(list(PROMPTS[1]), 3, sampling, torch.Generator().manual_seed(0))
    assert block.probs.shape == (3, VOCAB)
    torch.testing.assert_close(block.probs.sum(-1), torch.ones(3))
    assert all(float(block.probs[i, t]) > 0 for i, t in enumerate(block.tokens))
    result = generate(verifier, list(PROMPTS[1]), 20, drafter=drafter, draft_length=3, sampling=sampling, seed=1)
    assert len(result.tokens) == 20


def test_replayed_steps_equal_real_speculative_steps(head_dir, setup):  # noqa: F811
    head = load_feature_head(head_dir[0])
    target = load_model(setup / "target")
    seqs = teacher.generate_all(target, list(PROMPTS), 20, set(), 8, SamplingParams(), 0, 3, log=lambda line: None)
    verifier, drafter = drafter_for(head_dir[0], setup)
    blind = load_feature_head(head_dir[0])
    blind.fuse.weight[:, : blind.target_hidden_size] = 0  # the same head, deaf to the features
    differs = False
    for prompt, seq in zip(PROMPTS, seqs, strict=True):
        ids, positions, _, _, _ = make_batch([seq], torch.device("cpu"))
        features = feature.target_features(target, ids, positions)[0]
        drafted, deaf = feature.rollouts(head, features, seq, 4), feature.rollouts(blind, features, seq, 4)
        for k in (2, 4):
            real = generate(verifier, list(prompt), 20, drafter=drafter, draft_length=k).steps
            replayed = feature.feature_steps(drafted, seq, k, 20)
            assert [(s.num_drafted, s.num_accepted) for s in real] == \
                [(s.num_drafted, s.num_accepted) for s in replayed]
            differs |= [s.num_accepted for s in feature.feature_steps(deaf, seq, k, 20)] != \
                [s.num_accepted for s in replayed]
    assert differs  # the replay reads the features (a mutation that drops them is caught)


@pytest.fixture(scope="module")
def random_head(tmp_path_factory):
    """A random head on a random full-strength target, its attention output scaled up: every draft depends on
    the features and on which keys each row attends to (the trained pair's peaked target is nearly a bigram
    model, and a plain random head's attention adds too little to its residual to show a wrong mask)."""
    root = tmp_path_factory.mktemp("random-head")
    save_checkpoint(root / "target", "qwen2", seed=1)
    save_checkpoint(root / "head", "qwen2", seed=2, num_hidden_layers=2, hidden_size=32, intermediate_size=48,
                    initializer_range=0.05)
    head = FeatureHead(load_model(root / "head", feature_head_body=True), 64)
    torch.manual_seed(3)
    with torch.no_grad():
        for module in (head.fuse, head.predict):
            torch.nn.init.normal_(module.weight, std=0.3)
        for layer in head.body.layers:
            layer.attention.wqkv.weight *= 8  # peaked scores: RoPE positions matter
            layer.attention.wo.weight *= 20
    return head, root


@pytest.mark.parametrize("pair", ["trained", "random"])
def test_every_rollout_row_is_the_block_the_drafter_proposes_there(pair, head_dir, setup, random_head):  # noqa: F811
    head, root = (load_feature_head(head_dir[0]), setup) if pair == "trained" else random_head
    target = load_model(root / "target")
    prompt = list(PROMPTS[1]) if pair == "trained" else [5, 17, 33, 8, 2, 41]  # the random pair has 96 ids
    [seq] = teacher.generate_all(target, [prompt], 12, set(), 8, SamplingParams(), 0, 1, log=lambda line: None)
    ids, positions, _, _, _ = make_batch([seq], torch.device("cpu"))
    drafted = feature.rollouts(head, feature.target_features(target, ids, positions)[0], seq, 5)
    verifier = TorchVerifier(load_model(root / "target"))
    drafter = FeatureDrafter(head, verifier, verifier.vocab_size)
    for i in range(len(seq.continuation)):
        context = seq.prompt + seq.continuation[:i]
        verifier.prefill(context, 64)
        drafter.prefill(context, 64)
        assert drafter.propose(context, 5, SamplingParams(), None).tokens == drafted[i].tolist(), i


def test_the_cli_drafts_with_a_feature_head(head_dir, setup):  # noqa: F811
    args = [sys.executable, "-m", "dfvg", "generate", "--target", str(setup / "target"), "--prompt-ids", "5,17,99",
            "--max-new-tokens", "16", "--json", "--device", "cpu"]
    plain = subprocess.run(args + ["--no-draft"], capture_output=True, text=True, timeout=300)
    spec = subprocess.run(args + ["--draft", str(head_dir[0]), "--draft-length", "3"], capture_output=True,
                          text=True, timeout=300)
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr
    assert json.loads(spec.stdout)["tokens"] == json.loads(plain.stdout)["tokens"]
    assert json.loads(spec.stdout)["stats"]["num_accepted_tokens"] > 0  # on the FPGA: test_fpga_feature_head.py


def test_unsupported_schedules_and_bad_folders_are_refused(head_dir, setup, tmp_path):  # noqa: F811
    verifier, drafter = drafter_for(head_dir[0], setup)
    engine = Engine(verifier)
    for kwargs in ({"mode": "overlap"}, {"mode": "overlap", "tree": TreeSpec((2, 1))}):
        with pytest.raises(UserError, match="feature head drafts in the sync schedule"):
            engine.decode(drafter, list(PROMPTS[0]), 8, k=2, **kwargs)
    with pytest.raises(UserError, match="one sequence at a time"):
        engine.decode_batch([drafter, drafter], [list(PROMPTS[0])] * 2, 8, k=2)

    class NoFeatures:  # a verifier that cannot give features
        model, vocab_size = verifier.model, VOCAB
    with pytest.raises(UserError, match="does not give"):
        make_drafter(head_dir[0], "cpu", torch.float32, VOCAB, fast=False, verifier=NoFeatures())
    with pytest.raises(UserError, match="features 64 wide, but the target's hidden size is 32"):
        load_feature_head(head_dir[0], target_hidden_size=32)
    broken = tmp_path / "broken"
    broken.mkdir()
    for item in head_dir[0].iterdir():
        if item.name != "feature_head.safetensors":
            (broken / item.name).write_bytes(item.read_bytes())
    with pytest.raises(UserError, match="feature_head.safetensors is missing"):
        load_feature_head(broken)
    (broken / "feature_head.json").write_text('{"format": 9}')
    with pytest.raises(UserError, match="not a DFVG feature head of format 1"):
        load_feature_head(broken)


def test_a_drafter_taking_over_mid_generation_catches_up(head_dir, setup):  # noqa: F811
    verifier, follower = drafter_for(head_dir[0], setup)
    _, newcomer = drafter_for(head_dir[0], setup, verifier)
    prompt, greedy = list(PROMPTS[1]), SamplingParams()
    step = HostStep(verifier, follower, greedy, torch.Generator())
    step.prefill(prompt, 64)
    newcomer.prefill(prompt, 64)  # then it sits out while the follower drafts
    seq = list(prompt)
    for _ in range(4):
        seq += step(seq, 3).committed
    want = follower.propose(seq, 3, greedy, None)
    got = newcomer.propose(seq, 3, greedy, None)
    assert got.tokens == want.tokens and len(seq) > len(prompt) + 4


def test_tensor_parallel_and_standalone_loaders_refuse_a_head(head_dir, setup, monkeypatch):  # noqa: F811
    monkeypatch.setattr(group, "_CURRENT", group.TensorParallel(1, 2, torch.device("cpu")))
    with pytest.raises(UserError, match="does not run under tensor parallelism"):
        make_drafter(head_dir[0], "cpu", torch.float32, VOCAB, fast=False)
    monkeypatch.setattr(group, "_CURRENT", None)
    with pytest.raises(UserError, match="cannot run as a standalone draft"):
        load_model(head_dir[0])
    rtl = subprocess.run([sys.executable, "-m", "dfvg.fpga.rtl_run", "--draft", str(head_dir[0]), "--prompt-ids",
                          "5,17", "--tokens", "2"], capture_output=True, text=True, timeout=300)
    assert rtl.returncode == 2 and rtl.stderr.count("\n") == 1 and "is a feature head" in rtl.stderr


def test_the_graph_verifier_gives_the_eager_verifiers_features(head_dir, setup):  # noqa: F811
    from dfvg.gpu.graphs import GraphVerifier

    eager, eager_drafter = drafter_for(head_dir[0], setup)
    graph = GraphVerifier(load_model(setup / "target"), compile_blocks=False, cache_len=96)
    graph_drafter = make_drafter(head_dir[0], "cpu", torch.float32, VOCAB, fast=False, verifier=graph)
    for prompt in PROMPTS:
        want = generate(eager, list(prompt), 24, drafter=eager_drafter, draft_length=3)
        got = generate(graph, list(prompt), 24, drafter=graph_drafter, draft_length=3)
        assert got.tokens == want.tokens
        assert [s.num_accepted for s in got.steps] == [s.num_accepted for s in want.steps]
        engine = Engine(graph)
        assert engine.decode(graph_drafter, list(prompt), 24, k=3).tokens == want.tokens
    assert sum(s.num_accepted for s in got.steps) > 0


def test_a_plain_decode_beside_a_head_replays_graphs_without_the_feature_write(head_dir, setup, distilled):  # noqa: F811
    """One engine, one graph verifier, a head attached (as in a `dfvg run` with the head as draft_model): the
    plain decode and a standalone draft's write no features (their graphs are the plain model's), and the head
    decoded after them drafts exactly as it did before them."""
    from dfvg.gpu.graphs import GraphVerifier

    verifier = GraphVerifier(load_model(setup / "target"), compile_blocks=False, cache_len=96)
    head = make_drafter(head_dir[0], "cpu", torch.float32, VOCAB, verifier=verifier)
    standalone = make_drafter(distilled[0], "cpu", torch.float32, VOCAB, verifier=verifier)
    engine, prompt = Engine(verifier), list(PROMPTS[1])
    first = engine.decode(head, prompt, 24, k=3)
    assert sum(s.num_accepted for s in first.steps) > 0 and verifier.features.any()
    verifier.features.zero_()
    assert engine.decode(None, prompt, 24, k=0).tokens == first.tokens
    assert engine.decode(standalone, prompt, 24, k=3).tokens == first.tokens
    assert not verifier.features.any()  # neither wrote a feature
    again = engine.decode(head, prompt, 24, k=3)
    assert again.tokens == first.tokens
    assert [s.num_accepted for s in again.steps] == [s.num_accepted for s in first.steps]


def test_features_are_written_where_a_head_may_take_over_and_warm_up_prepares_both_kinds(head_dir, setup,
                                                                                           distilled):  # noqa: F811
    """A standalone draft whose fallback is a head writes the features (the head may take over mid-decode and
    read them); warm-up prepares the verify graphs with and without the write, so neither decode captures one."""
    from dfvg.gpu.graphs import GraphVerifier

    verifier = GraphVerifier(load_model(setup / "target"), compile_blocks=False, cache_len=96)
    head = make_drafter(head_dir[0], "cpu", torch.float32, VOCAB, verifier=verifier)
    standalone = make_drafter(distilled[0], "cpu", torch.float32, VOCAB, verifier=verifier)
    engine, prompt = Engine(verifier, fallbacks=[head]), list(PROMPTS[1])
    engine.decode(standalone, prompt, 16, k=3)
    assert verifier.features.any() and verifier.features_end > 0
    engine = Engine(verifier)
    engine.warm_up([head, None], prompt, [3], 16)
    prepared = set(verifier.gm.graphs)
    assert {key[1] for key in prepared if key[0][0] == "verify-accept-runner"} == {False, True}
    engine.decode(head, prompt, 16, k=3)
    engine.decode(None, prompt, 16, k=0)
    assert not [key for key in set(verifier.gm.graphs) - prepared if key[0][0].startswith("verify-accept")]
    assert verifier.features_end == 0  # the plain decode wrote none, and says so


def test_a_feature_head_run_stopped_and_resumed_equals_one_run(setup):  # noqa: F811
    """Two leases of --feature-head training (stop, then --resume) export the head of one run; a plain
    draft's checkpoint is not taken for a head's."""
    ckpt = setup / "ckpt-head"
    # batches of 24: the stop comes after the first epoch, so the resumed run recomputes features the first kept
    first = run(options(setup, "head-leased", feature_head=True, steps=12, batch_size=24, checkpoint_dir=str(ckpt),
                        stop_after=7), log=lambda line: None)
    assert first["finished"] is False and first["step"] == 7
    with pytest.raises(UserError, match="draft shape differs from the checkpoint"):
        run(options(setup, "plain-on-head", steps=12, batch_size=24, resume=str(ckpt)), log=lambda line: None)
    with pytest.raises(UserError, match="trained with feature_unroll=2, this run has feature_unroll=3"):
        run(options(setup, "other-loss", feature_head=True, feature_unroll=3, steps=12, batch_size=24,
                    resume=str(ckpt)),
            log=lambda line: None)
    with pytest.raises(UserError, match="--feature-unroll >= 1"):
        run(options(setup, "bad", feature_head=True, feature_unroll=0), log=lambda line: None)
    run(options(setup, "head-leased", feature_head=True, steps=12, batch_size=24, resume=str(ckpt)),
        log=lambda line: None)
    whole = run(options(setup, "head-whole", feature_head=True, steps=12, batch_size=24), log=lambda line: None)
    for name in ("model.safetensors", "feature_head.safetensors"):
        a, b = (load_file(str(setup / run_dir / name)) for run_dir in ("head-leased", "head-whole"))
        assert all(torch.equal(a[n], b[n]) for n in a)
    assert json.loads((setup / "head-leased" / "distill_recipe.json").read_text())["losses"] == whole["losses"]


def test_a_head_started_from_a_draft_begins_as_that_draft(setup, distilled):  # noqa: F811
    """--init-from: with fuse's feature half zero the untrained head drafts exactly what the standalone draft
    drafts (its replayed validation steps equal the draft's teacher-forced ones); another shape is refused."""
    draft_dir, draft_summary = distilled
    head = run(options(setup, "head-from-draft", feature_head=True, steps=1, init_from=str(draft_dir)),
               log=lambda line: None)
    for k in (2, 4):
        started, draft = head["acceptance_before"][k], draft_summary["acceptance_after"][k]
        assert started["num_verify_steps"] == draft["num_verify_steps"]
        assert started["per_position_acceptance"] == draft["per_position_acceptance"]
    assert draft_summary["acceptance_after"][4]["acceptance_rate"] > 0.15  # a draft that drafts something
    assert len(head["init_from_sha256"]) == 64
    with pytest.raises(UserError, match="its shape differs from this run's draft"):
        run(options(setup, "other-shape", feature_head=True, hidden=16, init_from=str(draft_dir)),
            log=lambda line: None)


def test_a_head_started_from_a_head_begins_as_that_head(setup, head_dir):  # noqa: F811
    """--init-from a feature head: body and projections are that head's (the new run's replayed validation
    steps before training equal the head's after its training); a standalone draft may not start from it."""
    path, trained = head_dir
    again = run(options(setup, "head-from-head", feature_head=True, steps=1, init_from=str(path)),
                log=lambda line: None)
    for k in (2, 4):
        assert again["acceptance_before"][k] == trained["acceptance_after"][k]
    assert trained["acceptance_after"][4]["acceptance_rate"] > 0.15
    with pytest.raises(UserError, match="is a feature head: pass --feature-head"):
        run(options(setup, "draft-from-head", init_from=str(path)), log=lambda line: None)


def test_a_run_from_a_draft_keeps_its_head_vocabulary_on_other_data(setup, distilled):  # noqa: F811
    """Teacher data regenerated differently (here: sampled at another seed) counts other head ids; a run that
    --init-from a draft keeps that draft's ids, so its weights still mean the same tokens."""
    draft_dir, _ = distilled
    other = dict(steps=1, seed=5, teacher_temperature=1.0, teacher_cache=str(setup / "teacher-sampled"))
    run(options(setup, "fresh-vocab", **other), log=lambda line: None)
    run(options(setup, "kept-vocab", init_from=str(draft_dir), **other), log=lambda line: None)
    ids = {name: load_model(setup / name).head_token_ids for name in ("draft", "fresh-vocab", "kept-vocab")}
    assert not torch.equal(ids["fresh-vocab"], ids["draft"])  # the data alone would choose other rows
    assert torch.equal(ids["kept-vocab"], ids["draft"])
    record = json.loads((setup / "kept-vocab" / "draft_vocab.json").read_text())  # the ids the loss trained
    assert record["token_ids"] == ids["draft"].tolist() and record["source"].startswith("kept from --init-from")


def recorded(drafter) -> list[list[int]]:
    """Every block `drafter` proposes from now on, in order (its propose wrapped on the instance)."""
    blocks, propose = [], drafter.propose

    def record(*args, **kwargs):
        block = propose(*args, **kwargs)
        blocks.append(block.tokens)
        return block

    drafter.propose = record
    return blocks


def graph_head(head_dir, verifier):
    """The head's CUDA-graph drafter, here replaying its block graphs eagerly on the CPU."""
    from dfvg.gpu.graph_head import GraphFeatureDrafter

    eager = make_drafter(head_dir, "cpu", torch.float32, VOCAB, fast=False, verifier=verifier)
    return GraphFeatureDrafter(eager.head, verifier, VOCAB, compile_blocks=False, cache_len=96)


@pytest.mark.parametrize("pair", ["trained", "random"])
@pytest.mark.parametrize("k", [1, 3, 4])
def test_the_graph_head_drafts_the_eager_heads_blocks(head_dir, setup, random_head, pair, k):  # noqa: F811
    """Greedy: the block graph (c catch-up positions, then k - 1 self-fed ones) proposes what the eager head
    proposes, whole blocks step for step (the random pair's drafts depend on every feature and position), so
    the output equals plain decoding; every (c, k) graph it used was captured."""
    from dfvg.gpu.graph_head import GraphFeatureDrafter
    from dfvg.gpu.graphs import GraphVerifier

    head, root = (load_feature_head(head_dir[0]), setup) if pair == "trained" else random_head
    long_prompt = [(i * 37 + 11) % 61 for i in range(150)]  # 64-row chunks: graphs, then eager near the scratch
    prompts = PROMPTS[:2] if pair == "trained" else ([5, 17, 33, 8, 2, 41], [60, 3], long_prompt)
    for verifier in (TorchVerifier(load_model(root / "target")),
                     GraphVerifier(load_model(root / "target"), compile_blocks=False, cache_len=96)):
        eager = FeatureDrafter(head, verifier, verifier.vocab_size)
        graphs = GraphFeatureDrafter(head, verifier, verifier.vocab_size, compile_blocks=False, cache_len=96)
        eager_blocks, graph_blocks = recorded(eager), recorded(graphs)
        for prompt in prompts:
            want = generate(verifier, list(prompt), 24, drafter=eager, draft_length=k)
            got = generate(verifier, list(prompt), 24, drafter=graphs, draft_length=k)
            assert got.tokens == want.tokens == generate(verifier, list(prompt), 24).tokens
            assert [(s.num_drafted, s.num_accepted) for s in got.steps] == \
                [(s.num_drafted, s.num_accepted) for s in want.steps]
        assert graph_blocks == eager_blocks and len(eager_blocks) > 6  # whole blocks, rejected drafts too
        used = {key[1] for key in graphs.gm.graphs if key[0] == "feature-draft" and key[2] == k}
        assert used and max(used) <= k + 1
        assert ("feature-prefill-chunk",) in graphs.gm.graphs  # prompts went through the padded chunk graph


@pytest.mark.parametrize("k", [2, 4])
def test_the_graph_head_equals_the_eager_head_at_every_catch_up_length(random_head, k):
    """Lockstep on the feature-sensitive random head, the verifier's states recomputed for each context: every
    step accepts a different number of the drafts (0..k, so the graph feeds c = 1..k + 1 positions with the
    target's states), and the graph's block equals the eager head's every time."""
    lockstep(*random_head, k, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_replayed_head_graphs_equal_the_eager_head(random_head):
    """The same lockstep with real CUDA-graph captures and replays (float32: the block path, whose rows the
    eager head computes alike), so a value frozen into a graph at capture would show."""
    lockstep(*random_head, 4, "cuda")


def lockstep(head, root, k: int, device: str) -> None:
    import copy

    from dfvg.gpu.graph_head import GraphFeatureDrafter

    verifier, greedy = TorchVerifier(load_model(root / "target", device=device)), SamplingParams()
    eager = FeatureDrafter(copy.deepcopy(head).to(device), verifier, verifier.vocab_size)
    graphs = GraphFeatureDrafter(copy.deepcopy(head).to(device), verifier, verifier.vocab_size,
                                 compile_blocks=False, cache_len=96)
    graphs.prepare(k)  # before any prefill: it sizes the cache itself, and captures the prompt's chunk graph
    assert graphs.gm.cache_len >= 96 and ("feature-prefill-chunk",) in graphs.gm.graphs
    context = [5, 17, 33, 8, 2, 41]
    verifier.prefill(context, 96)
    for drafter in (eager, graphs):
        drafter.prefill(context, 96)
    for step in range(2 * (k + 1)):
        verifier.prefill(context, 96)  # f_p of every position of the context
        want = eager.propose(context, k, greedy, None).tokens
        assert graphs.propose(context, k, greedy, None).tokens == want, step
        accepted = step % (k + 1)
        for drafter in (eager, graphs):
            drafter.rollback(len(context) + accepted)
        context = context + want[:accepted] + [(7 * step + 3) % 90 + 2]
    used = {key[1] for key in graphs.gm.graphs if key[0] == "feature-draft" and key[2] == k}
    assert used == set(range(1, k + 2))


def test_a_compiled_head_without_fused_layers_feeds_prompts_eagerly(random_head, monkeypatch):
    """Where the head's layers are compiled but not fused (fp32 on CUDA, a q/k-norm head), a prompt goes through
    the eager forward: chunks through the compiled block would recompile for every new chunk length."""
    from dfvg.gpu.graph_head import GraphFeatureDrafter

    head, root = random_head
    verifier = TorchVerifier(load_model(root / "target"))
    compiled = GraphFeatureDrafter(head, verifier, verifier.vocab_size, compile_blocks=True, cache_len=96)
    calls = []
    monkeypatch.setattr(FeatureDrafter, "_feed", lambda self, *args: calls.append(len(args[0])) or ("l", "f"))
    assert not compiled.gm.fused and compiled._feed([5, 6, 7], 0, torch.zeros(3, 1)) == ("l", "f")
    assert calls == [3]


def test_the_graph_head_catches_up_a_long_gap_and_samples_eagerly(head_dir, setup):  # noqa: F811
    """A graph head that sat out several steps fills the gap through its padded chunk graph (`_fill`), then drafts
    the follower's block from its block graph; a sampled block takes the eager path (no graph of that k is
    captured)."""
    verifier, follower = drafter_for(head_dir[0], setup)
    newcomer = graph_head(head_dir[0], verifier)
    prompt, greedy = list(PROMPTS[1]), SamplingParams()
    step = HostStep(verifier, follower, greedy, torch.Generator())
    step.prefill(prompt, 64)
    newcomer.prefill(prompt, 64)
    seq = list(prompt)
    for _ in range(4):
        seq += step(seq, 3).committed
    assert len(seq) - newcomer.true_len > 3 + 1  # the gap is longer than a verify leaves
    assert newcomer.propose(seq, 3, greedy, None).tokens == follower.propose(seq, 3, greedy, None).tokens
    assert all(key[1] <= key[2] + 1 for key in newcomer.gm.graphs if key[0] == "feature-draft")  # gap filled first
    newcomer.rollback(len(seq))
    block = newcomer.propose(seq, 2, SamplingParams(temperature=0.8), torch.Generator().manual_seed(0))
    assert block.probs is not None and not any(key[0] == "feature-draft" and key[2] == 2 for key in newcomer.gm.graphs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_head_drafts_from_graphs_and_stays_lossless(head_dir, setup):  # noqa: F811
    """make_drafter on CUDA gives the graph head; greedy output equals the graph target's plain output in bf16,
    on the fused device step (prompts of k + 2 tokens or more) and on the host step with the head's block
    graph (shorter ones), with no fault sending a device step to the host."""
    from dfvg.gpu.fast import DeviceStep
    from dfvg.gpu.graph_head import GraphFeatureDrafter
    from dfvg.gpu.graphs import GraphVerifier
    from dfvg.gpu.tree_device import DeviceTreeStep
    from dfvg.tree import parse_tree_spec

    def target():
        return GraphVerifier(load_model(setup / "target", torch.bfloat16, "cuda"), compile_blocks=False, cache_len=96)

    verifier, plain = target(), target()
    drafter = make_drafter(head_dir[0], "cuda", torch.bfloat16, VOCAB, verifier=verifier)
    assert isinstance(drafter, GraphFeatureDrafter)
    engine, accepted = Engine(verifier), 0
    long_prompt = [token for _ in range(6) for token in PROMPTS[1]][:150]  # prefilled in fused 64-row chunks
    for prompt in (*PROMPTS, long_prompt):
        for k in (1, 3, 4):
            got = engine.decode(drafter, list(prompt), 24, k=k)
            assert got.tokens == Engine(plain).decode(None, list(prompt), 24, k=0).tokens
            accepted += sum(s.num_accepted for s in got.steps)
    assert any(key[0] == "feature-draft" for key in drafter.gm.graphs) and accepted > 0
    steps = [s for s in engine.device_steps.values() if isinstance(s, DeviceStep)]
    assert len(steps) == 3 and all(s.rows.drafter is drafter and s.host is None for s in steps)
    prompt = list(PROMPTS[1])  # and the head's trees on the device tree step
    for spec in ("2,2,1", "dynamic:12"):
        got = engine.decode(drafter, prompt, 24, k=3, tree=parse_tree_spec(spec))
        assert got.tokens == Engine(plain).decode(None, prompt, 24, k=0).tokens
    assert sum(isinstance(s, DeviceTreeStep) for s in engine.device_steps.values()) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_a_head_trains_with_its_target_features_kept(setup):  # noqa: F811
    """--feature-head training on CUDA with the bf16 teacher: the target's features are kept across epochs
    (`feature.TargetFeatures`, its GPU budget) and the loss falls."""
    summary = run(options(setup, "gpu-head", feature_head=True, device="cuda", steps=30, teacher_dtype="bfloat16",
                          teacher_cache=str(setup / "teacher_gpu_head")), log=lambda line: None)
    assert summary["losses"][-1] < summary["losses"][0]
    assert feature.cache_budget(torch.device("cuda")) > 0
    target = load_model(setup / "target", dtype=torch.bfloat16, device="cuda")  # a sequence's features: the
    tokens = tuple(range(3, 40))  # same bits whatever cache the target had before (resumed runs rely on it)
    alone = feature.TargetFeatures(target, budget=0).of(tokens)
    target.setup_cache(8, 300)
    assert torch.equal(feature.TargetFeatures(target, budget=0).of(tokens), alone) and alone.dtype == torch.bfloat16
