"""Bad input at every entry point, as a user meets it (a subprocess): refused in one line, nothing half-written.

One table, one row per kind of mistake: the command (`dfvg generate`, `dfvg run`, every script under
scripts/, `make -C fpga` / `make -C gpu`), the substring that names this mistake in the refusal, and the
exit status (2; 130 for Ctrl-C). Every row asserts: that status, exactly one non-empty stderr line without
a traceback, no stdout (make's own "Entering directory" lines aside), and no file or folder left behind in
the workspace or the repository's output folders. The two Ctrl-C rows interrupt a running experiment once
its first repetition is saved; the run_all row then reruns the same command and checks that it resumes.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import build_tokenizer, save_checkpoint

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
HAS_CUDA = torch.cuda.is_available()
REPO_OUTPUTS = ("data", "results", "models", "fpga/build", "gpu/build")  # where a script could write by default


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_pair) -> Path:
    """What the rows read: the tiny pair, broken checkpoints, prompt files, configs (never written)."""
    w = tmp_path_factory.mktemp("bad-input") / "inputs"  # each row runs in a sibling folder of its own
    w.mkdir()
    target, draft = tiny_pair
    for name in ("target", "draft"):
        (w / name).symlink_to(tiny_pair[name == "draft"])
    weights = (target / "model.safetensors").read_bytes()
    broken = {"trunc": {"model.safetensors": weights[:100]},  # cut inside the header
              "cut": {"model.safetensors": weights[: len(weights) * 9 // 10]},  # header fine, data cut short
              "badjson": {"config.json": '{"model_type": "qwen2",'},
              "listjson": {"config.json": "[1, 2]"},
              "badtok": {"tokenizer.json": '{"version": '},
              "gpt2": {"config.json": json.dumps({**json.loads((target / "config.json").read_text()),
                                                  "model_type": "gpt2"})},
              "strtype": {"config.json": json.dumps({**json.loads((target / "config.json").read_text()),
                                                     "hidden_size": "64"})},
              "blockcfg": {"config.json": json.dumps({**json.loads((target / "config.json").read_text()),
                                                      "dfvg_block_size": 4})}}
    for name, files in broken.items():
        shutil.copytree(target, w / name)
        for file, content in files.items():
            (w / name / file).write_bytes(content if isinstance(content, bytes) else content.encode())
    shutil.copytree(target, w / "notok")
    (w / "notok" / "tokenizer.json").unlink()
    (w / "pickle").mkdir()
    for file in ("config.json", "tokenizer.json"):
        shutil.copy(target / file, w / "pickle" / file)
    torch.save({}, w / "pickle" / "pytorch_model.bin")
    save_checkpoint(w / "othertok", "qwen2", seed=2, tokenizer=build_tokenizer(shuffle=True), num_hidden_layers=1)
    (w / "afile").write_text("a regular file, not a folder\n")
    (w / "ok.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"w{i + 4} w5 w6 w7"}) + "\n"
                                        for i in range(2)))
    (w / "latin.jsonl").write_bytes(b'{"prompt": "caf\xe9"}\n')
    (w / "empty.jsonl").write_text("")
    (w / "dict.json").write_text('{"prompt": "not in a list"}')
    (w / "long.jsonl").write_text(json.dumps({"id": "long", "prompt": " ".join(["w5"] * 600)}) + "\n")
    base = {"target_model": str(target), "draft_model": str(draft), "dataset": str(w / "ok.jsonl"),
            "num_prompts": 1, "max_new_tokens": 4, "variants": ["baseline", "speculative"], "threads": 1}
    configs = {"syntax": None, "unknown": {"colour": "red"}, "wrongtype": {"num_runs": "two"},
               "badtree": {"tree": "0,2"}, "nodata": {"dataset": str(w / "none.jsonl")},
               "shape": {"dataset": str(w / "dict.json")},
               "latin": {"dataset": str(w / "latin.jsonl")}, "empty": {"dataset": str(w / "empty.jsonl")},
               "long": {"dataset": str(w / "long.jsonl")}, "device": {"devices": {"draft": "tpu0"}},
               "cuda": {"devices": {"verify": "cuda:0"}},
               "bits": {"devices": {"draft": "fpga", "fpga": {"bits": 3}}},
               "board": {"devices": {"draft": "fpga", "fpga": {"board": "zynq"}}},
               "xrt": {"devices": {"draft": "fpga", "fpga": {"mode": "xrt"}}},
               "tp": {"tensor_parallel": 2}, "tpzero": {"tensor_parallel": 0},
               "tpoverlap": {"tensor_parallel": 2, "variants": ["baseline", "overlap"]},
               "faultkey": {"devices": {"faults": {"colour": "red"}}},
               "faultretry": {"devices": {"faults": {"retry_after_s": 0}}},
               "faultdevice": {"devices": {"faults": {"fallback": ["tpu0"]}}},
               "ok": {}, "long-run": {"num_prompts": 2, "max_new_tokens": 150, "num_runs": 3, "name": "long-run"}}
    for name, extra in configs.items():
        text = "target_model: [unclosed\n" if extra is None else yaml.safe_dump({**base, **extra})
        (w / f"{name}.yaml").write_text(text)
    return w


# run_all.py arguments of a run long enough (3 repetitions of ~2 s) to be interrupted in its second
LONG_RUN_ALL = ("run_all.py", "--model-path", "target", "--draft-path", "draft", "--dataset-path", "ok.jsonl",
                "--tag", "long", "--num-runs", "3", "--num-prompts", "2", "--max-new-tokens", "150",
                "--draft-length", "3", "--output", "res")


def check_run_all_resumes(w: Path) -> None:
    """The same command again restores repetition 1 from the progress area and runs only 2 and 3."""
    [state_file] = (w / "res").glob(".long.progress/*/completed.pkl")
    saved = pickle.loads(state_file.read_bytes())
    assert saved["runs_done"] == 1
    first = {g.prompt_id: g.stats["prefill_s"] for g in saved["variants"]["baseline"]["generations"]}
    done = run_command(LONG_RUN_ALL, w)
    assert done.returncode == 0, done.stderr
    assert "resuming: 1 of 3 repetitions restored" in done.stderr
    [run_dir] = [p for p in (w / "res").iterdir()]  # the report only: no progress area, no temp dirs left
    assert run_dir.name.startswith("long-") and json.loads(done.stdout.splitlines()[-1])["run_dir"] == str(run_dir)
    rows = [json.loads(line) for line in (run_dir / "generations.jsonl").read_text().splitlines()]
    assert sorted({r["run"] for r in rows}) == [0, 1, 2] and len(rows) == 3 * 2 * 2
    assert {r["prompt_id"]: r["stats"]["prefill_s"] for r in rows
            if r["run"] == 0 and r["variant"] == "baseline"} == first  # reused, not measured again
    shutil.rmtree(w / "res")


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]  # first item: "dfvg", a script name, or "make"
    expect: str  # a substring of the one stderr line that names this mistake
    code: int = 2
    skip: str = ""  # why this row cannot run here ("" = it can)
    interrupt: str = ""  # glob (under the workspace) whose appearance triggers Ctrl-C
    after: Callable[[Path], None] | None = None  # more checks once the row's own checks passed


def gen(*args: str, prompt: tuple[str, ...] = ("--prompt-ids", "1,2")) -> tuple[str, ...]:
    return ("dfvg", "generate", *args, *prompt)


def run(config: str, *args: str) -> tuple[str, ...]:
    return ("dfvg", "run", "--config", f"{config}.yaml", "--output", "out", *args)


RUN_ALL = ("run_all.py", "--model-path", "target", "--draft-path", "draft", "--dataset-path", "ok.jsonl",
           "--tag", "t", "--output", "out")
NO_CUDA = "this machine has CUDA" if HAS_CUDA else ""
LONG_PROMPT = ",".join(["5"] * 600)

CASES: dict[str, Case] = {
    # dfvg generate: checkpoints
    "truncated-safetensors": Case(gen("--target", "trunc", "--no-draft"),
                                  "trunc/model.safetensors is not a readable safetensors file"),
    "safetensors-data-cut-short": Case(gen("--target", "cut", "--no-draft"), "incomplete metadata"),
    "config-invalid-json": Case(gen("--target", "badjson", "--no-draft"), "config.json is not valid JSON"),
    "config-not-an-object": Case(gen("--target", "listjson", "--no-draft"), "must hold a JSON object, got a JSON list"),
    "config-wrong-type": Case(gen("--target", "strtype", "--no-draft"),
                              "hidden_size must be a positive integer, got '64'"),
    "unknown-model-type": Case(gen("--target", "gpt2", "--no-draft"), "model_type 'gpt2' is not supported"),
    "pickle-checkpoint": Case(gen("--target", "pickle", "--no-draft"), "holds only a pickle (.bin) checkpoint"),
    "missing-target-dir": Case(gen("--target", "nope", "--no-draft"), "checkpoint directory not found: nope"),
    "tokenizer-missing": Case(gen("--target", "notok", "--no-draft"), "tokenizer.json not found in notok"),
    "tokenizer-broken": Case(gen("--target", "badtok", "--no-draft"), "cannot read badtok/tokenizer.json"),
    "draft-other-tokenizer": Case(gen("--target", "target", "--draft", "othertok"),
                                  "the draft's tokenizer (othertok) differs"),
    # dfvg generate: prompt and flags
    "empty-prompt": Case(gen("--target", "target", "--no-draft", prompt=("--prompt", "")),
                         "the prompt encodes to zero tokens"),
    "prompt-beyond-context": Case(gen("--target", "target", "--no-draft", prompt=("--prompt-ids", LONG_PROMPT)),
                                  "prompt (600 tokens) + max_new_tokens (64) exceeds the model's context of 512"),
    "prompt-ids-out-of-range": Case(gen("--target", "target", "--no-draft", prompt=("--prompt-ids", "1,500")),
                                    "token ids in [0, 96); bad: [500]"),
    "zero-max-new-tokens": Case(gen("--target", "target", "--no-draft", "--max-new-tokens", "0"),
                                "max_new_tokens must be >= 1, got 0"),
    "non-integer-count": Case(gen("--target", "target", "--no-draft", "--max-new-tokens", "ten"),
                              "argument --max-new-tokens: invalid int value: 'ten'"),
    "zero-draft-length": Case(gen("--target", "target", "--draft", "draft", "--draft-length", "0"),
                              "--draft-length must be >= 1, got 0"),
    "tree-bad-spec": Case(gen("--target", "target", "--draft", "draft", "--tree", "2,x"),
                          "--tree must be branching factors >= 1 per depth (e.g. 2,2,1) or dynamic:N"),
    "tree-zero-budget": Case(gen("--target", "target", "--draft", "draft", "--tree", "dynamic:0"),
                             "got 'dynamic:0'"),
    "tree-without-draft": Case(gen("--target", "target", "--no-draft", "--tree", "2,2"), "--tree needs a draft"),
    "tree-with-tensor-parallel": Case(gen("--target", "target", "--draft", "draft", "--tree", "2,2",
                                          "--tensor-parallel", "2"), "--tree with --tensor-parallel is not supported"),
    "sampled-tree-on-fpga-draft": Case(gen("--target", "target", "--draft", "draft", "--draft-device", "fpga",
                                           "--tree", "dynamic:8", "--temperature", "0.8"),
                                       "--tree on --draft-device fpga is greedy only"),
    "nan-temperature": Case(gen("--target", "target", "--no-draft", "--temperature", "nan"),
                            "temperature must be a finite number >= 0 (0 = greedy), got nan"),
    "unknown-dtype": Case(gen("--target", "target", "--no-draft", "--dtype", "float64"),
                          "argument --dtype: invalid choice: 'float64'"),
    "cuda-without-gpu": Case(gen("--target", "target", "--no-draft", "--device", "cuda"),
                             "device 'cuda' requested but CUDA is not available here", skip=NO_CUDA),
    "fpga-bits": Case(gen("--target", "target", "--draft", "draft", "--draft-device", "fpga", "--fpga-bits", "3"),
                      "--fpga-bits must be 8 or 4, got 3"),
    "fpga-group-size": Case(gen("--target", "target", "--draft", "draft", "--draft-device", "fpga", "--fpga-bits",
                                "4", "--fpga-group-size", "0"), "--fpga-group-size must be an even integer"),
    "fpga-unknown-board": Case(gen("--target", "target", "--draft", "draft", "--draft-device", "fpga",
                                   "--fpga-board", "zynq"), "unknown FPGA board 'zynq'"),
    "tensor-parallel-zero": Case(gen("--target", "target", "--no-draft", "--tensor-parallel", "0"),
                                 "--tensor-parallel must be >= 1"),
    "tensor-parallel-not-dividing-heads": Case(gen("--target", "target", "--no-draft", "--tensor-parallel", "3"),
                                               "--tensor-parallel 3 does not split the target's 4 attention heads "
                                               "and 2 KV heads evenly; use one of 1, 2, 4"),
    "tensor-parallel-more-than-gpus": Case(gen("--target", "target", "--no-draft", "--device", "cuda",
                                               "--tensor-parallel", "8"), "--tensor-parallel 8 needs 8 GPUs",
                                           skip="this machine has 8 GPUs" if torch.cuda.device_count() >= 8 else ""),
    "tensor-parallel-without-torchrun": Case(gen("--target", "target", "--no-draft", "--tensor-parallel", "2"),
                                             "start it as torchrun --nproc-per-node 2 -m dfvg"),
    "draft-deadline-word": Case(gen("--target", "target", "--draft", "draft", "--draft-deadline", "soon"),
                               "--draft-deadline must be auto, off or a number of seconds > 0, got 'soon'"),
    "draft-deadline-negative": Case(gen("--target", "target", "--draft", "draft", "--draft-deadline", "-1"),
                                   "faults.deadline (--draft-deadline), when not auto or off, must be a number"),
    "draft-retry-after-zero": Case(gen("--target", "target", "--draft", "draft", "--draft-retry-after", "0"),
                                   "faults.retry_after_s (--draft-retry-after) must be a number of seconds > 0"),
    "draft-fallback-unknown": Case(gen("--target", "target", "--draft", "draft", "--draft-fallback", "tpu0"),
                                   "unknown device 'tpu0'"),
    # dfvg run / run_experiments.py: configs
    "yaml-syntax-error": Case(run("syntax"), "syntax.yaml is not valid YAML at line 2"),
    "config-unknown-key": Case(run("unknown"), "unknown key 'colour'"),
    "run-config-wrong-type": Case(run("wrongtype"), "num_runs must be an integer >= 1, got 'two'"),
    "run-config-bad-tree": Case(run("badtree"), "tree must be branching factors per depth (e.g. 2,2,1) or "
                                                "dynamic:N, got '0,2'"),
    "config-missing": Case(("run_experiments.py", "--config", "none.yaml"), "config file not found: none.yaml"),
    "dataset-missing": Case(run("nodata"), "none.jsonl not found"),
    "dataset-wrong-shape": Case(run("shape"), "expected a JSON list of prompts, got a JSON dict"),
    "dataset-not-utf8": Case(run("latin"), "latin.jsonl is not UTF-8 text (byte 0xe9"),
    "dataset-empty": Case(run("empty"), "empty.jsonl: no prompts"),
    "dataset-prompt-beyond-context": Case(run("long"), "prompt 'long' has 600 tokens"),
    "device-unknown": Case(run("device"), "devices: draft: unknown device 'tpu0'"),
    "device-cuda-without-gpu": Case(run("cuda"), "verify: device 'cuda:0' requested but CUDA is not available",
                                    skip=NO_CUDA),
    "device-fpga-bits": Case(run("bits"), "fpga.bits must be one of 8, 4, got 3"),
    "device-xrt-without-xclbin": Case(run("xrt"), "fpga.mode xrt needs fpga.xclbin"),
    "run-tensor-parallel-zero": Case(run("tpzero"), "tensor_parallel must be an integer >= 1, got 0"),
    "run-tensor-parallel-overlap": Case(run("tpoverlap"), "tensor_parallel 2 runs the sync schedule at batch 1; "
                                                          "drop variants overlap"),
    "run-tensor-parallel-without-torchrun": Case(run("tp"), "tensor_parallel 2 needs one process per rank"),
    "faults-unknown-key": Case(run("faultkey"), "unknown key faults.colour (allowed: fallback, deadline"),
    "faults-zero-retry": Case(run("faultretry"), "faults.retry_after_s (--draft-retry-after) must be a number"),
    "faults-unknown-fallback": Case(run("faultdevice"), "faults.fallback: unknown device 'tpu0'"),
    "output-through-a-file": Case(run("ok", "--output", "afile/results"),
                                  "afile is a file; pass a writable directory as --output"),
    "output-on-proc": Case(run("ok", "--output", "/proc/dfvg-results"), "/proc/dfvg-results is not writable"),
    "run-ctrl-c": Case(run("long-run"), "interrupted: no results written; rerun the same command to resume",
                       code=130, interrupt="out/.long-run.progress/*/completed.pkl"),
    # run_all.py
    "run-all-zero-batch-size": Case((*RUN_ALL, "--batch-size", "0"), "batch_size must be an integer >= 1, got 0"),
    "run-all-negative-num-prompts": Case((*RUN_ALL, "--num-prompts", "-1"), "num_prompts must be an integer >= 1"),
    "run-all-zero-num-runs": Case((*RUN_ALL, "--num-runs", "0"), "num_runs must be an integer >= 1, got 0"),
    "run-all-unknown-dtype": Case((*RUN_ALL, "--dtype", "float64"), "dtype must be one of auto, float32"),
    "run-all-unwritable-output": Case((*RUN_ALL, "--output", "afile/x"), "afile is a file; pass a writable"),
    "run-all-ctrl-c-then-resume": Case(LONG_RUN_ALL, "interrupted: no results written; rerun the "
                                       "same command to resume", code=130,
                                       interrupt="res/.long.progress/*/completed.pkl", after=check_run_all_resumes),
    # add_model.py
    "add-model-missing-dir": Case(("add_model.py", "--target", "nope", "--draft", "draft", "--registry",
                                   "reg/models.yaml"), "--target 'nope' is neither a checkpoint directory"),
    "add-model-truncated-weights": Case(("add_model.py", "--target", "target", "--draft", "trunc", "--registry",
                                         "reg/models.yaml"), "trunc/model.safetensors is not a readable"),
    "add-model-unwritable-registry": Case(("add_model.py", "--target", "target", "--draft", "draft", "--registry",
                                           "afile/models.yaml"), "cannot write the model registry"),
    # prepare_dataset.py
    # benchmarks/gpu_speed.py and feature_head_fpga.py: options refused before anything loads
    "gpu-speed-fpga-head-without-its-phase": Case(("benchmarks/gpu_speed.py", "--fpga-head", "draft", "--phases",
                                                   "dfvg"), "--fpga-head drafts in the fpga phase"),
    "head-fpga-missing-prompt-files": Case(("benchmarks/feature_head_fpga.py", "--target", "target", "--prompt-dir",
                                            "nowhere"), "nowhere/humaneval.jsonl is missing"),
    "head-fpga-prompts-into-a-folder": Case(("benchmarks/feature_head_fpga.py", "--target", "target",
                                             "--write-prompts", "target"), "--write-prompts target is a directory"),
    "head-fpga-block-head-replayed": Case(("benchmarks/feature_head_fpga.py", "--target", "target", "--head",
                                           "blockcfg"), "blockcfg drafts blocks (dfvg_block_size), and the replayed"),
    # benchmarks/fpga_reproject.py: the recorded report it re-projects
    "reproject-missing-summary": Case(("benchmarks/fpga_reproject.py", "--summary", "nowhere.json", "--target",
                                       "target"), "not a readable performance_summary.json"),
    "reproject-not-a-summary": Case(("benchmarks/fpga_reproject.py", "--summary", "target/config.json",
                                     "--target", "target"), "not a readable performance_summary.json"),
    "prepare-invalid-json": Case(("prepare_dataset.py", "--input", "badjson/config.json", "--output", "p.jsonl"),
                                 "config.json is not valid JSON"),
    "prepare-not-utf8": Case(("prepare_dataset.py", "--input", "latin.jsonl", "--output", "p.jsonl"),
                             "is not UTF-8 text"),
    "prepare-zero-limit": Case(("prepare_dataset.py", "--input", "ok.jsonl", "--limit", "0", "--output", "p.jsonl"),
                               "--limit must be >= 1"),
    "prepare-output-is-a-dir": Case(("prepare_dataset.py", "--input", "ok.jsonl", "--output", "target"),
                                    "--output target is a directory"),
    # download_models.py (nothing here reaches the network)
    "download-bad-only": Case(("download_models.py", "--only", "bogus"), "argument --only: invalid choice: 'bogus'"),
    "download-bad-repo-id": Case(("download_models.py", "--hf-repo", "bad id!", "--models-dir", "m"),
                                 "--hf-repo 'bad id!' is not a hub repo id"),
    "download-name-with-path": Case(("download_models.py", "--hf-repo", "a/b", "--name", "../x", "--models-dir",
                                     "m"), "--name must be a plain folder name"),
    "download-models-dir-through-a-file": Case(("download_models.py", "--only", "draft", "--models-dir", "afile/m"),
                                               "pass a writable directory as --models-dir"),
    # distill_draft.py
    "distill-zero-layers": Case(("distill_draft.py", "--target", "target", "--output", "dd", "--layers", "0"),
                                "--layers must be in [1, 64]"),
    "distill-hidden-above-target": Case(("distill_draft.py", "--target", "target", "--output", "dd", "--hidden",
                                         "128"), "needs --hidden <= the target's hidden size 64"),
    "distill-unwritable-output": Case(("distill_draft.py", "--target", "target", "--output", "afile/dd"),
                                      "pass a writable directory as --output"),
    # collect_results.py
    "collect-missing-dir": Case(("collect_results.py", "--output", "none"), "results directory not found: none"),
    "collect-no-runs": Case(("collect_results.py", "--output", "target"), "no run directories"),
    # make
    "make-fpga-unknown-kernel": Case(("make", "-C", "fpga", "sim", "KERNELS=nope"),
                                     "unknown kernel(s) in KERNELS: nope"),
    "make-fpga-bad-python": Case(("make", "-C", "fpga", "sim", "PYTHON=/nonexistent/python"),
                                 "PYTHON=/nonexistent/python cannot import torch"),
    "make-fpga-without-vivado": Case(("make", "-C", "fpga", "synthesize"), "vivado was not found on PATH",
                                     skip="vivado is installed" if shutil.which("vivado") else ""),
    "make-gpu-without-gpu": Case(("make", "-C", "gpu", "all"), "gpu: no CUDA GPU on this machine", skip=NO_CUDA),
}


def command(argv: tuple[str, ...]) -> list[str]:
    head, *rest = argv
    if head == "dfvg":
        return [sys.executable, "-m", "dfvg", *rest]
    if head == "make":
        return ["make", "-C", str(REPO / rest[1]), f"PYTHON={sys.executable}", *rest[2:]]  # a later PYTHON= wins
    return [sys.executable, str(REPO / ("" if head.startswith("benchmarks/") else "scripts") / head), *rest]


def run_command(argv: tuple[str, ...], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command(argv), capture_output=True, text=True, cwd=cwd, env=ENV, timeout=300)


def as_in_a_terminal() -> None:
    """The child takes Ctrl-C as a terminal's foreground command does, however the suite was started: a shell
    that runs the suite in the background (`cmd &`, nohup) makes it inherit SIGINT ignored, and Python then
    installs no KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupted(argv: tuple[str, ...], cwd: Path, trigger: str) -> subprocess.CompletedProcess:
    """Start the command, press Ctrl-C (SIGINT) once `trigger` appears, and collect what it printed."""
    proc = subprocess.Popen(command(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                            env=ENV, preexec_fn=as_in_a_terminal)
    deadline = time.monotonic() + 240
    while not list(cwd.glob(trigger)):
        assert proc.poll() is None, f"finished before it could be interrupted: {proc.communicate()}"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def snapshot(*roots: Path) -> set[str]:
    """Every path under the roots (symlinks not followed) and under the repository's output folders."""
    paths: set[str] = set()
    for root in (*roots, *(REPO / folder for folder in REPO_OUTPUTS)):
        for folder, dirs, files in os.walk(root):
            paths |= {folder, *(os.path.join(folder, name) for name in dirs + files)}
    return paths


@dataclass
class Outcome:
    done: subprocess.CompletedProcess
    cwd: Path  # the row's own folder: symlinks to the inputs, and whatever the command wrote
    left: set[str]  # paths that were not there before


def attempt(name: str, inputs: Path) -> Outcome:
    """Run one row in its own folder (so rows can run side by side) and see what it left behind."""
    case, cwd = CASES[name], inputs.parent / f"row-{name}"
    cwd.mkdir()
    for entry in inputs.iterdir():
        (cwd / entry.name).symlink_to(entry)
    before = snapshot(cwd, inputs)
    done = interrupted(case.argv, cwd, case.interrupt) if case.interrupt else run_command(case.argv, cwd)
    return Outcome(done, cwd, snapshot(cwd, inputs) - before)


def skip_reason(case: Case) -> str:
    if case.argv[0] == "make" and shutil.which("make") is None:
        return "make is not installed"
    return case.skip


@pytest.fixture(scope="module")
def outcomes(request, inputs) -> dict[str, Outcome]:
    """Every selected row, two at a time (each is mostly a Python start-up with torch: ~3 s of one core)."""
    selected = [item.callspec.params["name"] for item in request.session.items
                if getattr(item, "originalname", "") == "test_bad_input_is_refused_in_one_line"]
    names = [n for n in dict.fromkeys(selected) if not skip_reason(CASES[n])]
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {n: pool.submit(attempt, n, inputs) for n in names}
    return {n: f.result() for n, f in futures.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_refused_in_one_line(name, outcomes):
    case = CASES[name]
    if skip_reason(case):
        pytest.skip(skip_reason(case))
    done, cwd, left = outcomes[name].done, outcomes[name].cwd, outcomes[name].left
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == case.code, done.stderr
    assert "Traceback" not in done.stderr and len(lines) == 1, done.stderr
    assert case.expect in lines[0], lines[0]
    prefix = "interrupted: " if case.code == 130 else "Makefile:" if case.argv[0] == "make" else "error: "
    assert lines[0].startswith(prefix), lines[0]
    stdout = [line for line in done.stdout.splitlines() if line.strip() and not line.startswith("make: ")]
    assert stdout == [], done.stdout  # no partial result printed
    if case.interrupt:  # only the completed repetitions, saved for a rerun: no run directory, no temp file
        root = cwd / case.interrupt.split("/")[0]
        assert left and all(Path(p).relative_to(root).parts[0].endswith(".progress") for p in left - {str(root)}), left
        assert not [p for p in left if ".tmp" in Path(p).name], left
    else:
        assert left == set(), f"left behind: {sorted(left)}"
    if case.after:
        case.after(cwd)
