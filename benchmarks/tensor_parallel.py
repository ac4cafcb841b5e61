"""Tensor-parallel verification speed: decode and verify step times and the all-reduce cost at TP N.

    torchrun --nproc-per-node N benchmarks/tensor_parallel.py --target models/qwen2.5-coder-1.5b-instruct \\
        --draft models/qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768 --out $OUT          # N = 1, 2, 4
    torchrun --nproc-per-node 2 benchmarks/tensor_parallel.py --shape llama-2-7b --out $OUT  # random weights
    python benchmarks/tensor_parallel.py --report $OUT [--allreduce-us 2=12,4=15]          # table + scaling model

UNTESTED ON GPUs: written without a multi-GPU machine; here it has run on CPU ranks only (gloo, --device cpu,
tiny checkpoints). One run at TP N (rank 0 prints a table and writes tensor_parallel_<label>_tp<N>.json, then
one JSON line) measures, on the eager path, medians of --repeats:
- one all-reduce of [1, hidden] and of [k+1, hidden] in the target's dtype (50 back to back, per operation);
- a decode step: verifying an empty block (1 token) at position --position: the sharded forward, the argmax
  merge and rank 0's decision broadcast; and a verify step of k drafts + 1;
- plain and speculative decoding end to end on --prompts prompts (tokens/s, mean accepted length), the draft
  on rank 0 (--draft-device), when --draft is given.
TP 1 is the same script under `torchrun --nproc-per-node 1` (the eager single-GPU `TorchVerifier`), so every
TP compares eager with eager; DFVG's CUDA-graph single-GPU step is benchmarks/gpu_speed.py's. `--shape` uses
random bf16 weights of a public shape: speed only, never tokens or acceptance (labelled `random weights`).
`--report DIR` merges the runs (decode step vs TP 1: the issue's goal is <= 0.6 at TP 2) and prints the
modeled 7B/70B scaling (dfvg.parallel.scaling) from the measured all-reduce, or from --allreduce-us (assumed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_decode import random_model  # noqa: E402
from dfvg.checkpoint import load_config, load_model, resolve_dtype  # noqa: E402
from dfvg.devices import synchronize  # noqa: E402
from dfvg.drafter import DraftBlock  # noqa: E402
from dfvg.engine import Engine, make_drafter  # noqa: E402
from dfvg.generate import GREEDY  # noqa: E402
from dfvg.parallel import group, scaling  # noqa: E402
from dfvg.parallel.shard import shard_transformer  # noqa: E402
from dfvg.parallel.verifier import TensorParallelVerifier  # noqa: E402
from dfvg.verifier import TorchVerifier  # noqa: E402

PROMPTS = ROOT / "benchmarks" / "data" / "humaneval_prompts_qwen.json"  # pre-tokenized for the Qwen pair


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--target", help="target checkpoint directory")
    source.add_argument("--shape", choices=sorted(scaling.TARGETS), help="random bf16 weights of this shape")
    source.add_argument("--report", help="merge the JSON files of earlier runs in this folder")
    parser.add_argument("--draft", help="draft checkpoint: also time plain vs speculative decoding")
    parser.add_argument("--draft-device", default="cuda:0", help="where rank 0 drafts (cpu, cuda:N, fpga)")
    parser.add_argument("--device", default="cuda", help="cuda (NCCL, one GPU per rank) or cpu (gloo)")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--k", type=int, default=4, help="draft length")
    parser.add_argument("--position", type=int, default=400, help="cache position of the timed steps")
    parser.add_argument("--prompts", type=int, default=4, help="prompts decoded end to end (with --draft)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--allreduce-us", default="", help="--report: N=us,... when no run measured them")
    parser.add_argument("--out", default=".", help="folder for the JSON file")
    return parser.parse_args(argv)


def median_s(fn, repeats: int, device: torch.device) -> float:
    """Median wall time of fn(), synchronized on both sides; every rank calls it in lockstep."""
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def allreduce_s(tp: group.TensorParallel | None, rows: int, hidden: int, dtype: torch.dtype, repeats: int) -> float:
    """Seconds per all-reduce of [rows, hidden]: 50 back to back, after a warm-up that sets up the communicator."""
    if tp is None:
        return 0.0
    x = torch.zeros(rows, hidden, dtype=dtype, device=tp.device)

    def fifty() -> None:
        for _ in range(50):
            dist.all_reduce(x)

    fifty()
    return median_s(fifty, repeats, tp.device) / 50


def load_target(args: argparse.Namespace, tp: group.TensorParallel | None, device: torch.device,
                dtype: torch.dtype) -> TorchVerifier:
    """The eager target: this rank's shard at TP > 1, the whole model at TP 1."""
    if args.shape:
        full = random_model(scaling.TARGETS[args.shape])  # on CUDA: --shape runs are GPU runs
    else:
        full = load_model(args.target, dtype=dtype, device="cpu")
    if tp is None:
        return TorchVerifier(full.to(device))
    return TensorParallelVerifier(shard_transformer(full, tp), tp)


