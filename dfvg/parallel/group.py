"""Who this process is in a tensor-parallel run, and the checks of `--tensor-parallel N` (`tensor_parallel: N`).

torchrun starts N copies of the same command and tells each its RANK, LOCAL_RANK and WORLD_SIZE in the
environment. `start` checks N against the target and the machine, joins the process group (NCCL on CUDA, one
GPU per rank: cuda:LOCAL_RANK; gloo on CPU) and returns this rank's `TensorParallel`; with N = 1 it joins
nothing and returns None. Every check runs before any process group exists and reads only the arguments, the
checkpoint's config.json and the machine, so every rank refuses a bad N with the same line (rank 0 prints it).

The group is process state because torch.distributed's is: `current` returns it, so the drafter factory
(`dfvg.engine.make_drafter`) can tell a rank that drafts (0) from one that receives rank 0's drafts.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from dfvg.checkpoint import load_config
from dfvg.devices import resolve_device
from dfvg.errors import UserError
from dfvg.model import ModelConfig


@dataclass(frozen=True)
class TensorParallel:
    """This process's place in the group: its rank, the group's size, and the device its shard lives on."""

    rank: int
    size: int
    device: torch.device  # cuda:LOCAL_RANK (NCCL) or cpu (gloo); collectives' tensors live here too

    @property
    def leads(self) -> bool:
        """Rank 0 drafts, decides every token and alone writes output and reports."""
        return self.rank == 0


_CURRENT: TensorParallel | None = None


def current() -> TensorParallel | None:
    """The group this process joined with `start`, or None in a single-process run."""
    return _CURRENT


def leads() -> bool:
    """Whether this process speaks for the run: no launcher, or torchrun's rank 0 (readable before `start`)."""
    return int(os.environ.get("RANK", "0")) == 0


def splits_heads(size: int, cfg: ModelConfig) -> bool:
    """N must divide the query heads; KV heads are split when N divides them and replicated (each shared by
    N / KV ranks) when KV divides N. Example: 12 heads, 2 KV heads -> N = 1, 2, 4, 6, 12; not 3."""
    kv = cfg.num_kv_heads
    return cfg.num_heads % size == 0 and (kv % size == 0 or size % kv == 0)


def check_size(size: int, cfg: ModelConfig, device_name: str, gpus: int, flag: str) -> None:
    """Refuse an N this target or machine cannot run, in one line naming `flag` and what would work."""
    if size < 1:
        raise UserError(f"{flag} must be >= 1 (the number of ranks the target is split over), got {size}")
    if device_name.startswith("cuda") and size > gpus:
        raise UserError(f"{flag} {size} needs {size} GPUs (one per rank) but this machine has {gpus}; lower it, "
                        "or split over CPU processes with --device cpu (gloo)")
    if not splits_heads(size, cfg):
        allowed = [n for n in range(1, cfg.num_heads + 1) if splits_heads(n, cfg)]
        raise UserError(f"{flag} {size} does not split the target's {cfg.num_heads} attention heads and "
                        f"{cfg.num_kv_heads} KV heads evenly; use one of {', '.join(map(str, allowed))}")


def check_launch(size: int, flag: str) -> None:
    """N ranks need N processes: torchrun's WORLD_SIZE must equal N (and a torchrun launch needs N > 1)."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if size > 1 and launched != size:
        raise UserError(f"{flag} {size} needs one process per rank: start it as torchrun --nproc-per-node {size} "
                        f"-m dfvg ... (this is {'one of ' + str(launched) if launched > 1 else 'a single'} process)")
    if size == 1 and launched > 1:
        raise UserError(f"started as {launched} processes (torchrun) but {flag} is 1; pass {flag} {launched}")


def start(size: int, device_name: str, target: str | Path | ModelConfig,
          flag: str = "--tensor-parallel") -> TensorParallel | None:
    """Check N against the target (its checkpoint directory, or its shapes for random weights), then join the
    group torchrun started; None (and no group) when N is 1."""
    global _CURRENT
    if size != 1:
        cfg = target if isinstance(target, ModelConfig) else load_config(target)
        check_size(size, cfg, device_name, torch.cuda.device_count(), flag)
    check_launch(size, flag)
    if size == 1:
        return None
    if not device_name.startswith("cuda"):
        resolve_device(device_name)  # refuses an unknown name in its usual line
    local_rank = int(os.environ["LOCAL_RANK"])
    if device_name.startswith("cuda"):
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", rank=int(os.environ["RANK"]), world_size=size, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=size)
    _CURRENT = TensorParallel(dist.get_rank(), size, device)
    return _CURRENT


def stop(completed: bool = False) -> None:
    """Leave the group (a no-op without one), so the process exits without NCCL's teardown warnings.

    completed: this rank finished without an error, as every rank should have; the ranks then meet at a
    barrier before any tears the group down (a gloo rank was once aborted, SIGABRT, while its peer left
    first). Not after an error: the other ranks may be waiting in another collective, and a barrier would hang."""
    global _CURRENT
    if dist.is_available() and dist.is_initialized():
        if completed:
            dist.barrier()
        dist.destroy_process_group()
    _CURRENT = None


def leave_process(code: int) -> None:
    """End a torchrun worker now with `code`, skipping the interpreter's and C++ runtime's teardown (a no-op
    outside torchrun). Call it once the command is over and `stop` has torn the group down.

    Why: with every rank done and the gloo group destroyed, a rank still aborted in the process's exit path
    ("terminate called without an active exception", no Python frame left: a C++ teardown race inside
    torch), in CI once and in 2 of 39 `dfvg run` launches on the 2-core machine under load (2026-12-05).
    Its reports were written; the abort only turned exit status 0 into a SIGABRT and a torchrun failure.
    What a worker writes is closed by then, and stdout and stderr are flushed here."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
