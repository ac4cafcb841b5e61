"""Device names as users write them (`cpu`, `cuda`, `cuda:N`), checked against this machine."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from dfvg.errors import UserError


def resolve_device(name: str) -> torch.device:
    """torch.device for `cpu` / `cuda` / `cuda:N`, refusing one this machine does not have."""
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise UserError(f"device {name!r} requested but CUDA is not available here; use cpu")
        index = int(name.split(":")[1]) if ":" in name and name.split(":")[1].isdigit() else 0
        if name not in ("cuda", f"cuda:{index}") or index >= torch.cuda.device_count():
            raise UserError(f"device {name!r} does not exist (this machine has {torch.cuda.device_count()} GPU(s))")
        return torch.device("cuda", index)
    raise UserError(f"unknown device {name!r} (use cpu, cuda or cuda:N)")


def synchronize(device: torch.device) -> None:
    """Wait for queued work so a host clock read afterwards is honest."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_now(device: torch.device) -> float:
    synchronize(device)
    return time.perf_counter()


@contextmanager
def tf32_matmuls(enabled: bool) -> Iterator[None]:
    """Set TF32 for float32 CUDA matmuls inside the block, then restore the caller's setting.

    The flag is process-wide: a part that wants TF32 (training speed) or must not have it (exact float32
    arithmetic) scopes it here, so no other part inherits the choice silently."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


@contextmanager
def cpu_threads(count: int) -> Iterator[None]:
    """Run the block on `count` CPU threads, then restore the caller's count. A quantizer calibrates on one
    thread: float sums split across threads round differently, so the same model gave other scales (and other
    drafts) when built with another thread count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
