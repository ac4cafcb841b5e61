"""The `dfvg generate` command: output format, --no-draft equivalence, and one-line refusals of bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from dfvg.cli import main
from tests.conftest import build_tokenizer, save_checkpoint


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_output_and_no_draft_equivalence(tiny_pair, capsys):
    target, draft = map(str, tiny_pair)
    base = ["generate", "--target", target, "--prompt", "w5 w6 w7 w8", "--max-new-tokens", "17", "--json"]
    code, out, _ = run_cli(capsys, *base, "--draft", draft, "--draft-length", "3")
    assert code == 0
    spec = json.loads(out)
    assert len(spec["tokens"]) <= 17 and spec["text"].startswith("w")
    for key in ("acceptance_rate", "mean_accepted_length", "num_verify_steps", "num_draft_tokens",
                "num_accepted_tokens", "tokens_per_second"):
        assert key in spec["stats"]
    assert spec["prompt_tokens"] == [5, 6, 7, 8] and spec["chat_template"] is False  # no template: raw text
    code, out, _ = run_cli(capsys, *base, "--no-draft")
    assert code == 0 and json.loads(out)["tokens"] == spec["tokens"]


def test_prompt_ids_and_text_output(tiny_pair, capsys):
    target, draft = map(str, tiny_pair)
    code, out, _ = run_cli(capsys, "generate", "--target", target, "--draft", draft, "--prompt-ids", "3,4,5",
                           "--max-new-tokens", "5", "--temperature", "0.8", "--top-k", "10", "--seed", "3")
    assert code == 0 and len(out.split()) <= 5


def test_python_dash_m_is_the_same_cli(tiny_pair):
    target, draft = map(str, tiny_pair)
    args = ["generate", "--target", target, "--draft", draft, "--prompt-ids", "9", "--max-new-tokens", "6", "--json"]
    proc = subprocess.run([sys.executable, "-m", "dfvg", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["tokens"]) == 6


@pytest.fixture(scope="module")
def broken(tmp_path_factory, tiny_pair):
    """Checkpoint directories that must each be refused in one line."""
    root = tmp_path_factory.mktemp("broken")
    target = tiny_pair[0]
    shutil.copytree(target, root / "gpt2")
    config = json.loads((target / "config.json").read_text())
    (root / "gpt2" / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    (root / "pickle").mkdir()
    shutil.copy(target / "config.json", root / "pickle" / "config.json")
    torch.save({}, root / "pickle" / "pytorch_model.bin")
    save_checkpoint(root / "othertok", "qwen2", seed=2, tokenizer=build_tokenizer(shuffle=True))
    shutil.copytree(target, root / "badshape")
    weights = load_file(target / "model.safetensors")
    weights["model.norm.weight"] = torch.ones(7)
    save_file(weights, root / "badshape" / "model.safetensors")
    return root


BAD_CASES = {
    "missing-dir": (["--target", "{root}/nope", "--no-draft"], "not found"),
    "unknown-model-type": (["--target", "{root}/gpt2", "--no-draft"], "model_type 'gpt2'"),
    "pickle": (["--target", "{root}/pickle", "--no-draft"], "pickle"),
    "other-tokenizer": (["--target", "{target}", "--draft", "{root}/othertok"], "tokenizer"),
    "wrong-shape": (["--target", "{root}/badshape", "--no-draft"], "shape"),
    "bad-ids": (["--target", "{target}", "--no-draft", "--prompt-ids", "1,x"], "comma-separated"),
    "ids-out-of-vocab": (["--target", "{target}", "--no-draft", "--prompt-ids", "1,5000"], "[0, 96)"),
    "no-cuda": (["--target", "{target}", "--no-draft", "--device", "cuda"], "CUDA"),
    "bad-temperature": (["--target", "{target}", "--no-draft", "--temperature", "-1"], "temperature"),
    "bad-top-p": (["--target", "{target}", "--no-draft", "--top-p", "0"], "top_p"),
    "no-draft-given": (["--target", "{target}"], "--draft"),
    "bad-draft-length": (["--target", "{target}", "--draft", "{target}", "--draft-length", "0"], "draft-length"),
    "bad-max-new": (["--target", "{target}", "--no-draft", "--max-new-tokens", "0"], "max_new_tokens"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_input_is_one_line(case, broken, tiny_pair, capsys):
    if case in ("no-cuda", "graphs-on-cpu") and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    args, expected = BAD_CASES[case]
    args = [a.format(root=broken, target=tiny_pair[0]) for a in args]
    if "--prompt-ids" not in args:
        args += ["--prompt-ids", "1,2"]
    code, out, err = run_cli(capsys, "generate", *args)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and expected in err, err
    assert "Traceback" not in err


def test_subprocess_error_has_no_traceback(broken):
    proc = subprocess.run(
        [sys.executable, "-m", "dfvg", "generate", "--target", str(broken / "gpt2"), "--no-draft", "--prompt-ids", "1"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.startswith("error:")
