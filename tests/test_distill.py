"""Distilling an FPGA-sized draft (dfvg/distill/, scripts/distill_draft.py) on a tiny target, on CPU.

The tiny target is a 1-layer qwen2 whose decoder layer is scaled down and LM head scaled up, so its greedy
continuations are peaked and learnable by a 1-layer draft from a few thousand positions (a random
full-strength tiny transformer is nearly unlearnable at this size, which would make the tests vacuous).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dfvg.checkpoint import load_model
from dfvg.distill import data, evaluate, teacher, vocab
from dfvg.distill.pipeline import DistillOptions, run
from dfvg.drafter import TorchDrafter
from dfvg.errors import UserError
from dfvg.generate import generate
from dfvg.sampling import SamplingParams
from dfvg.verifier import TorchVerifier
from tests.conftest import EOS_ID, build_tokenizer, hf_config

VOCAB = 160
HEAD = 96
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "distill_draft.py"


def save_peaked_target(directory: Path) -> None:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(
        hf_config("qwen2", vocab_size=VOCAB, num_hidden_layers=1, initializer_range=0.3), dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight *= 4
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight *= 0.02
            layer.mlp.down_proj.weight *= 0.02
    model.save_pretrained(directory)
    build_tokenizer(VOCAB).save(str(directory / "tokenizer.json"))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": EOS_ID}))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return peaked_setup(tmp_path_factory.mktemp("distill"))


def peaked_setup(root: Path) -> Path:
    """The peaked target and 200 random prompts in `root` (test_block_draft.py shares it)."""
    save_peaked_target(root / "target")
    rng = random.Random(0)
    prompts = [{"id": f"p{i}", "prompt": " ".join(f"w{rng.randrange(2, VOCAB)}" for _ in range(rng.randrange(3, 12)))}
               for i in range(200)]
    (root / "prompts.jsonl").write_text("\n".join(json.dumps(p) for p in prompts))
    return root


def options(root: Path, output: str, **overrides) -> DistillOptions:
    base = dict(target=str(root / "target"), output=str(root / output), prompts=str(root / "prompts.jsonl"),
                layers=1, hidden=32, vocab_top=HEAD, steps=100, max_new_tokens=24, lr=3e-3, init="random",
                eval_ks=(2, 4), teacher_batch=64, teacher_cache=str(root / "teacher"))
    return DistillOptions(**{**base, **overrides})


@pytest.fixture(scope="module")
def distilled(setup):
    summary = run(options(setup, "draft"), log=lambda line: None)
    return setup / "draft", summary


def test_loss_decreases(distilled):
    losses = distilled[1]["losses"]
    assert sum(losses[-10:]) / 10 < 0.6 * sum(losses[:10]) / 10


def test_trained_draft_beats_random_on_held_out(distilled):
    _, summary = distilled
    before, after = summary["acceptance_before"][4], summary["acceptance_after"][4]
    assert after["acceptance_rate"] > 0.15
    assert after["acceptance_rate"] > 4 * before["acceptance_rate"]
    assert after["mean_accepted_length"] > before["mean_accepted_length"]


def test_three_splits_are_disjoint_recorded_and_old_held_out_never_trained(distilled, setup):
    _, summary = distilled
    keys = {name: set(summary[f"{name}_prompts"]) for name in ("train", "validation", "test")}
    assert all(keys.values()) and sum(map(len, keys.values())) == 200
    assert not (keys["train"] & keys["validation"] or keys["train"] & keys["test"] or keys["validation"] & keys["test"])
    assert keys["test"] == {k for k in keys["train"] | keys["validation"] | keys["test"] if data.is_held_out(k, 0.25)}
    assert not any(data.is_held_out(k, 0.25) for k in keys["train"])  # the two-way split's held-out set
    recipe = json.loads((distilled[0] / "distill_recipe.json").read_text())
    for name in ("train", "validation", "test"):
        assert recipe[f"{name}_prompts"] == summary[f"{name}_prompts"]
    assert recipe["options"]["seed"] == 0 and set(recipe["acceptance_test"]) == {"2", "4"}


def test_test_acceptance_by_prompt_source(setup):
    """Two prompt files: the test split is also reported per source, each table over that source's test
    prompts alone (recomputed here from the exported draft and the cached test continuations), and the
    sources' steps add up to the whole table's."""
    lines = (setup / "prompts.jsonl").read_text().splitlines()
    (setup / "alpha.jsonl").write_text("\n".join(lines[:120]))
    (setup / "beta.jsonl").write_text("\n".join(lines[120:]))
    summary = run(options(setup, "draft-by-source", prompts=f"{setup / 'alpha.jsonl'},{setup / 'beta.jsonl'}",
                          steps=30, save_dtype="float32", teacher_cache=str(setup / "teacher-by-source")),
                  log=lambda line: None)
    cache = setup / "teacher-by-source" / "test"
    tests = data.load_teacher(cache, json.loads((cache / data.TEACHER_META).read_text())["recipe"])
    alpha = [seq for seq, key in zip(tests, summary["test_prompts"], strict=True) if key.startswith("alpha/")]
    model = load_model(setup / "draft-by-source")
    want = evaluate.acceptance_table(evaluate.greedy_matches(model, alpha), [2, 4], 24)
    assert summary["acceptance_test_by_source"]["alpha"] == {k: want[k] for k in (2, 4)}
    by_source, whole = summary["acceptance_test_by_source"], summary["acceptance_test"]
    assert set(by_source) == {"alpha", "beta"}
    for k in (2, 4):
        assert sum(t[k]["num_verify_steps"] for t in by_source.values()) == whole[k]["num_verify_steps"]
        assert by_source["alpha"][k]["num_verify_steps"] != whole[k]["num_verify_steps"]
    counts = {n: sum(key.startswith(n + "/") for key in summary["test_prompts"]) for n in by_source}
    assert min(counts.values()) > 0 and sum(counts.values()) == len(summary["test_prompts"])


def test_extra_samples_per_training_prompt(setup):
    """`source*3`: two more sampled continuations per training prompt, none for held-out prompts."""
    cache = setup / "teacher-x3"
    summary = run(options(setup, "draft-x3", prompts=str(setup / "prompts.jsonl") + "*3", steps=2,
                          teacher_cache=str(cache)), log=lambda line: None)
    meta = json.loads((cache / "train-samples" / data.TEACHER_META).read_text())["recipe"]
    train = data.load_teacher(cache / "train", json.loads((cache / "train" / data.TEACHER_META).read_text())["recipe"])
    extra = data.load_teacher(cache / "train-samples", meta)
    held = data.load_teacher(cache / "test", json.loads((cache / "test" / data.TEACHER_META).read_text())["recipe"])
    assert meta["temperature"] == 0.7 and len(train) == len(summary["train_prompts"])
    assert len(extra) == 2 * len(train) and len(held) == len(summary["test_prompts"])
    assert {tuple(s.prompt) for s in extra} == {tuple(s.prompt) for s in train}
    greedy = {tuple(s.prompt): s.continuation for s in train}
    assert sum(s.continuation != greedy[tuple(s.prompt)] for s in extra) > len(extra) // 4  # really sampled


def test_head_vocabulary_file_and_tensor_agree(distilled):
    directory, _ = distilled
    record = json.loads((directory / vocab.VOCAB_FILE).read_text())
    ids = load_file(str(directory / "model.safetensors"))["lm_head.token_ids"]
    assert ids.tolist() == record["token_ids"] and len(record["token_ids"]) == HEAD
    assert EOS_ID in record["token_ids"] and ids.dtype == torch.int64
    assert json.loads((directory / "config.json").read_text())["dfvg_head_vocab"] == HEAD


def test_head_never_proposes_outside_its_table(distilled):
    """Property: over many random contexts, greedy and sampled drafts stay inside the head's ids."""
    model = load_model(distilled[0])
    allowed = set(model.head_token_ids.tolist())
    drafter = TorchDrafter(model, VOCAB)
    rng, generator = random.Random(1), torch.Generator().manual_seed(1)
    for trial in range(60):
        context = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 20))]
        drafter.prefill(context, len(context) + 8)
        sampling = SamplingParams() if trial % 2 else SamplingParams(temperature=1.5)
        block = drafter.propose(context, 6, sampling, generator)
        assert set(block.tokens) <= allowed
        if block.probs is not None:
            outside = torch.ones(VOCAB, dtype=torch.bool)
            outside[list(allowed)] = False
            assert float(block.probs[:, outside].sum()) == 0.0


