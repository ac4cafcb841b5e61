"""Training across leases (dfvg/distill/resume.py, shards.py): exact resumption, and copies cut short refused.

A tiny draft (1 layer, hidden 64, vocab 512: its embedding is bigger than one shard, so tensors are cut
into pieces) trains on synthetic teacher data; shards are capped at 160 KiB so a checkpoint spans many files.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dfvg.distill import resume, shards, train
from dfvg.distill.teacher import TeacherSequence
from dfvg.errors import UserError
from dfvg.model import ModelConfig

VOCAB, SMALL_FILES = 512, 160 * 2**10
CFG = ModelConfig("qwen2", VOCAB, 64, 96, 1, 2, 1, 32, attention_bias=True)


def synthetic_data(count: int = 7) -> list[TeacherSequence]:
    generator = torch.Generator().manual_seed(5)
    out = []
    for i in range(count):
        prompt = torch.randint(2, VOCAB, (3 + i % 4,), generator=generator).tolist()
        continuation = torch.randint(2, VOCAB, (6 + i % 3,), generator=generator).tolist()
        probs = torch.softmax(torch.randn(len(continuation), 8, generator=generator) * 3, -1)
        ids = torch.stack([torch.randperm(VOCAB, generator=generator)[:8] for _ in continuation]).to(torch.int32)
        ids[:, 0] = torch.tensor(continuation, dtype=torch.int32)
        out.append(TeacherSequence(prompt, continuation, ids, probs.sort(-1, descending=True).values))
    return out


def train_tiny(steps: int, ckpt: resume.Checkpointing | None = None, lr: float = 3e-3):
    model = train.build_draft(CFG, None, seed=0)
    params = train.TrainParams(steps=steps, batch_size=3, lr=lr, warmup=2, seed=0)
    state = train.train(model, synthetic_data(), params, torch.arange(VOCAB), torch.device("cpu"),
                        log=lambda line: None, ckpt=ckpt)
    return model, state


def checkpointing(directory: Path, **kw) -> resume.Checkpointing:
    return resume.Checkpointing(directory, max_file_bytes=SMALL_FILES, **kw)


def test_n_steps_equal_n_half_stop_and_resume_bit_for_bit(tmp_path):
    whole, whole_state = train_tiny(8)
    half, half_state = train_tiny(8, checkpointing(tmp_path, stop_after=4))  # 4 steps: 12 draws, 7 per epoch
    assert half_state.step == 4 and len(half_state.losses) == 4
    assert not all(torch.equal(a, b) for a, b in zip(whole.parameters(), half.parameters(), strict=True))
    files = list(tmp_path.glob("state-*.safetensors"))
    assert len(files) > 3 and all(f.stat().st_size <= SMALL_FILES for f in files)
    resumed, state = train_tiny(8, checkpointing(tmp_path, resume=tmp_path))
    assert state.step == 8 and state.losses == whole_state.losses
    for (name, a), b in zip(whole.named_parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b), name
    assert sorted(p.name for p in tmp_path.glob("state-*")) == sorted(  # the step-4 shards are gone
        p.name for p in tmp_path.glob("state-s0000008-*"))


def test_periodic_checkpoints_resume_too(tmp_path):
    whole, _ = train_tiny(6)
    train_tiny(6, checkpointing(tmp_path / "a", every=2, stop_after=5))  # stops at 5, after the step-4 save
    resumed, state = train_tiny(6, checkpointing(tmp_path / "b", resume=tmp_path / "a"))
    assert state.step == 6 and all(torch.equal(a, b) for a, b in zip(whole.parameters(), resumed.parameters(),
                                                                         strict=True))


@pytest.mark.parametrize("damage, needle", [
    (lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), "cut short"),
    (lambda p: p.write_bytes(p.read_bytes()[:-8] + b"\0" * 8), "sha256"),
    (lambda p: p.unlink(), "missing"),
])
def test_a_damaged_shard_is_refused_in_one_line(tmp_path, damage, needle):
    train_tiny(4, checkpointing(tmp_path, stop_after=2))
    damage(sorted(tmp_path.glob("state-*.safetensors"))[1])
    with pytest.raises(UserError, match=needle) as err:
        train_tiny(4, checkpointing(tmp_path, resume=tmp_path))
    assert "\n" not in str(err.value) and "training checkpoint" in str(err.value)


def test_resuming_another_run_or_nothing_is_refused(tmp_path):
    train_tiny(4, checkpointing(tmp_path, stop_after=2))
    with pytest.raises(UserError, match="lr=0.003, this run has lr=0.001"):
        train_tiny(4, checkpointing(tmp_path, resume=tmp_path), lr=1e-3)
    with pytest.raises(UserError, match="no checkpoint.json"):
        train_tiny(4, checkpointing(tmp_path / "empty", resume=tmp_path / "empty"))
    with pytest.raises(UserError, match="--checkpoint-dir"):
        train_tiny(4, resume.Checkpointing(stop_after=2))


def test_a_time_budget_stops_after_at_least_one_step(tmp_path):
    _, state = train_tiny(50, checkpointing(tmp_path, time_budget_s=1e-6))
    assert state.step == 1 and (tmp_path / resume.META).is_file()


def test_shards_round_trip_every_dtype_and_shape_under_the_size_cap(tmp_path):
    tensors = {"big": torch.randn(300, 128), "bf16": torch.randn(70, 200).to(torch.bfloat16),
               "scalar": torch.tensor(3.0), "empty": torch.zeros(0, 4), "ids": torch.arange(10, dtype=torch.int64)}
    manifest = shards.save_sharded(tmp_path, "x", tensors, SMALL_FILES)
    assert len(manifest["files"]) >= 2 and manifest["tensors"]["big"]["pieces"] >= 2
    assert all((tmp_path / f["name"]).stat().st_size <= SMALL_FILES for f in manifest["files"])
    back = shards.load_sharded(tmp_path, manifest, "test")
    assert all(back[n].dtype == t.dtype and torch.equal(back[n], t) for n, t in tensors.items())
