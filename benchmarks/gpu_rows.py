"""Cost of a T-row step against a one-row decode step, at growing contexts, and whether rows are batch-invariant.

    python benchmarks/gpu_rows.py --out $OUT                 # on the H200: writes gpu_rows.json (+ .png)
    python benchmarks/gpu_rows.py --sweep --out $OUT         # first sweep block sizes per weight shape
    python benchmarks/gpu_rows.py --modes-only --out $OUT    # only the launch-mode comparison (5.)

Random bf16 weights of the Qwen2.5-Coder-1.5B target's exact shapes (timing and bit-invariance depend on
the shapes only; token-level results are gpu_speed.py's). Each row is the product's own code path:
`GraphModel.forward` with the fused Triton layers, captured in one CUDA graph per (T, context) and timed
by CUDA events around replays (medians). What it measures:

1. `--sweep`: each weight shape's launch alone (28 copies in one graph, so L2 never holds the matrix) over
   block sizes, at T = 1 and T = 5 (`--sweep-rows`); the best (sum over the row counts) goes into
   `block_sizes.TUNED` for the rest of the run and into tuned.json (gpu_speed.py --tuned: the real pair);
2. the whole target step at T = 1 .. 64 rows at 512, 2k, 8k and 32k tokens of context: ms, the ratio to
   T = 1 at the same context, and the bytes streamed (weights + the K/V cache read) per second;
3. cuBLAS GEMMs of the same weight shapes for 1 / 5 / 16 / 64 rows in one graph (the physics beside it);
4. batch invariance on the whole model: logits of a T-row step against T one-row steps from the same
   cache, bit for bit (`rows_identical` per T);
5. code variants side by side (`gpu_modes.modes_of` lists them: the attention before, other tables, tile heights,
   the module switches flipped), at T = 1 .. 64 and contexts 512 and 32k in alternating rounds; whether every mode's
   logits equal the first mode's bit for bit; the faster block-size table on the whole step (fastest_tuned.json;
   among the modes with the shipped switches) is the one the rest of the run uses;
6. `--profile`: device time per kernel name in a replayed step at T = 1, 16, 64, contexts 512, 32,704.
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

from benchmarks.gpu_decode import SHAPES, graph_of, random_model, rotating  # noqa: E402
from benchmarks.gpu_modes import MODE_CONTEXTS, TALL_TILES, fastest_table, launch_modes  # noqa: E402
from benchmarks.gpu_report import copy_tb_s  # noqa: E402
from benchmarks.gpu_speed import cuda_median_ms  # noqa: E402
from dfvg.errors import OneLineParser, UserError  # noqa: E402
from dfvg.gpu import block_sizes, fused, gemv_stream  # noqa: E402
from dfvg.gpu.graphs import GraphModel, capture_graph  # noqa: E402

ROWS = (1, 2, 3, 5, 8, 9, 16, 17, 32, 64)
CONTEXTS = (512, 2048, 8192, 32704)  # 32k: the model's 32,768 less the graph model's scratch slots


def shapes(cfg) -> dict[str, tuple[int, int, dict]]:
    """name -> (N seen by the launch, K, fused_linear options) of a model's weight-streaming launches (the
    target's here; draft_block.py's drafts too, whose distilled head has its own rows)."""
    d, i = cfg.hidden_size, cfg.intermediate_size
    return {"wqkv": (cfg.qkv_size, d, {}), "wo": (d, cfg.num_heads * cfg.head_dim, {"residual": True}),
            "w13": (i, d, {"norm": True, "swiglu": True}), "w2": (d, i, {"residual": True}),
            "lm_head": (cfg.head_vocab_size or cfg.vocab_size, d, {"norm": True})}


def sweep_grid(n: int, k: int, norm: bool, space: dict[str, tuple[int, ...]] | None = None) -> list[dict]:
    """Block sizes to try: split-K where the output blocks alone leave SMs idle (< 4 per SM), every split with a BK
    step; launches with RMSNorm read the whole row first, so split only up to 4 ways. BN 128 for wide weights: x's
    L2 traffic is ~2 T / BN of the weight bytes, which a many-row verify feels (RESULTS.md, 2026-12-04 17:48 UTC).
    `space` replaces any of the value lists (`sweep_space`), e.g. deeper pipelines of narrower K steps."""
    space = {"BN": (16, 32, 64, 128) if n >= 4096 else (16, 32, 64), "BK": (128, 256), "SPLIT_K": (1, 2, 4, 8),
             "num_warps": (4, 8), "num_stages": (3, 4), "SWAP_AB": (0,)} | (space or {})
    return [{"BN": bn, "BK": bk, "SPLIT_K": split, "num_warps": warps, "num_stages": stages, "SWAP_AB": swap}
            for swap in space["SWAP_AB"] for bn in space["BN"] for bk in space["BK"] for split in space["SPLIT_K"]
            for warps in space["num_warps"] for stages in space["num_stages"]
            if (split == 1 or (-(-n // bn) * split <= 2400 and (split <= 4 or not norm)))
            and (split - 1) * gemv_stream.split_columns(k, split, bk) < k]


def sweep_space(text: str) -> dict[str, tuple[int, ...]]:
    """'BK=64,128 num_stages=4,5,6' -> {"BK": (64, 128), "num_stages": (4, 5, 6)}; the keys it does not name keep
    sweep_grid's lists. Why: a lease tests one hypothesis (e.g. deeper pipelines of narrower K steps) on the
    launches it concerns, in minutes, instead of the whole default grid. Refused in one line: an unknown or
    repeated key, and values a launch cannot take (block sizes and warps: powers of two; splits 1-64; stages >= 1)."""
    space: dict[str, tuple[int, ...]] = {}
    for word in text.split():
        key, _, values = word.partition("=")
        if key not in block_sizes.BLOCK_KEYS or key in space:
            keys = ", ".join(block_sizes.BLOCK_KEYS)
            raise argparse.ArgumentTypeError(f"{word!r}: KEY is one of {keys}, each once (BK=64,128)")
        try:
            numbers = tuple(int(v) for v in values.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{word!r}: give {key}=n,n,... with whole numbers") from None
        rule = next((rule for v in numbers if (rule := block_sizes.block_value_rule(key, v))), None)
        if rule:
            raise argparse.ArgumentTypeError(f"{word!r}: {key} values are {rule}")
        space[key] = numbers
    return space


def shape_grid(cfg, name: str, space: dict | None = None) -> list[dict]:
    """sweep_grid's block sizes for launch `name`; QKV + RoPE's BN within half a head (RoPE's pairs, one program)."""
    n, k, opts = shapes(cfg)[name]
    norm = own_norm(name, opts)
    return [c for c in sweep_grid(n, k, norm, space) if name != "wqkv" or c["BN"] <= cfg.head_dim // 2]


def sweep_launches(cfg, only_text: str, space: dict) -> tuple[str, ...]:
    """--sweep-shapes' launches (all when empty), checked before any GPU time: UserError for a name that is not a
    launch, or a `space` that leaves one nothing to try."""
    only = tuple(dict.fromkeys(w for w in only_text.split(",") if w)) or tuple(shapes(cfg))
    unknown = sorted(set(only) - set(shapes(cfg)))
    if unknown:
        raise UserError(f"--sweep-shapes: unknown launch(es) {unknown}; known: {', '.join(shapes(cfg))}")
    for name in only:
        if not shape_grid(cfg, name, space):
            raise UserError(f"the block sizes asked for leave {name} none to try (split-K over 4 is refused where "
                            "RMSNorm comes first, a split must keep one BK step, QKV's BN is at most 64): widen it")
    return only


def own_norm(name: str, opts: dict) -> bool:
    """Whether launch `name` runs RMSNorm's 1/RMS pass itself: not where a factored norm hands it the producer's
    block sums (`fused.FACTORED_NORM`: gate/up; `fused.FACTORED_QKV_NORM`: QKV past layer 0, which this times, and
    the LM head)."""
    if fused.FACTORED_QKV_NORM and name in ("wqkv", "lm_head"):
        return False
    return name == "wqkv" or (opts.get("norm", False) and not (fused.FACTORED_NORM and name == "w13"))


def launch_of(cfg, name: str, n: int, k: int, opts: dict, rows: int):
    """A callable(weight, config): the fused launch of one weight shape at `rows` rows as a forward runs it, and
    nothing else: with a factored norm (`fused.FACTORED_NORM`, `FACTORED_QKV_NORM`) the producer (O, down) also
    stores its scaled rows and block sums and the consumer (gate/up; QKV, the LM head) reads such sums instead of
    its own 1/RMS pass; without, over `fused.NORM_IN_PRODUCER_ABOVE` rows O normalizes for gate/up and gate/up has no
    norm. Split-K counters, caches and the sums made once."""
    counters, x = fused.new_counters("cuda"), torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    normalized = fused.NORM_IN_PRODUCER_ABOVE is not None and rows > fused.NORM_IN_PRODUCER_ABOVE
    g = torch.ones(k, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
    gn = torch.ones(n, device="cuda", dtype=torch.bfloat16)
    producer = (name == "wo" and fused.FACTORED_NORM) or (name == "w2" and fused.FACTORED_QKV_NORM)
    if producer:
        return lambda w, c: fused.linear_then_scaled(x, w, gn, residual=res, config=c, counters=counters)[0]
    given = None
    if not own_norm(name, opts) and opts.get("norm", name == "wqkv"):  # the producer's (O's; down's) block sums
        made_by = shapes(cfg)["wo" if name == "w13" else "w2"]
        given = torch.rand(rows, -(-k // block_sizes.linear_config(*made_by[:2])["BN"]), device="cuda") + 1.0
    if name == "wqkv":
        hd, slots = cfg.head_dim, 1024
        dims = (cfg.num_heads, cfg.num_kv_heads, hd, cfg.intermediate_size, cfg.rms_norm_eps)
        pos = torch.arange(400, 400 + rows, device="cuda")
        cos, sin = torch.randn(slots, hd, device="cuda"), torch.randn(slots, hd, device="cuda")
        kc = torch.zeros(slots, cfg.num_kv_heads, hd, device="cuda", dtype=torch.bfloat16)
        vc = kc.clone()
        return lambda w, c: fused.qkv_rope(x, g, w, None, pos, cos, sin, kc, vc, dims, c, counters=counters,
                                           row_sums=given)
    if name == "wo" and normalized:  # (as `layer_forward` does where `fused._norms_alike`: tables of >= 2 warps)
        return lambda w, c: fused.linear_then_norm(x, w, gn, residual=res, config=c, counters=counters)[0]
    kwargs = {"norm": g if own_norm(name, opts) and not (normalized and name == "w13") else None,
              "residual": res if opts.get("residual") else None, "swiglu": opts.get("swiglu", False),
              "counters": counters, "row_sums": given}
    return lambda w, c: fused.fused_linear(x, w, config=c, **kwargs)


def time_launch(launch, weights: list, config: dict | None) -> float | None:
    """Microseconds per launch (28 in one graph, rotating weight copies); None if Triton cannot build it."""
    try:
        graph = graph_of(rotating(lambda w: launch(w, config), weights), 28)
        return cuda_median_ms(graph.replay, 20) * 1000 / 28
    except Exception as exc:  # a config that does not compile is a sweep result, not a crash
        print(f"    {config}: {str(exc)[:120]}", flush=True)
        return None


def sweep(cfg, rows: tuple[int, ...] = (1, 5), only: tuple[str, ...] = (), space: dict | None = None) -> list[dict]:
    """Every launch of `only` (default: all) x config at each row count of `rows`; the best by the sum goes into
    block_sizes.TUNED (so (1, 5, 16, 64) weighs the verify rows as much as the decode row). A launch none of
    whose configs builds keeps its table entry, with a printed line."""
    results = []
    for name in only or shapes(cfg):
        n, k, opts = shapes(cfg)[name]
        rows_n = 2 * n if opts.get("swiglu") else n
        copies = max(2, min(28, -(-240_000_000 // (rows_n * k * 2))))
        weights = [torch.randn(rows_n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        launches = {t: launch_of(cfg, name, n, k, opts, t) for t in rows}
        for config in shape_grid(cfg, name, space):
            us = {t: time_launch(launches[t], weights, config) for t in rows}
            if None not in us.values():
                results.append({"shape": name, "n": n, "k": k, "config": config,
                                **{f"us_T{t}": us[t] for t in rows},
                                f"TB_s_T{rows[0]}": rows_n * k * 2 / us[rows[0]] / 1e6})
        del weights
        mine = [r for r in results if r["shape"] == name]
        if not mine:
            print(f"  {name:8s} {n}x{k}: no config built; its table entry stays", flush=True)
            continue
        best = min(mine, key=lambda r: sum(r[f"us_T{t}"] for t in rows))
        block_sizes.apply_tuned([[n, k, best["config"]]])
        best["best"] = True
        print(f"  {name:8s} {n}x{k}: best {best['config']} " + ", ".join(f"T={t} {best[f'us_T{t}']:.1f} us"
                                                                         for t in rows), flush=True)
    return results


def step_graph(gm: GraphModel, rows: int, context: int):
    """The captured target step of `rows` tokens whose last one sits at position context - 1."""
    ids = torch.randint(0, gm.model.config.vocab_size, (1, rows), device="cuda")
    pos = torch.arange(context - rows, context, device="cuda")
    graph, _ = capture_graph(lambda: gm.forward(ids, pos), gm.device)
    graph.inputs = ids, pos  # the graph reads them: they must live as long as it does
    return graph


def step_times(gm: GraphModel, weight_bytes: int, kv_bytes_per_token: int) -> list[dict]:
    out = []
    for context in CONTEXTS:
        base = None
        for rows in ROWS:
            ms = cuda_median_ms(step_graph(gm, rows, context).replay, 30)
            base = base or ms
            moved = weight_bytes + kv_bytes_per_token * context
            out.append({"context": context, "T": rows, "ms": ms, "ratio_to_T1": ms / base,
                        "bytes": moved, "TB_s": moved / (ms * 1e-3) / 1e12})
            print(f"  context {context:6d} T={rows:3d}: {ms:.3f} ms ({ms / base:.2f}x T=1, "
                  f"{out[-1]['TB_s']:.2f} TB/s)", flush=True)
    return out


def cublas_times(cfg) -> list[dict]:
    """The weight GEMMs of one target step (28 layers + head) through cuBLAS in one graph, per row count."""
    weights = [torch.randn(n * (2 if o.get("swiglu") else 1), k, device="cuda", dtype=torch.bfloat16)
               for _ in range(cfg.num_layers) for n, k, o in list(shapes(cfg).values())[:4]]
    head = torch.randn(cfg.vocab_size, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    out = []
    for rows in (1, 5, 16, 64):
        xs = {w.shape[1]: torch.randn(rows, w.shape[1], device="cuda", dtype=torch.bfloat16) for w in weights}
        graph = graph_of(lambda xs=xs: [F.linear(xs[w.shape[1]], w) for w in weights + [head]])
        out.append({"T": rows, "ms": cuda_median_ms(graph.replay, 30)})
        print(f"  cuBLAS GEMMs of one step, T={rows}: {out[-1]['ms']:.3f} ms", flush=True)
    return out


@torch.inference_mode()
def invariance(gm: GraphModel, context: int = 600) -> list[dict]:
    """Logits of one T-row step against T one-row steps over the same tokens and cache, bit for bit."""
    vocab = gm.model.config.vocab_size
    caches = [layer.attention.kv_cache for layer in gm.model.layers]
    for c in caches:
        c.k.normal_()
        c.v.normal_()
    history = [(c.k.clone(), c.v.clone()) for c in caches]
    out = []
    for rows in (2, 5, 9, 16, 17, 33, 64):
        ids = torch.randint(0, vocab, (1, rows), device="cuda")
        pos = torch.arange(context, context + rows, device="cuda")
        together = gm.forward(ids, pos)
        for c, (k, v) in zip(caches, history, strict=True):
            c.k.copy_(k)
            c.v.copy_(v)
        alone = torch.cat([gm.forward(ids[:, i:i + 1], pos[i:i + 1]) for i in range(rows)])
        same = (together == alone).all(-1)
        out.append({"T": rows, "rows_identical": int(same.sum()), "rows": rows,
                    "argmax_identical": int((together.argmax(-1) == alone.argmax(-1)).sum()),
                    "max_abs_diff": (together - alone).abs().max().item()})
        print(f"  invariance T={rows}: {out[-1]['rows_identical']}/{rows} rows bit-identical", flush=True)
    return out


def tall_tile_invariance(gm: GraphModel) -> dict[int, list[dict]]:
    """`invariance` with each height of TALL_TILES: a taller tile must keep every row bit-identical too."""
    shipped = fused.TILE_ROWS
    out = {}
    try:
        for rows in TALL_TILES:
            fused.TILE_ROWS = rows
            print(f"  {rows}-row tiles:", flush=True)
            out[rows] = invariance(gm)
    finally:
        fused.TILE_ROWS = shipped
    return out


def kernel_profile(gm: GraphModel, contexts=(512, 32704), rows_list=(1, 16, 64), replays: int = 20) -> list[dict]:
    """Device time per step of each kernel (by name) in a replayed T-row step, at a short and at the longest
    context: where a verify's extra time goes, and what a long context adds (attention's split and merge).
    (torch.profiler over graph replays; an empty list where CUPTI reports no kernels in graphs.)"""
    from torch.profiler import ProfilerActivity, profile

    out = []
    for context in contexts:
        for rows in rows_list:
            graph = step_graph(gm, rows, context)
            graph.replay()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(replays):
                    graph.replay()
                torch.cuda.synchronize()
            mine = []
            for event in prof.key_averages():
                total = getattr(event, "self_device_time_total", 0) or getattr(event, "self_cuda_time_total", 0)
                if total > 0:
                    mine.append({"T": rows, "context": context, "kernel": event.key, "us_per_step": total / replays,
                                 "launches_per_step": event.count / replays})
            mine.sort(key=lambda r: -r["us_per_step"])
            print(f"  profile context {context} T={rows}: " + "; ".join(
                f"{r['kernel'][:40]} {r['us_per_step']:.0f} us ({r['launches_per_step']:.0f}x)" for r in mine[:6]),
                flush=True)
            out += mine
    return out


def plot(rows: list[dict], path: Path, gpu: str) -> None:
    """ms per step against context for T = 1, 5, 16, 64 (rows: {"T", "context", "ms"}), measured on `gpu`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for t in (1, 5, 16, 64):
        mine = [r for r in rows if r["T"] == t]
        ax.plot([r["context"] for r in mine], [r["ms"] for r in mine], marker="o", label=f"T = {t}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel(f"ms per target step (measured, {gpu.replace('NVIDIA ', '')})")
    ax.set_title("Qwen2.5-Coder-1.5B shapes, bf16, fused layers")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_first_mode(result: dict, path: Path) -> None:
    """A --modes-only run's plot: the first mode's (the shipped step's, as listed first) ms against context, where
    it was timed at more than one."""
    modes = result["launch_modes"]
    first = [r for r in modes if r["mode"] == modes[0]["mode"]] if modes else []
    if len({r["context"] for r in first}) > 1:
        plot(first, path, result["gpu"])


def whole_numbers(text: str, low: int, high: int, what: str, example: str) -> tuple[int, ...]:
    """'1,5,16' -> (1, 5, 16), each within low..high; else argparse's error (one line) naming `what`."""
    try:
        numbers = tuple(int(t) for t in text.split(","))
    except ValueError:
        numbers = ()
    if not numbers or not all(low <= t <= high for t in numbers):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {what} {low}..{high}, "
                                         f"e.g. {example}")
    return numbers


def row_counts(text: str) -> tuple[int, ...]:
    """--sweep-rows: comma-separated row counts of 1..fused.MAX_ROWS (argparse turns the error into one line)."""
    return whole_numbers(text, 1, fused.MAX_ROWS, "row counts", "1,5,16,64")


def contexts_of(text: str) -> tuple[int, ...]:
    """--mode-contexts: comma-separated contexts the modes take, each leaving room for 64 rows in the cache."""
    return whole_numbers(text, fused.MAX_ROWS, max(CONTEXTS), "contexts", "512,1024")


def given_tables(paths: str, sweep: bool) -> dict[str, list]:
    """--tuned's tables by mode-table name: one file's is "given", several are "given <file stem>" each (a --sweep
    starts from one file only)."""
    files = [path for path in paths.split(",") if path]
    if len(files) > 1 and sweep:
        raise UserError("--sweep starts from one --tuned file, not several")
    if len(files) == 1:
        return {"given": block_sizes.read_tuned(files[0])}
    names = [f"given {Path(path).stem}" for path in files]
    if len(set(names)) < len(names):
        raise UserError(f"--tuned {paths}: two files of one name; give each table its own file name")
    return {name: block_sizes.read_tuned(path) for name, path in zip(names, files, strict=True)}


def rows_over(table: list[list], rows: list[list]) -> list[list]:
    """A table's [N, K, config] rows with `rows` in place of its rows of the same shapes (and any new shapes)."""
    return [[n, k, config] for (n, k), config in ({(n, k): c for n, k, c in table} |
                                                  {(n, k): c for n, k, c in rows}).items()]


def block_size_tables(args, cfg, only: tuple[str, ...], result: dict, out: Path) -> dict[str, list]:
    """The tables the modes compare: shipped (with this GPU's rows, as the product runs), --tuned's, the sweep's."""
    block_sizes.adopt_gpu_table(torch.cuda.get_device_name())
    tables = {"shipped": block_sizes.tuned_rows()}
    tables |= {name: rows_over(tables["shipped"], rows) for name, rows in (args.tuned or {}).items()}
    if len(args.tuned or {}) == 1:  # (one file: it stays applied, and a --sweep starts from it)
        block_sizes.apply_tuned(args.tuned["given"])
    if args.sweep:
        result["sweep"] = sweep(cfg, args.sweep_rows, only, args.sweep_space)
        (out / "tuned.json").write_text(json.dumps(block_sizes.tuned_rows()))
        tables["swept"] = block_sizes.tuned_rows()
    return tables


def main(argv=None) -> None:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=".")
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--sweep-rows", default="1,5", type=row_counts,
                   help="row counts whose summed launch time the sweep minimizes (the first's TB/s is reported)")
    p.add_argument("--sweep-shapes", default="", help="with --sweep: only these launches, e.g. w13,w2 (of wqkv, wo, "
                   "w13, w2, lm_head; the others keep the table they have)")
    p.add_argument("--sweep-space", default={}, type=sweep_space,
                   help="with --sweep: replace its value lists, e.g. 'BK=64,128 num_stages=4,5,6,7 num_warps=4'")
    p.add_argument("--tuned", help="tuned.json of an earlier sweep to apply (a --sweep then starts from it); several, "
                   "comma-separated, each a table of its own beside the shipped one ('given <file stem>')")
    p.add_argument("--modes-only", action="store_true", help="only the launch-mode comparison")
    p.add_argument("--modes", default="", help="launch modes to run, separated by ';' (default: all)")
    p.add_argument("--mode-contexts", default=MODE_CONTEXTS, type=contexts_of,
                   help="contexts the modes are timed at, e.g. 512,1024 (default: "
                   f"{','.join(map(str, MODE_CONTEXTS))})")
    p.add_argument("--profile", action="store_true",
                   help="first, device time per kernel at T = 1 / 16 / 64, contexts 512 and 32,704")
    args = p.parse_args(argv)
    if (args.sweep_shapes or args.sweep_space) and not args.sweep:
        p.error("--sweep-shapes and --sweep-space go with --sweep")
    cfg = SHAPES["qwen2.5-coder-1.5b"]
    try:
        only = sweep_launches(cfg, args.sweep_shapes, args.sweep_space) if args.sweep else ()
        args.tuned = given_tables(args.tuned, args.sweep) if args.tuned else None  # the paths' rows, checked
    except UserError as exc:
        p.error(str(exc))
    if not torch.cuda.is_available():
        sys.exit("gpu_rows.py needs a CUDA GPU (this machine has none)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "weights": "random (timing only)",
              "provenance": "measured"}
    tables = block_size_tables(args, cfg, only, result, out)
    model = random_model(cfg)
    gm = GraphModel(model, compile_blocks=False, fused_layers=True)
    gm.ensure_cache(max(CONTEXTS) + max(ROWS))
    weight_bytes = sum(p.numel() * 2 for n, p in model.named_parameters() if n != "tok_embeddings.weight")
    kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2
    if args.profile:
        result["kernel_profile"] = kernel_profile(gm)
    result["launch_modes"] = launch_modes(gm, tables, [m.strip() for m in args.modes.split(";") if m.strip()],
                                          contexts=args.mode_contexts)
    result["fastest_block_sizes"] = fastest = fastest_table(result["launch_modes"])
    block_sizes.TUNED.clear()
    block_sizes.apply_tuned(tables[fastest])
    result["tuned"] = block_sizes.tuned_rows()
    (out / "fastest_tuned.json").write_text(json.dumps(tables[fastest]))
    print(f"  fastest whole step: {fastest} block sizes (fastest_tuned.json)", flush=True)
    if args.modes_only:
        (out / "gpu_rows.json").write_text(json.dumps(result, indent=1))
        plot_first_mode(result, out / "gpu_rows.png")
        return
    rate = copy_tb_s(result["gpu"])
    result |= {"weight_bytes": weight_bytes, "kv_bytes_per_token": kv_per_token, "copy_tb_s": rate,
               "floor_ms": weight_bytes / (rate * 1e12) * 1e3, "invariance": invariance(gm),
               "invariance_tall_tiles": tall_tile_invariance(gm),
               "steps": step_times(gm, weight_bytes, kv_per_token), "cublas": cublas_times(cfg)}
    t1 = next(r for r in result["steps"] if r["T"] == 1 and r["context"] == CONTEXTS[0])
    result["fraction_of_floor_T1_512"] = result["floor_ms"] / t1["ms"]
    short = [r["ratio_to_T1"] for r in result["steps"] if r["context"] == CONTEXTS[0]]
    result["max_ratio_T_le_64_at_512"] = max(short)
    (out / "gpu_rows.json").write_text(json.dumps(result, indent=1))
    plot(result["steps"], out / "gpu_rows.png", result["gpu"])
    print(json.dumps({k: result[k] for k in ("floor_ms", "fraction_of_floor_T1_512", "max_ratio_T_le_64_at_512")}))


if __name__ == "__main__":
    main()
