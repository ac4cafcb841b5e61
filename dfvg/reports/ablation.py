"""`ablation_results.json`: what each component adds, stage by stage, and the draft-length sweep.

Stages in order: baseline (target alone) -> speculative (float draft, sync) -> fpga (FPGA draft, sync;
its headline speed is the board projection, the emulated speed is kept beside it) -> overlap (draft
overlapped with verification) -> adaptive (overlap + adaptive draft length). `gain_vs_previous` compares a
stage with the stage before it that ran; a stage that did not run is listed under `not_run` with why.
Every number is a `{value, unit, provenance, source}` record.
"""

from __future__ import annotations

from dfvg.host.records import (
    RunResults,
    VariantResult,
    acceptance_metrics,
    has_projection,
    mean_std,
    projection_provenance,
    record,
    tokens_per_second_by_run,
)

SCHEMA = "dfvg/ablation_results/v1"
STAGES = ("baseline", "speculative", "fpga", "overlap", "adaptive")
WHAT = {
    "baseline": "target model alone, autoregressive",
    "speculative": "+ speculative decoding with a float draft (sync)",
    "fpga": "+ draft on the FPGA datapath (sync; board-projected speed)",
    "overlap": "+ draft overlapped with verification",
    "adaptive": "+ adaptive draft length",
}


def headline(v: VariantResult) -> tuple[float, str, str]:
    """(tokens/s, provenance, source): projected for an FPGA draft, measured otherwise."""
    if has_projection(v):
        return mean_std(tokens_per_second_by_run(v, projected=True))[0], projection_provenance(v), \
            "board-projected (dfvg.fpga.board.latency draft time + measured verification)"
    return mean_std(tokens_per_second_by_run(v))[0], "measured", "wall clock, mean over repetitions"


def stage_entry(v: VariantResult, base_tps: float, previous: tuple[str, float] | None) -> dict:
    tps, provenance, source = headline(v)
    entry = {"stage": v.name, "what": WHAT.get(v.name, v.description), "mode": v.mode, "drafter": v.drafter,
             "draft_device": v.draft_device,
             "tokens_per_second": record(tps, "tokens/s", provenance, source),
             "speedup_vs_baseline": record(tps / base_tps if base_tps else 0.0, "x", provenance,
                                           "tokens/s over the baseline's measured tokens/s")}
    if previous is not None:
        name, prev_tps = previous
        entry["gain_vs_previous"] = record(tps / prev_tps if prev_tps else 0.0, "x", provenance,
                                           f"tokens/s over stage {name!r}")
    if v.drafter != "none":
        acc = acceptance_metrics(v)
        entry["acceptance_rate"] = record(acc["acceptance_rate"], "fraction", "measured", "dfvg.stats")
        entry["mean_accepted_length"] = record(acc["mean_accepted_length"], "tokens/step", "measured",
                                               "dfvg.stats; bonus token counted")
    if has_projection(v):
        emulated = mean_std(tokens_per_second_by_run(v))[0]
        entry["emulated_tokens_per_second"] = record(emulated, "tokens/s", "measured",
                                                     "with the FPGA datapath emulated on this CPU")
    return entry


def sweep_entries(results: RunResults, base_tps: float) -> list[dict]:
    """One entry per draft length: the sweep variants plus the speculative variant's k."""
    points = [v for v in results.ran() if v.name.startswith("sweep:")]
    spec = results.variants.get("speculative")
    if spec is not None and spec in results.ran() and all(v.draft_length != spec.draft_length for v in points):
        points.append(spec)
    out = []
    for v in sorted(points, key=lambda v: v.draft_length):
        tps, std = mean_std(tokens_per_second_by_run(v))
        acc = acceptance_metrics(v)
        out.append({"variant": v.name, "draft_length": record(v.draft_length, "tokens", "assumed", "config"),
                    "tokens_per_second": record(tps, "tokens/s", "measured", "mean over repetitions"),
                    "tokens_per_second_std": record(std, "tokens/s", "measured", "sample std"),
                    "speedup": record(tps / base_tps if base_tps else 0.0, "x", "measured", "over baseline"),
                    "acceptance_rate": record(acc["acceptance_rate"], "fraction", "measured", "dfvg.stats"),
                    "mean_accepted_length": record(acc["mean_accepted_length"], "tokens/step", "measured",
                                                   "bonus token counted")})
    return out


def ablation_results(results: RunResults) -> dict:
    base_tps = mean_std(tokens_per_second_by_run(results.baseline))[0]
    ran = {v.name: v for v in results.ran()}
    stages, previous = [], None
    for name in STAGES:
        if name in ran:
            stages.append(stage_entry(ran[name], base_tps, previous))
            previous = (name, headline(ran[name])[0])
    not_run = {name: (results.variants[name].skipped if name in results.variants else "not in the config's variants")
               for name in STAGES if name not in ran}
    return {"schema": SCHEMA, "run_id": results.run_id, "stages": stages,
            "draft_length_sweep": sweep_entries(results, base_tps), "not_run": not_run}
