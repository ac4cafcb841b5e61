"""Anatomy of one decode step on the GPU: compiled blocks vs fused Triton layers, per kernel and per shape.

    python benchmarks/gpu_decode.py --out $OUT            # on the H200; writes gpu_decode.json

Block sizes per weight shape, and T-row against one-row steps, are benchmarks/gpu_rows.py's.

Why a separate script: the end-to-end benchmark (gpu_speed.py) needs the real checkpoints, which take
minutes to carry to the GPU machine; decode *speed* depends only on the shapes. Here the models have the
exact shapes of the Qwen2.5-Coder 1.5B target and 0.5B draft with random bf16 weights (timing only; the
token-level results stay in gpu_speed.py). What it measures (CUDA events around graph replays, medians):

1. correctness of the fused layers against the eager-kernel forward (logits, next-token agreement,
   K/V written into the cache) at T = 1, 5, 9;
2. one target/draft graph replay per T for graphs over eager kernels, compiled blocks and fused layers;
3. a torch.profiler kernel table of one T = 1 (and a fused T = 5) replay of each forward;
4. prefill of prompts of 150 to 8,192 tokens: the fused 64-row graph chunks against one eager causal pass
   (`--prefill-only`: this part alone).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_speed import cuda_median_ms  # noqa: E402
from dfvg.gpu.graphs import LONG_PROMPT, GraphModel, capture_graph, graph_prefill, token_graph  # noqa: E402
from dfvg.model import ModelConfig, Transformer  # noqa: E402

SHAPES = {  # config.json facts of the pinned pair (models/*/config.json after scripts/download_models.py)
    "qwen2.5-coder-1.5b": ModelConfig(model_type="qwen2", vocab_size=151936, hidden_size=1536,
                                      intermediate_size=8960, num_layers=28, num_heads=12, num_kv_heads=2,
                                      head_dim=128, rope_theta=1e6, attention_bias=True),
    "qwen2.5-coder-0.5b": ModelConfig(model_type="qwen2", vocab_size=151936, hidden_size=896,
                                      intermediate_size=4864, num_layers=24, num_heads=14, num_kv_heads=2,
                                      head_dim=64, rope_theta=1e6, attention_bias=True, tie_word_embeddings=True),
}
CACHE = 1024
POSITION = 400  # typical HumanEval prompt + half the new tokens


def random_model(cfg: ModelConfig) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(cfg).to(device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.8, 1.2)
            else:
                p.normal_(0.0, 0.02)
    return model


def graph_of(body, repeat: int = 1) -> torch.cuda.CUDAGraph:
    """One CUDA graph of `repeat` back-to-back calls of body (warmed up first)."""
    return capture_graph(lambda: [body() for _ in range(repeat)], torch.device("cuda"))[0]


def forwards(model: Transformer, quick: bool) -> dict[str, GraphModel]:
    gms = {"graphs_compiled": GraphModel(model, compile_blocks=True, fused_layers=False),
           "graphs_fused": GraphModel(model, compile_blocks=False, fused_layers=True)}
    if quick:
        del gms["graphs_compiled"]
    else:
        gms["graphs_eager"] = GraphModel(model, compile_blocks=False, fused_layers=False)
    for gm in gms.values():
        gm.ensure_cache(CACHE)
    return gms


@torch.inference_mode()
def check(model: Transformer, gms: dict[str, GraphModel]) -> list[dict]:
    """Fused vs eager-kernel forward at POSITION with a random cache history, T = 1, 5, 9."""
    rows = []
    gms = {"reference": GraphModel(model, compile_blocks=False, fused_layers=False), **gms}
    gms["reference"].ensure_cache(CACHE)
    cache = [layer.attention.kv_cache for layer in model.layers]
    for c in cache:
        c.k.normal_()
        c.v.normal_()
    history = [(c.k.clone(), c.v.clone()) for c in cache]
    for t in (1, 5, 9):
        ids = torch.randint(0, model.config.vocab_size, (1, t), device="cuda")
        pos = torch.arange(POSITION, POSITION + t, device="cuda")
        outs, written = {}, {}
        for name in ("reference", "graphs_fused"):
            for c, (k, v) in zip(cache, history, strict=True):
                c.k.copy_(k)
                c.v.copy_(v)
            outs[name] = gms[name].forward(ids, pos).float()
            written[name] = torch.cat([c.k[0, POSITION:POSITION + t].flatten() for c in cache]).float()
        ref, got = outs["reference"], outs["graphs_fused"]
        rows.append({"T": t, "logits_rel_diff": ((got - ref).norm() / ref.norm()).item(),
                     "argmax_agree": (got.argmax(-1) == ref.argmax(-1)).float().mean().item(),
                     "k_cache_rel_diff": ((written["graphs_fused"] - written["reference"]).norm()
                                          / written["reference"].norm()).item()})
        print(f"  check T={t}: {rows[-1]}", flush=True)
    return rows


def replay_times(model: Transformer, gms: dict[str, GraphModel], ts=(1, 5, 9)) -> dict:
    start = gms["graphs_fused"].scratch_pos - 40
    out = {}
    for name, gm in gms.items():
        for t in ts:
            runner = token_graph(gm, [0] * t, start, last_only=False)
            out[f"{name}_T{t}_ms"] = cuda_median_ms(runner.graph.replay)
        print(f"  {name}: " + ", ".join(f"T={t} {out[f'{name}_T{t}_ms']:.3f} ms" for t in ts), flush=True)
    return out


def rotating(call, weights: list) -> callable:
    """A launcher that takes the next weight copy on every call, so L2 never holds the matrix it streams."""
    state = {"i": 0}

    def launch():
        state["i"] += 1
        return call(weights[state["i"] % len(weights)])

    return launch


# prompt lengths timed: the 20 held-out HumanEval prompts the speed runs take are 43-188 tokens (median 100, chat
# template included), where the product prefills in 64-row graph chunks; `graphs.LONG_PROMPT` (512, estimated) is the
# crossover to one cuBLAS pass that these lengths check
PREFILL_LENGTHS = (64, 128, 192, 384, 512, 2048, 8192)


def prefill_times(cfg: ModelConfig, lengths: tuple[int, ...] = PREFILL_LENGTHS) -> list[dict]:
    """Prefill of prompts of each length, three ways in one process: the fused 64-row graph chunks
    (`graph_prefill`), one eager pass with causal attention over the prompt's own slots (`run_layers(
    causal_prefix=True)`: cuBLAS GEMMs over every row, SDPA), and what `GraphModel.prefill` picks (the product
    path; `LONG_PROMPT` decides). The crossover sets LONG_PROMPT (issue 16: prefill at least at cuBLAS speed)."""
    model = random_model(cfg)
    gm = GraphModel(model, compile_blocks=False, fused_layers=True)
    gm.ensure_cache(max(lengths) + 64)
    return [prefill_row(gm, torch.randint(0, cfg.vocab_size, (length,)).tolist()) for length in lengths]


@torch.inference_mode()
def prefill_row(gm: GraphModel, ids: list[int]) -> dict:
    model, pos = gm.model, torch.arange(len(ids), device="cuda")[None]

    def one_pass():
        return model.run_layers(model.embed(torch.tensor([ids], device="cuda")), pos, causal_prefix=True)

    graph_prefill(gm, ids)  # capture
    row = {"tokens": len(ids), "graph_chunks_ms": cuda_median_ms(lambda: graph_prefill(gm, ids), 5),
           "one_causal_pass_ms": cuda_median_ms(one_pass, 5), "product_ms": cuda_median_ms(lambda: gm.prefill(ids), 5),
           "long_prompt": LONG_PROMPT}
    print(f"  prefill {len(ids):5d} tokens: 64-row graph chunks {row['graph_chunks_ms']:7.1f} ms, one causal pass "
          f"{row['one_causal_pass_ms']:7.1f} ms, GraphModel.prefill {row['product_ms']:7.1f} ms", flush=True)
    return row


def kernel_table(gm: GraphModel, label: str, t: int = 1) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    runner = token_graph(gm, [0] * t, gm.scratch_pos - 40, last_only=False)
    runner.graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            runner.graph.replay()
        torch.cuda.synchronize()
    rows = [{"kernel": e.key[:90], "count_per_step": e.count / 5, "us_per_step": e.device_time_total / 5}
            for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(key=lambda r: -r["us_per_step"])
    total = sum(r["us_per_step"] for r in rows)
    launches = sum(r["count_per_step"] for r in rows)
    print(f"  {label}: {launches:.0f} kernels per T={t} step, {total:.0f} us of kernel time; top 8:")
    for r in rows[:8]:
        print(f"    {r['us_per_step']:8.1f} us  x{r['count_per_step']:5.0f}  {r['kernel']}")
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=".")
    p.add_argument("--models", default=",".join(SHAPES))
    p.add_argument("--quick", action="store_true", help="fused and compiled forwards only (no eager graphs)")
    p.add_argument("--prefill-only", action="store_true", help="only part 4, the prefill paths")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("gpu_decode.py needs a CUDA GPU (this machine has none)")
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "weights": "random (timing only)",
              "cache_slots": CACHE, "position": POSITION, "prefill": {}}
    for name in args.models.split(","):
        cfg = SHAPES[name]
        print(f"{name}:", flush=True)
        if args.prefill_only:
            result["prefill"][name] = prefill_times(cfg)
            continue
        model = random_model(cfg)
        gms = forwards(model, args.quick)
        entry = {"check": check(model, gms), "replay": replay_times(model, gms),
                 "weight_bytes": sum(p.numel() * 2 for n, p in model.named_parameters()
                                     if n != "tok_embeddings.weight" or cfg.tie_word_embeddings)}
        entry["kernels"] = {label: kernel_table(gms[label], label) for label in ("graphs_compiled", "graphs_fused")
                            if label in gms}
        entry["kernels_T5"] = kernel_table(gms["graphs_fused"], "fused, T = 5", 5)
        result[name] = entry
        del gms, model
        torch.cuda.empty_cache()
        result["prefill"][name] = prefill_times(cfg)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "gpu_decode.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {Path(args.out) / 'gpu_decode.json'}")


if __name__ == "__main__":
    main()
