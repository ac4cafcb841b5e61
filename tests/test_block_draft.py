"""The block drafter (dfvg/block_draft.py, dfvg/distill/block.py): k drafts from one pass, trained on a tiny
target on CPU; lossless greedy and sampled, on the eager and the graph paths (CPU replays of the bodies)."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from dfvg.block_draft import BlockDrafter
from dfvg.checkpoint import BLOCK_MASKS_TENSOR, load_model
from dfvg.distill import block, evaluate, teacher
from dfvg.distill.pipeline import run
from dfvg.distill.train import make_batch
from dfvg.drafter import TorchDrafter
from dfvg.engine import Engine, make_drafter
from dfvg.errors import UserError
from dfvg.generate import generate
from dfvg.gpu.fast import DeviceStep
from dfvg.gpu.graph_drafter import GraphBlockDrafter
from dfvg.gpu.graphs import GraphVerifier
from dfvg.sampling import SamplingParams
from dfvg.stats import mean_accepted_length
from dfvg.verifier import TorchVerifier
from tests.stats_helpers import chi_square_p_value, samples_for_power, tilted
from tests.test_distill import VOCAB, options, peaked_setup
from tests.test_sampling import V8, PrefixModel, exact_first_two_laws

SIZE = 4
PROMPTS = ([5, 17, 99], [150, 3, 42, 42, 7, 60], [9, 9, 31, 4, 77])


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return peaked_setup(tmp_path_factory.mktemp("block"))


@pytest.fixture(scope="module")
def trained(setup):
    summary = run(options(setup, "block", block_size=SIZE, eval_ks=(2, 4), layers=2, hidden=64, steps=150),
                  log=lambda line: None)  # mask rows need two layers here: offset 2 is the target's map applied twice
    return setup / "block", summary


def test_block_draft_trains_and_its_masks_learn(trained):
    """The loss falls, and on validation the k = 4 blocks accept more than before training; the masks are
    saved under their name with config.json's dfvg_block_size."""
    directory, summary = trained
    losses = summary["losses"]
    assert sum(losses[-10:]) / 10 < 0.7 * sum(losses[:10]) / 10
    before, after = summary["acceptance_before"][4], summary["acceptance_after"][4]
    assert after["mean_accepted_length"] > before["mean_accepted_length"] + 0.3
    assert after["per_position_acceptance"][1] > 0.05  # the first mask's token (position 2): 0 before training
    assert json.loads((directory / "config.json").read_text())["dfvg_block_size"] == SIZE
    assert load_file(str(directory / "model.safetensors"))[BLOCK_MASKS_TENSOR].shape == (SIZE - 1, 64)


def test_training_rows_see_what_drafting_rows_see(trained, setup):
    """Each mask row of the training batch computes what the drafter's real pass computes for that anchor: the
    committed tokens up to it, then the masks (a leak of a later token, or a wrong position, breaks this). Three
    sequences of unequal lengths in one right-padded batch: every anchor of each, its teacher rows included."""
    target, model = load_model(setup / "target"), load_model(trained[0])
    seqs = teacher.generate_all(target, list(PROMPTS), 12, set(), 8, SamplingParams(), 0, 3, log=lambda line: None)
    seqs = [replace(s, continuation=s.continuation[:n], topk_ids=s.topk_ids[:n], topk_probs=s.topk_probs[:n])
            for s, n in zip(seqs, (3, 12, 7), strict=True)]  # unequal lengths: padding anchors and rows
    ids, _, mask, _, _ = make_batch(seqs, torch.device("cpu"))
    with torch.no_grad():
        hidden, teacher_rows, _ = block.block_hidden(model, ids, mask)
        train_logits = model.logits(hidden)
    width, before = ids.shape[1], 0  # before: teacher rows of the earlier sequences
    for b, seq in enumerate(seqs):
        full, first, n = seq.prompt + seq.continuation, len(seq.prompt) - 1, len(seq.continuation)
        for j in range(n):
            model.setup_cache(1, 64)
            with torch.no_grad():
                live = model.feed(full[: first + j + 1] + model.config.mask_ids, 0)[-SIZE:]
            rows = [first + j] + [width + j * (SIZE - 1) + i for i in range(SIZE - 1)]
            torch.testing.assert_close(train_logits[b, rows], live, atol=1e-4, rtol=1e-4)
            want = [before + j + i if j + i < n else -1 for i in range(SIZE)]  # mask i learns token j + i
            assert teacher_rows[b, rows].tolist() == want
        before += n


