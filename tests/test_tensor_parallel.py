"""Tensor parallelism of the target (dfvg/parallel): two gloo processes on tiny checkpoints must decode exactly
what one process decodes, and the CLI/run entry points must work under torchrun.

- pure parts: the vocabulary/MLP split, KV-head replication, the merge of shard maxima (ties included), the
  checks of N;
- two spawned ranks (gloo, fp32) on tiny Llama (odd vocabulary: uneven shards), Qwen2 and Qwen3 targets:
  logits within 1e-5 of one process; greedy tokens identical for plain decoding, a draft that disagrees
  (partial acceptance), a draft equal to the target (everything accepted); sampled tokens identical;
- `torchrun ... -m dfvg generate --tensor-parallel 2` and `dfvg run` with `tensor_parallel: 2`: rank 0 alone
  prints / writes one report, with the single-process tokens.
Bad N (not dividing the heads, more than the GPUs, no torchrun) are rows of tests/test_bad_input.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import yaml

from dfvg.engine import Engine, load_verifier, make_drafter
from dfvg.errors import UserError
from dfvg.model import ModelConfig
from dfvg.parallel import group
from dfvg.parallel.shard import kv_head_range, shard_range
from dfvg.parallel.verifier import merge_shard_maxima
from dfvg.sampling import SamplingParams
from tests.conftest import save_checkpoint

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
ARCHS = {"llama": {"vocab_size": 93}, "qwen2": {}, "qwen3": {}}  # llama: 93 rows split 47 / 46
PROMPT = [5, 17, 33, 8, 2, 41]
NEW_TOKENS = 14
SAMPLED = SamplingParams(temperature=0.9, top_k=40, top_p=0.95)


def config(heads: int, kv: int) -> ModelConfig:
    return ModelConfig("qwen2", 100, 64, 96, 1, heads, kv, 16)


@pytest.mark.parametrize("total", [93, 96, 151936])
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_shard_ranges_tile_the_whole_range(total, size):
    spans = [shard_range(total, rank, size) for rank in range(size)]
    assert spans[0][0] == 0 and spans[-1][1] == total
    assert all(a[1] == b[0] for a, b in zip(spans[:-1], spans[1:], strict=True))
    assert max(e - s for s, e in spans) - min(e - s for s, e in spans) <= 1


def test_kv_heads_split_or_replicated_with_their_query_heads():
    cfg = config(heads=12, kv=2)
    assert [kv_head_range(cfg, r, 2) for r in range(2)] == [(0, 1), (1, 2)]
    assert [kv_head_range(cfg, r, 4) for r in range(4)] == [(0, 1), (0, 1), (1, 2), (1, 2)]
    for size in (2, 4, 6, 12):  # each rank's query heads read exactly the KV head(s) it keeps
        for rank in range(size):
            q0, q1 = shard_range(12, rank, size)
            kv0, kv1 = kv_head_range(cfg, rank, size)
            assert {h // 6 for h in range(q0, q1)} <= set(range(kv0, kv1))


def test_merged_shard_maxima_are_the_unsharded_argmax_ties_included():
    assert merge_shard_maxima(torch.tensor([[3.0, 5.0], [5.0, 5.0]]), torch.tensor([[1, 4], [7, 9]])).tolist() == [7, 4]
    gen = torch.Generator().manual_seed(0)
    logits = torch.randint(0, 4, (64, 93), generator=gen).float()  # few distinct values: ties everywhere
    for size in (2, 3, 4):
        spans = [shard_range(93, r, size) for r in range(size)]
        values = torch.stack([logits[:, s:e].max(-1).values for s, e in spans])
        ids = torch.stack([logits[:, s:e].max(-1).indices + s for s, e in spans])
        assert torch.equal(merge_shard_maxima(values, ids), logits.argmax(-1))


def test_bad_sizes_are_refused_with_what_would_work():
    cfg = config(heads=12, kv=2)
    for size in (1, 2, 4, 6, 12):
        group.check_size(size, cfg, "cuda", gpus=12, flag="--tensor-parallel")
    with pytest.raises(UserError, match="does not split the target's 12 attention heads and 2 KV heads evenly; "
                                        "use one of 1, 2, 4, 6, 12"):
        group.check_size(3, cfg, "cpu", gpus=0, flag="--tensor-parallel")
    with pytest.raises(UserError, match="--tensor-parallel 4 needs 4 GPUs .* this machine has 2"):
        group.check_size(4, cfg, "cuda", gpus=2, flag="--tensor-parallel")
    group.check_size(4, cfg, "cpu", gpus=0, flag="--tensor-parallel")  # CPU ranks need no GPU


def test_launch_must_match_the_size(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    group.check_launch(2, "--tensor-parallel")
    with pytest.raises(UserError, match="started as 2 processes .* pass --tensor-parallel 2"):
        group.check_launch(1, "--tensor-parallel")
    with pytest.raises(UserError, match="torchrun --nproc-per-node 4 -m dfvg"):
        group.check_launch(4, "--tensor-parallel")


# ---- two ranks vs one process ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tp")
    dirs = {arch: root / arch for arch in ARCHS}
    for arch, overrides in ARCHS.items():
        save_checkpoint(dirs[arch], arch, seed=3, **overrides)
    dirs["draft"] = root / "draft"
    save_checkpoint(dirs["draft"], "qwen2", seed=4, num_hidden_layers=1, hidden_size=32, intermediate_size=48)
    return dirs


def decode_all(dirs: dict[str, Path], device: str = "cpu", tp: group.TensorParallel | None = None) -> dict:
    """Logits and tokens of every case; the same calls whether this process holds a shard or the whole target."""
    torch.set_num_threads(1)
    out = {}
    for arch in ARCHS:
        engine = Engine(load_verifier(dirs[arch], torch.device(device), torch.float32, fast=False,
                                      tensor_parallel=tp))
        vocab = engine.verifier.vocab_size
        with torch.inference_mode():
            engine.verifier.prefill(PROMPT, 64)
            out[f"{arch}/logits"] = engine.verifier.score(PROMPT[-1:] + [7, 9, 11], len(PROMPT) - 1).cpu()
            out[f"{arch}/plain"] = engine.decode(None, PROMPT, NEW_TOKENS, k=0).tokens
            for name, draft in (("other", dirs["draft"]), ("itself", dirs[arch])):
                result = engine.decode(make_drafter(draft, device, torch.float32, vocab, fast=False), PROMPT,
                                       NEW_TOKENS, k=3)
                out[f"{arch}/{name}"] = result.tokens
                out[f"{arch}/{name}/accepted"] = (result.stats()["num_accepted_tokens"], len(result.steps))
            drafter = make_drafter(dirs["draft"], device, torch.float32, vocab, fast=False)
            out[f"{arch}/sampled"] = engine.decode(drafter, PROMPT, NEW_TOKENS, k=3, sampling=SAMPLED, seed=7).tokens
    return out


def rank_main(rank: int, dirs: dict[str, Path], port: int, device: str, result: Path) -> None:
    """One rank, started as torchrun would start it (its environment), through `dfvg.parallel.group.start`."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    tp = group.start(2, device, dirs["qwen2"])
    completed = False
    try:
        out = decode_all(dirs, device, tp)
        if tp.leads:
            torch.save(out, result)
        completed = True
    finally:
        group.stop(completed)
    group.leave_process(0)  # as `dfvg` ends a worker (the exit path's teardown abort never runs)


