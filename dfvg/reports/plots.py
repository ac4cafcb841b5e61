"""The run's PNG plots (matplotlib, Agg backend): speedup vs draft length, the draft/verify timeline, energy.

- `speedup_vs_draft_length.png`: measured speedup over the baseline at each draft length the run tried
  (sweep + speculative), baseline at k = 0; the FPGA variant's board-projected speedup as its own marker.
- `timeline.png`: a Gantt chart of the first prompt of the first repetition, one panel per variant that
  drafted, one row per device, draft and verify bars in different colours; overlap shows as bars of the
  two devices side by side in time (from the host runtime's Timeline events, or in sync decoding the
  measured step durations laid end to end).
- `energy_breakdown.png`: energy per token by component per variant, stacked; hatched = not measured.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dfvg.host.records import (  # noqa: E402
    RunResults,
    has_projection,
    mean_std,
    tokens_per_second_by_run,
)
from dfvg.reports.energy import energy_rows  # noqa: E402

STAGE_COLOURS = {"draft": "tab:orange", "verify": "tab:blue", "prefill": "tab:gray", "fault": "tab:red"}


def speedup_plot(results: RunResults, path: Path) -> Path:
    base = mean_std(tokens_per_second_by_run(results.baseline))[0] or 1.0
    points = sorted({(v.draft_length, mean_std(tokens_per_second_by_run(v))[0] / base)
                     for v in results.ran() if v.mode == "sync" and v.drafter == "torch"})
    fig, ax = plt.subplots(figsize=(6, 4))
    xs, ys = [0] + [k for k, _ in points], [1.0] + [s for _, s in points]
    ax.plot(xs, ys, "o-", label="float draft, sync (measured)")
    for v in results.ran():
        if has_projection(v):
            tps = mean_std(tokens_per_second_by_run(v, projected=True))[0]
            ax.plot([v.draft_length], [tps / base], "s", color="tab:red", label=f"{v.name} (board-projected)")
        elif v.mode == "overlap":
            tps = mean_std(tokens_per_second_by_run(v))[0]
            ax.plot([v.draft_length], [tps / base], "^", label=f"{v.name} (measured)")
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set(xlabel="draft length k", ylabel="speedup over target alone", title=f"Speedup vs draft length\n"
           f"{results.run_id}")
    ax.legend(fontsize=8)
    return save(fig, path)


def lane(event: dict, verify_device: str) -> tuple[str, str]:
    """(device, lane): draft work (a drafter's prefill included) and verify work get separate lanes."""
    stage = event["stage"]
    drafting = stage in ("draft", "fault") or (stage == "prefill" and event["device"] != verify_device)
    return event["device"], "draft" if drafting else "verify"


def timeline_plot(results: RunResults, path: Path) -> Path:
    drafted = [v for v in results.ran() if v.drafter != "none" and v.generations and v.generations[0].timeline]
    main = [v for v in drafted if not v.name.startswith("sweep:")] or drafted
    panels = main[:4] or [v for v in results.ran() if v.generations][:1]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 1.6 + 1.6 * len(panels)), squeeze=False)
    for ax, v in zip(axes[:, 0], panels, strict=True):
        g = v.generations[0]
        rows = sorted({lane(e, v.verify_device) for e in g.timeline})
        for e in g.timeline:
            row = rows.index(lane(e, v.verify_device))
            ax.broken_barh([(e["start"], e["end"] - e["start"])], (row - 0.4, 0.8),
                           facecolors=STAGE_COLOURS.get(e["stage"], "tab:green"), edgecolor="white", linewidth=0.4,
                           label=e["stage"])
        ax.set_yticks(range(len(rows)), [f"{lane} @ {device}" for device, lane in rows])
        ax.set_title(f"{v.name}: {g.prompt_id}, {len(g.tokens)} tokens ({v.mode})", fontsize=9)
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles, strict=True))
        ax.legend(unique.values(), unique.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    axes[-1, 0].set_xlabel("seconds since the prompt started")
    fig.suptitle("Draft / verify timeline per device (overlap = bars of both lanes at the same time)")
    return save(fig, path)


def energy_plot(results: RunResults, path: Path) -> Path:
    rows = [r for r in energy_rows(results) if r[2] == "energy_per_token" and r[0] != "total" and r[3] != ""]
    variants = list(dict.fromkeys(r[1] for r in rows)) or ["(no energy data)"]
    fig, ax = plt.subplots(figsize=(7, 4))
    bottoms = [0.0] * len(variants)
    for component in dict.fromkeys(r[0] for r in rows):
        values, hatches = [], []
        for v in variants:
            match = [r for r in rows if r[0] == component and r[1] == v]
            values.append(float(match[0][3]) if match else 0.0)
            hatches.append("//" if match and match[0][5] != "measured" else "")
        bars = ax.bar(variants, values, bottom=bottoms, label=component)
        for bar, hatch in zip(bars, hatches, strict=True):
            bar.set_hatch(hatch)
        bottoms = [b + x for b, x in zip(bottoms, values, strict=True)]
    ax.set(ylabel="J / token", title="Energy per token by component (hatched: assumed or modeled)")
    if rows:
        ax.legend(fontsize=8)
    ax.tick_params(axis="x", labelrotation=20)
    return save(fig, path)


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_plots(results: RunResults, directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    return [speedup_plot(results, directory / "speedup_vs_draft_length.png"),
            timeline_plot(results, directory / "timeline.png"),
            energy_plot(results, directory / "energy_breakdown.png")]
