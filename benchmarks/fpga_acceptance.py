"""Acceptance of the FPGA int8 / int4 drafters vs the float TorchDrafter on the real Qwen pair (greedy, CPU).

    python benchmarks/fpga_acceptance.py [--prompts 4] [--max-new-tokens 64] [--draft-length 4]
        [--drafters torch,fpga8,fpga4] [--threads 2] [--output results/fpga_acceptance.json]

For each HumanEval prompt it decodes the target alone (greedy), then speculatively with each drafter,
checks every output equals the plain one token for token, and reports acceptance rate alpha and mean
accepted length tau (bonus token counted, dfvg/stats.py), all `measured`; it also times the emulated
drafters alone (draft tokens/s of the integer datapath on this machine, `measured`) and prints the U280
board time per block and per token from the latency model (`modeled`). The quantized artifacts are built
(or reloaded) before the target is loaded, so at most one float draft is in memory next to the target.
The last line is one JSON object (also written to --output).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from dfvg.checkpoint import load_model
from dfvg.datasets import load_humaneval
from dfvg.drafter import TorchDrafter
from dfvg.fpga.datapath.artifact import load_or_build
from dfvg.fpga.datapath.drafter import FpgaDrafter
from dfvg.generate import generate
from dfvg.sampling import SamplingParams
from dfvg.stats import StepRecord, acceptance_rate, mean_accepted_length
from dfvg.tokenizer import encode, eos_token_ids, load_tokenizer
from dfvg.verifier import TorchVerifier

ROOT = Path(__file__).resolve().parents[1]
FPGA_BITS = {"fpga8": 8, "fpga4": 4}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(ROOT / "models/qwen2.5-coder-1.5b-instruct"))
    parser.add_argument("--draft", default=str(ROOT / "models/qwen2.5-coder-0.5b-instruct"))
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--draft-length", type=int, default=4)
    parser.add_argument("--drafters", default="fpga8,fpga4,torch")
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--board", default="u280")
    parser.add_argument("--speed-tokens", type=int, default=16, help="draft tokens per timed emulation block")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default=str(ROOT / "results/fpga_acceptance.json"))
    return parser.parse_args()


def make(name: str, args: argparse.Namespace, vocab: int):
    if name == "torch":
        return TorchDrafter(load_model(args.draft), vocab)
    return FpgaDrafter.from_checkpoint(args.draft, target_vocab_size=vocab, bits=FPGA_BITS[name],
                                       group_size=args.group_size, board=args.board)


def emulation_speed(drafter: FpgaDrafter, prompt: list[int], tokens: int, threads: int) -> dict:
    """Median over 3 blocks of `tokens` drafts after the prompt: tokens/s of the emulated datapath alone."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    times = []
    for _ in range(3):
        drafter.prefill(prompt, len(prompt) + tokens + 1)
        start = time.perf_counter()
        drafter.propose(prompt, tokens, SamplingParams(), None)
        times.append(time.perf_counter() - start)
    torch.set_num_threads(previous)
    median = statistics.median(times)
    return {"value": tokens / median, "unit": "tokens/s", "provenance": "measured",
            "source": f"median of 3 blocks of {tokens} drafts after a {len(prompt)}-token prompt, "
                      f"{threads} threads, load {os.getloadavg()[0]:.2f}"}