@pytest.mark.parametrize("k", [1, 3, 5])
def test_saved_draft_loads_and_decoding_stays_lossless(distilled, setup, k):
    target = TorchVerifier(load_model(setup / "target"))
    drafter = TorchDrafter(load_model(distilled[0]), VOCAB)
    for prompt in ([5, 17, 99], [150, 3, 42, 42, 7, 60]):
        plain = generate(target, prompt, 30, eos_ids=[EOS_ID])
        spec = generate(target, prompt, 30, eos_ids=[EOS_ID], drafter=drafter, draft_length=k)
        assert spec.tokens == plain.tokens
        assert spec.stats()["num_accepted_tokens"] > 0


def test_graph_paths_map_head_rows_to_token_ids(distilled, setup):
    """GraphDrafter and the fused device step (CPU replays of the CUDA-graph bodies) draft the same
    token ids as TorchDrafter: a head row is mapped back through head_token_ids, not used as an id."""
    from dfvg.engine import Engine
    from dfvg.gpu.graph_drafter import GraphDrafter
    from dfvg.gpu.graphs import GraphVerifier

    target_model, draft_model = load_model(setup / "target"), load_model(distilled[0])
    verifier = TorchVerifier(target_model)
    graph_verifier = GraphVerifier(target_model, compile_blocks=False, cache_len=96)
    graph_drafter = GraphDrafter(draft_model, VOCAB, compile_blocks=False, cache_len=96)
    allowed = set(load_file(str(distilled[0] / "model.safetensors"))["lm_head.token_ids"].tolist())
    for prompt in ([5, 17, 99], [150, 3, 42, 42, 7, 60]):
        want = generate(verifier, prompt, 30, drafter=TorchDrafter(draft_model, VOCAB), draft_length=4)
        got = generate(graph_verifier, prompt, 30, drafter=graph_drafter, draft_length=4)
        assert got.tokens == want.tokens
        assert [s.num_accepted for s in got.steps] == [s.num_accepted for s in want.steps]
        fast = Engine(graph_verifier).decode(graph_drafter, prompt, 30, k=4)
        assert fast.tokens == want.tokens and fast.stats()["num_accepted_tokens"] > 0
        block = graph_drafter.propose(prompt, 4, SamplingParams(), None)
        assert set(block.tokens) <= allowed


