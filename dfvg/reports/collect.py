"""Gathering run directories (`results/<run_id>/`) into cross-run summaries (`scripts/collect_results.py`).

Owns: finding complete runs (a directory holding `performance_summary.json`; the hidden temp directories
of runs in progress are skipped), the per-run table, the aggregate over runs of the same experiment name
(mean ± sample std of each variant's tokens/s and speedup over those runs), and writing
`summary.json`, `summary.csv`, `summary.md` and `plots/summary_speedup.png` atomically (temp file +
rename). Every number copied keeps its provenance; aggregates say which runs they are over.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dfvg.errors import UserError  # noqa: E402
from dfvg.host.records import mean_std, record  # noqa: E402
from dfvg.outputs import atomic_write  # noqa: E402

CSV_HEADER = ("run_id", "experiment", "variant", "tokens_per_second", "tokens_per_second_std", "speedup",
              "speedup_provenance", "acceptance_rate", "mean_accepted_length", "projected_tokens_per_second",
              "projected_speedup", "output_match_rate")


def find_runs(root: Path) -> list[Path]:
    if not root.is_dir():
        raise UserError(f"results directory not found: {root} (run scripts/run_experiments.py first)")
    runs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")
                  and (p / "performance_summary.json").is_file())
    if not runs:
        raise UserError(f"no run directories with performance_summary.json under {root}; "
                        "run scripts/run_experiments.py --config configs/default.yaml first")
    return runs


def read_summary(run: Path) -> dict:
    path = run / "performance_summary.json"
    try:
        data = json.loads(path.read_text())
        data["variants"].items()
    except (json.JSONDecodeError, KeyError, AttributeError, TypeError) as err:
        raise UserError(f"{path} is not a DFVG performance summary ({err}); delete or re-run that run") from None
    meta = run / "run_metadata.json"
    data["experiment"] = json.loads(meta.read_text()).get("config", {}).get("name") if meta.is_file() else None
    return data


def value(entry: dict, *keys: str) -> float | None:
    for key in keys:
        entry = entry.get(key) if isinstance(entry, dict) else None
    return entry.get("value") if isinstance(entry, dict) else None


def run_rows(summary: dict) -> list[dict]:
    rows = []
    for name, v in summary["variants"].items():
        rows.append({
            "run_id": summary.get("run_id"), "experiment": summary.get("experiment") or summary.get("run_id"),
            "variant": name, "tokens_per_second": value(v, "measured", "tokens_per_second"),
            "tokens_per_second_std": value(v, "measured", "tokens_per_second_std"),
            "speedup": value(v, "measured", "speedup"),
            "speedup_provenance": (v.get("measured", {}).get("speedup") or {}).get("provenance"),
            "acceptance_rate": value(v, "acceptance", "acceptance_rate"),
            "mean_accepted_length": value(v, "acceptance", "mean_accepted_length"),
            "projected_tokens_per_second": value(v, "projected", "tokens_per_second"),
            "projected_speedup": value(v, "projected", "speedup"),
            "output_match_rate": value(v, "acceptance", "output_match_rate")})
    return rows


def aggregate(rows: list[dict]) -> dict:
    """experiment -> variant -> mean ± std over that experiment's runs (each run's mean is one sample)."""
    out: dict = {}
    for experiment in dict.fromkeys(r["experiment"] for r in rows):
        mine = [r for r in rows if r["experiment"] == experiment]
        runs = sorted({r["run_id"] for r in mine})
        src = f"mean ± sample std over {len(runs)} run(s): {', '.join(runs)}"
        out[experiment] = {}
        for variant in dict.fromkeys(r["variant"] for r in mine):
            tps = [r["tokens_per_second"] for r in mine if r["variant"] == variant and r["tokens_per_second"]]
            spd = [r["speedup"] for r in mine if r["variant"] == variant and r["speedup"]]
            (tm, ts), (sm, ss) = mean_std(tps), mean_std(spd)
            out[experiment][variant] = {
                "tokens_per_second": record(tm, "tokens/s", "measured", src),
                "tokens_per_second_std": record(ts, "tokens/s", "measured", src),
                "speedup": record(sm, "x", "measured", src), "speedup_std": record(ss, "x", "measured", src)}
    return out


def csv_text(rows: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, CSV_HEADER, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def markdown(rows: list[dict], agg: dict) -> str:
    def f(x: float | None, fmt: str = ".2f") -> str:
        return "-" if x is None else format(x, fmt)

    lines = ["# DFVG results", "", "| run | variant | tok/s (measured) | speedup | α | τ (bonus counted) | "
             "projected tok/s (modeled) | projected speedup |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['run_id']} | {r['variant']} | {f(r['tokens_per_second'])} ± "
                     f"{f(r['tokens_per_second_std'])} | {f(r['speedup'])}x | {f(r['acceptance_rate'], '.3f')} | "
                     f"{f(r['mean_accepted_length'])} | {f(r['projected_tokens_per_second'])} | "
                     f"{f(r['projected_speedup'])} |")
    lines += ["", "## Mean ± std over runs of the same experiment", "", "| experiment | variant | tok/s | speedup |",
              "|---|---|---|---|"]
    for experiment, variants in agg.items():
        for variant, m in variants.items():
            lines.append(f"| {experiment} | {variant} | {f(m['tokens_per_second']['value'])} ± "
                         f"{f(m['tokens_per_second_std']['value'])} | {f(m['speedup']['value'])} ± "
                         f"{f(m['speedup_std']['value'])}x |")
    return "\n".join(lines) + "\n"


def speedup_png(agg: dict) -> bytes:
    labels = [f"{e}\n{v}" for e, vs in agg.items() for v in vs]
    means = [m["speedup"]["value"] for vs in agg.values() for m in vs.values()]
    stds = [m["speedup_std"]["value"] for vs in agg.values() for m in vs.values()]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(labels)), 4))
    ax.bar(range(len(labels)), means, yerr=stds, capsize=3)
    ax.axhline(1.0, color="gray", ls="--", lw=0.8)
    ax.set_xticks(range(len(labels)), labels, fontsize=7, rotation=30)
    ax.set(ylabel="speedup over target alone (measured)", title="Speedup per variant, mean ± std over runs")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    return buffer.getvalue()


def collect(root: Path) -> dict:
    """Read every run under root and write the summaries; returns the summary document."""
    runs = find_runs(root)
    rows = [row for run in runs for row in run_rows(read_summary(run))]
    agg = aggregate(rows)
    doc = {"schema": "dfvg/summary/v1", "runs": [r.name for r in runs], "aggregate": agg,
           "rows_note": "per-run values are copied from each run's performance_summary.json (see its provenance)"}
    atomic_write(root / "summary.json", json.dumps(doc, indent=2) + "\n")
    atomic_write(root / "summary.csv", csv_text(rows))
    atomic_write(root / "summary.md", markdown(rows, agg))
    atomic_write(root / "plots" / "summary_speedup.png", speedup_png(agg))
    return doc
