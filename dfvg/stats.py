"""Canonical metrics of speculative decoding, defined once, and the provenance-carrying `Metric` record.

Definitions (used by the CLI, the runtime and every report):
- acceptance rate alpha = accepted draft tokens / proposed draft tokens;
- mean accepted length tau = tokens committed per verification step, *counting the bonus/correction token*
  (so plain decoding has tau = 1 and a fully accepted block of k has tau = k + 1);
- per-position acceptance[i] = P(draft i accepted | draft i proposed);
- accepted-length histogram[a] = number of steps that accepted exactly a drafts;
- tokens without the draft = tokens committed by steps that verified no drafts because the drafter had
  failed (dfvg.fallback): the cost of draft faults, in tokens the target decoded alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

PROVENANCES = ("measured", "modeled", "estimated", "assumed")


@dataclass(frozen=True)
class Metric:
    """A reported number with its unit and where it comes from."""

    value: float
    unit: str
    provenance: str
    source: str = ""

    def __post_init__(self):
        if self.provenance not in PROVENANCES:
            raise ValueError(f"provenance must be one of {PROVENANCES}, got {self.provenance!r}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class StepRecord:
    """One propose -> verify -> accept -> commit step."""

    num_drafted: int
    num_accepted: int
    draft_s: float = 0.0
    verify_s: float = 0.0
    modeled_draft_s: float | None = None
    without_draft: bool = False  # no drafts because the drafter had failed (dfvg.fallback)


def acceptance_rate(steps: Sequence[StepRecord]) -> float:
    drafted = sum(step.num_drafted for step in steps)
    return sum(step.num_accepted for step in steps) / drafted if drafted else 0.0


def mean_accepted_length(steps: Sequence[StepRecord]) -> float:
    """Tokens committed per step, bonus token counted."""
    return sum(step.num_accepted + 1 for step in steps) / len(steps) if steps else 0.0


def per_position_acceptance(steps: Sequence[StepRecord]) -> list[float]:
    """Entry i: fraction of steps proposing a draft at position i that accepted it."""
    longest = max((step.num_drafted for step in steps), default=0)
    rates = []
    for i in range(longest):
        proposed = [step for step in steps if step.num_drafted > i]
        rates.append(sum(step.num_accepted > i for step in proposed) / len(proposed))
    return rates


def accepted_length_histogram(steps: Sequence[StepRecord]) -> list[int]:
    """Entry a: number of steps that accepted exactly a drafts."""
    longest = max((step.num_drafted for step in steps), default=0)
    histogram = [0] * (longest + 1)
    for step in steps:
        histogram[step.num_accepted] += 1
    return histogram


def tokens_without_draft(steps: Sequence[StepRecord]) -> int:
    """Tokens committed by steps whose drafter had failed (each such step commits the target's one token)."""
    return sum(step.num_accepted + 1 for step in steps if step.without_draft)
