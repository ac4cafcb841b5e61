"""Two end-to-end times from one run: what this machine measured, and what the configured board would take.

Owns the projection: the run's schedule is replayed event by event with each draft block's duration replaced
by its modeled board time (`TimelineEvent.modeled_s`, i.e. `DraftBlock.modeled_s` from dfvg.fpga.board.latency),
every target stage (prefill, transfer to the verifier, verify, accept) kept at its measured duration, and the
PCIe transfer of the token ids between host and card modeled from the latency model's `DesignParams`.
The replay keeps the schedule's dependencies: in `sync` a block is drafted after the previous commit and
verified after it is drafted; in `overlap` the block drafted ahead starts with the previous verification, a
discarded one still occupies the board, and a fresh draft waits for the board to be free. Nothing here edits
the measured timeline, and the projected number is never labelled measured: it is `modeled` when every draft
block had a modeled time, `estimated` otherwise (some draft durations were measured ones).

PCIe: `latency.model_block` already counts the ids in and the drafts out inside a block's time, so by default
(`pcie_in_draft=True`) the replay adds nothing for them and reports the modeled transfer separately; with
`pcie_in_draft=False` (a drafter whose modeled time covers compute only) the transfer is added per block.

Does not own: the board model (dfvg.fpga.board.latency), the timeline (dfvg.host.timeline).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from dfvg.errors import UserError
from dfvg.fpga.board.latency import DesignParams, model_block, pcie_time_s
from dfvg.generate import GenerationResult
from dfvg.host.timeline import Timeline, TimelineEvent
from dfvg.stats import Metric, StepRecord

MODES = ("sync", "overlap")


def pcie_transfer_s(num_ids: int, design: DesignParams) -> float:
    """One block's ids over PCIe: one transfer in, one out, int32 each (latency.model_block's convention)."""
    return pcie_time_s(4 * num_ids, design)


def events_from_steps(steps: Sequence[StepRecord], prefill_s: float = 0.0) -> list[TimelineEvent]:
    """Sync-schedule events rebuilt from step records (verify_s includes the acceptance rule)."""
    events = [TimelineEvent("prefill", "verify", 0.0, prefill_s, 0)]
    t = prefill_s
    for i, s in enumerate(steps):
        if s.num_drafted:
            events.append(TimelineEvent("draft", "draft", t, t + s.draft_s, s.num_drafted, step=i,
                                        modeled_s=s.modeled_draft_s))
            t += s.draft_s
        events.append(TimelineEvent("verify", "verify", t, t + s.verify_s, s.num_drafted + 1, step=i))
        t += s.verify_s
    return events


def as_events(source: object, mode: str) -> tuple[list[TimelineEvent], float]:
    """(events, measured end-to-end seconds) from a Timeline, a list of events/dicts, a result or steps."""
    if isinstance(source, Timeline):
        return source.events, source.span_s()
    if isinstance(source, GenerationResult):
        events, measured = events_from_steps(source.steps, source.prefill_s), source.prefill_s + source.decode_s
    elif isinstance(source, Sequence) and all(isinstance(s, StepRecord) for s in source):
        events = events_from_steps(source)
        measured = sum(s.draft_s + s.verify_s for s in source)
    elif isinstance(source, Sequence):
        events = [e if isinstance(e, TimelineEvent) else TimelineEvent(**e) for e in source]
        return events, (max(e.end for e in events) - min(e.start for e in events)) if events else 0.0
    else:
        raise UserError(f"project_times needs a Timeline, events, a GenerationResult or steps, got {type(source)}")
    if mode == "overlap":
        raise UserError("an overlap projection needs the run's timeline (discarded early drafts are only there); "
                        "pass timeline=Timeline() to run_pipeline")
    return events, measured


class Replay:
    """Two resources: the board (drafts) and the host/GPU (target stages). Times in seconds from 0."""

    def __init__(self, design: DesignParams, pcie_in_draft: bool):
        self.design, self.pcie_in_draft = design, pcie_in_draft
        self.board_free = 0.0
        self.commit = 0.0  # when the last step's tokens were committed
        self.ahead_ready: dict[int, float] = {}  # step -> when its block drafted ahead is on the host
        self.draft_s = 0.0  # board time of every block, discarded ones included
        self.transfer_s = 0.0
        self.blocks = self.discarded = self.measured_blocks = 0

    def board_block(self, event: TimelineEvent, not_before: float) -> float:
        """Run one draft block on the board; returns when its tokens are on the host."""
        duration = event.modeled_s if event.modeled_s is not None else event.duration
        self.measured_blocks += event.modeled_s is None
        start = max(self.board_free, not_before)
        self.board_free = start + duration
        pcie = pcie_transfer_s(event.tokens + 1, self.design)
        self.draft_s += duration
        self.transfer_s += pcie
        self.blocks += 1
        self.discarded += event.discarded
        return self.board_free + (0.0 if self.pcie_in_draft else pcie)

    def step(self, step: int, events: list[TimelineEvent], ahead: list[TimelineEvent]) -> None:
        """One verification step; `ahead` are the drafts for step+1 launched while it verified."""
        fresh = [e for e in events if e.stage == "draft" and not e.speculative]
        if fresh:
            ready = self.board_block(fresh[0], self.commit)
        else:
            ready = self.ahead_ready.pop(step, self.commit)
        launch = max(ready, self.commit)  # the schedule starts the draft-ahead, then moves the block over
        start = launch + sum(e.duration for e in events if e.stage == "transfer")
        for event in ahead:
            arrival = self.board_block(event, launch)
            if not event.discarded:
                self.ahead_ready[step + 1] = arrival
        target = sum(e.duration for e in events if e.stage in ("verify", "accept"))
        self.commit = start + target

    def end(self) -> float:
        return max(self.commit, self.board_free)  # the schedule joins a draft still running at the end


def prefill_time(events: list[TimelineEvent], mode: str, draft_prefill_s: float | None) -> float:
    """Target prefill as measured; the draft's as modeled when given, else as measured; joined per mode."""
    prefills = [e for e in events if e.stage == "prefill"]
    if not prefills:
        return 0.0
    target, draft = prefills[0].duration, sum(e.duration for e in prefills[1:])
    draft = draft if draft_prefill_s is None else draft_prefill_s
    return target + draft if mode == "sync" else max(target, draft)


