"""The user scripts as users run them (subprocesses): bad input is one line on stderr, exit 2, no traceback;
good input works (a tiny run_experiments run, add_model registering a pair)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import build_tokenizer, save_checkpoint

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run(script: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / script), *map(str, args)], capture_output=True,
                          text=True, cwd=cwd or REPO, env=ENV, timeout=300)


def assert_one_line_refusal(done: subprocess.CompletedProcess, *needles: str) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for needle in needles:
        assert needle in lines[0]


def prompts_file(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt": "w4 w5 w6 w7"}) + "\n")
    return path


@pytest.fixture
def bad_config(tmp_path, tiny_pair) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"target_model": str(tiny_pair[0]), "draft_model": str(tiny_pair[1]),
                                    "max_new_tokens": -3}))
    return path


def test_run_experiments_refusals(tmp_path, bad_config):
    assert_one_line_refusal(run("run_experiments.py", "--config", tmp_path / "none.yaml"), "not found")
    assert_one_line_refusal(run("run_experiments.py", "--config", bad_config), "max_new_tokens", ">= 1")
    (tmp_path / "broken.yaml").write_text("target_model: [unclosed\n")
    assert_one_line_refusal(run("run_experiments.py", "--config", tmp_path / "broken.yaml"), "not valid YAML")
    if not torch.cuda.is_available():  # a GPU config refuses a CPU machine before looking for checkpoints
        assert_one_line_refusal(run("run_experiments.py", "--config", REPO / "configs" / "llama7b.yaml"),
                                "CUDA is not available")
    elif not (REPO / "models" / "llama-2-7b-hf").exists():
        assert_one_line_refusal(run("run_experiments.py", "--config", REPO / "configs" / "llama7b.yaml"),
                                "download")


def test_run_experiments_tiny_end_to_end(tmp_path, tiny_pair):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({
        "name": "tiny", "target_model": str(tiny_pair[0]), "draft_model": str(tiny_pair[1]),
        "dataset": str(prompts_file(tmp_path)), "num_prompts": 1, "max_new_tokens": 6, "draft_length": 2,
        "variants": ["baseline", "speculative"], "threads": 1}))
    done = run("run_experiments.py", "--config", config, "--output", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    run_dirs = list((tmp_path / "out").iterdir())
    assert len(run_dirs) == 1 and (run_dirs[0] / "performance_summary.json").is_file()
    assert f"reports: {run_dirs[0]}" in done.stdout
    collected = run("collect_results.py", "--output", tmp_path / "out")
    assert collected.returncode == 0 and (tmp_path / "out" / "summary.csv").is_file()


def test_collect_results_refusals(tmp_path):
    assert_one_line_refusal(run("collect_results.py", "--output", tmp_path / "missing"), "not found")
    assert_one_line_refusal(run("collect_results.py", "--output", tmp_path), "no run directories")
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "performance_summary.json").write_text("{not json")
    assert_one_line_refusal(run("collect_results.py", "--output", tmp_path), "not a DFVG performance summary")


def test_run_all_refusals(tmp_path, tiny_pair):
    target, draft = tiny_pair
    data = prompts_file(tmp_path)
    base = ["--dataset-path", data, "--tag", "t"]
    assert_one_line_refusal(run("run_all.py", "--model-path", tmp_path / "nope", *base), "--target")
    assert_one_line_refusal(run("run_all.py", "--model-path", target, *base), "no draft registered")
    assert_one_line_refusal(run("run_all.py", "--model-path", target, "--draft-path", draft,
                                "--dataset-path", data, "--tag", "a/b"), "--tag")
    assert_one_line_refusal(run("run_all.py", "--model-path", target, "--draft-path", draft, *base,
                                "--num-runs", "0"), "num_runs")
    assert_one_line_refusal(run("run_all.py", "--model-path", target, "--draft-path", draft, "--tag", "t",
                                "--dataset-path", tmp_path / "none.jsonl"), "not found")


def test_add_model_registers_pair_atomically(tmp_path, tiny_pair):
    registry = tmp_path / "configs" / "models.yaml"
    done = run("add_model.py", "--target", tiny_pair[0], "--draft", tiny_pair[1], "--name", "tiny",
               "--registry", registry)
    assert done.returncode == 0, done.stderr
    pairs = yaml.safe_load(registry.read_text())["pairs"]
    assert pairs["tiny"] == {"target": str(tiny_pair[0].resolve()), "draft": str(tiny_pair[1].resolve())}
    assert [p.name for p in registry.parent.iterdir()] == ["models.yaml"]  # no temp file left behind


def test_add_model_refusals(tmp_path, tiny_pair):
    registry = tmp_path / "models.yaml"
    assert_one_line_refusal(run("add_model.py", "--target", tmp_path / "x", "--draft", tiny_pair[1],
                                "--registry", registry), "--target")
    other = tmp_path / "other"
    save_checkpoint(other, "qwen2", seed=3, tokenizer=build_tokenizer(shuffle=True), num_hidden_layers=1)
    assert_one_line_refusal(run("add_model.py", "--target", tiny_pair[0], "--draft", other,
                                "--registry", registry), "tokenizer")
    (other / "model.safetensors").unlink()
    assert_one_line_refusal(run("add_model.py", "--target", tiny_pair[0], "--draft", other,
                                "--registry", registry), "safetensors")
    assert not registry.exists()