def step_times(verifier: TorchVerifier, args: argparse.Namespace) -> dict:
    """Median decode-step and verify-step seconds at cache position args.position (random token ids)."""
    gen = torch.Generator().manual_seed(0)
    seq = torch.randint(0, verifier.vocab_size, (args.position,), generator=gen).tolist()
    drafts = torch.randint(0, verifier.vocab_size, (args.k,), generator=gen).tolist()
    verifier.prefill(seq, args.position + args.k + 2)
    rng = torch.Generator().manual_seed(0)

    def verify(tokens: list[int]):
        return lambda: verifier.verify(seq, DraftBlock(tokens, None, 0.0), GREEDY, rng)

    verify([])()  # first touch
    return {"decode_ms": median_s(verify([]), args.repeats, verifier.device) * 1e3,
            "verify_ms": median_s(verify(drafts), args.repeats, verifier.device) * 1e3}


def prompts(vocab_size: int, count: int) -> tuple[list[list[int]], str]:
    """HumanEval prompts tokenized for the Qwen pair, or random ids for another vocabulary."""
    ids = [p["ids"] for p in json.loads(PROMPTS.read_text())[:count]]
    if all(max(p) < vocab_size for p in ids):
        return ids, f"{PROMPTS.name}[:{count}]"
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab_size, (64,), generator=gen).tolist() for _ in range(count)], "random ids"


def end_to_end(verifier: TorchVerifier, args: argparse.Namespace, dtype: torch.dtype) -> dict:
    """Plain and speculative decoding of the prompts through the engine: tokens/s and mean accepted length."""
    engine = Engine(verifier)
    drafter = make_drafter(args.draft, args.draft_device, dtype, verifier.vocab_size, fast=False)
    batch, source = prompts(verifier.vocab_size, args.prompts)
    out = {"prompts": source}
    for name, d, k in (("plain", None, 0), ("speculative", drafter, args.k)):
        engine.decode(d, batch[0][:24], 4, k=k)  # warm-up
        start, results = time.perf_counter(), [engine.decode(d, p, args.new_tokens, k=k) for p in batch]
        seconds = time.perf_counter() - start
        out[f"{name}_tok_s"] = sum(len(r.tokens) for r in results) / seconds
        steps = [s for r in results for s in r.steps]
        out[f"{name}_mean_accepted_length"] = sum(s.num_accepted + 1 for s in steps) / len(steps)
    return out


