"""A GPU draft's greedy block in one launch (`dfvg.gpu.draft_megakernel`) against the per-launch fused steps,
side by side in one process.

    python benchmarks/draft_block.py --out $OUT        # on the H200: draft_block.json, a table on stdout

Random bf16 weights with the draft shapes DFVG ships or downloads (timing depends on the shapes only):
the distilled FPGA-sized draft (4 layers of 512, a 32k-row head over a token subset, embedding rows tied to
it) and the 0.5B draft (24 layers of 896, the full head). For k tokens after a context of 200 or 2000, each
mode's block is captured in a CUDA graph and timed by CUDA events in alternating rounds (median over rounds
of the median of 20 replays):
- per_launch: the drafter's draft graph with the block kernel off (`draft_graph`, ~30 launches a token);
- per_launch_no_split_k: the same with `latency_config` block sizes (the control for the one below);
- one_launch_launch_sizes: the block kernel with the per-launch block sizes (split-K as the launches have it;
  the drafts must equal per_launch's bit for bit);
- one_launch_no_split_k: with `latency_config` block sizes (shipped).
`*_same_drafts_as_per_launch` says which drafts matched. Also the grid barrier alone (`barrier_us`).
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
from benchmarks.gpu_report import COPY_TB_S  # noqa: E402
from benchmarks.gpu_speed import cuda_median_ms  # noqa: E402
from dfvg.gpu import block_sizes, draft_megakernel  # noqa: E402
from dfvg.gpu.graphs import GraphDrafter, capture_graph, draft_graph  # noqa: E402
from dfvg.gpu.kernels import HAVE_TRITON  # noqa: E402
from dfvg.model import ModelConfig  # noqa: E402

VOCAB = 151936
DISTILLED = ModelConfig(model_type="qwen2", vocab_size=VOCAB, hidden_size=512, intermediate_size=1536, num_layers=4,
                        num_heads=8, num_kv_heads=2, head_dim=64, rope_theta=1e6, attention_bias=True,
                        tie_word_embeddings=True, head_vocab_size=32768, embed_rows=True)
DRAFTS = {"distilled-4x512": DISTILLED, "qwen2.5-coder-0.5b": SHAPES["qwen2.5-coder-0.5b"]}
CONTEXTS = (200, 2000)
KS = (1, 2, 4, 6, 8)
CACHE = 4096


def draft_of(cfg: ModelConfig):
    """Random weights; a distilled draft's head over a random sorted token subset, as `dfvg.distill` builds."""
    model = random_model(cfg)
    if cfg.head_vocab_size:
        ids = torch.randperm(VOCAB, device="cuda")[: cfg.head_vocab_size].sort().values
        model.head_token_ids.copy_(ids)
        model.token_rows.copy_(torch.searchsorted(ids, torch.arange(VOCAB, device="cuda")).clamp(
            max=cfg.head_vocab_size - 1))
    return model


MODES = {  # name -> (one launch?, block sizes: "launch" = linear_config, "latency" = latency_config)
    "per_launch": (False, "launch"),
    "per_launch_no_split_k": (False, "latency"),
    "one_launch_launch_sizes": (True, "launch"),
    "one_launch_no_split_k": (True, "latency"),  # shipped
}


class _Block:
    """One mode's captured block for k drafts: state [1, 3] in, drafts [1, k] out."""

    def __init__(self, drafter: GraphDrafter, k: int, one_launch: bool, sizes: str):
        if not one_launch:  # the drafter's own draft graph, captured with these block sizes and the kernel off
            shipped = dict(block_sizes.TUNED)
            block_sizes.TUNED.update(draft_megakernel.gemv_configs(drafter.model, sizes))
            draft_megakernel.ENABLED = False
            try:
                graph = draft_graph(drafter.gm, k, VOCAB)
            finally:
                draft_megakernel.ENABLED = True
                block_sizes.TUNED.clear()
                block_sizes.TUNED.update(shipped)
            self.state, self.drafts, self.graph = graph.state, graph.drafts, graph.graph
            return
        self.state = torch.zeros(1, 3, dtype=torch.long, device="cuda")
        self.drafts = torch.zeros(1, k, dtype=torch.long, device="cuda")
        self.kernel = draft_megakernel.DraftMegakernel(drafter.model, k, VOCAB, gemv=sizes)  # kept: the graph
        self.graph, _ = capture_graph(lambda: self.kernel(self.state, self.drafts), drafter.device)  # uses its buffers


