"""The records an experiment run produces (`dfvg.host.experiments`), handed to the report writers, and the
aggregates every report shares. They live beside the code that fills them; `dfvg.reports` only reads them.

Owns: `Generation` (one prompt decoded by one variant in one repetition), `VariantResult` (all of a
variant's generations, its energy measurements and GPU samples), `RunResults` (the whole run), and the
arithmetic over them: tokens/s per repetition and its mean ± std, the canonical acceptance metrics over all
steps (from `dfvg.stats`), output match against the baseline, projected board times, drafting faults.

Does not own: running anything (`dfvg.host.experiments`), file formats (the other `dfvg.reports` modules).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from dfvg.energy import GpuSample, Measurement
from dfvg.stats import (
    Metric,
    StepRecord,
    acceptance_rate,
    accepted_length_histogram,
    mean_accepted_length,
    per_position_acceptance,
)

MEASURED = "measured"


@dataclass
class Generation:
    """One prompt, one variant, one repetition."""

    variant: str
    run: int
    prompt_id: str
    prompt_tokens: int
    tokens: list[int]
    text: str
    stats: dict  # GenerationResult.stats()
    steps: list[StepRecord]
    timeline: list[dict]  # TimelineEvent fields: stage, device, start, end, tokens, provenance, step
    projected_s: float | None = None  # end-to-end seconds with the draft on the modeled board
    projection_source: str = ""
    projection_provenance: str = "modeled"  # "estimated" when some draft blocks had no modeled time
    batch_share: float = 1.0  # 1/B: a batch's rows share one wall clock, each is charged its share

    @property
    def seconds(self) -> float:
        return (self.stats["prefill_s"] + self.stats["decode_s"]) * self.batch_share


@dataclass
class VariantResult:
    """A variant (baseline, speculative, fpga, overlap, adaptive, sweep:k=N) over all repetitions."""

    name: str
    description: str
    mode: str  # "ar", "sync" or "overlap"
    drafter: str  # "none", "torch" or "fpga"
    draft_device: str | None
    verify_device: str
    draft_length: int
    adaptive: bool = False
    generations: list[Generation] = field(default_factory=list)
    energy: list[tuple[int, Measurement]] = field(default_factory=list)  # (repetition, measurement)
    gpu_samples: list[GpuSample] = field(default_factory=list)
    fpga_power: Metric | None = None  # board power the FPGA energy is modeled with
    skipped: str | None = None  # why it did not run

    def runs(self) -> list[int]:
        return sorted({g.run for g in self.generations})

    def steps(self) -> list[StepRecord]:
        return [s for g in self.generations for s in g.steps]

    def num_tokens(self) -> int:
        return sum(len(g.tokens) for g in self.generations)

    def seconds(self) -> float:
        return sum(g.seconds for g in self.generations)


@dataclass
class RunResults:
    """Everything one `run_experiments` call produced; `config` is the ExperimentConfig."""

    config: Any
    run_id: str
    variants: dict[str, VariantResult]
    started_utc: str
    finished_utc: str = ""
    board: Any = None  # dfvg.fpga.board.boards.Board of the FPGA variant / resource estimate
    fpga_workload: Any = None  # dfvg.fpga.board.latency.DraftWorkload of the draft model
    fpga_design: Any = None  # dfvg.fpga.board.latency.DesignParams
    gpu_reason: str = ""  # why there are no GPU figures (empty when there are)
    gpu_names: list[str] = field(default_factory=list)
    peak_rss_b: float = 0.0
    notes: list[str] = field(default_factory=list)
    warmup_s: float = 0.0  # graph capture / compilation and first touch, once per process, outside every tok/s

    @property
    def baseline(self) -> VariantResult:
        return self.variants["baseline"]

    def ran(self) -> list[VariantResult]:
        return [v for v in self.variants.values() if v.skipped is None and v.generations]


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    if not values:
        return 0.0, 0.0
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def tokens_per_second_by_run(v: VariantResult, projected: bool = False) -> list[float]:
    """Per repetition: all generated tokens / all end-to-end seconds (prefill + decode) of that repetition."""
    rates = []
    for run in v.runs():
        gens = [g for g in v.generations if g.run == run]
        secs = sum((g.projected_s if projected else g.seconds) or 0.0 for g in gens)
        rates.append(sum(len(g.tokens) for g in gens) / secs if secs > 0 else 0.0)
    return rates


def has_projection(v: VariantResult) -> bool:
    return bool(v.generations) and all(g.projected_s is not None for g in v.generations)


def projection_provenance(v: VariantResult) -> str:
    """The weakest label among the generations' projections."""
    labels = {g.projection_provenance for g in v.generations}
    return "estimated" if "estimated" in labels else "modeled"


