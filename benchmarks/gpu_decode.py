"""Anatomy of one decode step on the GPU: compiled blocks vs fused Triton layers, per kernel and per shape.

    python benchmarks/gpu_decode.py --out $OUT            # on the H200; writes gpu_decode.json
    python benchmarks/gpu_decode.py --sweep               # also sweep the GEMV block sizes per shape

Why a separate script: the end-to-end benchmark (gpu_speed.py) needs the real checkpoints, which take
minutes to carry to the GPU machine; decode *speed* depends only on the shapes. Here the models have the
exact shapes of the Qwen2.5-Coder 1.5B target and 0.5B draft with random bf16 weights (timing only; the
token-level results stay in gpu_speed.py). What it measures (CUDA events around graph replays, medians):

1. correctness of the fused layers against the eager-kernel forward (logits, next-token agreement,
   K/V written into the cache) at T = 1, 5, 9;
2. one target/draft graph replay per T for graphs over eager kernels, compiled blocks and fused layers;
3. each weight-streaming GEMV shape alone: cuBLAS (F.linear) vs the fused kernel, microseconds and the
   achieved bandwidth (a graph of 28 back-to-back launches, as in a real step);
4. a torch.profiler kernel table of one T = 1 replay of each forward.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_speed import cuda_median_ms  # noqa: E402
from dfvg.gpu import fused  # noqa: E402
from dfvg.gpu.graphs import GraphModel, capture_graph, graph_prefill, token_graph  # noqa: E402
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


def apply_best(results: list[dict]) -> dict:
    """Put each shape's fastest swept config into fused.TUNED (what the replays below then use)."""
    best: dict[tuple, dict] = {}
    for r in results:
        key = (r["shape"], r["T"])
        if "us" in r and r.get("config") and (key not in best or r["us"] < best[key]["us"]):
            best[key] = r
    fused.apply_tuned([[r["n"], r["k"], fused.rows_bucket(r["T"]), r["config"]] for r in best.values()])
    return {f"{shape} T={t}": {"config": r["config"], "us": r["us"]} for (shape, t), r in best.items()}


def forwards(model: Transformer, quick: bool) -> dict[str, GraphModel]:
    gms = {"graphs_compiled": GraphModel(model, compile_blocks=True, fused_layers=False),
           "graphs_fused": GraphModel(model, compile_blocks=False, fused_layers=True),
           "graphs_fused_cublas_w2_verify": GraphModel(model, compile_blocks=False, fused_layers=True)}
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
        fused.CUBLAS_DOWN_PROJECTION = not name.endswith("fused")
        for t in ts:
            runner = token_graph(gm, [0] * t, start, last_only=False)
            out[f"{name}_T{t}_ms"] = cuda_median_ms(runner.graph.replay)
        print(f"  {name}: " + ", ".join(f"T={t} {out[f'{name}_T{t}_ms']:.3f} ms" for t in ts), flush=True)
    fused.CUBLAS_DOWN_PROJECTION = True
    return out


def gemv_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int, dict]]:
    d, i, qkv = cfg.hidden_size, cfg.intermediate_size, cfg.qkv_size
    return {"wo": (d, cfg.num_heads * cfg.head_dim, {"residual": True}),
            "w13": (2 * i, d, {"norm": True, "swiglu": True}), "w2": (d, i, {"residual": True}),
            "lm_head": (cfg.vocab_size, d, {"norm": True, "out_dtype": torch.float32}), "wqkv": (qkv, d, {})}


def rotating(call, weights: list) -> callable:
    """A launcher that takes the next weight copy on every call, so L2 never holds the matrix it streams."""
    state = {"i": 0}

    def launch():
        state["i"] += 1
        return call(weights[state["i"] % len(weights)])

    return launch


def sweep_configs(rows: int, quick: bool = False) -> list[dict]:
    if quick:
        if rows == 1:
            return [{"BN": bn, "BK": bk, "UNROLL": u, "num_warps": w} for bn, bk, u, w in
                    ((2, 1024, 2, 4), (4, 512, 1, 4), (4, 512, 2, 4), (4, 512, 4, 4), (4, 1024, 2, 4),
                     (8, 512, 2, 4), (8, 1024, 1, 4), (4, 512, 2, 8), (8, 512, 2, 8), (4, 256, 4, 4),
                     (2, 512, 3, 4), (4, 512, 3, 4), (8, 512, 3, 8))]
        return [{"BN": bn, "BK": bk, "UNROLL": 1, "num_warps": 4} for bn in (16, 32) for bk in (128, 256)]
    if rows == 1:
        grid = [{"BN": bn, "BK": bk, "UNROLL": u, "num_warps": 4} for bn in (2, 4, 8) for bk in (512, 1024)
                for u in (1, 2, 4)]
        return grid + [{"BN": 4, "BK": 512, "UNROLL": 2, "num_warps": 2}, {"BN": 2, "BK": 1024, "UNROLL": 2,
                                                                            "num_warps": 2}]
    return [{"BN": bn, "BK": bk, "UNROLL": u, "num_warps": 4} for bn in (16, 32) for bk in (128, 256) for u in (1, 2)]


