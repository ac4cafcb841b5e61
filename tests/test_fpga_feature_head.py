"""A feature head on the FPGA datapath (dfvg/fpga/datapath/head_quantize.py, head_model.py, feature_drafter.py).

- the integer head drafts what the float head drafts on the trained tiny pair (most first drafts; a head whose
  feature scales are wrong does not), and it reads the features (zeroing them changes its drafts);
- every `integer_rollouts` row is the block `FpgaFeatureDrafter.propose` drafts there (feature-sensitive
  random pair), so the acceptance benchmark's replay is exact;
- greedy decoding with it equals plain, through `dfvg.generate` and the CLI, and its replayed steps are the
  real steps;
- the artifact is reused, rebuilt when the head changes, and refused in one line when asked to;
- the board model counts the int8 features (H bytes a new position) in a block's PCIe time;
- features are rounded half up and saturated at +-127.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from dfvg.checkpoint import load_model
from dfvg.distill import feature, teacher
from dfvg.engine import Engine, make_drafter
from dfvg.errors import UserError
from dfvg.feature_head import load_feature_head
from dfvg.fpga.board.latency import model_block
from dfvg.fpga.datapath.artifact import load_or_build_head
from dfvg.fpga.datapath.feature_drafter import FpgaFeatureDrafter
from dfvg.fpga.datapath.head_model import IntegerFeatureHead, integer_rollouts
from dfvg.fpga.datapath.head_quantize import calibration_features, quantize_feature_head, quantize_features
from dfvg.fpga.datapath.tree_drafter import DatapathFeatureTreeDrafter
from dfvg.generate import generate
from dfvg.host.experiments import run_experiments
from dfvg.sampling import SamplingParams
from dfvg.tree import parse_tree_spec
from dfvg.verifier import TorchVerifier
from tests.test_distill import VOCAB
from tests.test_distill import setup as setup  # noqa: F401  (the tiny peaked target and its prompts)
from tests.test_experiments import write_yaml
from tests.test_feature_head import PROMPTS
from tests.test_feature_head import head_dir as head_dir  # noqa: F401  (a trained tiny head)
from tests.test_feature_head import random_head as random_head  # noqa: F401

CALIBRATION = [[5, 17, 90, 3, 42, 7, 60, 50, 9, 11, 13, 2, 40, 41, 77, 8], [50, 3, 42, 42, 7, 60, 12, 90, 5]]


def sequences(target, prompts, n=16):
    return teacher.generate_all(target, [list(p) for p in prompts], n, set(), 4, SamplingParams(), 0, 4,
                                log=lambda line: None)


def features_of(target, seq):
    ids = torch.tensor([seq.prompt + seq.continuation[:-1]])
    return feature.target_features(target, ids, torch.arange(ids.shape[1])[None])[0]


def integer_head(head, target, bits=8, predict_bits=16):
    tensors, meta = quantize_feature_head(head, CALIBRATION, calibration_features(target, CALIBRATION), bits, 16,
                                          predict_bits)
    return IntegerFeatureHead(tensors, head.body.config, bits, "cpu"), meta


def scales(meta):
    return torch.tensor(meta["feature_head"]["feature_scales"], dtype=torch.float64)


@pytest.fixture(scope="module")
def trained(head_dir, setup):  # noqa: F811
    target = load_model(setup / "target")
    head = load_feature_head(head_dir[0])
    seqs = sequences(target, PROMPTS + ([40, 41, 42, 43], [77, 8, 8]))
    return head, target, seqs


@pytest.mark.parametrize("bits,predict_bits", [(8, 16), (8, 8), (4, 16)])
def test_the_integer_head_drafts_what_the_float_head_drafts(trained, bits, predict_bits):
    head, target, seqs = trained
    model, meta = integer_head(head, target, bits, predict_bits)
    agree = total = 0
    for seq in seqs:
        f = features_of(target, seq)
        floats = feature.rollouts(head, f, seq, 3)
        ints = integer_rollouts(model, quantize_features(f, scales(meta)), seq, 3)
        agree += int((floats == ints).sum())
        total += floats.numel()
    assert agree >= 0.9 * total, (agree, total)


def test_wrong_feature_scales_or_no_features_change_the_drafts(trained):
    head, target, seqs = trained
    model, meta = integer_head(head, target)
    seq = seqs[1]
    f = features_of(target, seq)
    right = integer_rollouts(model, quantize_features(f, scales(meta)), seq, 3)
    wrong = integer_rollouts(model, quantize_features(f, scales(meta) / 8), seq, 3)  # saturates most channels
    deaf = integer_rollouts(model, torch.zeros_like(quantize_features(f, scales(meta))), seq, 3)
    assert not torch.equal(right, wrong) and not torch.equal(right, deaf)


def quantized_random_head(random_head):  # noqa: F811
    head, root = random_head
    target = load_model(root / "target")
    return integer_head(head, target) + (target, root)


def test_every_integer_rollout_row_is_the_block_the_drafter_proposes(random_head):  # noqa: F811
    model, meta, target, root = quantized_random_head(random_head)
    [seq] = sequences(target, [[5, 17, 33, 8, 2, 41]], 12)
    drafted = integer_rollouts(model, quantize_features(features_of(target, seq), scales(meta)), seq, 5)
    verifier = TorchVerifier(load_model(root / "target"))
    drafter = FpgaFeatureDrafter(model, meta, verifier, verifier.vocab_size)
    for i in range(len(seq.continuation)):
        context = seq.prompt + seq.continuation[:i]
        verifier.prefill(context, 64)
        drafter.prefill(context, 64)
        assert drafter.propose(context, 5, SamplingParams(), None).tokens == drafted[i].tolist(), i


@pytest.mark.parametrize("k", [1, 4])
def test_greedy_decoding_equals_plain_and_the_replay_is_the_real_run(trained, head_dir, setup, k):  # noqa: F811
    head, target, seqs = trained
    verifier = TorchVerifier(load_model(setup / "target"))
    drafter = make_drafter(head_dir[0], "fpga", torch.float32, VOCAB, verifier=verifier)
    assert isinstance(drafter, FpgaFeatureDrafter)
    accepted = 0
    for seq in seqs[:3]:
        plain = generate(TorchVerifier(load_model(setup / "target")), seq.prompt, 16)
        spec = generate(verifier, seq.prompt, 16, drafter=drafter, draft_length=k)
        assert spec.tokens == plain.tokens == seq.continuation
        drafted = integer_rollouts(drafter.model, quantize_features(features_of(target, seq), drafter.feature_scales),
                                   seq, 4)
        replayed = feature.feature_steps(drafted, seq, k, 16)
        assert [(s.num_drafted, s.num_accepted) for s in spec.steps] == \
            [(s.num_drafted, s.num_accepted) for s in replayed]
        accepted += spec.stats()["num_accepted_tokens"]
        assert all(s.modeled_draft_s > 0 for s in spec.steps if s.num_drafted)
    assert accepted > 0


def test_sampled_decoding_takes_one_hot_drafts(head_dir, setup):  # noqa: F811
    verifier = TorchVerifier(load_model(setup / "target"))
    drafter = make_drafter(head_dir[0], "fpga", torch.float32, VOCAB, verifier=verifier)
    result = generate(verifier, list(PROMPTS[1]), 20, drafter=drafter, draft_length=3,
                      sampling=SamplingParams(temperature=0.8), seed=1)
    assert len(result.tokens) == 20 and result.stats()["num_accepted_tokens"] > 0


def test_the_artifact_is_reused_rebuilt_and_refused(head_dir, setup, tmp_path):  # noqa: F811
    folder = tmp_path / "head"
    shutil.copytree(head_dir[0], folder)
    tensors, meta = load_or_build_head(folder, setup / "target")
    artifact = folder / "dfvg_fpga_head_int8"
    stamp = (artifact / "weights.safetensors").stat().st_mtime_ns
    again, _ = load_or_build_head(folder, setup / "target")
    assert (artifact / "weights.safetensors").stat().st_mtime_ns == stamp
    assert all(torch.equal(again[n], t) for n, t in tensors.items())
    weights = load_file(str(folder / "feature_head.safetensors"))
    weights["predict.weight"] = weights["predict.weight"] * 2
    save_file(weights, str(folder / "feature_head.safetensors"))
    with pytest.raises(UserError, match="stale: source.projections_sha256"):
        load_or_build_head(folder, setup / "target", on_stale="refuse")
    rebuilt, _ = load_or_build_head(folder, setup / "target")
    assert torch.equal(rebuilt["predict.weight"], tensors["predict.weight"])  # twice the rows: same int8 rows,
    assert torch.equal(rebuilt["predict.shift"], tensors["predict.shift"] - 1)  # twice the scale
    weights = setup / "target" / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the target retrained in place
    try:
        with pytest.raises(UserError, match="stale: target.weights_mtime_ns"):
            load_or_build_head(folder, setup / "target", on_stale="refuse")
    finally:
        os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    narrow, _ = load_or_build_head(folder, setup / "target", predict_bits=8)  # an artifact of its own
    assert int(narrow["predict.input_bits"][0]) == 8 and (folder / "dfvg_fpga_head_int8_p8").is_dir()
    meta = json.loads((artifact / "meta.json").read_text())
    meta["feature_head"]["predict_bits"] = 8
    (artifact / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="stale: feature_head.predict_bits"):
        load_or_build_head(folder, setup / "target", on_stale="refuse")


def test_the_block_time_counts_int8_features(head_dir, setup):  # noqa: F811
    verifier = TorchVerifier(load_model(setup / "target"))
    drafter = make_drafter(head_dir[0], "fpga", torch.float32, VOCAB, verifier=verifier)
    hidden = verifier.model.config.hidden_size
    assert drafter.workload.feature_bits == 8 and drafter.workload.feature_size == hidden
    pcie = drafter.design.pcie_gbps * 1e9
    bf16 = dataclasses.replace(drafter.workload, feature_bits=16)
    for new in (1, 4):
        int8_s = drafter.modeled_block_s(2, 10, new)
        bf16_s = model_block(bf16, drafter.board, drafter.design, 2, 10, new).block_time.value
        assert bf16_s - int8_s == pytest.approx(new * hidden / pcie, rel=1e-6)  # H bytes less a position
    assert drafter.modeled_block_s(1, 10, 4) - drafter.modeled_block_s(1, 10, 4, feature_tokens=0) == \
        pytest.approx(4 * hidden / pcie, rel=1e-6)  # a tree level's nodes send no features


def test_the_cli_drafts_with_the_head_on_the_fpga_datapath(head_dir, setup):  # noqa: F811
    args = [sys.executable, "-m", "dfvg", "generate", "--target", str(setup / "target"), "--prompt-ids", "5,17,99",
            "--max-new-tokens", "16", "--json", "--device", "cpu"]
    plain = subprocess.run(args + ["--no-draft"], capture_output=True, text=True, timeout=300)
    fpga = subprocess.run(args + ["--draft", str(head_dir[0]), "--draft-device", "fpga", "--draft-length", "3"],
                          capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0 and fpga.returncode == 0, fpga.stderr
    assert json.loads(fpga.stdout)["tokens"] == json.loads(plain.stdout)["tokens"]
    xrt = subprocess.run(args + ["--draft", str(head_dir[0]), "--draft-device", "fpga", "--fpga-mode", "xrt",
                                 "--xclbin", "x.xclbin"], capture_output=True, text=True, timeout=300)
    assert xrt.returncode == 2 and xrt.stderr.count("\n") == 1 and "--fpga-mode emulate" in xrt.stderr
    tree = subprocess.run(args + ["--draft", str(head_dir[0]), "--draft-device", "fpga", "--tree", "2,1"],
                          capture_output=True, text=True, timeout=300)
    assert tree.returncode == 0 and json.loads(tree.stdout)["tokens"] == json.loads(plain.stdout)["tokens"]
    dynamic = subprocess.run(args + ["--draft", str(head_dir[0]), "--draft-device", "fpga", "--tree", "dynamic:8"],
                             capture_output=True, text=True, timeout=300)
    assert dynamic.returncode == 0 and json.loads(dynamic.stdout)["tokens"] == json.loads(plain.stdout)["tokens"]
    sampled = subprocess.run(args + ["--draft", str(head_dir[0]), "--draft-device", "fpga", "--tree", "2,1",
                                     "--temperature", "0.8"], capture_output=True, text=True, timeout=300)
    assert sampled.returncode == 2 and sampled.stderr.count("\n") == 1 and "greedy only" in sampled.stderr


def test_features_round_half_up_and_saturate():
    f = torch.tensor([[0.5, -0.5, 1.49, 200.0, -200.0, 0.0]])
    q = quantize_features(f, torch.ones(6, dtype=torch.float64))
    assert q.dtype == torch.int8 and q.tolist() == [[1, 0, 1, 127, -127, 0]]


def test_dfvg_run_drafts_with_the_head_on_the_fpga_variant(head_dir, setup, tmp_path):  # noqa: F811
    raw = {"name": "head-fpga", "target_model": str(setup / "target"), "draft_model": str(head_dir[0]),
           "dataset": str(setup / "prompts.jsonl"), "num_prompts": 2, "max_new_tokens": 10, "draft_length": 3,
           "num_runs": 1, "variants": ["baseline", "speculative", "fpga"], "output_dir": str(tmp_path / "results"),
           "warmup": False, "tree": "dynamic:6"}
    run_dir = run_experiments(write_yaml(tmp_path / "exp.yaml", raw))
    summary = json.loads((run_dir / "performance_summary.json").read_text())
    fpga = summary["variants"]["fpga"]
    assert fpga["draft_device"] == "fpga" and fpga["acceptance"]["output_match_rate"]["value"] == 1.0
    generations = [json.loads(line) for line in (run_dir / "generations.jsonl").read_text().splitlines()]
    trees = [g["stats"] for g in generations if g["variant"] == "fpga"]
    assert trees and all(t["num_draft_tokens"] > 3 * t["num_verify_steps"] for t in trees)  # trees, not chains
    assert fpga["projected"]["tokens_per_second"]["provenance"] == "modeled"


def test_dfvg_run_skips_what_a_head_cannot_draft_and_runs_the_rest(head_dir, setup, tmp_path):  # noqa: F811
    """Every variant with the head as draft_model: the overlap schedules and the batch of 2's speculative row are
    reported as skipped (a head drafts from the block just verified, one sequence at a time); the baseline, the
    sync variants and every plain batch row run, and the head's outputs equal the baseline's."""
    raw = {"name": "head-all", "target_model": str(setup / "target"), "draft_model": str(head_dir[0]),
           "dataset": str(setup / "prompts.jsonl"), "num_prompts": 2, "max_new_tokens": 10, "draft_length": 3,
           "num_runs": 1, "variants": ["baseline", "speculative", "overlap", "adaptive", "batch"],
           "output_dir": str(tmp_path / "results"), "warmup": True, "batch_sizes": [1, 2]}
    summary = json.loads((run_experiments(write_yaml(tmp_path / "exp.yaml", raw)) / "performance_summary.json")
                         .read_text())
    assert set(summary["skipped"]) == {"overlap", "adaptive", "batch:B=2:spec"}
    skipped = summary["skipped"]
    assert "sync schedule only" in skipped["overlap"] and "one sequence" in skipped["batch:B=2:spec"]
    assert set(summary["variants"]) == {"baseline", "speculative", "batch:B=1:plain", "batch:B=1:spec",
                                        "batch:B=2:plain"}
    assert summary["variants"]["speculative"]["acceptance"]["output_match_rate"]["value"] == 1.0


def first_child_path(tree) -> list[int]:
    """The tokens along each node's first child from the root: the chain the head would draft."""
    path, node = [], -1
    while node in tree.parents:
        node = tree.parents.index(node)
        path.append(tree.tokens[node])
    return path


