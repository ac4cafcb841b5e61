"""Where a greedy tree step's time goes, against the chain step it competes with (random weights).

    python benchmarks/tree_step.py --out $OUT                      # on a GPU: tree_step.json, a table on stdout
    python benchmarks/tree_step.py --device cpu --tiny --out DIR   # smoke run here: op counts, no timing worth quoting

Why: on the real pair a depth-4 dynamic:15 tree (16 verify rows, one tensor-core tile) costs 1.40x the k = 4
chain's step for +22 % τ (H100, 2026-12-05, benchmarks/RESULTS.md), while 16 verify rows cost at most 1.07x
5 rows. The rest is the tree's bookkeeping (growing, pruning, accepting, compacting on the device): many tiny
launches, each a node of the captured graph. This measures, for the chain and each --trees shape over the same
models and context: the captured step's time (median over rounds of the median of 20 replays, CUDA events),
and from one profiled set of replays the launches per step and the device time per kernel name
(torch.profiler; on a CPU the aten ops per step instead, a proxy for the launch count: the fused layers are
CUDA-only, so only the difference between shapes means something there).

Random bf16 weights of the 1.5B target and of the shipped 4 x 512 draft's shapes (timing depends on the shapes
only; acceptance, and so how far each replay advances, is that of random weights: about nothing, which is the
worst case for neither). --tiny: small shapes of the same architecture, for the CPU smoke run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.draft_block import DISTILLED  # noqa: E402
from benchmarks.gpu_decode import SHAPES  # noqa: E402
from benchmarks.gpu_speed import cuda_median_ms, tree_specs  # noqa: E402
from dfvg.gpu.fast import DeviceStep  # noqa: E402
from dfvg.gpu.graph_drafter import GraphDrafter  # noqa: E402
from dfvg.gpu.graphs import GraphVerifier  # noqa: E402
from dfvg.gpu.tree_device import DeviceTreeStep  # noqa: E402
from dfvg.model import Transformer  # noqa: E402
from dfvg.tree import TreeSpec  # noqa: E402

CONTEXT, CACHE, REPLAYS = 300, 2048, 20


def models(device: str, tiny: bool) -> tuple[Transformer, Transformer]:
    """(target, draft) with random weights (as `gpu_decode.random_model`; the draft's head over a random sorted
    token subset, as `draft_block.draft_of`): the real shapes, or --tiny ones; bf16 on CUDA, fp32 on a CPU."""
    target_cfg, draft_cfg = SHAPES["qwen2.5-coder-1.5b"], DISTILLED
    if tiny:
        small = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2, head_dim=16)
        target_cfg = dataclasses.replace(target_cfg, **small)
        draft_cfg = dataclasses.replace(draft_cfg, **small, head_vocab_size=128)
    torch.manual_seed(0)
    out = []
    for cfg in (target_cfg, draft_cfg):
        model = Transformer(cfg)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.uniform_(0.8, 1.2) if name.endswith("norm.weight") else p.normal_(0.0, 0.02)
            if cfg.head_vocab_size:
                model.head_token_ids.copy_(torch.randperm(cfg.vocab_size)[: cfg.head_vocab_size].sort().values)
                model.token_rows.copy_(torch.searchsorted(model.head_token_ids, torch.arange(cfg.vocab_size))
                                       .clamp(max=cfg.head_vocab_size - 1))
        out.append(model.to(device=device, dtype=torch.bfloat16 if device == "cuda" else torch.float32).eval())
    return out[0], out[1]


def steps(target: Transformer, draft: Transformer, trees: list[TreeSpec], k: int, device: str) -> dict:
    """name -> (replay function, the step object), every step prefilled with the same random context."""
    fused = device == "cuda"
    verifier = GraphVerifier(target, compile_blocks=False, cache_len=CACHE, fused_layers=fused)
    drafter = GraphDrafter(draft, target.config.vocab_size, compile_blocks=False, cache_len=CACHE, fused_layers=fused)
    context = torch.randint(0, target.config.vocab_size, (CONTEXT,), generator=torch.Generator().manual_seed(0))
    out = {f"chain k={k}": DeviceStep(verifier, drafter, k)}
    out |= {f"tree {spec.label()} depth {k}": DeviceTreeStep(verifier, drafter, spec, k) for spec in trees}
    for step in out.values():
        step.prefill(context.tolist(), CACHE // 2)
    return {name: (step.rows.graph.replay if isinstance(step, DeviceStep) else step.graph.replay)
            for name, step in out.items()}


VIEWS = {"view", "_unsafe_view", "_reshape_alias", "slice", "select", "expand", "t", "transpose", "unsqueeze",
         "squeeze", "permute", "alias", "detach", "as_strided", "unbind", "split", "lift_fresh"}  # no kernel


class OpCounter(TorchDispatchMode):
    """Counts the aten ops a CPU replay dispatches (views left out): the launches a captured step would hold."""

    def __init__(self):
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in VIEWS:
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))


def kernels(replay, device: str) -> tuple[float, list[dict]]:
    """(launches per step, [{kernel, us_per_step, per_step}] by device time): one profiled set of replays
    (on a CPU: the dispatched ops per step, with no time)."""
    if device != "cuda":
        with OpCounter() as counter:
            for _ in range(REPLAYS):
                replay()
        rows = [{"kernel": name, "us_per_step": None, "per_step": n / REPLAYS} for name, n in counter.counts.items()]
        rows.sort(key=lambda r: -r["per_step"])
        return sum(r["per_step"] for r in rows), rows
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPLAYS):
            replay()
        torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        us = getattr(event, "self_device_time_total", 0) or getattr(event, "self_cuda_time_total", 0)
        if us > 0:
            rows.append({"kernel": event.key, "us_per_step": us / REPLAYS, "per_step": event.count / REPLAYS})
    rows.sort(key=lambda r: -r["us_per_step"])
    return sum(r["per_step"] for r in rows), rows


def measure(replays: dict, device: str, rounds: int) -> list[dict]:
    times = {name: [] for name in replays}
    if device == "cuda":
        for _ in range(rounds):  # alternating rounds: every step sees the same clocks
            for name, replay in replays.items():
                times[name].append(cuda_median_ms(replay, REPLAYS))
    out = []
    for name, replay in replays.items():
        launches, by_kernel = kernels(replay, device)
        ms = statistics.median(times[name]) if times[name] else None
        out.append({"step": name, "ms": ms, "launches_per_step": launches, "kernels": by_kernel})
    chain = out[0]
    for row in out:
        row["ms_over_chain"] = row["ms"] / chain["ms"] if row["ms"] else None
        row["extra_launches_over_chain"] = row["launches_per_step"] - chain["launches_per_step"]
        top = "; ".join(f"{r['kernel'][:32]} {r['per_step']:.0f}x" for r in row["kernels"][:4])
        timing = f"{row['ms']:.3f} ms ({row['ms_over_chain']:.2f}x chain), " if row["ms"] else ""
        print(f"  {row['step']:28s} {timing}{row['launches_per_step']:.0f} launches/step "
              f"({row['extra_launches_over_chain']:+.0f}); top: {top}", flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for tree_step.json")
    p.add_argument("--trees", default="dynamic:15 dynamic:31 2,2,1,1", type=tree_specs,
                   help="tree shapes, space-separated (as gpu_speed.py --trees)")
    p.add_argument("--k", type=int, default=4, help="the chain's draft length and the trees' depth")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="small shapes (the CPU smoke run)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("tree_step.py needs a CUDA GPU for timings (this machine has none): --device cpu --tiny counts ops")
    target, draft = models(args.device, args.tiny)
    result = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__,
              "weights": "random (timing only)", "shapes": "tiny" if args.tiny else "1.5B target, 4 x 512 draft",
              "provenance": "measured", "context": CONTEXT,
              "rows": measure(steps(target, draft, args.trees, args.k, args.device), args.device, args.rounds)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tree_step.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out / 'tree_step.json'}")


if __name__ == "__main__":
    main()
