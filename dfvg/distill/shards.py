"""Tensors in files of at most 16 MiB, listed in a sha256 manifest: the form distillation state travels in.

What this module owns: writing a dict of tensors as `<stem>-NNNNN.safetensors` files, none over
`max_bytes` (a tensor too big for one file is cut into flat pieces), the manifest that lists every file
with its size and sha256 and every tensor with its shape and number of pieces, and reading them back,
refusing in one line a file that is missing, cut short or altered. What it does not own: what the tensors
mean (data.py's teacher cache, resume.py's training checkpoint) or where the manifest is stored (the
caller puts it in its own JSON file, written after the shards, so a manifest never names a file that
was not yet complete).

Why 16 MiB: a GPU lease's device call carries a working tree of 64 MiB and sends back files one by one
under a per-file size limit; 16 MiB files fit both, and a copy that dies half-way is caught by the hash,
not by a confusing safetensors error (or, worse, by no error at all on a file truncated at a tensor edge).
Example: 40 MiB of top-k probabilities and 1 MiB of tokens at 16 MiB per file -> pieces topk_probs#0..#2
(16, 16, 8 MiB less header room) and tokens#0 packed into 3 files.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from dfvg.download import sha256_file
from dfvg.errors import UserError

MAX_FILE_BYTES = 16 * 2**20
HEADER_ROOM = 64 * 2**10  # the safetensors JSON header of one file (names, shapes, offsets)


def _pieces(tensors: dict[str, Tensor], payload: int) -> tuple[list[tuple[str, Tensor]], dict]:
    """Every tensor as flat pieces of at most `payload` bytes: ([("name#i", piece)], {name: shape, pieces})."""
    pieces, layout = [], {}
    for name, tensor in tensors.items():
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        per_piece = max(1, payload // max(1, flat.element_size()))
        chunks = flat.split(per_piece) if flat.numel() else (flat,)
        pieces += [(f"{name}#{i}", chunk.clone()) for i, chunk in enumerate(chunks)]
        layout[name] = {"shape": list(tensor.shape), "pieces": len(chunks)}
    return pieces, layout


def save_sharded(directory: Path, stem: str, tensors: dict[str, Tensor], max_bytes: int = MAX_FILE_BYTES) -> dict:
    """Write `tensors` as `<stem>-NNNNN.safetensors` files of at most max_bytes; return the manifest."""
    if max_bytes <= 2 * HEADER_ROOM:
        raise ValueError(f"max_bytes must exceed {2 * HEADER_ROOM}, got {max_bytes}")
    payload = max_bytes - HEADER_ROOM
    pieces, layout = _pieces(tensors, payload)
    groups: list[list[tuple[str, Tensor]]] = [[]]
    used = 0
    for name, piece in pieces:  # greedy packing in order: the pieces of a tensor stay adjacent
        size = piece.numel() * piece.element_size()
        if groups[-1] and used + size > payload:
            groups.append([])
            used = 0
        groups[-1].append((name, piece))
        used += size
    directory.mkdir(parents=True, exist_ok=True)
    files = []
    for index, group in enumerate(groups):
        path = directory / f"{stem}-{index:05d}.safetensors"
        save_file(dict(group), str(path))
        if path.stat().st_size > max_bytes:
            raise RuntimeError(f"{path} is {path.stat().st_size} bytes, over {max_bytes}: raise HEADER_ROOM")
        files.append({"name": path.name, "bytes": path.stat().st_size, "sha256": sha256_file(path)})
    return {"files": files, "tensors": layout}


def verify_files(directory: Path, manifest: dict, what: str) -> None:
    """One-line UserError for the first file that is missing or differs from the manifest."""
    for entry in manifest["files"]:
        path = directory / entry["name"]
        fix = f"copy {directory} again in full, or delete it to start {what} over"
        if not path.is_file():
            raise UserError(f"{what}: {path} is missing (the manifest lists it); {fix}")
        if path.stat().st_size != entry["bytes"]:
            raise UserError(f"{what}: {path} has {path.stat().st_size} bytes, the manifest says {entry['bytes']} "
                            f"(a copy cut short?); {fix}")
        if sha256_file(path) != entry["sha256"]:
            raise UserError(f"{what}: {path} does not match its sha256 in the manifest (altered or corrupt); {fix}")


def load_sharded(directory: Path, manifest: dict, what: str) -> dict[str, Tensor]:
    """The tensors of `manifest`, after every file's size and sha256 were checked (verify_files)."""
    verify_files(directory, manifest, what)
    pieces: dict[str, Tensor] = {}
    for entry in manifest["files"]:
        pieces.update(load_file(str(directory / entry["name"])))
    out = {}
    for name, info in manifest["tensors"].items():
        parts = [pieces[f"{name}#{i}"] for i in range(info["pieces"])]
        out[name] = torch.cat(parts).reshape(info["shape"])
    return out


def remove_stale(directory: Path, keep: dict, pattern: str) -> None:
    """Delete files matching `pattern` that the manifest `keep` does not list (an older run's shards)."""
    listed = {entry["name"] for entry in keep["files"]}
    for path in directory.glob(pattern):
        if path.name not in listed:
            path.unlink()
