"""What each launch adds to a replayed decode or verify step, in the graph as it runs: the step's timeline.

    python benchmarks/step_timeline.py --out $OUT                          # T = 1, 5, 16, 64 at a 512-token context
    python benchmarks/step_timeline.py --rows 1 --contexts 512,32704 --out $OUT
    python benchmarks/step_timeline.py --rows 1,64 --mode "<a gpu_modes.py launch mode>" --out $OUT

Why: issue 16's plain step runs at about half of the weight-stream floor, and neither measurement we have says
where the other half goes *in the graph*. Nsight Compute (ncu_step.py) times each kernel alone with cold caches;
the profiler's device time per kernel (gpu_rows.py --profile) counts a kernel from its start, and under
programmatic dependent launch a kernel starts while the one before it drains and waits inside it
(griddepcontrol.wait), so those durations overlap and sum to more than the step. Here each kernel of a replay is
charged what it adds to the step: its end minus the latest end before it (the first kernel: its whole duration).
The charges of a replay sum to its span on the GPU, first start to last end; the CUDA-event time of the replay
beside it includes the graph launch too. Summed per launch kind (QKV + RoPE, attention split, attention merge, O,
gate/up, down, LM head, other), a kind's charge is the time the step would lose if that kind's launches took no
time and nothing else moved: the target of a change (a merged launch, a faster GEMV) before it is written.

The product's own code path, as gpu_rows.py times it: random bf16 weights of the Qwen2.5-Coder-1.5B target's
shapes, `GraphModel.forward` with the fused Triton layers captured in one CUDA graph per row count, the step's
last row at position context - 1. Kernel times come from CUPTI through torch.profiler (the kernels of graph
replays are reported as kernels). Writes step_timeline.json and prints one table per (context, T).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dfvg.errors import OneLineParser  # noqa: E402

KINDS = ("QKV + RoPE", "attention split", "attention merge", "O", "gate/up", "down", "LM head", "other")
NAMED = {"_qkv_rope_kernel": "QKV + RoPE", "_attention_split_kernel": "attention split",
         "_attention_combine_kernel": "attention merge"}
LAYER_LINEARS = ("O", "gate/up", "down")  # the fused GEMV launches of a layer after its attention, in order


def kernel_events(trace: dict) -> list[tuple[str, float, float]]:
    """A chrome trace's GPU kernels (its "kernel" category, any case) as (name, start µs, end µs), by start."""
    kernels = [(event["name"], float(event["ts"]), float(event["ts"]) + float(event["dur"]))
               for event in trace.get("traceEvents", [])
               if str(event.get("cat", "")).lower() == "kernel" and event.get("ph") == "X"]
    return sorted(kernels, key=lambda kernel: kernel[1])


def replays_of(kernels: list, replays: int) -> list[list]:
    """The kernels of `replays` back-to-back replays of one graph, one list a replay (each replay launches the same
    kernels, so their count divides by `replays`); ValueError where it does not (kernels the profiler lost)."""
    if replays < 1 or not kernels or len(kernels) % replays:
        raise ValueError(f"{len(kernels)} kernels do not split into {replays} replays of one graph")
    per = len(kernels) // replays
    return [kernels[i * per:(i + 1) * per] for i in range(replays)]


def launch_kinds(names: list[str]) -> list[str]:
    """Each kernel's launch kind: the Triton kernels by name; a fused GEMV (`_linear_kernel`) by its place after the
    layer's attention merge (O, gate/up, down), and one after the last layer's down is the LM head."""
    kinds, linear_since_merge = [], None
    for name in names:
        short = name.split("(")[0].split()[-1] if name else name
        if short in NAMED:
            kinds.append(NAMED[short])
            linear_since_merge = 0 if short == "_attention_combine_kernel" else linear_since_merge
        elif short == "_linear_kernel" and linear_since_merge is not None:
            kinds.append(LAYER_LINEARS[linear_since_merge] if linear_since_merge < len(LAYER_LINEARS) else "LM head")
            linear_since_merge += 1
        else:
            kinds.append("other")
    return kinds


def charges(replay: list[tuple[str, float, float]]) -> list[float]:
    """What each kernel adds to the replay's span (µs): its end minus the latest end before it (never negative: a
    kernel that ends inside an earlier one adds nothing), the first kernel its duration. They sum to the span."""
    out, latest = [], None
    for _name, start, end in replay:
        out.append(end - start if latest is None else max(0.0, end - latest))
        latest = end if latest is None else max(latest, end)
    return out


