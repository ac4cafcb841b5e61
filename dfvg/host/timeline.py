"""Timeline events of one generation: which stage ran on which device, from when to when.

Owns: the `TimelineEvent` record and the `Timeline` that collects them from the host runtime's threads.
Times are seconds from the timeline's origin (the first reading of its clock), read from an injectable clock
so tests can drive it with a fake one. Every event the pipeline writes is `measured` on this machine; a
projection onto a board (dfvg.host.projection) builds its own, `modeled`, numbers and never edits these.

Stages: `prefill` (target or draft prompt pass), `draft` (one drafter call), `transfer` (draft block moved to
the verifier's device), `verify` (one target forward over k+1 positions), `accept` (the acceptance rule),
`fault` (a draft call that raised or missed its watchdog deadline, from its start to the fault's
detection; dfvg.fallback).
A `draft` event with `speculative=True` was drafted ahead during the previous step's verification
(overlap mode); `discarded=True` marks one whose assumption (block fully accepted, bonus guessed) failed.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

STAGES = ("prefill", "draft", "transfer", "verify", "accept", "fault")


@dataclass(frozen=True)
class TimelineEvent:
    stage: str
    device: str
    start: float  # seconds from the timeline's origin
    end: float
    tokens: int  # prefill: prompt tokens fed; draft: tokens drafted; verify: positions scored; accept: committed
    provenance: str = "measured"
    step: int = -1  # verification step this event belongs to (-1: prefill)
    modeled_s: float | None = None  # draft events of a board-modeled drafter: the modeled block time
    speculative: bool = False  # drafted ahead, before the previous block's verdict
    discarded: bool = False  # a speculative draft thrown away (its assumption failed)

    @property
    def duration(self) -> float:
        return self.end - self.start

    def to_dict(self) -> dict:
        return asdict(self)


class Timeline:
    """Thread-safe event log. `now()` reads the clock relative to the origin (set by the first reading)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.origin: float | None = None
        self._events: list[TimelineEvent] = []
        self._lock = threading.Lock()

    def now(self) -> float:
        reading = self.clock()
        with self._lock:
            if self.origin is None:
                self.origin = reading
            return reading - self.origin

    def record(self, stage: str, device: str, start: float, end: float, tokens: int, step: int = -1,
               **extra) -> TimelineEvent:
        """Add one measured event; start and end come from `now()`."""
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
        if end < start:
            raise ValueError(f"event {stage} ends ({end}) before it starts ({start})")
        event = TimelineEvent(stage, device, start, end, tokens, "measured", step, **extra)
        with self._lock:
            self._events.append(event)
        return event

    @property
    def events(self) -> list[TimelineEvent]:
        """Events ordered by start time (ties: by end)."""
        with self._lock:
            return sorted(self._events, key=lambda e: (e.start, e.end))

    def span_s(self) -> float:
        """First start to last end: the measured end-to-end time of what was recorded."""
        events = self.events
        return max(e.end for e in events) - min(e.start for e in events) if events else 0.0

    def busy_s(self, stage: str) -> float:
        return sum(e.duration for e in self.events if e.stage == stage)

    def to_dict(self) -> dict:
        return {"time_unit": "s", "span_s": self.span_s(), "events": [e.to_dict() for e in self.events]}

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict) -> Timeline:
        """Rebuild a timeline (e.g. from a report) for projection; the clock is not used afterwards."""
        timeline = cls()
        timeline.origin = 0.0
        timeline._events = [TimelineEvent(**e) for e in data["events"]]
        return timeline


def overlapping(a: TimelineEvent, b: TimelineEvent) -> bool:
    """True when the two events share some time (touching ends do not count)."""
    return a.start < b.end and b.start < a.end
