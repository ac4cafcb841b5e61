"""Re-project a recorded `dfvg run` report's FPGA variant with today's board model, and sweep the assumptions.

    python benchmarks/fpga_reproject.py --summary benchmarks/h200_2026-12-03_engine/performance_summary.json \
        --target models/qwen2.5-coder-1.5b-instruct --plot benchmarks/fpga_sweep_2026-12-03.png \
        --output benchmarks/fpga_projection_2026-12-03.json

Why: the report of 2026-12-03 ran its `fpga` variant (sync, int8 datapath emulated on the GPU) and its
`baseline` in one process, but its board projection used the board model of that day (LM head counted over
151,936 rows). No GPU is needed to redo the projection: in the sync schedule the replay of
dfvg.host.projection is a sum, so from the report's measured sums and the prompts' lengths,

    projected = [baseline e2e - baseline verify]   target prefill + host time outside verify (measured, same run)
              + sum over prompts of the modeled draft prompt pass        (modeled, exact prompt lengths)
              + sum over blocks of the modeled block time                (modeled, see below)
              + fpga verify_s                    every verify step incl. ids to the GPU, acceptance, sync (measured)

The report keeps no per-block context, so the block sum uses the block time's affinity in k and in the
context (compute-bound, everything on chip): blocks x t(1, c) + (draft tokens - blocks) x (t(2, c) - t(1, c))
at the mean context c = mean prompt length + mean new tokens / 2. The fixed cycles per layer are the RTL's
(simulated at tile sizes, fpga/reports/kernel_cycles.json); the assumed 1,000 is projected beside.
The overlap schedule cannot be replayed without the run's timeline; it is
bounded instead: a block drafted ahead is used only after a fully accepted block with the right bonus guess,
so at most the fully accepted steps (the histogram's last bin) skip a block, and a discarded block costs the
GPU nothing while it is shorter than a verify step. Every projected figure is `modeled`; every other one is
`measured` in that report. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dfvg.checkpoint import load_config  # noqa: E402
from dfvg.datasets import load_prompts  # noqa: E402
from dfvg.errors import OneLineParser, UserError  # noqa: E402
from dfvg.fpga.board.boards import Board, get_board  # noqa: E402
from dfvg.fpga.board.latency import DesignParams, DraftWorkload, model_block  # noqa: E402
from dfvg.fpga.board.workload import draft_workload  # noqa: E402
from dfvg.host.projection import modeled_prefill_s  # noqa: E402
from dfvg.tokenizer import encode, load_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "drafts/qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768"
CLOCKS_MHZ = (100, 150, 200, 250, 300, 350, 400)
EFFICIENCIES = (0.1, 0.25, 0.5, 0.75, 1.0)


def _value(variant: dict, section: str, name: str) -> float:
    return float(variant[section][name]["value"])


def read_summary(path: str) -> dict:
    """A `dfvg run` performance_summary.json that holds both a baseline and an fpga variant, or a one-line error."""
    try:
        summary = json.loads(Path(path).read_text())
        variants = summary["variants"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"--summary {path}: not a readable performance_summary.json ({type(exc).__name__}); "
                        "give the file a `dfvg run` wrote") from exc
    missing = [f"a {v} variant" for v in ("baseline", "fpga") if v not in variants]
    missing += [] if "projected" in variants.get("fpga", {"projected": 1}) else ["the fpga variant's projection"]
    if missing:
        raise UserError(f"--summary {path}: lacks {' and '.join(missing)}; re-project a `dfvg run` report whose "
                        "config has variants [baseline, fpga]")
    return summary


def recorded(summary: dict) -> dict:
    """The measured sums of the report's baseline and fpga variants (one process, one run)."""
    base, fpga = summary["variants"]["baseline"], summary["variants"]["fpga"]
    hist = fpga["acceptance"]["accepted_length_histogram"]["value"]
    return {"baseline_tok_s": _value(base, "measured", "tokens_per_second"),
            "host_s": _value(base, "measured", "end_to_end_s") - _value(base, "measured", "verify_s"),
            "verify_s": _value(fpga, "measured", "verify_s"), "new_tokens": _value(fpga, "measured", "new_tokens"),
            "blocks": int(sum(hist)), "full_blocks": int(hist[-1]),
            "draft_tokens": _value(fpga, "acceptance", "num_draft_tokens"),
            "k": int(summary["settings"]["draft_length"]["value"]),
            "recorded_projected_tok_s": _value(fpga, "projected", "tokens_per_second")}