def kind_table(replays: list[list]) -> dict:
    """Per launch kind, medians over replays of: launches a step, summed duration (µs), summed charge (µs); and the
    replay's span (µs, first start to last end)."""
    sums: dict[str, dict[str, list[float]]] = {kind: {"launches": [], "duration_us": [], "adds_us": []}
                                                for kind in KINDS}
    spans = []
    for replay in replays:
        kinds, added = launch_kinds([name for name, _s, _e in replay]), charges(replay)
        spans.append(max(end for _n, _s, end in replay) - replay[0][1])
        for kind in KINDS:
            mine = [i for i, k in enumerate(kinds) if k == kind]
            sums[kind]["launches"].append(float(len(mine)))
            sums[kind]["duration_us"].append(sum(replay[i][2] - replay[i][1] for i in mine))
            sums[kind]["adds_us"].append(sum(added[i] for i in mine))
    table = {kind: {key: statistics.median(values) for key, values in columns.items()}
             for kind, columns in sums.items() if max(columns["launches"]) > 0}
    return {"kinds": table, "span_us": statistics.median(spans)}


def print_table(context: int, rows: int, entry: dict) -> None:
    span = entry["span_us"]
    print(f"context {context}, T = {rows}: span {span:.1f} µs on the GPU, replay {entry['replay_ms'] * 1e3:.1f} µs "
          f"(CUDA events)", flush=True)
    print(f"  {'launch':<16} {'a step':>6} {'duration µs':>12} {'adds µs':>9} {'share':>6}")
    for kind, row in entry["kinds"].items():
        print(f"  {kind:<16} {row['launches']:6.0f} {row['duration_us']:12.1f} {row['adds_us']:9.1f} "
              f"{row['adds_us'] / span:6.1%}", flush=True)


def profiled_step(gm, rows: int, context: int, replays: int) -> dict:
    """The `rows`-row step at `context` captured once, replayed `replays` times under the profiler: its kind table,
    with the median CUDA-event time of a replay (ms) measured beside it."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.gpu_rows import step_graph
    from benchmarks.gpu_speed import cuda_median_ms

    graph = step_graph(gm, rows, context)
    replay_ms = cuda_median_ms(graph.replay, 30)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    return {"context": context, "T": rows, "replay_ms": replay_ms,
            **kind_table(replays_of(kernel_events(trace), replays))}


def set_launch_mode(parser: OneLineParser, name: str) -> None:
    """The switches of gpu_modes.py's launch mode `name` with the shipped block sizes of this GPU, for the whole
    run; an unknown name is one line listing the known ones."""
    import torch

    from benchmarks import gpu_modes
    from dfvg.gpu import block_sizes

    block_sizes.adopt_gpu_table(torch.cuda.get_device_name())
    tables = {"shipped": block_sizes.tuned_rows()}
    modes = {mode_name: mode for mode_name, mode in gpu_modes.modes_of(tables).items() if mode["table"] == "shipped"}
    if name not in modes:
        parser.error(f"--mode {name!r} is not a launch mode with the shipped block sizes; known: {'; '.join(modes)}")
    gpu_modes._set_mode(modes[name], tables)


def main(argv: list[str] | None = None) -> None:
    from benchmarks.gpu_rows import contexts_of, row_counts

    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=".")
    p.add_argument("--rows", default=(1, 5, 16, 64), type=row_counts,
                   help="row counts of the steps (default 1,5,16,64)")
    p.add_argument("--contexts", default=(512,), type=contexts_of, help="contexts of the steps (default 512)")
    p.add_argument("--replays", default=20, type=int, help="profiled replays a step (default 20)")
    p.add_argument("--mode", default=None, help="a launch mode of gpu_rows.py --modes (default: the shipped switches)")
    args = p.parse_args(argv)
    if args.replays < 1:
        p.error(f"--replays must be at least 1, got {args.replays}")
    import torch

    if not torch.cuda.is_available():
        sys.exit("error: step_timeline.py needs a CUDA GPU (this machine has none)")
    from benchmarks.gpu_decode import SHAPES, random_model
    from dfvg.gpu.graphs import GraphModel

    if args.mode is not None:
        set_launch_mode(p, args.mode)
    gm = GraphModel(random_model(SHAPES["qwen2.5-coder-1.5b"]), compile_blocks=False, fused_layers=True)
    gm.ensure_cache(max(args.contexts) + 64)
    steps = []
    for context in args.contexts:
        for rows in args.rows:
            try:
                steps.append(profiled_step(gm, rows, context, args.replays))
            except ValueError as exc:  # the profiler lost kernels: say so, keep the other steps
                print(f"context {context}, T = {rows}: no timeline ({exc})", flush=True)
                continue
            print_table(context, rows, steps[-1])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "step_timeline.json").write_text(json.dumps(
        {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "weights": "random (timing only)",
         "mode": args.mode or "shipped", "steps": steps}, indent=1))


if __name__ == "__main__":
    main()
