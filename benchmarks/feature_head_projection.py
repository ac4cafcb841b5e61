"""A feature head on the FPGA (modeled): a measured GPU run of the head, replayed with board-modeled blocks.

    python benchmarks/feature_head_projection.py \\
        --speed benchmarks/h200_2026-12-05_feature_head_graph/gpu_speed_fh2.json \\
        --head models/fh-l4-d512-2026-12-05 \
        --output benchmarks/h200_2026-12-05_feature_head_graph/fpga_projection_fh2.json

Why: issue 15 asks for the FPGA-resident draft's projection, and the head is the best draft measured. No
GPU run has drafted with the integer head yet, so this replays the head's own measured GPU schedule (the
sync schedule: the target waits while the board drafts) with the board parts modeled. Per prompt, every
measured cost of that run stays in:

    projected = target prefill                   measured: the same run's plain row, same prompt
              + the head's prompt pass            modeled: `modeled_prefill_s` (its int8 features over PCIe in)
              + steps x the head's block          modeled: `model_block` at the prompt's mean context, with the
                                                  step's mean catch-up (accepted + 1 positions, their features in)
              + steps x features to int8          assumed: one 5 us elementwise GPU kernel (not measured)
              + steps x features GPU -> host      modeled: the verify rows' int8 features over PCIe
              + the run's verify time             measured (the graph verify that writes the features)
              + host time outside draft + verify  measured

The steps are the float head's, as measured. The integer head's own τ is measured apart, on the CPU
(`benchmarks/feature_head_fpga.py`: int8 within 0.4 % and int4 within 2.3 % of the float head's at k = 4 on
the held-out test split), not in this replay. The board model's defaults (clock, DSP efficiency, PCIe,
launch) as everywhere (`dfvg/fpga/board`). Every projected figure says `modeled`; the plain row it is
compared with is measured.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dfvg.checkpoint import FEATURE_HEAD_FILE, load_config, read_json  # noqa: E402
from dfvg.errors import OneLineParser, UserError  # noqa: E402
from dfvg.fpga.board.boards import get_board  # noqa: E402
from dfvg.fpga.board.latency import DesignParams, model_block  # noqa: E402
from dfvg.fpga.board.workload import draft_workload  # noqa: E402
from dfvg.host.projection import modeled_prefill_s  # noqa: E402

QUANTIZE_KERNEL_S = 5e-6  # assumed: one elementwise GPU kernel rounds a step's (k + 1) x H features to int8


def block_s(workload, board, design, k: int, context: int, catch_up: float) -> float:
    """The modeled block at a fractional mean catch-up: linear between the two whole counts around it."""
    low = max(1, math.floor(catch_up))
    t_low = model_block(workload, board, design, k, context, new_tokens=low).block_time.value
    t_high = model_block(workload, board, design, k, context, new_tokens=low + 1).block_time.value
    return t_low + (catch_up - low) * (t_high - t_low)


def one_transfer_s(num_bytes: int, design: DesignParams) -> float:
    """One GPU -> host copy of the verify rows' features: one transfer's latency plus its bytes (the board
    model's PCIe terms, `dfvg.fpga.board.latency.pcie_time_s` pays two such latencies for a block's in and out)."""
    return design.pcie_latency_us * 1e-6 + num_bytes / (design.pcie_gbps * 1e9)


def project_prompt(stats: dict, plain: dict, prompt_len: int, k: int, workload, board, design) -> dict:
    """One prompt's projected seconds and their parts (module docstring)."""
    steps = stats["num_verify_steps"]
    catch_up = (stats["num_accepted_tokens"] + steps) / steps
    context = prompt_len + stats["num_new_tokens"] // 2
    parts = {
        "target_prefill_s": plain["prefill_s"],
        "head_prompt_pass_s": modeled_prefill_s(workload, board, design, prompt_len),
        "head_blocks_s": steps * block_s(workload, board, design, k, context, catch_up),
        "features_to_int8_s": steps * QUANTIZE_KERNEL_S,
        "features_to_host_s": steps * one_transfer_s(workload.feature_size * (k + 1), design),
        "verify_s": stats["verify_s"],
        "host_s": stats["decode_s"] - stats["draft_s"] - stats["verify_s"],
    }
    return {**parts, "projected_s": sum(parts.values()), "new_tokens": stats["num_new_tokens"]}