def test_exact_acceptance_equals_real_block_steps(trained, setup):
    target_model, draft_model = load_model(setup / "target"), load_model(trained[0])
    seqs = teacher.generate_all(target_model, list(PROMPTS), 20, set(), 8, SamplingParams(), 0, 3,
                                log=lambda line: None)
    matches = block.block_matches(draft_model, seqs)
    verifier, drafter = TorchVerifier(target_model), BlockDrafter(draft_model, VOCAB)
    accepted = 0
    for prompt, match in zip(PROMPTS, matches, strict=True):
        for k in (2, 4):
            real = generate(verifier, prompt, 20, drafter=drafter, draft_length=k).steps
            modeled = evaluate.steps_over(match, k, 20)
            assert [(s.num_drafted, s.num_accepted) for s in real] == [(s.num_drafted, s.num_accepted) for s in modeled]
            accepted += sum(s.num_accepted for s in real)
    assert accepted > 0


@pytest.mark.parametrize("k", [1, 3, 4, 6])
def test_greedy_output_equals_plain(trained, setup, k):
    """Lossless at every draft length; past the block size a block is just shorter (one pass drafts 4)."""
    target = TorchVerifier(load_model(setup / "target"))
    drafter = make_drafter(trained[0], "cpu", torch.float32, VOCAB)
    assert isinstance(drafter, BlockDrafter)
    for prompt in PROMPTS:
        plain = generate(target, prompt, 30)
        spec = generate(target, prompt, 30, drafter=drafter, draft_length=k)
        assert spec.tokens == plain.tokens and spec.stats()["num_accepted_tokens"] > 0
        assert max(s.num_drafted for s in spec.steps) == min(k, SIZE)


def test_one_forward_pass_per_block(trained):
    """A block of 4 costs the drafter one forward call (a chain draft of the same weights costs 4)."""
    model = load_model(trained[0])
    calls = []
    forward = model.forward
    model.forward = lambda *args, **kwargs: (calls.append(1), forward(*args, **kwargs))[1]
    drafter = BlockDrafter(model, VOCAB)
    drafter.prefill([5, 17, 99], 64)
    calls.clear()
    assert len(drafter.propose([5, 17, 99], 4, SamplingParams(), None).tokens) == 4 and len(calls) == 1
    calls.clear()
    TorchDrafter(model, VOCAB).propose([5, 17, 99], 4, SamplingParams(), None)
    assert len(calls) == 4
    model.forward = forward
    context = [5, 17, 99, 150, 3, 42, 42, 7, 60, 9, 9, 31]  # a drafter taking over mid-generation catches up first
    late, along = BlockDrafter(model, VOCAB), BlockDrafter(model, VOCAB)
    late.prefill(context[:3], 64)
    caught_up = late.propose(context, 4, SamplingParams(), None).tokens
    along.prefill(context, 64)
    assert caught_up == along.propose(context, 4, SamplingParams(), None).tokens


def test_graph_drafter_and_device_step_equal_the_eager_drafter(trained, setup):
    """GraphBlockDrafter's block replay and the fused device step (CPU replays of the CUDA-graph bodies) draft
    what BlockDrafter drafts, and the engine's output equals plain's through the device step."""
    target_model, draft_model = load_model(setup / "target"), load_model(trained[0])
    graph_verifier = GraphVerifier(target_model, compile_blocks=False, cache_len=96)
    graph_drafter = GraphBlockDrafter(draft_model, VOCAB, compile_blocks=False, cache_len=96)
    verifier = TorchVerifier(target_model)
    engine = Engine(graph_verifier)
    for prompt in PROMPTS:
        want = generate(verifier, prompt, 30, drafter=BlockDrafter(draft_model, VOCAB), draft_length=4)
        got = generate(graph_verifier, prompt, 30, drafter=graph_drafter, draft_length=4)
        assert got.tokens == want.tokens
        assert [s.num_accepted for s in got.steps] == [s.num_accepted for s in want.steps]
        fast = engine.decode(graph_drafter, prompt, 30, k=4)
        assert fast.tokens == want.tokens
        full = [s.num_accepted for s in want.steps if s.num_drafted == 4]  # the host step drafts fewer at the end
        assert [s.num_accepted for s in fast.steps][: len(full)] == full
    assert any(isinstance(step, DeviceStep) for step in engine.device_steps.values())
    with pytest.raises(UserError, match="one sequence at a time"):  # its step keeps one sequence's tokens
        engine.decode_batch([graph_drafter, graph_drafter], [list(PROMPTS[0])] * 2, 8, k=4)
    graph_drafter.confidence_wanted, prompt = True, list(PROMPTS[1])  # as `ConfidenceProbe` sets it
    eager = BlockDrafter(draft_model, VOCAB)
    for drafter in (graph_drafter, eager):
        drafter.prefill(prompt, 64)
    got, want = (d.propose(prompt, 4, SamplingParams(), None) for d in (graph_drafter, eager))
    assert got.tokens == want.tokens and got.confidence == pytest.approx(want.confidence, abs=1e-5)


