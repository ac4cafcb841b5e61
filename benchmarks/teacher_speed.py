"""Teacher data's speed (`dfvg.distill.teacher.generate_batch`), as the distillation pipeline runs it (each decode
step one CUDA graph), against the same loop with each step's kernels launched eagerly (as before 2026-12-05
23:10 UTC), in one run:

    python benchmarks/teacher_speed.py --out $OUT          # on the GPU; writes teacher_speed.json

The target's shapes (Qwen2.5-Coder 1.5B) with random bf16 weights, a batch of 128 prompts of 300-500 random
tokens, 128 new tokens each (no EOS: every row runs the whole batch). Rounds alternate the two; medians of
tokens per second. The run also reports how far the two agree (`agreement`): a graph replays the same
operations, but at these shapes it need not pick the same GEMM kernels (the first run, 23:44 UTC, found the
outputs not bit-identical, where the tiny model of the GPU test is).

Second table: the target's teacher-forced features for a feature head's training step
(`dfvg.distill.feature.target_features`, 32 sequences of 640 tokens, as `distill_h200.sh` trains), causal over
the sequences' own slots (shipped) against the whole cache under a mask (before), with the largest difference
between the two (bf16: different attention kernels round differently).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_decode import SHAPES, random_model  # noqa: E402
from benchmarks.gpu_speed import cuda_median_ms  # noqa: E402
from dfvg.distill.feature import target_features  # noqa: E402
from dfvg.distill.teacher import generate_batch  # noqa: E402
from dfvg.sampling import SamplingParams  # noqa: E402


def one_batch(model, prompts: list[list[int]], new_tokens: int, graph: bool) -> tuple[float, list]:
    """Seconds for one generate_batch, and its sequences."""
    torch.cuda.synchronize()
    began = time.perf_counter()
    seqs = generate_batch(model, prompts, new_tokens, set(), 8, SamplingParams(), torch.Generator(), graph=graph)
    torch.cuda.synchronize()
    return time.perf_counter() - began, seqs


def agreement(a: list, b: list) -> dict:
    """How far two runs' outputs agree: rows identical in tokens and top-k bits, tokens before each row's first
    difference (mean), and at the first step (same prefill, one step of each) the rows whose top-k ids match
    and the largest difference of a top-k probability."""
    def lead(x: list[int], y: list[int]) -> int:
        return next((i for i, (s, t) in enumerate(zip(x, y, strict=True)) if s != t), len(x))

    pairs = list(zip(a, b, strict=True))
    return {"rows": len(pairs),
            "rows_identical": sum(x.continuation == y.continuation and torch.equal(x.topk_ids, y.topk_ids)
                                  and torch.equal(x.topk_probs, y.topk_probs) for x, y in pairs),
            "mean_tokens_before_first_difference": statistics.mean(lead(x.continuation, y.continuation)
                                                                   for x, y in pairs),
            "first_step_topk_ids_equal": sum(torch.equal(x.topk_ids[0], y.topk_ids[0]) for x, y in pairs),
            "first_step_max_prob_difference": max((x.topk_probs[0] - y.topk_probs[0]).abs().max().item()
                                                  for x, y in pairs)}


def feature_times(model, rounds: int, batch: int = 32, length: int = 640) -> dict:
    """Median ms of the target's teacher-forced features, causal (shipped) and masked (before)."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 151936, (batch, length), generator=gen).cuda()
    positions = torch.arange(length, device="cuda")[None].expand(batch, length)

    def masked():
        model.setup_cache(batch, length)
        return model.norm(model.run_layers(model.embed(ids), positions)).float()

    runs = {"causal (shipped)": lambda: target_features(model, ids, positions), "masked (before)": masked}
    times: dict[str, list[float]] = {name: [] for name in runs}
    with torch.no_grad():
        outs = {name: run() for name, run in runs.items()}  # warm-up
        for _ in range(rounds):
            for name, run in runs.items():
                times[name].append(cuda_median_ms(run, reps=1))  # one call per round: rounds alternate
    diff = (outs["causal (shipped)"] - outs["masked (before)"]).abs().max().item()
    return {"batch": batch, "length": length, "ms": {name: statistics.median(ts) for name, ts in times.items()},
            "rounds": times, "max_abs_difference": diff}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model = random_model(SHAPES["qwen2.5-coder-1.5b"])
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(300, 501, (args.batch,), generator=gen).sort().values.tolist()
    prompts = [torch.randint(0, 151936, (n,), generator=gen).tolist() for n in lengths]
    modes = {"graphed step (shipped)": True, "eager step (before)": False}
    times: dict[str, list[float]] = {name: [] for name in modes}
    outputs = {}
    one_batch(model, prompts[:8], 4, True)  # warm-up: kernels loaded, allocator primed
    for _ in range(args.rounds):
        for name, graph in modes.items():
            seconds, outputs[name] = one_batch(model, prompts, args.new_tokens, graph)
            times[name].append(seconds)
    tokens = args.batch * args.new_tokens
    rows = [{"step": name, "seconds": statistics.median(ts), "tokens_per_s": tokens / statistics.median(ts),
             "rounds": ts} for name, ts in times.items()]
    agree = agreement(*outputs.values())
    print(f"{'step':<24}{'s/batch':>9}{'tok/s':>9}   ({args.batch} rows x {args.new_tokens} tokens, "
          f"prompts {lengths[0]}-{lengths[-1]}, {torch.cuda.get_device_name()})")
    for row in rows:
        print(f"{row['step']:<24}{row['seconds']:>9.2f}{row['tokens_per_s']:>9.0f}")
    print(f"speedup {rows[1]['seconds'] / rows[0]['seconds']:.2f}x; agreement: {agree}")
    features = feature_times(model, 2 * args.rounds + 1)
    print(f"features ({features['batch']} x {features['length']} tokens): "
          + ", ".join(f"{name} {ms:.1f} ms" for name, ms in features["ms"].items())
          + f"; largest difference {features['max_abs_difference']:.3g}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "teacher_speed.json").write_text(json.dumps(
        {"device": torch.cuda.get_device_name(), "batch": args.batch, "new_tokens": args.new_tokens,
         "prompt_lengths": [lengths[0], lengths[-1]], "rows": rows, "agreement": agree,
         "features": features}, indent=1))


if __name__ == "__main__":
    main()
