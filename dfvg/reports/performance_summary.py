"""`performance_summary.json`: speed and acceptance per variant, measured and (for the FPGA draft) projected.

Owns the file's layout. Every number is a record `{value, unit, provenance, source}`; settings taken from
the config are records too, labelled `assumed` (chosen, not observed). Speedups are over the baseline
(the target alone) measured in the same run and process. `mean_accepted_length` counts the bonus token.

Layout: {schema, run_id, target_model, draft_model, dataset, settings{...}, definitions{...},
variants{name: {description, mode, drafter, draft_device, verify_device, measured{...}, acceptance{...},
faults{...}, projected{...}?}}, skipped{name: reason}}.
"""

from __future__ import annotations

from dfvg.host.records import (
    RunResults,
    VariantResult,
    acceptance_metrics,
    fault_summary,
    has_projection,
    match_rates,
    mean_std,
    projection_provenance,
    record,
    tokens_per_second_by_run,
)
from dfvg.stats import Metric

SCHEMA = "dfvg/performance_summary/v1"
DEFINITIONS = {
    "tokens_per_second": "generated tokens / end-to-end seconds (prefill + decode), per repetition, then mean",
    "speedup": "tokens_per_second / the baseline's tokens_per_second in the same run",
    "acceptance_rate": "accepted draft tokens / proposed draft tokens",
    "mean_accepted_length": "tokens committed per verify step, COUNTING the bonus/correction token "
                            "(plain decoding = 1, a fully accepted block of k = k + 1)",
    "per_position_acceptance": "entry i: P(draft i accepted | draft i proposed)",
    "accepted_length_histogram": "entry a: number of verify steps that accepted exactly a drafts",
    "output_match_rate": "fraction of generations identical, token for token, to the baseline's",
    "draft_faults": "draft calls that raised or missed the watchdog deadline; each block was discarded and "
                    "drafting went on with the next configured drafter or none (dfvg.fallback)",
    "tokens_without_draft": "tokens the target decoded alone because its drafter had failed",
    "projected": "end-to-end time with each draft block at the FPGA board model's time (dfvg.fpga.board.latency) "
                 "and every target stage as measured here (dfvg.host.projection replays the schedule)",
}