@pytest.mark.parametrize("shape", ["2,2,1", "dynamic:8"])
def test_head_trees_on_the_datapath_are_lossless(trained, head_dir, setup, shape):  # noqa: F811
    head, target, seqs = trained
    verifier = TorchVerifier(load_model(setup / "target"))
    drafter = make_drafter(head_dir[0], "fpga", torch.float32, VOCAB, verifier=verifier)
    engine, chain_tau, tree_tau = Engine(verifier), [], []
    for seq in seqs[:4]:
        tree_run = engine.decode(drafter, seq.prompt, 16, k=3, tree=parse_tree_spec(shape))
        chain_run = engine.decode(drafter, seq.prompt, 16, k=3)
        assert tree_run.tokens == chain_run.tokens == seq.continuation
        tree_tau.append(tree_run.stats()["mean_accepted_length"])
        chain_tau.append(chain_run.stats()["mean_accepted_length"])
        assert tree_run.stats()["num_draft_tokens"] > chain_run.stats()["num_draft_tokens"]
    assert sum(tree_tau) >= sum(chain_tau) or shape.startswith("dynamic")
    assert sum(tree_tau) > len(tree_tau)


def test_a_head_tree_grows_the_chain_as_its_first_children(random_head):  # noqa: F811
    model, meta, target, root = quantized_random_head(random_head)
    verifier = TorchVerifier(load_model(root / "target"))
    drafter = FpgaFeatureDrafter(model, meta, verifier, verifier.vocab_size)
    [seq] = sequences(target, [[5, 17, 33, 8, 2, 41]], 12)
    for i in (0, 3, 7):
        context = seq.prompt + seq.continuation[:i]
        verifier.prefill(context, 64)
        drafter.prefill(context, 64)
        tree = DatapathFeatureTreeDrafter(drafter, parse_tree_spec("2,2,2,1")).propose(context, 4, SamplingParams(),
                                                                                      None)
        assert len(tree.tokens) == 2 + 4 + 8 + 8 and tree.modeled_s > 0
        verifier.prefill(context, 64)
        drafter.prefill(context, 64)
        assert first_child_path(tree) == drafter.propose(context, 4, SamplingParams(), None).tokens, i


