"""The quantized draft on disk: a versioned artifact, found next to its checkpoint, rebuilt when stale.

What this module owns: where the artifact lives (`<draft_dir>/dfvg_fpga_int8/`, `dfvg_fpga_int4_g128/`,
or a per-checkpoint cache folder when the draft folder is read-only), its files (`weights.safetensors`
of int8 / int16 / int32 / int4-packed uint8 tensors, `meta.json` with the format version, bits, group size,
source checkpoint (path, sha256 of config.json, weight bytes), calibration set and every real scale), the
staleness check, and the calibration set. The numbers themselves come from `quantize.py`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from dfvg.checkpoint import load_model, read_json, safetensors_files
from dfvg.datasets import load_humaneval
from dfvg.devices import cpu_threads
from dfvg.errors import UserError
from dfvg.feature_head import WEIGHTS_FILE as HEAD_WEIGHTS
from dfvg.feature_head import load_feature_head
from dfvg.fpga.datapath.head_quantize import calibration_features, quantize_feature_head
from dfvg.fpga.datapath.quantize import BUILTIN_CALIBRATION, builtin_calibration, quantize_model
from dfvg.tokenizer import encode, load_tokenizer

FORMAT_VERSION = 3  # 2: calibrated on one thread (`cpu_threads`), weights' mtime in the source; 3: a block drafter's
# mask vectors (`block_masks.*`) and its calibration with the masks after each sequence (older ones are rebuilt)
CALIBRATION_PROMPTS, CALIBRATION_TOKENS = 4, 256

def artifact_name(bits: int, group_size: int) -> str:
    return "dfvg_fpga_int8" if bits == 8 else f"dfvg_fpga_int4_g{group_size}"


def source_fingerprint(draft_dir: str | Path) -> dict:
    """What the artifact was built from: path, sha256 of config.json, total bytes and the latest modification
    time of the weight files (a checkpoint retrained in place keeps its shape and bytes, not its mtime)."""
    directory = Path(draft_dir).resolve()
    files = safetensors_files(directory)
    config_sha = hashlib.sha256((directory / "config.json").read_bytes()).hexdigest()
    return {"path": str(directory), "config_sha256": config_sha, "weights_bytes": sum(f.stat().st_size for f in files),
            "weights_mtime_ns": max(f.stat().st_mtime_ns for f in files)}


def default_artifact_dir(draft_dir: str | Path, bits: int, group_size: int) -> Path:
    """`<draft_dir>/dfvg_fpga_int8/` (or int4_gG), or a per-checkpoint cache folder when draft_dir is read-only."""
    directory = Path(draft_dir).resolve()
    if os.access(directory, os.W_OK):
        return directory / artifact_name(bits, group_size)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dfvg" / "fpga"
    return cache / hashlib.sha256(str(directory).encode()).hexdigest()[:16] / artifact_name(bits, group_size)


def save_artifact(directory: str | Path, tensors: dict[str, Tensor], meta: dict) -> None:
    """weights.safetensors + meta.json, written to a temp folder and renamed so no half artifact is left."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=directory.name + ".tmp", dir=directory.parent))
    save_file({n: t.contiguous() for n, t in tensors.items()}, str(tmp / "weights.safetensors"),
              metadata={"format_version": str(FORMAT_VERSION)})
    (tmp / "meta.json").write_text(json.dumps({"format_version": FORMAT_VERSION, **meta}, indent=1))
    if directory.exists():
        shutil.rmtree(directory)
    os.replace(tmp, directory)


def flat(meta: dict, prefix: str = "") -> dict:
    """{"source": {"path": p}} -> {"source.path": p}: the keys `check_meta` compares."""
    out = {}
    for key, value in meta.items():
        out |= flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value}
    return out


def check_meta(meta: dict, expected: dict, directory: Path) -> None:
    """Raise StaleArtifact naming the first field that differs (format version, bits, group size, source)."""
    have = flat(meta)
    for key, want in expected.items():
        if have.get(key) != want:
            raise StaleArtifact(f"FPGA artifact {directory} is stale: {key} is {have.get(key)!r}, expected {want!r}")


def load_artifact(directory: str | Path, expected: dict | None = None) -> tuple[dict[str, Tensor], dict]:
    """Reload an artifact; refuse (StaleArtifact, a UserError) one whose metadata differs from `expected`."""
    directory = Path(directory)
    meta = read_json(directory / "meta.json", "FPGA artifact meta.json")
    check_meta(meta, {"format_version": FORMAT_VERSION, **(expected or {})}, directory)
    if not (directory / "weights.safetensors").is_file():
        raise StaleArtifact(f"FPGA artifact {directory} lacks weights.safetensors; delete the folder to rebuild it")
    return load_file(str(directory / "weights.safetensors")), meta


def calibration_set(draft_dir: Path, vocab_size: int) -> tuple[list[list[int]], str]:
    """The last 4 HumanEval prompts (first 256 tokens; the benchmarks use the first ones), else builtin."""
    try:
        prompts = load_humaneval()[-CALIBRATION_PROMPTS:]
        tokenizer = load_tokenizer(draft_dir)
        seqs = [encode(tokenizer, p["prompt"])[:CALIBRATION_TOKENS] for p in prompts]
    except UserError:
        seqs = []
    # A tokenizer that maps the prompts to a handful of ids (a test's word-level vocab) calibrates nothing.
    if seqs and min(len(set(s)) for s in seqs) >= 16 and max(max(s) for s in seqs) < vocab_size:
        return seqs, f"humaneval[-{CALIBRATION_PROMPTS}:], first {CALIBRATION_TOKENS} tokens"
    return builtin_calibration(vocab_size), BUILTIN_CALIBRATION