def settings(results: RunResults) -> dict:
    cfg = results.config
    src = f"config {cfg.source}"
    return {
        "num_prompts": record(len(results.baseline.generations) // max(1, cfg.num_runs), "prompts", "assumed", src),
        "max_new_tokens": record(cfg.max_new_tokens, "tokens", "assumed", src),
        "draft_length": record(cfg.draft_length, "tokens", "assumed", src),
        "batch_size": record(cfg.batch_size, "sequences", "assumed", src),
        "temperature": record(cfg.temperature, "", "assumed", src),
        "num_runs": record(cfg.num_runs, "repetitions", "assumed", src),
    }


def measured_block(v: VariantResult, base_tps: float) -> dict:
    rates = tokens_per_second_by_run(v)
    tps, std = mean_std(rates)
    runs = max(1, len(v.runs()))
    src = f"{len(v.generations)} generations over {runs} repetition(s), wall clock (time.perf_counter)"
    steps = v.steps()
    return {
        "tokens_per_second": record(tps, "tokens/s", "measured", src),
        "tokens_per_second_std": record(std, "tokens/s", "measured", "sample std over repetitions"),
        "tokens_per_second_by_run": record(rates, "tokens/s", "measured", src),
        "ms_per_token": record(1000.0 / tps if tps else 0.0, "ms/token", "measured", "1000 / tokens_per_second"),
        "speedup": record(tps / base_tps if base_tps else 0.0, "x", "measured",
                          "tokens_per_second over the baseline's, same run"),
        "end_to_end_s": record(v.seconds() / runs, "s", "measured", "prefill + decode, summed over prompts"),
        "draft_s": record(sum(s.draft_s for s in steps) / runs, "s", "measured", "summed draft calls"),
        "verify_s": record(sum(s.verify_s for s in steps) / runs, "s", "measured", "summed verify calls"),
        "new_tokens": record(v.num_tokens() / runs, "tokens", "measured", "generated tokens, EOS included"),
    }


def acceptance_block(v: VariantResult, baseline: VariantResult) -> dict:
    acc = acceptance_metrics(v)
    exact, tokens = match_rates(v, baseline)
    src = f"dfvg.stats over {acc['num_verify_steps']} verify steps"
    return {
        "acceptance_rate": record(acc["acceptance_rate"], "fraction", "measured", src),
        "mean_accepted_length": record(acc["mean_accepted_length"], "tokens/step", "measured",
                                       src + "; bonus token counted"),
        "mean_accepted_length_counts_bonus": True,
        "per_position_acceptance": record(acc["per_position_acceptance"], "fraction", "measured", src),
        "accepted_length_histogram": record(acc["accepted_length_histogram"], "steps", "measured", src),
        "num_draft_tokens": record(acc["num_draft_tokens"], "tokens", "measured", src),
        "num_accepted_tokens": record(acc["num_accepted_tokens"], "tokens", "measured", src),
        "output_match_rate": record(exact, "fraction", "measured", "generations equal to the baseline's"),
        "token_match_rate": record(tokens, "fraction", "measured", "baseline tokens reproduced at their position"),
    }


def projected_block(v: VariantResult, base_tps: float) -> dict:
    tps, std = mean_std(tokens_per_second_by_run(v, projected=True))
    runs = max(1, len(v.runs()))
    src, prov = v.generations[0].projection_source, projection_provenance(v)
    return {
        "end_to_end_s": record(sum(g.projected_s for g in v.generations) / runs, "s", prov, src),
        "tokens_per_second": record(tps, "tokens/s", prov, src),
        "tokens_per_second_std": record(std, "tokens/s", prov, "sample std over repetitions"),
        "ms_per_token": record(1000.0 / tps if tps else 0.0, "ms/token", prov, "1000 / tokens_per_second"),
        "speedup": record(tps / base_tps if base_tps else 0.0, "x", prov,
                          "projected tokens_per_second over the baseline's measured one"),
        "draft_s": record(sum(s.modeled_draft_s or 0.0 for s in v.steps()) / runs, "s", "modeled",
                          "FPGA board model (dfvg.fpga.board.latency), summed over draft blocks"),
    }


def faults_block(v: VariantResult) -> dict:
    summary = fault_summary(v)
    src = f"dfvg.fallback over {len(v.generations)} generations"
    return {"draft_faults": record(summary["draft_faults"], "faults", "measured", src),
            "tokens_without_draft": record(summary["tokens_without_draft"], "tokens", "measured", src),
            "events": summary["faults"]}


def variant_entry(v: VariantResult, baseline: VariantResult, base_tps: float) -> dict:
    entry = {"description": v.description, "mode": v.mode, "drafter": v.drafter, "draft_device": v.draft_device,
             "verify_device": v.verify_device,
             "draft_length": record(v.draft_length, "tokens", "assumed", "config"),
             "measured": measured_block(v, base_tps)}
    if v.drafter != "none":
        entry["acceptance"] = acceptance_block(v, baseline)
        entry["faults"] = faults_block(v)
    if has_projection(v):
        entry["projected"] = projected_block(v, base_tps)
    return entry


def performance_summary(results: RunResults) -> dict:
    """The whole JSON document."""
    cfg, baseline = results.config, results.baseline
    base_tps, _ = mean_std(tokens_per_second_by_run(baseline))
    return {
        "schema": SCHEMA, "run_id": results.run_id, "target_model": str(cfg.target_model),
        "draft_model": str(cfg.draft_model) if cfg.draft_model else None, "dataset": cfg.dataset,
        "settings": settings(results), "definitions": DEFINITIONS,
        "warmup_s": Metric(results.warmup_s, "s", "measured", "graph capture, compilation and first touch of "
                           "every variant's shapes, once per process; outside every tokens/s").to_dict(),
        "variants": {v.name: variant_entry(v, baseline, base_tps) for v in results.ran()},
        "skipped": {v.name: v.skipped for v in results.variants.values() if v.skipped},
    }