def project_times(source: object, mode: str, *, design: DesignParams | None = None, pcie_in_draft: bool = True,
                  draft_prefill_s: float | None = None, board: str = "the board") -> dict[str, Metric]:
    """{"measured_s", "projected_s", "draft_board_s", "transfer_s"} for one run (see the module docstring).

    source: the run's Timeline (required for overlap), its events (objects or dicts), a GenerationResult or
    its steps (sync only). draft_prefill_s: the draft prefill's modeled board time (else its measured one).
    """
    if mode not in MODES:
        raise UserError(f"projection mode must be one of {', '.join(MODES)}, got {mode!r}")
    events, measured = as_events(source, mode)
    if mode == "sync" and any(e.speculative for e in events):
        raise UserError("this timeline has drafts made ahead of time: it is an overlap run, project it as overlap")
    replay = Replay(design or DesignParams(), pcie_in_draft)
    replay.commit = replay.board_free = prefill_time(events, mode, draft_prefill_s)
    by_step: dict[int, list[TimelineEvent]] = defaultdict(list)
    for event in events:
        if event.step >= 0:
            by_step[event.step].append(event)
    for step in sorted(by_step):
        ahead = [e for e in by_step.get(step + 1, []) if e.stage == "draft" and e.speculative]
        replay.step(step, by_step[step], ahead)
    return metrics(replay, measured, mode, board, draft_prefill_s)


def metrics(replay: Replay, measured: float, mode: str, board: str, draft_prefill_s: float | None) -> dict:
    all_modeled = replay.measured_blocks == 0 and replay.blocks > 0
    pcie = "inside each block's modeled time" if replay.pcie_in_draft else "added per block"
    source = (f"replay of the {mode} schedule: {replay.blocks} draft blocks ({replay.discarded} discarded) at "
              f"{'their modeled ' + board + ' time' if all_modeled else 'modeled time where known, else measured'}"
              f"; prefill, transfer to the verifier, verify and accept as measured; PCIe ids {pcie}; draft "
              f"prefill {'modeled' if draft_prefill_s is not None else 'as measured'}")
    return {
        "measured_s": Metric(measured, "s", "measured", "wall clock of this run on this machine"),
        "projected_s": Metric(replay.end(), "s", "modeled" if all_modeled else "estimated", source),
        "draft_board_s": Metric(replay.draft_s, "s", "modeled" if all_modeled else "estimated",
                                "sum of draft block times on the board, discarded blocks included"),
        "transfer_s": Metric(replay.transfer_s, "s", "modeled", f"PCIe token ids per block ({pcie})"),
    }


def modeled_prefill_s(workload: object, board: object, design: DesignParams, prompt_len: int) -> float:
    """Board time of the draft's prompt pass: one launch feeding prompt_len - 1 ids (latency.model_block)."""
    if prompt_len < 2:
        return 0.0
    return model_block(workload, board, design, k=1, context_len=0, new_tokens=prompt_len - 1).block_time.value