def build_artifact(draft_dir: str | Path, bits: int, group_size: int, directory: Path) -> tuple[dict, dict]:
    """Load the float draft, calibrate, quantize, save to `directory`; returns (tensors, meta)."""
    model = load_model(draft_dir, dtype=torch.float32, device="cpu")
    seqs, name = calibration_set(Path(draft_dir), model.config.vocab_size)
    with cpu_threads(1):  # the same scales whatever the thread count
        tensors, meta = quantize_model(model, bits, group_size, seqs, inplace=True)
    del model
    meta |= {"source": source_fingerprint(draft_dir), "calibration": name}
    save_artifact(directory, tensors, meta)
    return tensors, {"format_version": FORMAT_VERSION, **meta}


def load_or_build(draft_dir: str | Path, bits: int = 8, group_size: int = 128, directory: str | Path | None = None,
                  on_stale: str = "rebuild") -> tuple[dict[str, Tensor], dict]:
    """The artifact of draft_dir at these bits: reloaded when current, else built (or refused: on_stale="refuse")."""
    if bits not in (4, 8):
        raise UserError(f"FPGA weight bits must be 8 or 4, got {bits}")
    directory = Path(directory) if directory else default_artifact_dir(draft_dir, bits, group_size)
    expected = {"bits": bits, "group_size": group_size if bits == 4 else None,
                **flat({"source": source_fingerprint(draft_dir)})}
    return _reload_or(directory, expected, on_stale, lambda: build_artifact(draft_dir, bits, group_size, directory))


def _reload_or(directory: Path, expected: dict, on_stale: str, build) -> tuple[dict[str, Tensor], dict]:
    if (directory / "meta.json").is_file():
        try:
            return load_artifact(directory, expected)
        except StaleArtifact as err:
            if on_stale != "rebuild":
                raise
            print(f"dfvg: {err}; rebuilding it", file=sys.stderr)
    return build()


def head_fingerprint(head_dir: str | Path, target_dir: str | Path) -> dict:
    """A feature head's artifact depends on its body, its projections and the target whose features set its
    scales: the body's fingerprint, the projections' sha256, and the target's fingerprint."""
    projections = Path(head_dir).resolve() / HEAD_WEIGHTS
    if not projections.is_file():
        raise UserError(f"{projections} is missing; copy the feature head's folder again in full")
    return {"source": source_fingerprint(head_dir) | {"projections_sha256": hashlib.sha256(
        projections.read_bytes()).hexdigest()}, "target": source_fingerprint(target_dir)}


def load_or_build_head(head_dir: str | Path, target_dir: str | Path, bits: int = 8, group_size: int = 128,
                       predict_bits: int = 16, directory: str | Path | None = None,
                       on_stale: str = "rebuild") -> tuple[dict[str, Tensor], dict]:
    """A feature head's artifact (`head_quantize.py`): `<head_dir>/dfvg_fpga_head_int8/` (or int4_gG; `_p8` with
    8-bit predict rows),
    reloaded when its head, target, bits and predict width match, else built (the fp32 target runs once on
    the CPU over the calibration prompts: their features set the feature scales)."""
    if bits not in (4, 8):
        raise UserError(f"FPGA weight bits must be 8 or 4, got {bits}")
    name = "dfvg_fpga_head_" + artifact_name(bits, group_size).removeprefix("dfvg_fpga_") + \
        ("" if predict_bits == 16 else f"_p{predict_bits}")
    directory = Path(directory) if directory else default_artifact_dir(head_dir, bits, group_size).parent / name
    fingerprint = head_fingerprint(head_dir, target_dir)
    expected = {"bits": bits, "group_size": group_size if bits == 4 else None,
                "feature_head.predict_bits": predict_bits, **flat(fingerprint)}
    return _reload_or(directory, expected, on_stale,
                      lambda: build_head_artifact(head_dir, target_dir, bits, group_size, predict_bits, directory))


def build_head_artifact(head_dir: str | Path, target_dir: str | Path, bits: int, group_size: int,
                        predict_bits: int, directory: Path) -> tuple[dict, dict]:
    """Calibrate the head on the fp32 target's features over the calibration set, quantize, save."""
    target = load_model(target_dir, dtype=torch.float32, device="cpu")
    head = load_feature_head(head_dir, target_hidden_size=target.config.hidden_size)
    seqs, name = calibration_set(Path(head_dir), head.body.config.vocab_size)
    with cpu_threads(1):  # the same scales whatever the thread count
        features = calibration_features(target, seqs)
        del target
        tensors, meta = quantize_feature_head(head, seqs, features, bits, group_size, predict_bits)
    meta |= head_fingerprint(head_dir, target_dir) | {"calibration": name}
    save_artifact(directory, tensors, meta)
    return tensors, {"format_version": FORMAT_VERSION, **meta}


class StaleArtifact(UserError):
    """An artifact from another format version, bit width or source checkpoint."""
