"""Drafting that survives its device: a failed or hung draft costs speed, never the output.

Owns `GuardedDrafter`, the `Drafter` the engine hands every step (`dfvg.engine.Engine.guard`), the fault
policy, the fault records and the fault injection of the tests (`DFVG_FAIL_DRAFT_AFTER`,
`DFVG_HANG_DRAFT_AFTER`). A guard holds a chain of drafters - the configured one, then the fallback
devices - and drafts with the first that is healthy. Each call to a drafter runs under a watchdog
(`dfvg.watchdog`) whose deadline follows the drafter's measured block times. When a call raises or misses
its deadline:
- the block is discarded: the guard returns an empty block marked `without_draft`, so this step verifies
  no drafts and commits the target's own next token, exactly as plain decoding would;
- the drafter is marked failed and never called again (a hung call may still be running on its abandoned
  thread), unless `retry_after_s` is set: then, once that back-off has passed (doubling with each failure)
  and its last call has returned, it is prefilled afresh and drafts again;
- the next healthy drafter of the chain takes over from the next step (prefilled on the sequence so far),
  or, when none is left, every later step decodes with the target alone;
- a `DraftFault` is kept (when, which device, which error) until the engine's loop takes it into its
  `GenerationResult` (stats, `performance_summary.json`, the timeline).

Why the output stays the output of plain decoding, sampled too: a drafter draws its randomness from a
private copy of the step's generator, whose state is copied back only when the block is returned. A
failed block thus consumed nothing, and an empty block makes the verifier draw exactly one uniform per
token, as plain decoding does: the stream continues as if that block had never been proposed (and an
abandoned call can only ever touch its own copy).

Does not own: the loop and the steps (`dfvg.generate`, `dfvg.host.pipeline`, `dfvg.gpu.fast`), which
drafters the chain holds (`dfvg.engine`), the YAML and CLI spellings (`dfvg.host.device_config`, `dfvg.cli`).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any

import torch

from dfvg.devices import synchronize
from dfvg.drafter import DraftBlock, Drafter, device_label
from dfvg.errors import UserError
from dfvg.host.timeline import TimelineEvent
from dfvg.sampling import SamplingParams
from dfvg.watchdog import DeadlineMissed, Watchdog

WITHOUT_DRAFT = DraftBlock(tokens=[], probs=None, elapsed_s=0.0, without_draft=True)
RECENT_BLOCKS = 16  # the auto deadline follows the slowest of a drafter's last this-many calls
ENV_FAIL, ENV_HANG = "DFVG_FAIL_DRAFT_AFTER", "DFVG_HANG_DRAFT_AFTER"


class DraftDeviceError(RuntimeError):
    """A draft device failed: what the fault injection raises in place of an XRT or CUDA error."""


def _positive(value: Any, what: str, allow_none: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")
    if not ok and not (allow_none and value is None):
        raise UserError(f"{what} must be a number of seconds > 0{' or null' if allow_none else ''}, got {value!r}")


@dataclass(frozen=True)
class FaultPolicy:
    """How drafting faults are handled; YAML `faults:` of a device config, flags `--draft-*` of `dfvg generate`."""

    fallback: tuple[str, ...] = ()  # draft devices that take over, in order (same draft model); then target only
    deadline: float | str = "auto"  # watchdog: auto (from measured block times) | off | seconds per call
    deadline_factor: float = 20.0  # auto: this many times the slowest of the recent calls ...
    deadline_floor_s: float = 1.0  # ... but never less than this
    startup_deadline_s: float = 120.0  # prefills, and calls before any was measured (first calls compile)
    retry_after_s: float | None = None  # back-off before a failed drafter drafts again (doubles); None: never

    def __post_init__(self):
        if self.deadline not in ("auto", "off"):
            _positive(self.deadline, "faults.deadline (--draft-deadline), when not auto or off,")
        _positive(self.deadline_floor_s, "faults.deadline_floor_s")
        _positive(self.startup_deadline_s, "faults.startup_deadline_s")
        _positive(self.retry_after_s, "faults.retry_after_s (--draft-retry-after)", allow_none=True)
        if isinstance(self.deadline_factor, bool) or not isinstance(self.deadline_factor, (int, float)) \
                or not 1 <= self.deadline_factor < float("inf"):
            raise UserError(f"faults.deadline_factor must be a number >= 1, got {self.deadline_factor!r}")

    def deadline_s(self, recent: deque, startup: bool) -> float | None:
        """The watchdog deadline of the next call (None: no watchdog, the call runs inline)."""
        if self.deadline == "off":
            return None
        if startup or not recent:
            return max(self.startup_deadline_s, 0 if self.deadline == "auto" else self.deadline)
        if self.deadline != "auto":
            return float(self.deadline)
        return max(self.deadline_floor_s, self.deadline_factor * max(recent))


def parse_deadline(text: str) -> float | str:
    """`--draft-deadline`'s value: auto, off, or seconds (checked by FaultPolicy)."""
    if text in ("auto", "off"):
        return text
    try:
        return float(text)
    except ValueError:
        raise UserError(f"--draft-deadline must be auto, off or a number of seconds > 0, got {text!r}") from None