def test_a_block_drafter_starts_from_a_chain_draft(setup, trained):
    """--init-from a chain draft of the same shape: every weight but the masks is the chain draft's."""
    chain = setup / "chain"
    run(options(setup, "chain", steps=3), log=lambda line: None)
    summary = run(options(setup, "from_chain", block_size=3, eval_ks=(2, 3), steps=1, lr=1e-9,
                          init_from=str(chain)), log=lambda line: None)
    assert summary["init_from_sha256"]
    ours, theirs = load_model(setup / "from_chain"), load_model(chain)
    torch.testing.assert_close(ours.layers[0].attention.wqkv.weight, theirs.layers[0].attention.wqkv.weight,
                               atol=1e-2, rtol=1e-2)  # bf16 on disk, one step at lr 1e-9


def test_a_block_drafter_of_another_size_is_refused_before_the_teacher_runs(setup, trained):
    """--init-from a block drafter needs its --block-size (a chain run or another size would not load its masks),
    refused in one line before the teacher phase generates anything."""
    for block_size, eval_ks in ((3, (2, 3)), (0, (2, 4))):
        logged = []
        with pytest.raises(UserError, match=f"--block-size {SIZE}"):
            run(options(setup, "wrong_size", block_size=block_size, eval_ks=eval_ks, layers=2, hidden=64,
                        init_from=str(trained[0])),
                log=logged.append)
        assert not any(line.startswith("teacher") for line in logged)


def test_the_board_model_drafts_a_block_in_one_pass():
    """Modeled (dfvg.fpga.board.latency): fed the same rows, a block drafter's one pass and a chain's k passes do
    the same arithmetic (k layer rows, the head on k rows), but the block pays one pass's layer overhead, not k.
    sizing.size_draft sizes a block drafter after a fully accepted block (k + 1 new positions), one pass."""
    from dataclasses import replace

    from dfvg.checkpoint import load_config
    from dfvg.distill.sizing import size_draft
    from dfvg.fpga.board.boards import get_board
    from dfvg.fpga.board.latency import DesignParams, model_block
    from dfvg.fpga.board.workload import draft_workload

    chain = load_config("drafts/qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768")
    workload, board, design = draft_workload(chain, 8, 128, 0), get_board("u280"), DesignParams()
    one = model_block(workload, board, design, 4, 200, new_tokens=1, one_pass=True)
    many = model_block(workload, board, design, 4, 200, new_tokens=1)
    assert one.compute_time.value == pytest.approx(many.compute_time.value, rel=1e-3)  # attention: c, not c + i
    assert one.layer_overhead_time.value == pytest.approx(many.layer_overhead_time.value / 4)
    assert one.block_time.value < many.block_time.value and one.block_time.provenance == "modeled"
    sized = size_draft(replace(chain, block_size=4), 8, k=4)
    worst = model_block(workload, board, design, 4, 256, new_tokens=5, one_pass=True)
    assert sized.block_time.value == pytest.approx(worst.block_time.value)


def cli_generate(setup, capsys, *flags: str) -> tuple[int, str]:
    """`dfvg generate` on the tiny target and a fixed prompt with these flags: (exit status, stdout or stderr)."""
    from dfvg.cli import main

    base = ["generate", "--target", str(setup / "target"), "--prompt-ids", "5,17,99,150,3", "--max-new-tokens", "30",
            "--json"]
    status = main([*base, *flags])
    out, err = capsys.readouterr()
    return status, out if status == 0 else err.strip()


def assert_cli_drafts_equal_no_draft(setup, capsys, folder) -> None:
    """`dfvg generate --draft folder` gives `--no-draft`'s tokens and accepts drafts, on a torch device and on the
    emulated FPGA datapath (`--draft-device fpga`)."""
    plain = json.loads(cli_generate(setup, capsys, "--no-draft")[1])
    for device in ("cpu", "fpga"):
        status, out = cli_generate(setup, capsys, "--draft", str(folder), "--draft-device", device,
                                   "--draft-length", "4")
        spec = json.loads(out)
        assert status == 0 and spec["tokens"] == plain["tokens"] and spec["stats"]["num_accepted_tokens"] > 0