def test_bad_options_are_refused_before_the_build(head_dir, setup, tmp_path):  # noqa: F811
    verifier = TorchVerifier(load_model(setup / "target"))
    for options, message in (({"bits": 4, "group_size": 0}, "--fpga-group-size"), ({"bits": 6}, "--fpga-bits"),
                             ({"mode": "xrt"}, "--fpga-mode emulate")):
        with pytest.raises(UserError, match=message) as err:
            FpgaFeatureDrafter.from_checkpoint(head_dir[0], verifier, setup / "target", artifact_dir=tmp_path / "a",
                                               **options)
        assert "\n" not in str(err.value) and not (tmp_path / "a").exists()
    with pytest.raises(UserError, match="needs the target"):
        make_drafter(head_dir[0], "fpga", torch.float32, VOCAB, verifier=None)


def test_the_graph_verifier_feeds_the_fpga_head_as_the_eager_one_does(trained, head_dir, setup):  # noqa: F811
    """On CUDA the target is a `GraphVerifier` (here its CPU replay): the integer head reads its features, in
    chains through the host step and in trees through the eager tree step, and drafts what it drafts beside
    the eager verifier."""
    from dfvg.gpu.graphs import GraphVerifier

    head, target, seqs = trained
    eager = TorchVerifier(load_model(setup / "target"))
    graph = GraphVerifier(load_model(setup / "target"), compile_blocks=False, cache_len=96)
    for tree in (None, parse_tree_spec("dynamic:6")):
        runs = []
        for verifier in (eager, graph):
            drafter = make_drafter(head_dir[0], "fpga", torch.float32, VOCAB, verifier=verifier)
            runs.append([Engine(verifier).decode(drafter, seq.prompt, 16, k=3, tree=tree) for seq in seqs[:3]])
        for want, got, seq in zip(*runs, seqs, strict=False):
            assert got.tokens == want.tokens == seq.continuation
            assert [s.num_accepted for s in got.steps] == [s.num_accepted for s in want.steps]
        assert sum(s.num_accepted for run in runs[1] for s in run.steps) > 0