def project(rec: dict, lengths: list[int], workload: DraftWorkload, board: Board, design: DesignParams) -> dict:
    """Sync projection (and the overlap bound) of the recorded run on `board` at `design` (module docstring)."""
    context = round(sum(lengths) / len(lengths) + rec["new_tokens"] / len(lengths) / 2)
    design = dataclasses.replace(design, max_context=max(design.max_context, max(lengths) + 2 * rec["new_tokens"]))
    one, two = (model_block(workload, board, design, k, context).block_time.value for k in (1, 2))
    blocks_s = rec["blocks"] * one + (rec["draft_tokens"] - rec["blocks"]) * (two - one)
    prefill_s = sum(modeled_prefill_s(workload, board, design, n) for n in lengths)
    sync_s = rec["host_s"] + prefill_s + blocks_s + rec["verify_s"]
    block_k = model_block(workload, board, design, rec["k"], context).block_time.value
    overlap_best_s = sync_s - rec["full_blocks"] * block_k
    tok_s = rec["new_tokens"] / sync_s
    return {"mean_context": context, "block_ms_at_k": 1e3 * block_k, "draft_prefill_s": prefill_s,
            "draft_blocks_s": blocks_s, "projected_s_sync": sync_s, "projected_tok_s_sync": tok_s,
            "speedup_vs_baseline_sync": tok_s / rec["baseline_tok_s"],
            "speedup_vs_baseline_overlap_at_most": rec["new_tokens"] / overlap_best_s / rec["baseline_tok_s"],
            "block_shorter_than_verify_step": block_k < rec["verify_s"] / rec["blocks"], "provenance": "modeled"}


def sweep(rec: dict, lengths: list[int], workload: DraftWorkload, board: Board) -> list[dict]:
    """Sync speedup against the two assumed compute knobs: clock and DSP efficiency (the rest at defaults)."""
    return [{"clock_mhz": c, "dsp_efficiency": e, "speedup_vs_baseline_sync": project(
        rec, lengths, workload, board, DesignParams(clock_mhz=c, dsp_efficiency=e))["speedup_vs_baseline_sync"]}
        for c in CLOCKS_MHZ for e in EFFICIENCIES]


def plot(rows: list[dict], path: Path, title: str) -> None:
    """One line per DSP efficiency: projected sync speedup against the clock."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for e in EFFICIENCIES:
        pts = [(r["clock_mhz"], r["speedup_vs_baseline_sync"]) for r in rows if r["dsp_efficiency"] == e]
        ax.plot(*zip(*pts, strict=True), marker="o", label=f"DSP efficiency {e}")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set(xlabel="FPGA clock (MHz, assumed)", ylabel="projected speedup vs plain (modeled)", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--summary", default=str(ROOT / "benchmarks/h200_2026-12-03_engine/performance_summary.json"))
    p.add_argument("--target", default=str(ROOT / "models/qwen2.5-coder-1.5b-instruct"), help="for the tokenizer")
    p.add_argument("--draft", default=str(SHIPPED), help="the draft the fpga variant ran (its config.json)")
    p.add_argument("--board", default="u280")
    p.add_argument("--plot", default="")
    p.add_argument("--output", default="")
    args = p.parse_args()
    try:
        out = reproject(args)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


def reproject(args: argparse.Namespace) -> dict:
    """Read the report and the prompts, project, sweep; write the plot and the JSON when asked."""
    summary = read_summary(args.summary)
    tokenizer = load_tokenizer(args.target)
    prompts = load_prompts(ROOT / summary["dataset"], int(summary["settings"]["num_prompts"]["value"]))
    lengths = [len(encode(tokenizer, x["prompt"])) for x in prompts]
    rec, board = recorded(summary), get_board(args.board)
    workload = draft_workload(load_config(args.draft), 8)
    source = Path(args.summary).resolve()
    source = source.relative_to(ROOT) if source.is_relative_to(ROOT) else source
    out = {"source": str(source), "recorded": rec, "prompt_lengths": lengths,
           "projection": project(rec, lengths, workload, board, DesignParams()),
           "projection_1000_cycles_per_layer": project(rec, lengths, workload, board,
                                                       DesignParams(layer_overhead_cycles=1000.0)),
           "sweep": sweep(rec, lengths, workload, board)}
    print(json.dumps(out["projection"], indent=1))
    if args.plot:
        plot(out["sweep"], Path(args.plot), f"{summary['run_id']}: int8 4x512 draft on {board.name} (modeled)")
    if args.output:
        Path(args.output).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    sys.exit(main())