class FaultInjection:
    """The tests' faults: the first drafter of a chain raises on its N-th proposal, or hangs on it.

    The fault strikes after the real call has run (its caches and its generator are already advanced: the
    worst case for what the engine must discard), on the watchdog's thread, as a device error would."""

    def __init__(self, fail_after: int | None = None, hang_after: int | None = None, hang_s: float = 3600.0):
        self.fail_after, self.hang_after, self.hang_s = fail_after, hang_after, hang_s
        self.paused = False  # warm-up calls are not counted
        self.release = threading.Event()  # ends every injected hang early (tests)
        self.counts: dict[int, int] = {}  # id(slot) -> proposals counted

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> FaultInjection | None:
        values = {}
        for name in (ENV_FAIL, ENV_HANG):
            text = environ.get(name, "").strip()
            if text and (not text.isdigit() or int(text) < 1):
                raise UserError(f"{name} must be a whole number >= 1 (the proposal that fails), got {text!r}")
            values[name] = int(text) if text else None
        return cls(values[ENV_FAIL], values[ENV_HANG]) if any(values.values()) else None

    def wrap(self, slot: Slot, call: Callable[[], Any]) -> Callable[[], Any]:
        """call, or call followed by the fault this proposal of `slot` is to suffer."""
        if self.paused:
            return call
        n = self.counts[id(slot)] = self.counts.get(id(slot), 0) + 1
        if n not in (self.fail_after, self.hang_after):
            return call

        def faulty() -> Any:
            value = call()
            if n == self.fail_after:
                raise DraftDeviceError(f"injected device error on proposal {n} ({ENV_FAIL}={n})")
            self.release.wait(self.hang_s)  # ENV_HANG: the watchdog gives up long before this returns
            return value

        return faulty


@dataclass
class DraftFault:
    """One drafting fault, as reports show it."""

    device: str  # the drafter that failed (`fpga` for a board, else its torch device)
    kind: str  # "error" (it raised) or "timeout" (it missed the watchdog's deadline)
    error: str  # the exception, or the deadline missed
    at_s: float  # seconds from the start of the generation's prefill to the start of the failed call
    lost_s: float  # from the start of the failed call to the fault's detection (measured)
    fallback: str  # who drafts from now on: a device, or "target only"
    utc: str  # wall-clock time of the detection
    proposal: int  # the drafter's proposal (1, 2, ... in this process) that failed; 0: a prefill or rollback
    step: int = -1  # the verify step that took the fault (set by the engine's loop)

    def to_dict(self, tokens_without_draft: int) -> dict:
        return {**asdict(self), "tokens_without_draft": tokens_without_draft}

    def event(self) -> TimelineEvent:
        return TimelineEvent("fault", self.device, self.at_s, self.at_s + self.lost_s, 0, step=self.step)


class Slot:
    """One drafter and its health, shared by every guard that drafts with it."""

    def __init__(self, drafter: Drafter):
        self.drafter, self.label = drafter, device_label(drafter)
        self.failures, self.failed_at = 0, None
        self.abandoned: Future | None = None  # a call the watchdog gave up on (it may still be running)
        self.recent: deque = deque(maxlen=RECENT_BLOCKS)  # seconds of the last calls that returned
        self.proposals = 0  # calls to propose (or device steps drafting with it) so far

    def usable(self, now: float, policy: FaultPolicy) -> bool:
        if self.failed_at is None:
            return True
        if policy.retry_after_s is None or (self.abandoned is not None and not self.abandoned.done()):
            return False
        return now - self.failed_at >= policy.retry_after_s * 2 ** (self.failures - 1)

    def fail(self, now: float, abandoned: Future | None) -> None:
        self.failures, self.failed_at, self.abandoned = self.failures + 1, now, abandoned


def fork(generator: torch.Generator | None) -> torch.Generator | None:
    """A private generator in the same state (a drafter draws from it; copied back only on success)."""
    if generator is None:
        return None
    private = torch.Generator(device=generator.device)
    private.set_state(generator.get_state())
    return private