def two_ranks(dirs: dict[str, Path], device: str, tmp_path: Path) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(dirs, port, device, tmp_path / "rank0.pt"), nprocs=2, join=True)
    return torch.load(tmp_path / "rank0.pt")


def assert_same_decoding(sharded: dict, single: dict, atol: float) -> None:
    assert sharded.keys() == single.keys()
    for key, expected in single.items():
        if key.endswith("/logits"):
            assert sharded[key].shape == expected.shape, key
            torch.testing.assert_close(sharded[key], expected, rtol=0, atol=atol, msg=key)
        else:
            assert sharded[key] == expected, key


def test_two_gloo_ranks_decode_exactly_what_one_process_decodes(checkpoints, tmp_path):
    single = decode_all(checkpoints)
    for arch in ARCHS:
        assert single[f"{arch}/other"] == single[f"{arch}/itself"] == single[f"{arch}/plain"]
        accepted, steps = single[f"{arch}/itself/accepted"]
        assert accepted == NEW_TOKENS - steps  # the target as its own draft: every draft accepted
    assert single["qwen2/sampled"] != single["qwen2/plain"]  # the sampled case really samples
    assert_same_decoding(two_ranks(checkpoints, "cpu", tmp_path), single, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_nccl_ranks_decode_what_one_gpu_decodes(checkpoints, tmp_path):
    single = decode_all(checkpoints, "cuda")
    assert_same_decoding(two_ranks(checkpoints, "cuda", tmp_path), single, atol=1e-4)


# ---- the entry points under torchrun --------------------------------------------------------------------


def torchrun(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "dfvg", *args], capture_output=True, text=True, cwd=cwd, env=ENV, timeout=300)