def match_rates(v: VariantResult, baseline: VariantResult) -> tuple[float, float]:
    """(fraction of generations identical to the baseline's, fraction of baseline tokens reproduced at
    the same position). Paired by (repetition, prompt id)."""
    base = {(g.run, g.prompt_id): g.tokens for g in baseline.generations}
    exact, same, total = 0, 0, 0
    pairs = [(g.tokens, base[(g.run, g.prompt_id)]) for g in v.generations if (g.run, g.prompt_id) in base]
    for ours, theirs in pairs:
        exact += ours == theirs
        same += sum(a == b for a, b in zip(ours, theirs, strict=False))
        total += len(theirs)
    return (exact / len(pairs) if pairs else 0.0), (same / total if total else 0.0)


def acceptance_metrics(v: VariantResult) -> dict[str, Any]:
    """The canonical metrics over every step of every generation of the variant."""
    steps = v.steps()
    return {
        "acceptance_rate": acceptance_rate(steps),
        "mean_accepted_length": mean_accepted_length(steps),
        "per_position_acceptance": per_position_acceptance(steps),
        "accepted_length_histogram": accepted_length_histogram(steps),
        "num_verify_steps": len(steps),
        "num_draft_tokens": sum(s.num_drafted for s in steps),
        "num_accepted_tokens": sum(s.num_accepted for s in steps),
    }


def fault_summary(v: VariantResult) -> dict[str, Any]:
    """The drafting faults the variant's generations survived (dfvg.fallback), each with where it struck."""
    faults = [{"run": g.run, "prompt_id": g.prompt_id, **f} for g in v.generations for f in g.stats.get("faults", [])]
    return {"draft_faults": len(faults), "faults": faults,
            "tokens_without_draft": sum(g.stats.get("tokens_without_draft", 0) for g in v.generations)}


def energy_totals(v: VariantResult) -> dict[str, tuple[float | None, str, str]]:
    """component -> (joules over all repetitions or None, provenance, source)."""
    out: dict[str, tuple[float | None, str, str]] = {}
    for _, m in v.energy:
        joules, _, _ = out.get(m.component, (0.0, m.provenance, m.source))
        total = None if joules is None or m.energy_j is None else joules + m.energy_j
        out[m.component] = (total, m.provenance, m.source)
    fpga_s = sum(s.modeled_draft_s or 0.0 for s in v.steps())
    if v.drafter == "fpga" and v.fpga_power is not None:
        out["fpga"] = (v.fpga_power.value * fpga_s, "modeled",
                       f"board model: {v.fpga_power.value} W ({v.fpga_power.provenance}: "
                       f"{v.fpga_power.source}) x {fpga_s:.4f} s modeled draft time")
    return out


def record(value: Any, unit: str, provenance: str, source: str) -> dict:
    """A reported number (or list of numbers) as `{value, unit, provenance, source}` (a Metric's fields)."""
    if isinstance(value, (list, tuple)):
        Metric(0.0, unit, provenance, source)  # validates the provenance label
        return {"value": [float(x) for x in value], "unit": unit, "provenance": provenance, "source": source}
    return Metric(float(value), unit, provenance, source).to_dict()
