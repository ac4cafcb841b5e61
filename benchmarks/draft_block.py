"""A GPU draft's greedy block per block-size table, side by side in one process.

    python benchmarks/draft_block.py --out $OUT        # on the H200: draft_block.json, a table on stdout

Random bf16 weights with the draft shapes DFVG ships or downloads (timing depends on the shapes only): the
distilled FPGA-sized draft (4 layers of 512, a 32k-row head over a token subset, embedding rows tied to it;
the default) and the 0.5B draft (24 layers of 896, the full head; no table entry of its own yet, so both
tables are the same and it is skipped, until a sweep adds some). For k tokens after a context of 200 or 2000, the
drafter's own draft graph (`dfvg.gpu.graph_drafter.draft_graph`: what `GraphDrafter.propose` replays and what the
device step embeds) is captured once per table and timed by CUDA events in alternating rounds (median over
rounds of the median of 20 replays):
- shipped: `block_sizes.TUNED` as shipped (the distilled draft's shapes without split-K);
- split_k: `linear_config`'s default for every draft shape (split-K where a launch has few weight blocks).
`same_drafts`: both tables drafted the same tokens from the same state (the summation order differs, so a
near-tie may not).

History: a persistent kernel that ran the whole block in one launch, with grid barriers between phases, was
measured with this script and removed (benchmarks/RESULTS.md, 2026-12-04 20:00-20:30 UTC; commit da5bcaf).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import gpu_rows  # noqa: E402
from benchmarks.gpu_decode import SHAPES, random_model  # noqa: E402
from benchmarks.gpu_report import copy_tb_s  # noqa: E402
from benchmarks.gpu_speed import cuda_median_ms  # noqa: E402
from dfvg.gpu import block_sizes  # noqa: E402
from dfvg.gpu.graph_drafter import GraphDrafter, draft_graph  # noqa: E402
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


class _Block:
    """A drafter's captured block for k drafts under one block-size table: state [1, 3] in, drafts [1, k] out."""

    def __init__(self, drafter: GraphDrafter, k: int, table: dict):
        shipped = dict(block_sizes.TUNED)
        block_sizes.TUNED.clear()
        block_sizes.TUNED.update(table)  # the launches' sizes are fixed when the graph is captured
        try:
            graph = draft_graph(drafter.gm, k, VOCAB)
        finally:
            block_sizes.TUNED.clear()
            block_sizes.TUNED.update(shipped)
        self.state, self.drafts, self.graph = graph.state, graph.drafts, graph.graph


def tables_for(model) -> dict[str, dict]:
    """The two tables: as shipped, and without an entry for any of this draft's GEMV shapes (`gpu_rows.shapes`:
    the (N, K) each fused launch looks up)."""
    shapes = {(n, k) for n, k, _ in gpu_rows.shapes(model.config).values()}
    return {"shipped": dict(block_sizes.TUNED),
            "split_k": {shape: c for shape, c in block_sizes.TUNED.items() if shape not in shapes}}


def measure(name: str, cfg: ModelConfig, rounds: int) -> list[dict]:
    model = draft_of(cfg)
    tables = tables_for(model)
    if tables["shipped"] == tables["split_k"]:
        print(f"  {name}: no table entry for its shapes, so both tables are linear_config's; skipped", flush=True)
        return []
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    context = torch.randint(0, VOCAB, (max(CONTEXTS) + 1,)).tolist()
    blocks = {}
    for mode, table in tables.items():  # a drafter per table: draft graphs are kept per drafter
        drafter = GraphDrafter(model, VOCAB, compile_blocks=False, cache_len=CACHE)
        drafter.prefill(context, CACHE)  # the same cache (the model's) and context for both
        for k in KS:
            blocks[mode, k] = _Block(drafter, k, table)
    modes = list(tables)
    rows = []
    for context_len in CONTEXTS:
        for k in KS:
            drafts = {}
            for mode in modes:
                block = blocks[mode, k]
                block.state.copy_(torch.tensor([[11, 12, context_len - 1]]))
                block.graph.replay()
                drafts[mode] = block.drafts.clone()
            times = {mode: [] for mode in modes}
            for _ in range(rounds):
                for mode in modes:
                    times[mode].append(cuda_median_ms(blocks[mode, k].graph.replay, 20))
            row = {"draft": name, "context": context_len, "k": k,
                   "weight_floor_ms": k * weight_bytes / (copy_tb_s(torch.cuda.get_device_name()) * 1e9),
                   **{f"{mode}_ms": statistics.median(times[mode]) for mode in modes},
                   "same_drafts": bool(torch.equal(*drafts.values()))}
            row["shipped_over_split_k"] = row["shipped_ms"] / row["split_k_ms"]
            rows.append(row)
            print(f"  {name:18s} ctx {context_len:5d} k {k}: shipped {row['shipped_ms']:.3f} ms, split-K "
                  f"{row['split_k_ms']:.3f} ms ({row['shipped_over_split_k']:.3f}x), weights alone "
                  f"{row['weight_floor_ms']:.3f} ms, same drafts {row['same_drafts']}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for draft_block.json")
    p.add_argument("--drafts", default="distilled-4x512", help=f"comma-separated of {', '.join(DRAFTS)}")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds per row (default 5)")
    args = p.parse_args(argv)
    unknown = [d for d in args.drafts.split(",") if d not in DRAFTS]
    if unknown:
        p.error(f"unknown draft shape {unknown[0]!r}; choose from {', '.join(DRAFTS)}")
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: give at least 1")
    if not torch.cuda.is_available():
        sys.exit("draft_block.py needs a CUDA GPU (this machine has none)")
    block_sizes.adopt_gpu_table(torch.cuda.get_device_name())  # this GPU's rows before any copy of the table
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "weights": "random (timing only)",
              "provenance": "measured", "rows": []}
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.drafts.split(","):
        result["rows"] += measure(name, DRAFTS[name], args.rounds)
        torch.cuda.empty_cache()
        (args.out / "draft_block.json").write_text(json.dumps(result, indent=1))  # after each draft: kept if cut
    print(f"wrote {args.out / 'draft_block.json'}")


if __name__ == "__main__":
    main()
