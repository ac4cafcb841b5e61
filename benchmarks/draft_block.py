"""A GPU draft's greedy block in one launch (`dfvg.gpu.draft_megakernel`) against the per-launch fused steps,
side by side in one process.

    python benchmarks/draft_block.py --out $OUT        # on the H200: draft_block.json, a table on stdout

Random bf16 weights with the draft shapes DFVG ships or downloads (timing depends on the shapes only):
the distilled FPGA-sized draft (4 layers of 512, a 32k-row head over a token subset, embedding rows tied to
it) and the 0.5B draft (24 layers of 896, the full head). Each row is the drafter's own captured draft
graph (`dfvg.gpu.graphs.draft_graph`: what `GraphDrafter.propose` replays and what the device step embeds)
for k tokens after a context of 200 or 2000, with the one-launch block on and off, timed by CUDA events in
alternating rounds (median over rounds of the median of 20 replays). `same_drafts`: both ways drafted the
same tokens from the same state.
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

from benchmarks.gpu_decode import SHAPES, random_model  # noqa: E402
from benchmarks.gpu_report import COPY_TB_S  # noqa: E402
from benchmarks.gpu_speed import cuda_median_ms  # noqa: E402
from dfvg.gpu import draft_megakernel  # noqa: E402
from dfvg.gpu.graphs import GraphDrafter, draft_graph  # noqa: E402
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


def graphs_of(model, one_launch: bool) -> dict[int, object]:
    """A drafter's captured block graphs for every k, made with the one-launch block on or off."""
    draft_megakernel.ENABLED = one_launch
    try:
        drafter = GraphDrafter(model, VOCAB, compile_blocks=False, cache_len=CACHE)
        drafter.prefill(torch.randint(0, VOCAB, (max(CONTEXTS) + 1,)).tolist(), CACHE)
        return {k: draft_graph(drafter.gm, k, VOCAB) for k in KS}
    finally:
        draft_megakernel.ENABLED = True


def measure(name: str, cfg: ModelConfig, rounds: int) -> list[dict]:
    model = draft_of(cfg)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    modes = {"per_launch": graphs_of(model, False), "one_launch": graphs_of(model, True)}
    rows = []
    for context in CONTEXTS:
        for k in KS:
            drafts = {}
            for mode, graphs in modes.items():
                graphs[k].state.copy_(torch.tensor([[11, 12, context - 1]]))
                graphs[k].graph.replay()
                drafts[mode] = graphs[k].drafts.clone()
            times = {mode: [] for mode in modes}
            for _ in range(rounds):
                for mode, graphs in modes.items():
                    times[mode].append(cuda_median_ms(graphs[k].graph.replay, 20))
            ms = {mode: statistics.median(t) for mode, t in times.items()}
            rows.append({"draft": name, "context": context, "k": k, "per_launch_ms": ms["per_launch"],
                         "one_launch_ms": ms["one_launch"], "ratio": ms["one_launch"] / ms["per_launch"],
                         "one_launch_ms_per_token": ms["one_launch"] / k,
                         "weight_floor_ms_per_token": weight_bytes / (COPY_TB_S * 1e9),
                         "same_drafts": bool(torch.equal(drafts["per_launch"], drafts["one_launch"]))})
            r = rows[-1]
            print(f"  {name:18s} ctx {context:5d} k {k}: per-launch {r['per_launch_ms']:.3f} ms, one launch "
                  f"{r['one_launch_ms']:.3f} ms ({r['ratio']:.2f}x), {r['one_launch_ms_per_token'] * 1e3:.0f} us/token "
                  f"(weights alone {r['weight_floor_ms_per_token'] * 1e3:.0f}), same drafts {r['same_drafts']}",
                  flush=True)
    return rows


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
    for name in args.drafts.split(","):
        result["rows"] += measure(name, DRAFTS[name], args.rounds)
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "draft_block.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out / 'draft_block.json'}")


if __name__ == "__main__":
    main()
