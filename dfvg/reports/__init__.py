"""Report writers: one directory per run, written whole or not at all.

`write_run_reports(results, root)` writes into `root/.<run_id>.tmp-<pid>` and renames it to
`root/<run_id>` only when every file is written, so a crash or `kill -9` never leaves a half-written run
that `scripts/collect_results.py` would pick up (the next run deletes the temporary: dfvg.outputs); a
root that cannot take them is refused in one line (`dfvg.outputs.check_writable`, which the experiment
runner also calls before it starts). Files:

    performance_summary.json   speed, acceptance, match vs baseline, projected board speed (performance_summary)
    energy_analysis.csv        energy per component x variant (energy)
    ablation_results.json      stage-by-stage contributions and the draft-length sweep (ablation)
    resource_utilization.log   FPGA resource estimate, GPU/host usage during the run (resources_log)
    run_metadata.json          config, git commit, package versions, hardware (metadata)
    config.yaml                the config as given
    generations.jsonl          every generation: tokens, text, per-generation stats
    timeline.json              draft/verify events of every generation
    plots/*.png                speedup vs draft length, timeline, energy breakdown (plots)
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from dfvg.host.records import RunResults
from dfvg.outputs import check_writable
from dfvg.reports.ablation import ablation_results
from dfvg.reports.energy import energy_csv
from dfvg.reports.metadata import config_text, cpu_model, run_metadata
from dfvg.reports.performance_summary import performance_summary
from dfvg.reports.plots import write_plots
from dfvg.reports.resources_log import resource_log

REPORT_FILES = ("performance_summary.json", "energy_analysis.csv", "ablation_results.json",
                "resource_utilization.log", "run_metadata.json", "config.yaml", "generations.jsonl",
                "timeline.json", "plots/speedup_vs_draft_length.png", "plots/timeline.png",
                "plots/energy_breakdown.png")


def dump_json(data: object, path: Path) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def generations_jsonl(results: RunResults) -> str:
    lines = []
    for v in results.ran():
        for g in v.generations:
            lines.append(json.dumps({"variant": v.name, "run": g.run, "prompt_id": g.prompt_id,
                                     "prompt_tokens": g.prompt_tokens, "tokens": g.tokens, "text": g.text,
                                     "stats": g.stats, "projected_s": g.projected_s}, ensure_ascii=False))
    return "\n".join(lines) + "\n"


def timeline_json(results: RunResults) -> dict:
    return {"note": "seconds since each generation started; host-runtime Timeline events, or in sync decoding "
                    "the measured step durations laid end to end",
            "generations": [{"variant": v.name, "run": g.run, "prompt_id": g.prompt_id, "events": g.timeline}
                            for v in results.ran() for g in v.generations]}


def write_all(results: RunResults, directory: Path) -> None:
    dump_json(performance_summary(results), directory / "performance_summary.json")
    (directory / "energy_analysis.csv").write_text(energy_csv(results))
    dump_json(ablation_results(results), directory / "ablation_results.json")
    (directory / "resource_utilization.log").write_text(resource_log(results, cpu_model()))
    dump_json(run_metadata(results), directory / "run_metadata.json")
    (directory / "config.yaml").write_text(config_text(results.config))
    (directory / "generations.jsonl").write_text(generations_jsonl(results))
    dump_json(timeline_json(results), directory / "timeline.json")
    write_plots(results, directory / "plots")


def unique_dir(root: Path, run_id: str) -> Path:
    """root/run_id, or root/run_id-2, -3 ... when a run of the same second exists."""
    target, n = root / run_id, 2
    while target.exists():
        target, n = root / f"{run_id}-{n}", n + 1
    return target


def write_run_reports(results: RunResults, root: Path,
                      before_rename: Callable[[Path], None] | None = None) -> Path:
    """Write every report of the run into a fresh directory under root, atomically; returns it.
    `before_rename(final path)` runs once every file is written, just before the directory appears."""
    root = Path(root)
    check_writable(root, "--output (or output_dir)")
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{results.run_id}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        write_all(results, tmp)
        target = unique_dir(root, results.run_id)
        if before_rename is not None:
            before_rename(target)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