class GuardedDrafter:
    """The `Drafter` protocol over a chain of drafters, each call watched: it never raises a device fault.

    `live` is the drafter in use (None: target only). A drafter is `synced` once it is prefilled on the
    current generation; one that takes over mid-generation is prefilled on the sequence so far."""

    def __init__(self, slots: list[Slot], policy: FaultPolicy, injection: FaultInjection | None = None):
        self.slots, self.policy, self.injection = slots, policy, injection
        self.current = 0  # index of the live slot; len(slots): none left
        self.synced: set[int] = set()
        self.faults: list[DraftFault] = []  # not yet taken by the loop
        self.watchdog = Watchdog()
        self.origin, self.max_seq_len = time.perf_counter(), 0

    @property
    def live(self) -> Drafter | None:
        return self.slots[self.current].drafter if self.current < len(self.slots) else None

    @property
    def device(self) -> torch.device:
        return (self.live or self.slots[0].drafter).device

    @property
    def board(self) -> Any:
        return getattr(self.live, "board", None)

    @property
    def model(self) -> Any:
        return getattr(self.live, "model", None)

    @property
    def cached_len(self) -> int:
        return self.live.cached_len if self.current in self.synced else 0

    def select(self) -> Drafter | None:
        """Make the first usable drafter of the chain live (a retry may be due); returns it."""
        now = time.perf_counter()
        chosen = next((i for i, s in enumerate(self.slots) if s.usable(now, self.policy)), len(self.slots))
        if chosen != self.current:
            self.synced.discard(self.current)  # its cache may hold drafts of another schedule: prefill again
            self.current = chosen
        return self.live

    def prefill(self, prompt_ids: list[int], max_seq_len: int) -> None:
        self.origin, self.max_seq_len, self.synced = time.perf_counter(), max_seq_len, set()
        self.select()
        if self.live is not None:
            self._sync(prompt_ids)

    def rollback(self, num_valid: int) -> None:
        """Host-side bookkeeping in every drafter: not watched, but an error is still a fault."""
        if self.current in self.synced:
            self._call(lambda d: d.rollback(num_valid), watched=False)

    def propose(self, context: list[int], k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> DraftBlock:
        """The live drafter's block, or `WITHOUT_DRAFT` (nothing consumed from `generator`) after a fault."""
        if not self._ready(context):
            return WITHOUT_DRAFT
        private = fork(generator)
        ok, block = self._call(lambda d: d.propose(context, k, sampling, private), proposal=True)
        if not ok:
            return WITHOUT_DRAFT
        if generator is not None:
            generator.set_state(private.get_state())
        return block

    def run(self, fn: Callable[[], Any]) -> tuple[bool, Any]:
        """(True, fn()) with fn watched as a proposal of the live, synced drafter (a device step drafting
        with it inside a graph); (False, None) after a fault or when that drafter is not live."""
        if self.live is None or self.current not in self.synced:
            return False, None
        return self._call(lambda d: fn(), proposal=True)

    def take_faults(self) -> list[DraftFault]:
        faults, self.faults = self.faults, []
        return faults

    def _ready(self, context: list[int]) -> bool:
        """Select, and prefill on `context` a drafter that takes over; False when none is left."""
        self.select()
        while self.live is not None and self.current not in self.synced:
            self._sync(context)
        return self.live is not None

    def _sync(self, ids: list[int]) -> None:
        def prefill(drafter: Drafter) -> None:
            drafter.prefill(ids, self.max_seq_len)
            synchronize(torch.device(drafter.device))  # an asynchronous device error surfaces here, watched

        ok, _ = self._call(prefill, startup=True)
        if ok:
            self.synced.add(self.current)

    def _call(self, fn: Callable[[Drafter], Any], *, proposal: bool = False, startup: bool = False,
              watched: bool = True) -> tuple[bool, Any]:
        """(True, fn(live drafter)) under the watchdog, or (False, None) with the fault recorded."""
        slot = self.slots[self.current]
        call = lambda: fn(slot.drafter)  # noqa: E731
        slot.proposals += proposal
        if proposal and self.injection is not None and slot is self.slots[0]:
            call = self.injection.wrap(slot, call)
        deadline = self.policy.deadline_s(slot.recent, startup) if watched else None
        start = time.perf_counter()
        try:
            value = self.watchdog.call(call, deadline)
        except UserError:
            raise  # a usage mistake (a bad k, a missing file), not a device fault: the user must see it
        except DeadlineMissed as missed:
            self._fault(slot, "timeout", missed, start, missed.call, proposal)
            return False, None
        except Exception as error:  # any device error: XRT, CUDA (out of memory too), a driver's RuntimeError
            self._fault(slot, "error", error, start, None, proposal)
            return False, None
        if proposal:
            slot.recent.append(time.perf_counter() - start)
        return True, value

    def _fault(self, slot: Slot, kind: str, error: Exception, start: float, abandoned: Future | None,
               proposal: bool) -> None:
        now = time.perf_counter()
        slot.fail(now, abandoned)
        self.synced.discard(self.current)
        nxt = self.select()
        self.faults.append(DraftFault(
            slot.label, kind, f"{type(error).__name__}: {error}", start - self.origin, now - start,
            device_label(nxt) if nxt is not None else "target only",
            datetime.now(timezone.utc).isoformat(timespec="milliseconds"), slot.proposals if proposal else 0))


def take_faults(drafter: Drafter | None) -> list[DraftFault]:
    """The faults a guarded drafter saw since it was last asked (none for an unguarded one)."""
    return drafter.take_faults() if isinstance(drafter, GuardedDrafter) else []
