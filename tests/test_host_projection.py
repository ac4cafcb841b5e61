"""Projection arithmetic on hand-made timelines: sync and overlap replays, discarded drafts, PCIe, provenance."""

from __future__ import annotations

import pytest

from dfvg.errors import UserError
from dfvg.fpga.board.latency import DesignParams
from dfvg.generate import GenerationResult
from dfvg.host.projection import pcie_transfer_s, project_times
from dfvg.host.timeline import Timeline, TimelineEvent
from dfvg.stats import StepRecord


def ev(stage, start, end, tokens=1, step=-1, modeled=None, speculative=False, discarded=False):
    return TimelineEvent(stage, "fpga" if stage == "draft" else "cpu", start, end, tokens, step=step,
                         modeled_s=modeled, speculative=speculative, discarded=discarded)


SYNC = [
    ev("prefill", 0.0, 1.0), ev("prefill", 1.0, 1.5),
    ev("draft", 1.5, 2.5, 4, 0, modeled=0.1), ev("verify", 2.5, 3.0, 5, 0), ev("accept", 3.0, 3.1, 2, 0),
    ev("draft", 3.1, 4.1, 4, 1, modeled=0.2), ev("verify", 4.1, 4.5, 5, 1), ev("accept", 4.5, 4.6, 5, 1),
]

OVERLAP = [
    ev("prefill", 0.0, 1.0), ev("prefill", 0.0, 0.8),
    ev("draft", 1.0, 2.0, 2, 0, modeled=0.1), ev("verify", 2.0, 2.5, 3, 0), ev("accept", 2.5, 2.6, 3, 0),
    ev("draft", 2.0, 3.0, 3, 1, modeled=0.3, speculative=True),  # used as step 1's block
    ev("verify", 3.0, 3.4, 3, 1), ev("accept", 3.4, 3.5, 1, 1),
    ev("draft", 3.0, 4.0, 3, 2, modeled=0.8, speculative=True, discarded=True),  # step 1 rejected a draft
    ev("draft", 4.0, 5.0, 2, 2, modeled=0.1), ev("verify", 5.0, 5.3, 3, 2), ev("accept", 5.3, 5.4, 3, 2),
]


def test_sync_replay_replaces_draft_times_by_modeled_ones():
    out = project_times(SYNC, "sync")
    assert out["measured_s"].value == pytest.approx(4.6) and out["measured_s"].provenance == "measured"
    # prefill 1.0 + 0.5, then (0.1 + 0.5 + 0.1) + (0.2 + 0.4 + 0.1)
    assert out["projected_s"].value == pytest.approx(2.9) and out["projected_s"].provenance == "modeled"
    assert out["draft_board_s"].value == pytest.approx(0.3)
    with_prefill = project_times(SYNC, "sync", draft_prefill_s=0.05)
    assert with_prefill["projected_s"].value == pytest.approx(2.45)


def test_pcie_is_added_only_when_not_inside_the_block_time():
    design = DesignParams(pcie_latency_us=100.0, pcie_gbps=1.0)
    per_block = 2 * 100e-6 + 4 * 5 / 1e9  # 4 drafts + 1 id in, int32
    assert pcie_transfer_s(5, design) == pytest.approx(per_block)
    inside = project_times(SYNC, "sync", design=design)
    added = project_times(SYNC, "sync", design=design, pcie_in_draft=False)
    assert added["projected_s"].value - inside["projected_s"].value == pytest.approx(2 * per_block)
    assert inside["transfer_s"].value == pytest.approx(2 * per_block) and inside["transfer_s"].provenance == "modeled"


def test_overlap_replay_hides_drafts_and_charges_discarded_ones():
    out = project_times(OVERLAP, "overlap")
    # prefill max(1.0, 0.8) = 1.0; step 0: draft 1.0-1.1, verify+accept -> 1.7, ahead draft 1.1-1.4;
    # step 1: verify 1.7-2.2, ahead (discarded) 1.7-2.5; step 2: fresh draft waits for the board: 2.5-2.6,
    # verify+accept 2.6-3.0.
    assert out["projected_s"].value == pytest.approx(3.0)
    assert out["measured_s"].value == pytest.approx(5.4)
    assert out["draft_board_s"].value == pytest.approx(1.3)
    assert "1 discarded" in out["projected_s"].source
    cheap = [e if not e.discarded else ev("draft", 3.0, 4.0, 3, 2, 0.1, True, True) for e in OVERLAP]
    assert project_times(cheap, "overlap")["projected_s"].value == pytest.approx(2.7)


def test_unmodeled_drafts_make_the_projection_an_estimate():
    measured_only = [ev(e.stage, e.start, e.end, e.tokens, e.step) for e in SYNC]
    out = project_times(measured_only, "sync")
    assert out["projected_s"].provenance == "estimated"
    assert out["projected_s"].value == pytest.approx(4.6)  # replaying measured durations gives the run back


def test_sources_of_every_kind_and_refusals():
    steps = [StepRecord(4, 1, 1.0, 0.6, 0.1), StepRecord(4, 4, 1.0, 0.5, 0.2)]
    result = GenerationResult(tokens=[1] * 7, steps=steps, prefill_s=1.5, decode_s=3.1)
    assert project_times(result, "sync")["projected_s"].value == pytest.approx(1.5 + 0.7 + 0.7)
    assert project_times(steps, "sync")["measured_s"].value == pytest.approx(3.1)
    timeline = Timeline.from_dict({"events": [e.to_dict() for e in OVERLAP]})
    assert project_times(timeline, "overlap")["projected_s"].value == pytest.approx(3.0)
    assert project_times([e.to_dict() for e in OVERLAP], "overlap")["projected_s"].value == pytest.approx(3.0)
    with pytest.raises(UserError, match="needs the run's timeline"):
        project_times(result, "overlap")
    with pytest.raises(UserError, match="overlap run"):
        project_times(OVERLAP, "sync")
    with pytest.raises(UserError, match="sync, overlap"):
        project_times(SYNC, "pearl")


@pytest.mark.parametrize("mode", ["sync", "overlap"])
def test_fpga_drafter_run_projects_onto_its_board(tiny_pair, tmp_path, mode):
    """A real (emulated) FPGA drafter through the pipeline: lossless, every draft event carries its modeled
    board time, and the projection is `modeled`, built from exactly those times."""
    from dfvg.checkpoint import load_model
    from dfvg.engine import make_drafter
    from dfvg.generate import generate
    from dfvg.host.pipeline import run_pipeline
    from dfvg.verifier import TorchVerifier

    target = TorchVerifier(load_model(tiny_pair[0]))
    drafter = make_drafter(tiny_pair[1], "fpga", None, target.vocab_size, board="u55c", artifact_dir=tmp_path)
    prompt = list(range(2, 40))
    timeline = Timeline()
    result = run_pipeline(target, drafter, prompt, 16, draft_length=3, mode=mode, timeline=timeline)
    assert result.tokens == generate(target, prompt, 16).tokens
    drafts = [e for e in timeline.events if e.stage == "draft"]
    assert drafts and all(e.device == "fpga" and e.modeled_s > 0 for e in drafts)
    out = project_times(timeline, mode, board="u55c")
    assert out["projected_s"].provenance == "modeled" and "u55c" in out["projected_s"].source
    assert out["draft_board_s"].value == pytest.approx(sum(e.modeled_s for e in drafts))
    assert out["measured_s"].value == pytest.approx(timeline.span_s())