def test_teacher_rows_end_at_their_eos_and_the_batch_stops_when_all_have(setup):
    """Rows that hit an EOS keep running on the device (the host looks every DONE_CHECK_STEPS steps) and are
    cut afterwards: each continuation, EOS kept, equals a sequential `generate` with the same EOS ids, its top-k
    rows match it in number, and once every row has ended the batch stops at the next look, not at
    max_new_tokens. The EOS ids are tokens the rows produce early without them, so every row hits one."""
    model = load_model(setup / "target")
    prompts = [[5, 17, 99], [150, 3, 42, 42, 7, 60], [9], [7] * 12, [60, 61]]
    free = teacher.generate_batch(model, prompts, 40, set(), 8, SamplingParams(), torch.Generator())
    eos = {seq.continuation[step] for seq, step in zip(free, (2, 6, 9, 0, 11), strict=True)}
    decode_steps = 0
    forward = model.forward

    def counted(ids, *args, **kwargs):
        nonlocal decode_steps
        decode_steps += ids.shape[1] == 1
        return forward(ids, *args, **kwargs)

    model.forward = counted
    seqs = teacher.generate_batch(model, prompts, 40, eos, 8, SamplingParams(), torch.Generator())
    model.forward = forward
    assert decode_steps == teacher.DONE_CHECK_STEPS  # every row ended by step 12: stopped at the first look
    verifier = TorchVerifier(model)
    for prompt, seq in zip(prompts, seqs, strict=True):
        assert seq.continuation == generate(verifier, prompt, 40, eos_ids=sorted(eos)).tokens
        assert seq.continuation[-1] in eos and len(seq.topk_ids) == len(seq.topk_probs) == len(seq.continuation)


