"""FpgaDrafter: the Drafter contract, losslessness with the real speculative loop, CLI wiring, XRT host path."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from dfvg.checkpoint import load_model
from dfvg.cli import main
from dfvg.errors import UserError
from dfvg.fpga.datapath.drafter import FpgaDrafter
from dfvg.generate import generate
from dfvg.sampling import SamplingParams
from dfvg.verifier import TorchVerifier

PROMPT = [5, 9, 14, 3, 22, 41, 7]
GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def target(tiny_pair):
    return TorchVerifier(load_model(tiny_pair[0]))


@pytest.fixture(scope="module")
def self_drafter(tiny_pair):
    """The target itself, quantized: agrees often but not always, so blocks are partly accepted."""
    return FpgaDrafter.from_checkpoint(tiny_pair[0], target_vocab_size=96, bits=8)


@pytest.fixture(scope="module")
def plain(target):
    return generate(target, PROMPT, 24).tokens


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("which", ["self8", "self4", "draft8"])
def test_speculative_output_equals_plain_greedy(tiny_pair, target, plain, k, which):
    directory = tiny_pair[1] if which == "draft8" else tiny_pair[0]
    drafter = FpgaDrafter.from_checkpoint(directory, target_vocab_size=96, bits=int(which[-1]), group_size=16)
    result = generate(target, PROMPT, 24, drafter=drafter, draft_length=k)
    assert result.tokens == plain
    if which == "self8":
        accepted = [s.num_accepted for s in result.steps]
        assert sum(accepted) > 0
        assert k < 4 or any(a < s.num_drafted for a, s in zip(accepted, result.steps, strict=True))


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_every_family_is_lossless_through_the_datapath(tmp_path, capsys, arch):
    """A tiny target of each family drafting for itself through the integer datapath (Qwen3: qk-norm in
    integers), in the library and through `dfvg generate --draft-device fpga`: output equals plain greedy
    decoding, and the quantized self-draft agrees often."""
    from tests.conftest import save_checkpoint

    save_checkpoint(tmp_path, arch, seed=5)
    outputs = []
    for extra in (["--no-draft"], ["--draft", str(tmp_path), "--draft-device", "fpga", "--draft-length", "3"]):
        assert main(["generate", "--target", str(tmp_path), "--prompt-ids", "5,9,14,3", "--max-new-tokens", "12",
                     "--json", *extra]) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[1]["tokens"] == outputs[0]["tokens"] and outputs[1]["stats"]["num_accepted_tokens"] > 0
    verifier = TorchVerifier(load_model(tmp_path))
    reference = generate(verifier, PROMPT, 24).tokens
    for k, bits in ((1, 8), (4, 8), (4, 4)):
        drafter = FpgaDrafter.from_checkpoint(tmp_path, target_vocab_size=96, bits=bits, group_size=16,
                                              artifact_dir=tmp_path / f"art{bits}")
        result = generate(verifier, PROMPT, 24, drafter=drafter, draft_length=k)
        assert result.tokens == reference
        assert sum(s.num_accepted for s in result.steps) > 0


def test_block_fields(self_drafter):
    self_drafter.prefill(PROMPT, 64)
    block = self_drafter.propose(PROMPT, 4, GREEDY, None)
    assert len(block.tokens) == 4 and block.probs is None and block.elapsed_s > 0 and block.modeled_s > 0
    assert self_drafter.cached_len == len(PROMPT) + 3


HEAD_ROWS = 40  # the cut draft's LM head covers 40 of the 96 token ids


@pytest.fixture(scope="module")
def cut_head_draft(tiny_pair, tmp_path_factory):
    """The tiny draft with its LM head cut to HEAD_ROWS ids (a distilled head vocabulary, docs/distill.md)."""
    directory = tmp_path_factory.mktemp("cut_head")
    for item in tiny_pair[1].iterdir():
        if item.is_file():  # not the quantized artifacts other tests cache beside the checkpoint
            shutil.copy(item, directory / item.name)
    tensors = load_file(str(directory / "model.safetensors"))
    tensors["lm_head.weight"] = tensors["lm_head.weight"][: 2 * HEAD_ROWS : 2].contiguous()
    tensors["lm_head.token_ids"] = torch.arange(0, 2 * HEAD_ROWS, 2)
    save_file(tensors, str(directory / "model.safetensors"))
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "dfvg_head_vocab": HEAD_ROWS}))
    return directory


def test_modeled_block_time_by_hand(cut_head_draft, tmp_path):
    """The board model written out by hand for one block (dfvg/fpga/board/latency.py's documented formula), so a
    wrong count in the drafter's workload shows: k=4 drafts after a 7-token prompt on a U280 at the default
    design (250 MHz, 4096 DSPs x 1 MAC, 30 us launch, 2 x 5 us + 20 B at PCIe 4.0 x16's 31.5 GB/s), with 1000 cycles of
    fixed overhead per layer. The draft's few KB of weights and its KV cache sit on chip, so no pass streams
    off-chip bytes: each pass costs its MACs / (DSPs x clock) plus the layer overhead."""
    drafter = FpgaDrafter.from_checkpoint(cut_head_draft, target_vocab_size=96, bits=8, artifact_dir=tmp_path)
    drafter.prefill(PROMPT, 64)
    # the MAC efficiency pinned to 1 (the default reads the simulated RTL's, fpga/reports/draft_cycles.json)
    drafter.design = dataclasses.replace(drafter.design, layer_overhead_cycles=1000.0, dsp_efficiency=1.0)
    block = drafter.propose(PROMPT, 4, GREEDY, None)
    d, inter, heads, kv_heads, head_dim, layers = 32, 48, 4, 2, 8, 1  # tests/conftest.py's tiny draft
    cfg = drafter.model.config
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
            cfg.num_layers, cfg.head_vocab_size) == (d, inter, heads, kv_heads, head_dim, layers, HEAD_ROWS)
    layer_macs = d * (heads + 2 * kv_heads) * head_dim + heads * head_dim * d + 3 * d * inter  # 7,680
    head_macs = HEAD_ROWS * d  # the rows the head really has: 1,280 (not 96 x 32)
    contexts = [6, 7, 8, 9]  # one pass per draft: the first feeds PROMPT[-1] after 6 cached positions
    macs = sum(layers * layer_macs + head_macs + 2 * layers * heads * head_dim * c for c in contexts)  # 37,760
    clock = 250e6
    compute_s = macs / (4096 * 1 * clock)
    overhead_s = len(contexts) * layers * 1000 / clock
    launch_s, pcie_s = 30e-6, 2 * 5e-6 + 4 * (1 + 4) / (16 * 16 * 128 / 130 / 8 * 1e9)
    assert block.modeled_s == pytest.approx(launch_s + pcie_s + compute_s + overhead_s, rel=1e-9)


def test_deterministic_across_instances(tiny_pair, self_drafter):
    other = FpgaDrafter.from_checkpoint(tiny_pair[0], target_vocab_size=96, bits=8)
    blocks = []
    for drafter in (self_drafter, other, self_drafter):
        drafter.prefill(PROMPT, 64)
        blocks.append(drafter.propose(PROMPT, 6, GREEDY, None).tokens)
    assert blocks[0] == blocks[1] == blocks[2]


def test_rollback_then_propose_equals_a_fresh_drafter(tiny_pair, self_drafter):
    """After drafting past a rejection, the stale cache slots must not leak into the next block."""
    self_drafter.prefill(PROMPT, 64)
    first = self_drafter.propose(PROMPT, 4, GREEDY, None).tokens
    corrected = PROMPT + first[:1] + [(first[1] + 1) % 96]  # accept one draft, then a different token
    self_drafter.rollback(len(PROMPT) + 1)
    assert self_drafter.cached_len == len(PROMPT) + 1
    after = self_drafter.propose(corrected, 4, GREEDY, None).tokens
    fresh = FpgaDrafter.from_checkpoint(tiny_pair[0], target_vocab_size=96, bits=8)
    fresh.prefill(corrected, 64)
    assert after == fresh.propose(corrected, 4, GREEDY, None).tokens


def test_sampling_stays_valid_with_one_hot_drafts(target, self_drafter):
    sampling = SamplingParams(temperature=1.0, top_k=20)
    a = generate(target, PROMPT, 16, sampling=sampling, seed=3, drafter=self_drafter, draft_length=4)
    b = generate(target, PROMPT, 16, sampling=sampling, seed=3, drafter=self_drafter, draft_length=4)
    assert a.tokens == b.tokens and len(a.tokens) == 16


def test_xrt_host_path_on_the_simulated_device(tiny_pair, target, plain, tmp_path):
    xclbin = tmp_path / "dfvg_draft.xclbin"
    xclbin.write_bytes(b"xclbin2\0" + bytes(56))
    drafter = FpgaDrafter.from_checkpoint(tiny_pair[0], target_vocab_size=96, bits=8, mode="xrt",
                                          xclbin=xclbin, xrt_backend="simulated")
    result = generate(target, PROMPT, 24, drafter=drafter, draft_length=4)
    assert result.tokens == plain
    assert drafter.engine.launches == len([s for s in result.steps if s.num_drafted])  # one launch per block
    emulated = generate(target, PROMPT, 24, drafter=FpgaDrafter.from_checkpoint(tiny_pair[0], 96), draft_length=4)
    assert [s.num_accepted for s in result.steps] == [s.num_accepted for s in emulated.steps]


def cli(tiny_pair, *extra: str) -> list[str]:
    target, draft = tiny_pair
    return ["generate", "--target", str(target), "--draft", str(draft), "--prompt-ids", "5,9,14,3",
            "--max-new-tokens", "12", "--json", *extra]


def test_cli_fpga_equals_no_draft(tiny_pair, capsys):
    assert main(cli(tiny_pair, "--no-draft")) == 0
    plain_out = json.loads(capsys.readouterr().out)
    for bits in ("8", "4"):
        assert main(cli(tiny_pair, "--draft-device", "fpga", "--fpga-bits", bits, "--fpga-group-size", "16")) == 0
        spec = json.loads(capsys.readouterr().out)
        assert spec["tokens"] == plain_out["tokens"] and spec["stats"]["modeled_draft_s"] > 0


@pytest.mark.parametrize("extra,message", [
    (["--fpga-bits", "3"], "--fpga-bits must be 8 or 4"),
    (["--fpga-board", "u9000"], "unknown FPGA board"),
    (["--fpga-mode", "asic"], "--fpga-mode must be"),
    (["--fpga-mode", "xrt"], "needs --xclbin"),
    (["--fpga-mode", "xrt", "--xclbin", "x.xclbin"], "pyxrt"),
])
def test_cli_bad_fpga_options_are_one_line_errors(tiny_pair, capsys, monkeypatch, extra, message):
    monkeypatch.setitem(sys.modules, "pyxrt", None)  # no XRT here, even if a later machine has one
    assert main(cli(tiny_pair, "--draft-device", "fpga", *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and err.startswith("error: ")


def test_xrt_needs_an_existing_xclbin(tiny_pair, tmp_path):
    with pytest.raises(UserError, match="xclbin not found"):
        FpgaDrafter.from_checkpoint(tiny_pair[0], mode="xrt", xclbin=tmp_path / "none.xclbin", xrt_backend="simulated")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("bits", [8, 4])
def test_cuda_emulation_gives_the_cpu_tokens(tiny_pair, target, bits):
    tokens = {}
    for device in ("cpu", "cuda"):
        drafter = FpgaDrafter.from_checkpoint(tiny_pair[0], 96, bits=bits, group_size=16,
                                              emulate_device=device)
        tokens[device] = [s.num_accepted for s in generate(target, PROMPT, 24, drafter=drafter, draft_length=4).steps]
        drafter.prefill(PROMPT, 64)
        tokens[device + "_block"] = drafter.propose(PROMPT, 8, GREEDY, None).tokens
    assert tokens["cpu"] == tokens["cuda"] and tokens["cpu_block"] == tokens["cuda_block"]


@pytest.mark.slow
@pytest.mark.skipif(__import__("os").environ.get("DFVG_SLOW") != "1", reason="set DFVG_SLOW=1 (real 0.5B draft)")
@pytest.mark.parametrize("bits,min_top1", [(8, 0.85), (4, 0.75)])
def test_real_draft_integer_top1_tracks_float(bits, min_top1):
    """Qwen2.5-Coder-0.5B: the datapath's greedy token equals the float model's on most HumanEval/0 positions."""
    from pathlib import Path

    from dfvg.datasets import load_humaneval
    from dfvg.tokenizer import encode, load_tokenizer

    draft = Path(__file__).resolve().parents[1] / "models/qwen2.5-coder-0.5b-instruct"
    ids = encode(load_tokenizer(draft), load_humaneval(limit=1)[0]["prompt"])[:96]
    model = load_model(draft)
    model.setup_cache(1, len(ids))
    with torch.inference_mode():
        floats = model(torch.tensor([ids]), torch.arange(len(ids))[None])[0, 48:].argmax(-1)
    del model
    drafter = FpgaDrafter.from_checkpoint(draft, bits=bits)
    drafter.model.setup_cache(len(ids))
    drafter.model.forward(torch.tensor(ids[:48]), 0)
    ints = [drafter.model.next_token(torch.tensor([t]), 48 + i) for i, t in enumerate(ids[48:])]
    assert (torch.tensor(ints) == floats).double().mean() >= min_top1


def test_the_benchmarks_integer_matches_replay_the_fpga_drafters_steps(tiny_pair):
    """benchmarks/feature_head_fpga.py scores a standalone draft's integer datapath from one teacher-forced chain
    pass; its block steps are the steps a real FpgaDrafter run takes (int8 and int4)."""
    from argparse import Namespace

    from benchmarks.feature_head_fpga import draft_matches
    from dfvg.distill import evaluate, teacher

    target = load_model(tiny_pair[0])
    seqs = teacher.generate_all(target, [PROMPT, [7, 3, 3, 40]], 20, set(), 4, GREEDY, 0, 2, log=lambda line: None)
    for bits, name in ((8, "int8"), (4, "int4")):  # the target quantized drafts for itself: partly accepted
        args = Namespace(draft=str(tiny_pair[0]), target=str(tiny_pair[0]), group_size=16)
        matches = draft_matches(args, name, seqs)
        assert 0 < sum(int(m.sum()) for m in matches) < sum(len(m) for m in matches)
        fpga = FpgaDrafter.from_checkpoint(tiny_pair[0], target_vocab_size=96, bits=bits, group_size=16)
        for seq, m in zip(seqs, matches, strict=True):
            real = generate(TorchVerifier(target), seq.prompt, 20, drafter=fpga, draft_length=3)
            assert real.tokens == seq.continuation
            replayed = evaluate.block_steps(m, 3, 20)
            assert [(s.num_drafted, s.num_accepted) for s in real.steps] == \
                [(s.num_drafted, s.num_accepted) for s in replayed]