def test_dfvg_generate_drafts_with_a_block_folder_and_equals_no_draft(trained, setup, capsys):
    """The product's command with a block drafter's folder."""
    assert_cli_drafts_equal_no_draft(setup, capsys, trained[0])


@pytest.mark.parametrize("mode", ["sync", "overlap"])
def test_both_host_schedules_are_lossless(trained, setup, mode):
    """The host pipeline (`dfvg run`'s schedules): the overlap schedule drafts the next block while the target
    verifies, asking for k + 1 tokens (a block drafter gives at most its block size); output equals plain."""
    from dfvg.host.pipeline import run_pipeline

    target = TorchVerifier(load_model(setup / "target"))
    drafter = BlockDrafter(load_model(trained[0]), VOCAB)
    for prompt in PROMPTS:
        plain = generate(target, prompt, 30).tokens
        for k in (2, 4):
            assert run_pipeline(target, drafter, prompt, 30, draft_length=k, mode=mode).tokens == plain


def test_a_tree_grows_on_the_block_drafters_chain_rows_and_the_adaptive_length_reads_its_rows(trained, setup):
    """--tree with a block drafter grows the tree on its real rows (an ordinary draft for one token), eagerly as on
    the device tree, and stays lossless; each block carries its k rows' top probabilities, which the adaptive
    draft length reads (its forward-hook probe sees one pass per block)."""
    from dfvg.host.adaptive import block_confidence
    from dfvg.tree import parse_tree_spec

    target = TorchVerifier(load_model(setup / "target"))
    drafter = BlockDrafter(load_model(trained[0]), VOCAB)
    engine, accepted = Engine(target), 0
    for prompt in PROMPTS:
        tree = engine.decode(drafter, prompt, 20, k=3, tree=parse_tree_spec("2,2,1"))
        assert tree.tokens == generate(target, prompt, 20).tokens
        accepted += tree.stats()["num_accepted_tokens"]
    assert accepted > 0
    drafter.prefill(list(PROMPTS[1]), 64)
    confidence = block_confidence(drafter.propose(list(PROMPTS[1]), 4, SamplingParams(), None), None)
    assert len(confidence) == 4 and all(0 < c <= 1 for c in confidence)


@pytest.mark.parametrize("overrides, needle", [
    (dict(block_size=2, eval_ks=(2, 4)), "--eval-k"),
    (dict(block_size=1), "--block-size"),
])
def test_bad_block_options_are_one_line_errors(setup, overrides, needle):
    with pytest.raises(UserError, match=needle):
        options(setup, "bad", **overrides).check()


def test_a_bad_block_config_and_the_board_kernel_are_refused_in_one_line(trained, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(trained[0], broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "dfvg_block_size": 1}))
    with pytest.raises(UserError, match="dfvg_block_size"):
        load_model(broken)
    with pytest.raises(UserError, match="emulated FPGA datapath"):  # before the XRT options' checks and any artifact
        make_drafter(trained[0], "fpga", torch.float32, VOCAB, mode="xrt")


ALPHA = 1e-3
TV = 0.03
RUNS = samples_for_power(TV, V8, ALPHA / 2, 0.99)


def test_sampled_blocks_keep_the_target_distribution():
    """Pearson chi-square of tokens 1 and 2 against the target's enumerated laws, each at level ALPHA / 2 (a
    correct sampler fails with probability <= 1e-3; fixed seeds, so deterministic). The first step drafts 2
    tokens from one pass, so token 2 is the mask row's draft whenever token 1's is accepted. Negative control:
    draws tilted by TV 0.03 are rejected at the same n (the test has power >= 0.99 at that bias)."""
    target = TorchVerifier(PrefixModel(V8, seed=5))
    draft_model = PrefixModel(V8, seed=6)
    draft_model.config = SimpleNamespace(vocab_size=V8, max_position_embeddings=64, block_size=3, mask_ids=[V8, V8 + 1])
    drafter = BlockDrafter(draft_model, V8)
    params = SamplingParams(1.0)
    laws = exact_first_two_laws(target, [1, 2, 3], params)
    tokens = torch.tensor([generate(target, [1, 2, 3], 3, sampling=params, seed=seed, drafter=drafter,
                                    draft_length=2).tokens[:2] for seed in range(RUNS)])
    gen = torch.Generator().manual_seed(1)
    for i in range(2):
        assert chi_square_p_value(torch.bincount(tokens[:, i], minlength=V8), laws[i]) >= ALPHA / 2, i
        biased = torch.multinomial(tilted(laws[i], TV).float(), RUNS, replacement=True, generator=gen)
        assert chi_square_p_value(torch.bincount(biased, minlength=V8), laws[i]) < ALPHA / 2, i


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_block_drafter_changes_no_token(trained, setup):
    """bf16 on CUDA, fused layers, captured graphs: the device step with the block drafter (one draft pass per
    block) and its host-step blocks give plain decoding's tokens (the verify rows are bit for bit the decode
    step's). (That the replay drafts what the eager drafter drafts is checked on the CPU, in float32: in bf16 the
    eager attention rounds differently from the fused layers.)"""
    target = load_model(setup / "target", torch.bfloat16, "cuda")
    engine = Engine(GraphVerifier(target, cache_len=128))
    drafter = make_drafter(trained[0], "cuda", torch.bfloat16, VOCAB)
    assert isinstance(drafter, GraphBlockDrafter)
    accepted = 0
    for prompt in PROMPTS:
        plain = engine.decode(None, prompt, 40, k=0).tokens
        fast = engine.decode(drafter, prompt, 40, k=4)
        host = generate(engine.verifier, prompt, 40, drafter=drafter, draft_length=4)
        assert fast.tokens == plain and host.tokens == plain
        accepted += fast.stats()["num_accepted_tokens"]
    assert accepted > 0 and any(isinstance(step, DeviceStep) for step in engine.device_steps.values())


