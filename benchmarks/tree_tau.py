"""Mean accepted length τ of a k-chain against token trees, same draft, same prompts (greedy, fp32).

    python benchmarks/tree_tau.py [--prompts 5] [--max-new-tokens 64] [--device cpu|cuda] \
        [--shapes 2,2,1,1 4,2,1,1 dynamic:16] [--output results/tree_tau.json]

The chain is the engine's host step with k = --draft-length; every tree runs `dfvg.tree_step.TreeStep`
through the same `Engine.decode`. τ counts the bonus token (dfvg/stats.py); tree size is the mean number of
nodes a step verified. On a CPU the numbers worth quoting are τ and tree size, not tok/s. Each variant's
tokens are compared with the chain's (greedy trees are lossless, so they must match). The last line is one
JSON object, also written to --output. All values `measured` on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dfvg.checkpoint import load_model  # noqa: E402
from dfvg.datasets import load_prompts  # noqa: E402
from dfvg.drafter import TorchDrafter  # noqa: E402
from dfvg.engine import Engine  # noqa: E402
from dfvg.stats import StepRecord, mean_accepted_length  # noqa: E402
from dfvg.tokenizer import encode, eos_token_ids, load_tokenizer  # noqa: E402
from dfvg.tree import parse_tree_spec  # noqa: E402
from dfvg.verifier import TorchVerifier  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(ROOT / "models/qwen2.5-coder-1.5b-instruct"))
    parser.add_argument("--draft", default=str(ROOT / "models/qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768"))
    parser.add_argument("--dataset", default=str(ROOT / "data/humaneval-heldout.jsonl"))
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--draft-length", type=int, default=4, help="chain k, and the depth of dynamic trees")
    parser.add_argument("--shapes", nargs="+", default=["2,2,1,1", "4,2,1,1", "dynamic:16"])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--device", default="cpu", help="cpu or cuda: both models eager, fp32 (trees verify eagerly)")
    parser.add_argument("--output", default=str(ROOT / "results/tree_tau.json"))
    return parser.parse_args()


def summary(steps: list[StepRecord], tokens_match: list[bool]) -> dict:
    return {"tau": mean_accepted_length(steps), "tau_counts_bonus": True,
            "mean_tree_nodes": statistics.fmean(s.num_drafted for s in steps), "verify_steps": len(steps),
            "outputs_match_chain": all(tokens_match), "provenance": "measured"}


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    tokenizer, eos = load_tokenizer(args.target), eos_token_ids(args.target)
    device = torch.device(args.device)
    engine = Engine(TorchVerifier(load_model(args.target, device=device)))
    drafter = TorchDrafter(load_model(args.draft, device=device), engine.verifier.vocab_size)
    variants = {"chain": None, **{shape: parse_tree_spec(shape) for shape in args.shapes}}
    steps: dict[str, list[StepRecord]] = {name: [] for name in variants}
    match: dict[str, list[bool]] = {name: [] for name in variants}
    for task in load_prompts(args.dataset, limit=args.prompts):
        ids = encode(tokenizer, task["prompt"])
        chain_tokens = None
        for name, spec in variants.items():
            result = engine.decode(drafter, ids, args.max_new_tokens, k=args.draft_length, eos_ids=eos, tree=spec)
            chain_tokens = result.tokens if chain_tokens is None else chain_tokens
            steps[name] += result.steps
            match[name].append(result.tokens == chain_tokens)
            print(f"{task['id']:<14} {name:<12} tau {mean_accepted_length(result.steps):.2f}", file=sys.stderr,
                  flush=True)
    rows = {name: summary(steps[name], match[name]) for name in variants}
    return {"target": Path(args.target).name, "draft": Path(args.draft).name, "dataset": Path(args.dataset).name,
            "prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "draft_length": args.draft_length,
            "dtype": "float32", "device": args.device, "greedy": True, "variants": rows}


def main() -> None:
    args = parse_args()
    report = run(args)
    print(f"{'variant':<12} {'nodes/step':>10} {'tau':>6} {'steps':>6}  match")
    for name, row in report["variants"].items():
        print(f"{name:<12} {row['mean_tree_nodes']:>10.1f} {row['tau']:>6.2f} {row['verify_steps']:>6}  "
              f"{row['outputs_match_chain']}")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