def test_teacher_forced_acceptance_equals_real_speculative_steps(distilled, setup):
    """evaluate.block_steps reproduces generate()'s steps exactly (greedy, continuation ended by length)."""
    target_model, draft_model = load_model(setup / "target"), load_model(distilled[0])
    prompts = [[5, 17, 99], [150, 3, 42, 42, 7, 60], [9]]
    seqs = teacher.generate_all(target_model, prompts, 20, set(), 8, SamplingParams(), 0, 3, log=lambda line: None)
    matches = evaluate.greedy_matches(draft_model, seqs)
    verifier, drafter = TorchVerifier(target_model), TorchDrafter(draft_model, VOCAB)
    for prompt, seq, match in zip(prompts, seqs, matches, strict=True):
        assert generate(verifier, prompt, 20).tokens == seq.continuation  # batched teacher == sequential
        for k in (2, 4):
            real = generate(verifier, prompt, 20, drafter=drafter, draft_length=k).steps
            modeled = evaluate.block_steps(match, k, 20)
            assert [(s.num_drafted, s.num_accepted) for s in real] == [(s.num_drafted, s.num_accepted) for s in modeled]


def test_same_seed_same_weights_other_seed_differs(distilled, setup):
    run(options(setup, "again", steps=20), log=lambda line: None)
    run(options(setup, "again2", steps=20), log=lambda line: None)
    run(options(setup, "other", steps=20, seed=1), log=lambda line: None)
    a, b, c = (load_file(str(setup / name / "model.safetensors")) for name in ("again", "again2", "other"))
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not all(torch.equal(a[n], c[n]) for n in a if a[n].is_floating_point())


def test_pipeline_stopped_and_resumed_equals_one_run(setup, capsys):
    """Two "leases" (--stop-after, then --resume through the script) export the weights of one run."""
    sys.path.insert(0, str(SCRIPT.parent))
    import distill_draft

    ckpt = setup / "ckpt"
    first = run(options(setup, "leased", steps=20, checkpoint_dir=str(ckpt), stop_after=12), log=lambda line: None)
    assert first["finished"] is False and first["step"] == 12 and not (setup / "leased" / "model.safetensors").exists()
    argv = ["--target", str(setup / "target"), "--output", str(setup / "leased"), "--prompts",
            str(setup / "prompts.jsonl"), "--teacher-cache", str(setup / "teacher"), "--max-new-tokens", "24",
            "--steps", "20", "--layers", "1", "--hidden", "32", "--vocab-top", str(HEAD), "--lr", "3e-3",
            "--init", "random", "--eval-k", "2,4", "--teacher-batch", "64", "--resume", str(ckpt)]
    assert distill_draft.main(argv) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["acceptance_test"]
    whole = run(options(setup, "unleased", steps=20), log=lambda line: None)
    a, b = (load_file(str(setup / name / "model.safetensors")) for name in ("leased", "unleased"))
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert json.loads((setup / "leased" / "distill_recipe.json").read_text())["losses"] == whole["losses"]