@pytest.mark.parametrize("bits", [8, 4])
def test_the_fpga_datapath_drafts_a_block_in_one_pass(trained, setup, tmp_path, bits):
    """The emulated FPGA datapath runs a block drafter (int8, or int4 layers): each block is ONE integer pass of the
    uncached committed ids and k - 1 masks, whose mask slots the next pass overwrites, so each block equals a fresh
    datapath's single pass over the whole context (a stale mask slot or a wrong position breaks this); output equals
    plain; the drafts accept about as much as the float block drafter's; the modeled board time is one pass's."""
    from dfvg.fpga.board.latency import model_block
    from dfvg.fpga.datapath.drafter import FpgaDrafter, draft_in_one_pass
    from dfvg.host.pipeline import run_pipeline

    target = TorchVerifier(load_model(setup / "target"))
    made = [FpgaDrafter.from_checkpoint(trained[0], VOCAB, bits=bits, group_size=16, artifact_dir=tmp_path / "a")
            for _ in range(2)]
    fpga, fresh = made
    passes, blocks = [], 0
    last_logits, propose = fpga.model.last_logits, fpga.propose

    def counted(ids, start, last):
        passes.append(last)
        return last_logits(ids, start, last)

    def checked(context, k, sampling, generator):
        nonlocal blocks
        before, blocks = len(passes), blocks + 1
        block = propose(context, k, sampling, generator)
        assert passes[before:] == [len(block.tokens)] == [min(k, SIZE)]
        fresh.model.setup_cache(len(context) + SIZE)
        assert draft_in_one_pass(fresh.model, list(context), 0, len(block.tokens), VOCAB) == block.tokens
        assert block.modeled_s > 0
        return block

    fpga.prefill(list(PROMPTS[1]), 64)
    cached = fpga.cached_len
    assert fpga.propose(list(PROMPTS[1]), 0, SamplingParams(), None).tokens == [] and fpga.cached_len == cached
    fpga.model.last_logits, fpga.propose = counted, checked
    steps = {}
    for name, drafter in (("fpga", fpga), ("float", BlockDrafter(load_model(trained[0]), VOCAB))):
        steps[name] = []
        for prompt in PROMPTS:
            result = generate(target, list(prompt), 30, drafter=drafter, draft_length=4)
            assert result.tokens == generate(target, list(prompt), 30).tokens
            steps[name] += result.steps
    assert blocks == sum(s.num_drafted > 0 for s in steps["fpga"]) > 5  # every block was checked
    accepted = {name: mean_accepted_length(taken) for name, taken in steps.items()}
    assert accepted["fpga"] == pytest.approx(accepted["float"], rel=0.03) and accepted["float"] > 1.5
    one = model_block(fpga.workload, fpga.board, fpga.design, 4, 10, 2, one_pass=True).block_time.value
    assert fpga.modeled_block_s(4, 10, 2) == pytest.approx(one)
    for prompt in PROMPTS:  # the overlap schedule (`dfvg run`) asks for k + 1 drafts: the block gives its size
        overlapped = run_pipeline(target, fresh, list(prompt), 30, draft_length=4, mode="overlap")
        assert overlapped.tokens == generate(target, list(prompt), 30).tokens
