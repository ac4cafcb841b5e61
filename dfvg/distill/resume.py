"""The training checkpoint: everything a distillation run needs to continue exactly where it stopped.

What this module owns: `Checkpointing` (where and when to write, when to stop this run, what to resume
from), `TrainState` (step, the data order still to be drawn, the losses so far), and the checkpoint folder:
`state-sNNNNNNN-NNNNN.safetensors` shards (<= 16 MiB each, shards.py) holding the draft's parameters, the
AdamW moments and step counts, the data generator's and torch's global RNG states and the remaining data
order, then `checkpoint.json` (format, run fingerprint, step, losses, the optimizer's param groups and
the shards' manifest), written last through a rename. What it does not own: the loop (train.py).

Why this is enough for bit-identical resumption: the learning rate is a pure function of the step
(train.lr_at), the only randomness in training is the seeded data generator (its state is saved), and the
loop draws batches from `order` and refills it from that generator; so N steps in one go and N/2 + resume
+ N/2 on the same device give the same weights (tested on CPU in float32).

Why a fingerprint: resuming another run's checkpoint (other --steps, --lr, data or shape) would silently
train a hybrid; the checkpoint records the training parameters and a hash of the training data and
model shape, and a mismatch is one line naming what differs. The device may differ between leases.

A lease chain: every lease runs the same command with `--checkpoint-dir ckpt --time-budget S`, the
second and later ones with `--resume ckpt` too; the run that reaches --steps evaluates and exports.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dfvg.checkpoint import read_json
from dfvg.distill import shards
from dfvg.distill.teacher import TeacherSequence
from dfvg.errors import UserError
from dfvg.model import Transformer
from dfvg.outputs import atomic_write

FORMAT = 1
META = "checkpoint.json"
STEM = "state"


@dataclass(frozen=True)
class Checkpointing:
    directory: Path | None = None  # where checkpoints are written (None: nowhere)
    every: int = 0  # steps between checkpoints; 0 = only when this run stops or finishes
    stop_after: int = 0  # steps this run may take before it stops (0 = no limit)
    time_budget_s: float = 0.0  # stop before a step that could end past this many seconds (0 = no limit)
    resume: Path | None = None  # a checkpoint folder to continue from
    max_file_bytes: int = shards.MAX_FILE_BYTES

    def check(self) -> None:
        if self.every < 0 or self.stop_after < 0 or self.time_budget_s < 0:
            raise UserError("need --checkpoint-every >= 0, --stop-after >= 0 and --time-budget >= 0")
        if (self.every or self.stop_after or self.time_budget_s) and self.directory is None:
            raise UserError("--checkpoint-every, --stop-after and --time-budget need --checkpoint-dir "
                            "(where the run can be resumed from)")
        if self.resume is not None:
            require_checkpoint(self.resume)  # before the teacher phase, not after it


def require_checkpoint(directory: Path) -> None:
    if not (directory / META).is_file():
        raise UserError(f"--resume {directory}: no {META} there (no checkpoint written, or the copy is "
                        "incomplete); give the --checkpoint-dir of an earlier run")


@dataclass
class TrainState:
    step: int = 0  # optimizer steps taken
    order: list[int] = field(default_factory=list)  # data indices still to be drawn, in order
    losses: list[float] = field(default_factory=list)


def fingerprint(params: dict, data: list[TeacherSequence], model: Transformer) -> dict:
    """What a checkpoint must match to be resumed: training parameters, data hash, model shape."""
    digest = hashlib.sha256()
    for seq in data:
        digest.update(torch.tensor(seq.prompt + [-1] + seq.continuation, dtype=torch.int64).numpy().tobytes())
        digest.update(seq.topk_ids.to(torch.int32).numpy().tobytes())
        digest.update(seq.topk_probs.to(torch.float16).numpy().tobytes())
    shapes = {n: list(p.shape) for n, p in model.named_parameters()}
    return {"params": params, "data_sha256": digest.hexdigest(),
            "model_sha256": hashlib.sha256(json.dumps(shapes, sort_keys=True).encode()).hexdigest()}


def save(ckpt: Checkpointing, model: Transformer, optimizer: torch.optim.Optimizer, generator: torch.Generator,
         state: TrainState, run: dict) -> None:
    """Write the shards of this step, then checkpoint.json, then delete the previous step's shards."""
    opt = optimizer.state_dict()
    tensors = {f"model.{n}": p.detach() for n, p in model.named_parameters()}
    for index, values in opt["state"].items():
        tensors.update({f"optim.{index}.{key}": value for key, value in values.items()})
    tensors["rng.data"] = generator.get_state()
    tensors["rng.torch"] = torch.get_rng_state()
    tensors["data.order"] = torch.tensor(state.order, dtype=torch.int64)
    manifest = shards.save_sharded(ckpt.directory, f"{STEM}-s{state.step:07d}", tensors, ckpt.max_file_bytes)
    meta = {"format": FORMAT, "fingerprint": run, "step": state.step, "losses": state.losses,
            "param_groups": opt["param_groups"], **manifest}
    atomic_write(ckpt.directory / META, json.dumps(meta))
    shards.remove_stale(ckpt.directory, manifest, f"{STEM}-s*.safetensors")


def _check_same_run(directory: Path, meta: dict, run: dict) -> None:
    """One line naming the first thing that differs between the checkpoint's run and this one."""
    if meta.get("format") != FORMAT:
        raise UserError(f"--resume {directory}: checkpoint format {meta.get('format')}, this DFVG reads {FORMAT}")
    saved = meta["fingerprint"]
    for key, value in run["params"].items():
        if saved["params"].get(key) != value:
            raise UserError(f"--resume {directory}: the checkpoint was trained with {key}={saved['params'].get(key)}, "
                            f"this run has {key}={value}; use the same flags")
    for key, what in (("data_sha256", "training data (prompts, split or teacher cache)"),
                      ("model_sha256", "draft shape")):
        if saved[key] != run[key]:
            raise UserError(f"--resume {directory}: this run's {what} differs from the checkpoint's; "
                            "use the same flags and teacher cache")


def load(directory: Path, model: Transformer, optimizer: torch.optim.Optimizer, generator: torch.Generator,
         run: dict) -> TrainState:
    """Restore model, optimizer, RNGs and data position from `directory`; one-line errors for a missing,
    cut-short or foreign checkpoint."""
    require_checkpoint(directory)
    meta = read_json(directory / META, "training checkpoint")
    _check_same_run(directory, meta, run)
    tensors = shards.load_sharded(directory, meta, "training checkpoint")
    device = next(model.parameters()).device
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(tensors[f"model.{name}"])
    states: dict[int, dict] = {}
    for name, value in tensors.items():
        if name.startswith("optim."):
            _, index, key = name.split(".", 2)
            states.setdefault(int(index), {})[key] = value if key == "step" else value.to(device)
    optimizer.load_state_dict({"state": states, "param_groups": meta["param_groups"]})
    generator.set_state(tensors["rng.data"])
    torch.set_rng_state(tensors["rng.torch"])
    return TrainState(meta["step"], tensors["data.order"].tolist(), list(meta["losses"]))