def test_a_damaged_teacher_shard_is_refused_in_one_line(setup):
    import shutil

    cache = setup / "teacher-damaged"
    shutil.copytree(setup / "teacher", cache)
    shard = sorted((cache / "train").glob("teacher-*.safetensors"))[0]
    assert all(f.stat().st_size <= 16 * 2**20 for f in cache.rglob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(UserError, match="teacher cache: .* cut short") as err:
        run(options(setup, "damaged", steps=1, teacher_cache=str(cache)), log=lambda line: None)
    assert "\n" not in str(err.value)


def test_full_vocabulary_head_and_pca_init(setup):
    summary = run(options(setup, "full", vocab_top=0, init="target-pca", hidden=64, steps=5), log=lambda line: None)
    model = load_model(setup / "full")
    assert model.config.head_vocab_size is None and model.output.weight.shape == (VOCAB, 64)
    assert summary["head_coverage_of_train_tokens"] == 1.0


@pytest.mark.parametrize("argv, needle", [
    (["--layers", "0"], "--layers"),
    (["--vocab-top", "100000"], "--vocab-top"),
    (["--hidden", "100"], "--hidden"),
    (["--eval-k", "two"], "--eval-k"),
    (["--init", "zeros"], "--init"),
    (["--embed", "half"], "--embed"),
    (["--save-dtype", "int8"], "--save-dtype"),
    (["--prompts", "humaneval*0"], "'*'"),
    (["--device", "cuda:7"], "cuda"),
    (["--bogus"], "unrecognized"),
    (["--val-fraction", "0"], "--val-fraction"),
    (["--test-fraction", "0.5", "--val-fraction", "0.5"], "--test-fraction"),
    (["--stop-after", "5"], "--checkpoint-dir"),
    (["--checkpoint-every", "-1", "--checkpoint-dir", "c"], "--checkpoint-every"),
    (["--resume", "/nonexistent/ckpt"], "no checkpoint.json"),
])
def test_bad_flags_are_one_line_errors(setup, capsys, argv, needle):
    sys.path.insert(0, str(SCRIPT.parent))
    import distill_draft

    base = ["--target", str(setup / "target"), "--output", str(setup / "bad"),
            "--prompts", str(setup / "prompts.jsonl"), "--teacher-cache", str(setup / "teacher"),
            "--max-new-tokens", "24", "--steps", "1", "--hidden", "32"]  # fits the tiny target's 64 (pca init)
    try:
        code = distill_draft.main(base + argv)
    except SystemExit as exc:  # argparse-level mistakes exit from the parser itself
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and needle in err and err.startswith("error:")


def test_script_exit_status_for_a_missing_target(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--target", str(tmp_path / "nope"), "--output",
                           str(tmp_path / "out")], capture_output=True, text=True)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1


def test_checkpoint_refuses_a_bad_head_table(distilled, tmp_path):
    import shutil

    from safetensors.torch import save_file

    bad = tmp_path / "bad"
    shutil.copytree(distilled[0], bad, ignore=shutil.ignore_patterns("teacher"))
    tensors = load_file(str(bad / "model.safetensors"))
    tensors["lm_head.token_ids"] = tensors["lm_head.token_ids"].flip(0).contiguous()
    save_file(tensors, str(bad / "model.safetensors"))
    with pytest.raises(UserError, match="ascending"):
        load_model(bad)


def test_embedding_over_the_head_rows_is_tied_small_and_checked(distilled, tmp_path):
    """--embed head (the default): one bf16 [Vh, D] table for embedding and head, a token -> row table."""
    import shutil

    from safetensors.torch import save_file

    directory, _ = distilled
    config = json.loads((directory / "config.json").read_text())
    assert config["dfvg_embed_rows"] and config["tie_word_embeddings"] and config["torch_dtype"] == "bfloat16"
    tensors = load_file(str(directory / "model.safetensors"))
    assert "lm_head.weight" not in tensors and tensors["model.embed_tokens.weight"].shape == (HEAD, 32)
    assert tensors["model.embed_tokens.weight"].dtype == torch.bfloat16
    rows, head = tensors["model.embed_tokens.token_rows"], tensors["lm_head.token_ids"]
    assert rows.shape == (VOCAB,) and torch.equal(rows[head], torch.arange(HEAD))
    model = load_model(directory)
    assert model.output.weight is model.tok_embeddings.weight
    bad = tmp_path / "bad"
    shutil.copytree(directory, bad, ignore=shutil.ignore_patterns("teacher"))
    tensors["model.embed_tokens.token_rows"] = torch.full((VOCAB,), HEAD)
    save_file(tensors, str(bad / "model.safetensors"))
    with pytest.raises(UserError, match="token_rows"):
        load_model(bad)