def measure(args: argparse.Namespace) -> dict:
    cfg = scaling.TARGETS[args.shape] if args.shape else load_config(args.target)
    size = int(os.environ.get("WORLD_SIZE", "1"))
    tp = group.start(size, args.device, cfg, flag="WORLD_SIZE")
    device = tp.device if tp else torch.device("cuda" if args.device.startswith("cuda") else "cpu")
    dtype = resolve_dtype(args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    verifier = load_target(args, tp, device, dtype)
    label = args.shape or Path(args.target).name
    row = {"label": label, "weights": "random weights" if args.shape else "checkpoint", "tensor_parallel": size,
           "device": str(device), "dtype": str(dtype).removeprefix("torch."), "k": args.k, "position": args.position,
           "provenance": "measured", "command": " ".join(sys.argv),
           "allreduce_1_us": allreduce_s(tp, 1, cfg.hidden_size, dtype, args.repeats) * 1e6,
           f"allreduce_{args.k + 1}_us": allreduce_s(tp, args.k + 1, cfg.hidden_size, dtype, args.repeats) * 1e6}
    with torch.inference_mode():
        row.update(step_times(verifier, args))
        if args.draft and not args.shape:
            row.update(end_to_end(verifier, args, dtype))
    return row


def report(folder: Path, allreduce_us: str) -> dict:
    """The merged table of every run in `folder`, and the modeled 7B/70B scaling."""
    runs = [json.loads(p.read_text()) for p in sorted(folder.glob("tensor_parallel_*_tp*.json"))]
    print(f"{'target':<40} {'TP':>3} {'decode ms':>10} {'vs TP1':>7} {'verify ms':>10} {'all-reduce us':>14}")
    for run in sorted(runs, key=lambda r: (r["label"], r["tensor_parallel"])):
        base = next((r["decode_ms"] for r in runs if r["label"] == run["label"] and r["tensor_parallel"] == 1), None)
        ratio = f"{run['decode_ms'] / base:.2f}x" if base else "n/a"
        print(f"{run['label'] + ' (' + run['weights'] + ')':<40} {run['tensor_parallel']:>3} {run['decode_ms']:>10.3f} "
              f"{ratio:>7} {run['verify_ms']:>10.3f} {run['allreduce_1_us']:>14.1f}")
    measured = {r["tensor_parallel"]: r["allreduce_1_us"] * 1e-6 for r in runs  # GPU figures only: the model is H200's
                if r["tensor_parallel"] > 1 and r["device"].startswith("cuda")}
    given = {int(n): float(us) * 1e-6 for n, us in (item.split("=") for item in allreduce_us.split(",") if item)}
    if measured:
        figures, provenance, source = measured, "measured", f"all-reduce [1, hidden] of {folder}"
    elif given:
        figures, provenance, source = given, "assumed", "--allreduce-us"
    else:
        figures, provenance, source = {2: 0.0, 4: 0.0, 8: 0.0}, "assumed", "zero: the bandwidth floor alone"
    rows = scaling.scaling_rows({1: 0.0, **figures}, provenance, source)
    print(f"\nModeled scaling (all-reduce {provenance}: {source}):\n{scaling.format_rows(rows)}")
    return {"runs": runs, "scaling": [{k: v.to_dict() if hasattr(v, "to_dict") else v for k, v in r.items()}
                                      for r in rows]}


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.report:
        print(json.dumps(report(Path(args.report), args.allreduce_us)))
        return
    completed = False
    try:
        row = measure(args)
        completed = True
    finally:
        group.stop(completed)
    if group.leads():
        print(f"{row['label']} TP {row['tensor_parallel']} ({row['weights']}, {row['dtype']}, {row['device']}): "
              f"decode {row['decode_ms']:.3f} ms/token, verify (k={args.k}) {row['verify_ms']:.3f} ms/step, "
              f"all-reduce [1, hidden] {row['allreduce_1_us']:.1f} us")
        out = Path(args.out) / f"tensor_parallel_{row['label']}_tp{row['tensor_parallel']}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(row, indent=2))
        print(json.dumps(row))
    group.leave_process(0)  # a torchrun worker ends as `dfvg` does (the exit path's teardown abort never runs)


if __name__ == "__main__":
    main()