def test_generate_under_torchrun_prints_once_the_single_process_tokens(checkpoints, tmp_path):
    args = ("generate", "--target", str(checkpoints["qwen2"]), "--draft", str(checkpoints["draft"]),
            "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", str(NEW_TOKENS), "--json")
    done = torchrun(*args, "--tensor-parallel", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()  # rank 0 alone printed
    single = subprocess.run([sys.executable, "-m", "dfvg", *args], capture_output=True, text=True, env=ENV,
                            cwd=tmp_path, timeout=300)
    assert json.loads(line)["tokens"] == json.loads(single.stdout)["tokens"]


def test_run_config_under_torchrun_writes_one_report_from_rank_0(checkpoints, tmp_path):
    (tmp_path / "p.jsonl").write_text(json.dumps({"id": "a", "prompt": "w5 w17 w33 w8"}) + "\n")
    cfg = {"target_model": str(checkpoints["qwen3"]), "draft_model": str(checkpoints["draft"]), "threads": 1,
           "dataset": str(tmp_path / "p.jsonl"), "num_prompts": 1, "max_new_tokens": 8, "tensor_parallel": 2,
           "variants": ["baseline", "speculative"]}
    (tmp_path / "tp.yaml").write_text(yaml.safe_dump(cfg))
    done = torchrun("run", "--config", "tp.yaml", "--output", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    [run_dir] = (tmp_path / "out").iterdir()
    assert done.stdout.count("reports: ") == 1
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["tensor_parallel"] == 2
    lines = (run_dir / "generations.jsonl").read_text().splitlines()
    rows = {row["variant"]: row["tokens"] for row in map(json.loads, lines)}
    engine = Engine(load_verifier(checkpoints["qwen3"], torch.device("cpu"), torch.float32, fast=False))
    with torch.inference_mode():
        expected = engine.decode(None, [5, 17, 33, 8], 8, k=0).tokens  # word-level ids: w5 -> 5
    assert rows == {"baseline": expected, "speculative": expected}


def test_scaling_model_is_the_bandwidth_floor_plus_two_allreduces_per_layer():
    from dfvg.parallel.scaling import TARGETS, allreduce_budget, scaling_rows, step_seconds, weight_bytes

    cfg = TARGETS["llama-2-7b"]
    assert 6.5e9 < weight_bytes(cfg) / 2 < 6.8e9  # Llama-2-7B: 6.74 B parameters, the embedding not streamed
    floor = step_seconds(cfg, 1, allreduce_s=1.0)  # TP 1 has no all-reduce
    assert step_seconds(cfg, 2, 0.0) == pytest.approx(floor / 2)
    assert step_seconds(cfg, 2, 1e-5) == pytest.approx(floor / 2 + 2 * cfg.num_layers * 1e-5)
    budget = allreduce_budget(cfg, 2, 0.6)
    assert step_seconds(cfg, 2, budget) == pytest.approx(0.6 * floor)  # the budget meets the goal exactly
    rows = scaling_rows({1: 0.0, 2: budget}, "assumed", "test")
    assert [r["allreduce_us"].provenance for r in rows] == ["modeled", "assumed"] * len(TARGETS)
    assert rows[1]["speedup"].value == pytest.approx(1 / 0.6) and rows[1]["step_ms"].provenance == "modeled"