def test_full_embedding_with_a_head_vocabulary(setup):
    run(options(setup, "full-embed", embed="full", save_dtype="float32", steps=2), log=lambda line: None)
    tensors = load_file(str(setup / "full-embed" / "model.safetensors"))
    assert tensors["model.embed_tokens.weight"].shape == (VOCAB, 32) and tensors["lm_head.weight"].shape == (HEAD, 32)
    assert "model.embed_tokens.token_rows" not in tensors and tensors["lm_head.weight"].dtype == torch.float32
    assert load_model(setup / "full-embed").config.embed_rows is False


def test_fpga_datapath_drafts_inside_the_head_and_stays_lossless(setup, tmp_path):
    from dfvg.fpga.datapath.drafter import FpgaDrafter

    # target-pca init: the residual stream keeps the target's scale (a 0.02-scale toy residual is too small
    # for the quantizer's int32 norm constants)
    run(options(setup, "fpga", init="target-pca", steps=20), log=lambda line: None)
    allowed = set(load_model(setup / "fpga").head_token_ids.tolist())
    target = TorchVerifier(load_model(setup / "target"))
    prompt = [150, 3, 42, 42, 7, 60]
    plain = generate(target, prompt, 30, eos_ids=[EOS_ID]).tokens
    for bits in (8, 4):
        drafter = FpgaDrafter.from_checkpoint(setup / "fpga", target_vocab_size=VOCAB, bits=bits, group_size=32,
                                              artifact_dir=tmp_path / f"int{bits}")
        assert generate(target, prompt, 30, eos_ids=[EOS_ID], drafter=drafter, draft_length=4).tokens == plain
        drafter.prefill(prompt, 40)
        assert set(drafter.propose(prompt, 6, SamplingParams(), None).tokens) <= allowed


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_distill_runs_on_the_gpu_in_bf16_teacher_mode(setup):
    summary = run(options(setup, "gpu", device="cuda", steps=10, teacher_dtype="bfloat16",
                          teacher_cache=str(setup / "teacher_gpu")), log=lambda line: None)
    assert summary["losses"][-1] < summary["losses"][0]
    model = load_model(setup / "gpu", device="cuda")
    assert model.head_token_ids.device.type == "cuda"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_teacher_graphed_steps_equal_eager_steps(setup, temperature):
    """The teacher's CUDA-graph step runs the eager step's operations on buffers it updates in place: the same
    tokens and top-k ids, probabilities within bf16 rounding (a graph need not get the same GEMM kernels: at
    the target's shapes it did not, benchmarks/teacher_speed.py; at these it did, bit for bit). The
    prompts differ in length, and two rows' EOS ids are tokens they produce early (a free run's), so rows end
    at different steps and run on past their EOS; a second batch of other lengths reuses the cache
    (`setup_cache`) and captures again."""
    model = load_model(setup / "target", device="cuda", dtype=torch.bfloat16)
    prompts = [[5, 17, 99], [150, 3, 42, 42, 7, 60], [9], [7] * 40]
    free = teacher.generate_batch(model, prompts, 24, set(), 8, SamplingParams(), torch.Generator(), graph=False)
    eos = {EOS_ID, free[0].continuation[3], free[2].continuation[7]}

    def both(batch: list[list[int]]):
        return [teacher.generate_batch(model, batch, 24, eos, 8, SamplingParams(temperature),
                                       torch.Generator().manual_seed(3), graph=graph) for graph in (True, False)]

    for batch in (prompts, prompts[:2]):
        graphed, eager = both(batch)
        assert [s.continuation for s in graphed] == [s.continuation for s in eager]
        for g, e in zip(graphed, eager, strict=True):
            assert torch.equal(g.topk_ids, e.topk_ids)
            torch.testing.assert_close(g.topk_probs, e.topk_probs, rtol=0, atol=2e-2)