def run_drafter(name: str, drafter, target, prompts: list[list[int]], plains: list[list[int]],
                args: argparse.Namespace, eos: list[int]) -> dict:
    steps: list[StepRecord] = []
    matches, draft_s = [], 0.0
    for ids, plain in zip(prompts, plains, strict=True):
        result = generate(target, ids, args.max_new_tokens, eos_ids=eos, drafter=drafter,
                          draft_length=args.draft_length)
        steps += result.steps
        matches.append(result.tokens == plain)
        draft_s += result.stats()["draft_s"]
        print(f"  {name:<6} prompt {len(matches)}: alpha {result.stats()['acceptance_rate']:.3f} "
              f"match {matches[-1]}", flush=True)
    drafted = sum(s.num_drafted for s in steps)
    row = {"drafter": name, "acceptance_rate": acceptance_rate(steps),
           "mean_accepted_length": mean_accepted_length(steps), "mean_accepted_length_counts_bonus": True,
           "verify_steps": len(steps), "draft_tokens": drafted, "draft_s_in_generation": draft_s,
           "all_outputs_match_plain": all(matches), "provenance": "measured"}
    modeled = [s.modeled_draft_s for s in steps if s.modeled_draft_s is not None]
    if modeled:
        row["modeled_ms_per_block"] = {"value": 1e3 * statistics.mean(modeled), "unit": "ms", "provenance": "modeled",
                                       "source": f"latency.model_block on {args.board}, mean over blocks"}
        row["modeled_ms_per_draft_token"] = {"value": 1e3 * sum(modeled) / drafted, "unit": "ms",
                                             "provenance": "modeled", "source": "sum of block times / drafts"}
        for threads in sorted({1, 2, args.threads}):
            row[f"emulation_speed_{threads}t"] = emulation_speed(drafter, prompts[0], args.speed_tokens, threads)
    return row


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    names = args.drafters.split(",")
    for name in names:  # build the artifacts before the 7 GB target is in memory
        if name in FPGA_BITS:
            load_or_build(args.draft, FPGA_BITS[name], args.group_size)
            gc.collect()
    tokenizer, eos = load_tokenizer(args.target), eos_token_ids(args.target)
    prompts = [encode(tokenizer, t["prompt"]) for t in load_humaneval(limit=args.prompts)]
    target = TorchVerifier(load_model(args.target))
    start = time.perf_counter()
    plains = [generate(target, ids, args.max_new_tokens, eos_ids=eos).tokens for ids in prompts]
    plain_s = time.perf_counter() - start
    print(f"plain decoding: {sum(map(len, plains))} tokens in {plain_s:.1f} s", flush=True)
    summary = {"benchmark": "fpga_acceptance", "provenance": "measured", "dtype": "float32", "device": "cpu",
            "cpu": platform.processor() or platform.machine(), "threads": args.threads,
            "load_average_end": os.getloadavg(), "torch": torch.__version__, "target": args.target,
            "draft": args.draft, "prompts": len(prompts), "prompt_tokens": [len(p) for p in prompts],
            "max_new_tokens": args.max_new_tokens, "draft_length": args.draft_length, "greedy": True,
            "plain_tokens": sum(map(len, plains)), "plain_s": plain_s, "rows": []}
    for name in names:
        drafter = make(name, args, target.vocab_size)
        summary["rows"].append(run_drafter(name, drafter, target, prompts, plains, args, eos))
        del drafter
        gc.collect()
        write(summary, args.output)  # partial results survive an interrupted run
    return summary


def write(summary: dict, path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(summary, indent=2))


def print_table(summary: dict) -> None:
    print(f"\n{'drafter':<8} {'alpha':>7} {'tau':>6} {'match':>6} {'emul tok/s':>11} {'U280 ms/block':>14} "
          f"{'U280 ms/tok':>12}")
    for r in summary["rows"]:
        speed = r.get(f"emulation_speed_{summary['threads']}t", {}).get("value")
        block = r.get("modeled_ms_per_block", {}).get("value")
        token = r.get("modeled_ms_per_draft_token", {}).get("value")
        fmt = lambda v, spec: "-" if v is None else format(v, spec)
        print(f"{r['drafter']:<8} {r['acceptance_rate']:>7.3f} {r['mean_accepted_length']:>6.2f} "
              f"{str(r['all_outputs_match_plain']):>6} {fmt(speed, '11.2f')} {fmt(block, '14.3f')} "
              f"{fmt(token, '12.3f')}")
    print("alpha, tau, match, emul tok/s: measured; U280 ms: modeled (dfvg/fpga/board/latency.py)")


def main() -> int:
    args = parse_args()
    summary = run(args)
    print_table(summary)
    write(summary, args.output)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