def project(speed: dict, row: str, prompt_lens: list[int], workload, board, design, k: int) -> dict:
    head, plain = speed[row]["stats"], speed["dfvg_plain"]["stats"]
    prompts = [project_prompt(s, p, n, k, workload, board, design)
               for s, p, n in zip(head, plain, prompt_lens, strict=True)]
    total_s = sum(p["projected_s"] for p in prompts)
    tokens = sum(p["new_tokens"] for p in prompts)
    parts = {name: sum(p[name] for p in prompts) for name in prompts[0] if name not in ("projected_s", "new_tokens")}
    plain_tok_s = speed["dfvg_plain"]["tokens_per_s"]
    return {"projected_tokens_per_s": tokens / total_s, "vs_plain": tokens / total_s / plain_tok_s,
            "plain_tokens_per_s_measured": plain_tok_s,
            "gpu_head_tokens_per_s_measured": speed[row]["tokens_per_s"], "parts_s": parts,
            "block_ms_at_mean": 1e3 * parts["head_blocks_s"] / sum(s["num_verify_steps"] for s in head),
            "provenance": "modeled (board parts) on a measured schedule; acceptance: the float head's measured "
                          "steps, not the integer head's (its τ is measured apart: benchmarks/feature_head_fpga.py, "
                          "CPU replay); the GPU's int8 rounding of the features assumed at 5 us a step"}


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--speed", required=True, help="the dfvg phase JSON of gpu_speed.py with the head's row")
    p.add_argument("--row", default="dfvg_feature_k4")
    p.add_argument("--head", required=True, help="the head's folder (its config.json and feature_head.json)")
    p.add_argument("--prompts-file", default=str(ROOT / ".chunks/prompts.json"),
                   help="the run's prompts (gpu_speed.py --write-prompts); the first N are the run's")
    p.add_argument("--board", default="u280")
    p.add_argument("--output", default="")
    args = p.parse_args(argv)
    try:
        out = run(args)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps({b: {n: v for n, v in r.items() if n != "parts_s"} for b, r in out["projection"].items()},
                     indent=1))
    if args.output:
        Path(args.output).write_text(json.dumps(out, indent=1))
    return 0


def run(args) -> dict:
    for path, what in ((args.speed, "--speed"), (args.prompts_file, "--prompts-file")):
        if not Path(path).is_file():
            raise UserError(f"{what} {path}: no such file")
    speed = json.loads(Path(args.speed).read_text())
    if args.row not in speed or "dfvg_plain" not in speed:
        raise UserError(f"--speed {args.speed} lacks the rows {args.row} and dfvg_plain; give a gpu_speed.py dfvg "
                        "JSON of a run with --feature-head")
    meta = read_json(Path(args.head) / FEATURE_HEAD_FILE, FEATURE_HEAD_FILE)
    n = len(speed[args.row]["stats"])
    prompt_lens = [len(x["ids"]) for x in json.loads(Path(args.prompts_file).read_text())[:n]]
    k = int(args.row.rsplit("_k", 1)[1])
    board = get_board(args.board)
    projection = {}
    for bits in (8, 4):
        workload = draft_workload(load_config(args.head), bits, feature_size=meta["target_hidden_size"],
                                  feature_bits=8)
        projection[f"int{bits}"] = project(speed, args.row, prompt_lens, workload, board, DesignParams(), k)
    return {"source": args.speed, "row": args.row, "head": args.head, "board": board.name, "k": k,
            "prompt_lengths": prompt_lens, "projection": projection}


if __name__ == "__main__":
    sys.exit(main())
