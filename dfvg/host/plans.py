"""Which variants an experiment config asks for, and how each one decodes (`Plan`).

Owns the variant table: each variant name of a config (`baseline`, `speculative`, `fpga`, `overlap`,
`adaptive`, `sweep`, `batch`) becomes one or more plans (drafter kind, schedule, draft length, batch size,
which draft). Does not own running them (`dfvg.host.experiments`) or the config format
(`dfvg.host.experiment_config`).
"""

from __future__ import annotations

from dataclasses import dataclass

from dfvg.host.experiment_config import ExperimentConfig

DESCRIPTIONS = {
    "baseline": "target alone, autoregressive (measured in the same run)",
    "speculative": "speculative decoding, sync, float draft on a torch device",
    "fpga": "speculative decoding, sync, FPGA draft (bit-exact emulation here; board times modeled)",
    "overlap": "speculative decoding, draft overlapped with verification (host runtime)",
    "adaptive": "overlap with adaptive draft length (host runtime)",
    "sweep": "speculative decoding, sync, float draft, draft length k",
    "batch": "batch of B prompts, one target pass per step for all rows (one graph replay per step on CUDA, greedy)",
}



@dataclass(frozen=True)
class Plan:
    """How one variant decodes."""

    name: str
    drafter: str  # "none", "torch", "fpga"
    mode: str  # "ar", "sync", "overlap"
    draft_length: int
    adaptive: bool = False
    batch_size: int = 0  # prompts decoded together; 0: the config's batch_size
    draft: str = ""  # an extra_drafts name: this draft instead of draft_model


def batch_size_of(plan: Plan, cfg: ExperimentConfig) -> int:
    return plan.batch_size or cfg.batch_size


def max_batch_size(cfg: ExperimentConfig) -> int:
    return max((cfg.batch_size, *cfg.batch_sizes))


def plans(cfg: ExperimentConfig) -> list[Plan]:
    k = cfg.draft_length
    ahead = "fpga" if cfg.devices.draft == "fpga" else "torch"  # overlap/adaptive draft where devices.draft says
    table = {"baseline": [Plan("baseline", "none", "ar", 0)],
             "speculative": [Plan("speculative", "torch", "sync", k)] + [
                 Plan(f"speculative:{name}", "torch", "sync", k, draft=name) for name in cfg.extra_drafts],
             "fpga": [Plan("fpga", "fpga", "sync", k)],
             "overlap": [Plan("overlap", ahead, "overlap", k)],
             "adaptive": [Plan("adaptive", ahead, "overlap", k, adaptive=True)],
             "sweep": [Plan(f"sweep:k={n}", "torch", "sync", n) for n in cfg.draft_length_sweep],
             "batch": [p for b in cfg.batch_sizes for p in (
                 Plan(f"batch:B={b}:plain", "none", "ar", 0, batch_size=b),
                 Plan(f"batch:B={b}:spec", "torch", "sync", k, batch_size=b))]}
    return [p for v in cfg.variants for p in table[v]]
