"""`python -m dfvg.fpga.rtl_run`: greedy draft tokens computed by the simulated RTL, beside the datapath's.

Runs a draft's quantized artifact token by token through `RtlDraftModel` (every integer op a simulation of
its `fpga/rtl/` kernel in Icarus Verilog, sequenced from here as the board's controller would) and through
the Python integer datapath (`IntegerDraftModel`, what `FpgaDrafter` emulates), and prints ONE JSON object
(or a short text report) with both token lists and the simulated cycles: per pass, per op, per token.
Cycles are summed over the ops as if they ran one after another (no overlap between kernels), at the
simulated tile sizes (--tiles). `--report FILE` also writes them for the board model (`latency.py`).
A draft the RTL cannot run, or a missing iverilog, is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from dfvg.checkpoint import load_config
from dfvg.cli import parse_prompt_ids
from dfvg.errors import EXIT_USER_ERROR, OneLineParser, UserError, report_interrupt
from dfvg.fpga.datapath.artifact import load_or_build
from dfvg.fpga.datapath.drafter import draft_block
from dfvg.fpga.datapath.integer_model import IntegerDraftModel
from dfvg.fpga.rtlsim.icarus import Icarus
from dfvg.fpga.rtlsim.model import RtlDraftModel
from dfvg.fpga.rtlsim.ops import Tiles
from dfvg.model import ModelConfig

GEMV_OPS = ("embed", "wqkv", "wo", "w13", "w2", "scores", "pv", "output")  # ops that run on the GEMV tile


def build_parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="python -m dfvg.fpga.rtl_run", description=__doc__.split("\n")[0])
    ap.add_argument("--draft", required=True, help="draft checkpoint directory (HF format)")
    ap.add_argument("--prompt-ids", required=True, help="comma-separated token ids, e.g. 1,2,3")
    ap.add_argument("--tokens", type=int, default=1, help="greedy tokens to draft (default 1)")
    ap.add_argument("--bits", type=int, default=8, choices=(8, 4), help="weight bits of the decoder layers")
    ap.add_argument("--group-size", type=int, default=128, help="int4 columns per group scale")
    ap.add_argument("--artifact-dir", help="where the quantized artifact is (built there when missing)")
    ap.add_argument("--tiles", default="16,16,16", help="GEMV lanes P, elements W, vector lanes (default 16,16,16)")
    ap.add_argument("--report", help="also write the cycles as JSON here (the board model reads it)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    return ap


def parse_tiles(text: str) -> Tiles:
    try:
        p, w, lanes = (int(v) for v in text.split(","))
    except ValueError:
        raise UserError(f"--tiles must be three integers P,W,LANES, got {text!r}") from None
    if min(p, w, lanes) < 2 or w % 2 or any(v & (v - 1) for v in (p, w, lanes)):
        raise UserError(f"--tiles values must be powers of two >= 2, got {text!r}")
    return Tiles(p, w, lanes)


def check_draft(cfg: ModelConfig, bits: int, group_size: int, tiles: Tiles) -> None:
    """Refuse, in one line, a draft the RTL kernels cannot run (their port widths and beat structure)."""
    if cfg.head_dim % 2:
        raise UserError(f"the RTL rope kernel needs an even head_dim, the draft has {cfg.head_dim}")
    if cfg.hidden_size >= 1 << 16 or cfg.intermediate_size >= 1 << 17:
        raise UserError(f"the RTL rmsnorm/GEMV need hidden_size < 65536 and intermediate_size < 131072, the draft "
                        f"has {cfg.hidden_size} and {cfg.intermediate_size}")
    if bits == 4 and group_size % tiles.w:
        raise UserError(f"int4 group size {group_size} must be a multiple of the GEMV tile width W={tiles.w} "
                        "(--group-size or --tiles)")


def _passes(model: RtlDraftModel, prompt: list[int], n: int, vocab: int) -> tuple[list[int], list[dict]]:
    """Draft n tokens one pass at a time, recording each pass's simulated cycles by op and its wall time."""
    tokens, passes, ids, pos = [], [], prompt, 0
    for _ in range(n):
        cycles0, macs0, start = dict(model.sim.cycles), dict(model.sim.macs), time.perf_counter()
        tokens.append(model.next_token(torch.tensor(ids, dtype=torch.long), pos, vocab))
        by_op = {op: c - cycles0.get(op, 0) for op, c in model.sim.cycles.items() if c - cycles0.get(op, 0)}
        macs = {op: c - macs0.get(op, 0) for op, c in model.sim.macs.items() if c - macs0.get(op, 0)}
        passes.append({"fed_tokens": len(ids), "context": pos, "cycles": sum(by_op.values()), "cycles_by_op": by_op,
                       "macs_by_op": macs, "wall_s": round(time.perf_counter() - start, 2)})
        pos, ids = pos + len(ids), [tokens[-1]]
    return tokens, passes


def run(args: argparse.Namespace) -> dict:
    """Both token lists and the simulated cycles, as the JSON object the command prints."""
    tiles, draft = parse_tiles(args.tiles), Path(args.draft)
    if args.tokens < 1:
        raise UserError(f"--tokens must be >= 1, got {args.tokens}")
    cfg = load_config(draft)
    check_draft(cfg, args.bits, args.group_size, tiles)
    sim = Icarus()  # refuses a missing iverilog before anything slow runs
    try:
        prompt = parse_prompt_ids(args.prompt_ids, cfg.vocab_size)
        tensors, _ = load_or_build(draft, args.bits, args.group_size, args.artifact_dir)
        length = len(prompt) + args.tokens
        reference = IntegerDraftModel(tensors, cfg, args.bits, "cpu")
        reference.setup_cache(length)
        datapath_tokens = draft_block(reference, prompt, 0, args.tokens, cfg.vocab_size)
        model = RtlDraftModel(tensors, cfg, args.bits, sim, tiles)
        model.setup_cache(length)
        tokens, passes = _passes(model, prompt, args.tokens, cfg.vocab_size)
    finally:
        sim.close()
    one_token = passes[1:] or passes  # the prompt pass feeds several tokens; later passes feed one
    return {
        "draft": str(draft), "bits": args.bits, "prompt_ids": prompt, "tokens": tokens,
        "datapath_tokens": datapath_tokens, "match": tokens == datapath_tokens,
        "cycles_per_token": round(sum(p["cycles"] for p in one_token) / len(one_token)),
        "cycles_per_token_from": "one-token passes" if passes[1:] else "the prompt pass (only one pass ran)",
        "passes": passes, "gemv_ops": list(GEMV_OPS), "num_layers": cfg.num_layers,
        "tiles": {"P": tiles.p, "W": tiles.w, "lanes": tiles.lanes},
        "simulator": sim.version, "provenance": "simulated",
        "note": "cycles: kernels run one after another (no overlap), simulated clock cycles, not a board",
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with torch.inference_mode():
            result = run(args)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return report_interrupt()
    if args.report:
        Path(args.report).write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        print(json.dumps(result))
    else:
        print(f"RTL tokens {result['tokens']}; datapath tokens {result['datapath_tokens']} "
              f"({'equal' if result['match'] else 'DIFFERENT'}); {result['cycles_per_token']} simulated cycles/token "
              f"at P={result['tiles']['P']} x W={result['tiles']['W']}; {result['simulator']}")
    return 0 if result["match"] else 1


if __name__ == "__main__":
    sys.exit(main())