def label_of(config: dict | None) -> str:
    if config is None:
        return "fused default"
    return f"fused BN{config['BN']} BK{config['BK']} U{config['UNROLL']} w{config['num_warps']}"


def gemv_bench(cfg: ModelConfig, rows: int, sweep: bool, quick: bool = False) -> list[dict]:
    """Each GEMV shape alone, 28 launches per graph: cuBLAS F.linear vs fused_linear configs."""
    results = []
    for name, (n, k, opts) in gemv_shapes(cfg).items():
        if quick and name == "wqkv":
            continue
        copies = max(2, min(28, -(-240_000_000 // (n * k * 2))))  # more bytes than L2 (50 MB) between reuses
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        out_n = n // 2 if opts.get("swiglu") else n  # the N that fused_linear (and fused.TUNED) sees
        res = torch.randn(rows, out_n, device="cuda", dtype=torch.bfloat16)
        g = torch.ones(k, device="cuda", dtype=torch.bfloat16)
        kwargs = {"norm": g if opts.get("norm") else None, "residual": res if opts.get("residual") else None,
                  "swiglu": opts.get("swiglu", False), "out_dtype": opts.get("out_dtype")}
        variants = {"cublas": rotating(lambda w, x=x: F.linear(x, w), weights)}
        for config in [None] + (sweep_configs(rows, quick) if sweep else []):
            label = label_of(config)
            results.append({"shape": name, "T": rows, "variant": label, "config": config, "n": out_n, "k": k})
            variants[label] = rotating(
                lambda w, x=x, config=config, kwargs=kwargs: fused.fused_linear(x, w, config=config, **kwargs),
                weights)
        for label, fn in variants.items():
            row = next((r for r in results if r["shape"] == name and r["T"] == rows and r["variant"] == label), None)
            if row is None:
                row = {"shape": name, "T": rows, "variant": label, "n": out_n, "k": k}
                results.append(row)
            try:
                graph = graph_of(fn, 28)
                us = cuda_median_ms(graph.replay, 20) * 1000 / 28
            except Exception as exc:  # a config Triton cannot compile is a sweep result, not a crash
                row["error"] = str(exc)[:200]
                continue
            row.update(us=us, TB_s=n * k * 2 / us / 1e6)
            del graph
        mine = [r for r in results if r["shape"] == name and r["T"] == rows and "us" in r]
        best = min((r for r in mine if r["variant"] != "cublas"), key=lambda r: r["us"])
        base = next(r for r in mine if r["variant"] == "cublas")
        print(f"  {name:8s} T={rows} {n}x{k}: cublas {base['us']:.1f} us ({base['TB_s']:.2f} TB/s), best fused "
              f"{best['variant']} {best['us']:.1f} us ({best['TB_s']:.2f} TB/s)", flush=True)
    return results


def qkv_bench(cfg: ModelConfig, rows: int) -> list[dict]:
    """The fused RMSNorm+QKV+RoPE+cache-write launch alone per config (28 launches per graph)."""
    d, hd = cfg.hidden_size, cfg.head_dim
    dims = (cfg.num_heads, cfg.num_kv_heads, hd, cfg.intermediate_size, cfg.rms_norm_eps)
    weights = [torch.randn(cfg.qkv_size, d, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(28)]
    bias = torch.zeros(cfg.qkv_size, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(rows, d, device="cuda", dtype=torch.bfloat16)
    g = torch.ones(d, device="cuda", dtype=torch.bfloat16)
    pos = torch.arange(400, 400 + rows, device="cuda")
    cos, sin = torch.randn(CACHE, hd, device="cuda"), torch.randn(CACHE, hd, device="cuda")
    kc = torch.zeros(CACHE, cfg.num_kv_heads, hd, device="cuda", dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    configs = [None] + ([{"BN": 2, "BK": 1024, "UNROLL": 2, "num_warps": 4}, {"BN": 4, "BK": 512, "UNROLL": 2,
                                                                            "num_warps": 4}] if rows == 1 else
                        [{"BN": 16, "BK": 128, "UNROLL": 1, "num_warps": 4},
                         {"BN": 16, "BK": 256, "UNROLL": 2, "num_warps": 4},
                         {"BN": 32, "BK": 128, "UNROLL": 1, "num_warps": 4},
                         {"BN": 16, "BK": 512, "UNROLL": 1, "num_warps": 8}])
    out = []
    for config in configs:
        fn = rotating(lambda w, config=config: fused.qkv_rope(x, g, w, bias, pos, cos, sin, kc, vc, dims, config),
                      weights)
        try:
            us = cuda_median_ms(graph_of(fn, 28).replay, 20) * 1000 / 28
        except Exception as exc:
            out.append({"T": rows, "variant": label_of(config), "error": str(exc)[:200]})
            continue
        out.append({"T": rows, "variant": label_of(config), "config": config, "us": us})
        print(f"  qkv_rope T={rows} {label_of(config)}: {us:.1f} us", flush=True)
    return out


def prefill_times(cfg: ModelConfig, length: int = 150) -> dict:
    """Prefill of a `length`-token prompt: eager feed vs 16-token chunks through the fused T=16 graph."""
    model = random_model(cfg)
    gm = GraphModel(model, compile_blocks=False, fused_layers=True)
    gm.ensure_cache(CACHE)
    ids = torch.randint(0, cfg.vocab_size, (length,)).tolist()
    with torch.inference_mode():
        graph_prefill(gm, ids)  # capture
        eager = cuda_median_ms(lambda: model.feed(ids, 0, last_only=True), 5)
        chunked = cuda_median_ms(lambda: graph_prefill(gm, ids), 5)
    print(f"  prefill {length} tokens: eager {eager:.1f} ms, fused 16-token graph chunks {chunked:.1f} ms", flush=True)
    return {"tokens": length, "eager_ms": eager, "graph_chunks_ms": chunked}


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
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--models", default=",".join(SHAPES))
    p.add_argument("--quick", action="store_true", help="a smaller sweep, fused forwards only")
    p.add_argument("--qkv-only", action="store_true", help="only prefill timing and the QKV+RoPE launch per config")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("gpu_decode.py needs a CUDA GPU (this machine has none)")
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "weights": "random (timing only)",
              "cache_slots": CACHE, "position": POSITION}
    if args.qkv_only:
        result["prefill"] = {name: prefill_times(cfg) for name, cfg in SHAPES.items()}
        result["qkv"] = [r for t in (1, 5, 9) for r in qkv_bench(SHAPES["qwen2.5-coder-1.5b"], t)]
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gpu_decode_qkv.json").write_text(json.dumps(result, indent=1))
        return
    for name in args.models.split(","):
        cfg = SHAPES[name]
        print(f"{name}:", flush=True)
        entry = {}
        if name == "qwen2.5-coder-1.5b":
            entry["gemv"] = [r for t in (1, 5, 9) for r in gemv_bench(cfg, t, args.sweep, args.quick)]
            entry["tuned"] = apply_best(entry["gemv"]) if args.sweep else {}
            print(f"  tuned: {entry['tuned']}", flush=True)
        model = random_model(cfg)
        gms = forwards(model, args.quick)
        entry |= {"check": check(model, gms), "replay": replay_times(model, gms),
                 "weight_bytes": sum(p.numel() * 2 for n, p in model.named_parameters()
                                     if n != "tok_embeddings.weight" or cfg.tie_word_embeddings)}
        entry["kernels"] = {label: kernel_table(gms[label], label) for label in ("graphs_compiled", "graphs_fused")
                            if label in gms}
        entry["kernels_T5"] = kernel_table(gms["graphs_fused_cublas_w2_verify"], "fused, cuBLAS w2 for T > 1", 5)
        result[name] = entry
        del gms, model
        torch.cuda.empty_cache()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "gpu_decode.json").write_text(json.dumps(result, indent=1))
    if args.sweep:  # gpu_speed.py --tuned applies the same block sizes to the real-model run
        (Path(args.out) / "tuned.json").write_text(json.dumps(fused.tuned_rows()))
    print(f"wrote {Path(args.out) / 'gpu_decode.json'}")


if __name__ == "__main__":
    main()