def measure(name: str, cfg: ModelConfig, rounds: int) -> list[dict]:
    model = draft_of(cfg)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    drafter = GraphDrafter(model, VOCAB, compile_blocks=False, cache_len=CACHE)
    drafter.prefill(torch.randint(0, VOCAB, (max(CONTEXTS) + 1,)).tolist(), CACHE)
    start = time.perf_counter()
    blocks = {}
    for mode, (one_launch, sizes) in MODES.items():
        own = drafter
        if not one_launch:
            own = GraphDrafter(model, VOCAB, compile_blocks=False, cache_len=CACHE)
            own.gm.ensure_cache(CACHE)  # the same cache tensors (the model's), already holding the context
        for k in KS:  # (a per-launch mode's drafter of its own: draft graphs are kept per drafter and k)
            blocks[mode, k] = _Block(own, k, one_launch, sizes)
        print(f"    {mode}: captured at {time.perf_counter() - start:.0f} s", flush=True)
    print(f"  {name}: {len(blocks)} blocks compiled and captured in {time.perf_counter() - start:.0f} s", flush=True)
    rows = []
    for context in CONTEXTS:
        for k in KS:
            drafts = {}
            for mode in MODES:
                block = blocks[mode, k]
                block.state.copy_(torch.tensor([[11, 12, context - 1]]))
                block.graph.replay()
                drafts[mode] = block.drafts.clone()
            times = {mode: [] for mode in MODES}
            for _ in range(rounds):
                for mode in MODES:
                    times[mode].append(cuda_median_ms(blocks[mode, k].graph.replay, 20))
            row = {"draft": name, "context": context, "k": k,
                   "weight_floor_ms_per_token": weight_bytes / (COPY_TB_S * 1e9)}
            for mode in MODES:
                row[f"{mode}_ms"] = statistics.median(times[mode])
                row[f"{mode}_same_drafts_as_per_launch"] = bool(torch.equal(drafts[mode], drafts["per_launch"]))
            rows.append(row)
            print(f"  {name:18s} ctx {context:5d} k {k}: " + ", ".join(
                f"{mode} {row[f'{mode}_ms']:.3f}" for mode in MODES) + f" ms; weights alone "
                f"{row['weight_floor_ms_per_token'] * k:.3f}; same drafts " + "".join(
                "y" if row[f"{mode}_same_drafts_as_per_launch"] else "n" for mode in MODES), flush=True)
    return rows


if HAVE_TRITON:
    import triton.language as tl
    from triton import jit

    from dfvg.gpu.draft_megakernel import _grid_barrier

    @jit
    def _barriers_kernel(bar_ptr, n):
        """n grid barriers and nothing else, then the block kernel's exit (both counters back to zero)."""
        nprog = tl.num_programs(0)
        for i in range(n):
            _grid_barrier(bar_ptr, (i + 1) * nprog)
        done = tl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu") == nprog - 1
        tl.atomic_xchg(bar_ptr, 0, mask=done)
        tl.atomic_xchg(bar_ptr + 1, 0, mask=done)


def barrier_us(programs: int, barriers: int = 1000) -> float:
    """Microseconds per grid barrier alone: one launch of `programs` programs passing `barriers` barriers with
    no work between them, less the same launch with none (the floor under each phase of the block)."""
    counter = torch.zeros(2, dtype=torch.int32, device="cuda")
    run = lambda n: _barriers_kernel[(programs,)](counter, n, num_warps=4)  # noqa: E731
    run(1)
    torch.cuda.synchronize()
    return (cuda_median_ms(lambda: run(barriers), 10) - cuda_median_ms(lambda: run(0), 10)) * 1e3 / barriers


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for draft_block.json")
    p.add_argument("--drafts", default=",".join(DRAFTS), help=f"comma-separated of {', '.join(DRAFTS)}")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds per row (default 5)")
    args = p.parse_args(argv)
    unknown = [d for d in args.drafts.split(",") if d not in DRAFTS]
    if unknown:
        p.error(f"unknown draft shape {unknown[0]!r}; choose from {', '.join(DRAFTS)}")
    if not torch.cuda.is_available():
        sys.exit("draft_block.py needs a CUDA GPU (this machine has none)")
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "weights": "random (timing only)",
              "provenance": "measured", "rows": []}
    result["barrier_us"] = {n: barrier_us(n) for n in (8, 32, 66, 132)}
    print(f"  grid barrier alone, us per barrier by programs: {result['barrier_us']}", flush=True)
    for name in args.drafts.split(","):
        result["rows"] += measure(name, DRAFTS[name], args.rounds)
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "draft_block.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out / 'draft_block.json'}")


if __name__ == "__main__":
    main()
