"""Hardware counters of one decode step, kernel by kernel: where the fused step loses the bandwidth floor.

    python benchmarks/ncu_step.py --out $OUT                       # T = 1, the first 24 kernels of a step
    python benchmarks/ncu_step.py --rows 1,16 --kernels 0 --out $OUT  # every kernel of the T = 1 and 16 steps
    python benchmarks/ncu_step.py --launch w13 --config '{"BK": 128}' --out $OUT   # one GEMV launch, with source

Why: issue 16's plain decode runs at about half of the weight-stream floor (49.8 % on the H200, 2026-12-06), and
CUDA-event timings (gpu_rows.py) say how long each launch takes, not why: whether a GEMV is short of bytes in
flight, of occupancy, or is one wave and a small tail (`launch__waves_per_multiprocessor`). Nsight Compute reads
that from the hardware.

The product's own code path, as gpu_rows.py times it: random bf16 weights of the Qwen2.5-Coder-1.5B target's
shapes, `GraphModel.forward` with the fused Triton layers captured in one CUDA graph per row count, at a
512-token context. The script runs itself under `ncu --graph-profiling node` (each kernel of a graph replay is
profiled on its own; the counters bracket one replay with cudaProfilerStart/Stop) and writes

- ncu_step_T<rows>.csv: ncu's raw page per profiled step (every metric of the sections below and the DRAM
  byte counts, base units; ncu's own ==PROF== / ==ERROR== lines too);
- ncu_step.json / the printed table: per kernel launch, its step's row count, its time, DRAM bytes and rate
  against the copy rate (default: this GPU's, measured on this workplace's machines), the DRAM throughput ncu
  reports, waves per SM, achieved occupancy, registers, shared memory and the warp state its warps wait in most.

ncu serializes and replays each kernel: times are each kernel alone with cold caches between passes, not the
step's overlapped (PDL) time. Needs ncu's hardware counters: on this workplace's H100s (Firecracker) they work,
on its gVisor H200s they do not ("LibraryNotLoaded"), and the script then stops with ncu's own message.
`--clock-control none` leaves the clocks as they are (the device README's rule).

`--launch NAME` profiles one fused GEMV launch alone instead (gpu_rows.py's launches: wqkv, wo, w13, w2, lm_head; at
`--rows`, with the shipped block sizes or `--config`'s), its 4th call, with ncu's SourceCounters section and the
kernel's source imported into ncu_launch_<NAME>_T<rows>.ncu-rep: which instruction its warps wait on
(`ncu --import <file> --page source`). Why: the gate/up launch's warps wait on L1TEX 38.5 % of their stall
cycles (H100, 2026-12-06), and the sections alone do not say which load. Not yet run on a GPU (CPU tests cover
the command and the refusals).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.gpu_decode import SHAPES, random_model  # noqa: E402
from benchmarks.gpu_report import copy_tb_s  # noqa: E402
from benchmarks.gpu_rows import launch_of, row_counts, shapes, step_graph  # noqa: E402
from dfvg.errors import OneLineParser  # noqa: E402
from dfvg.gpu import block_sizes  # noqa: E402
from dfvg.gpu.block_sizes import BLOCK_KEYS, block_value_rule  # noqa: E402
from dfvg.gpu.graphs import GraphModel  # noqa: E402

SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "MemoryWorkloadAnalysis", "WarpStateStats")
EXTRA_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")  # in no section's table: asked for by name
COLUMNS = {  # the table's columns: JSON key -> ncu metric (raw page, base units)
    "time_ns": "gpu__time_duration.sum",
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "dram_pct_of_peak": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "waves_per_sm": "launch__waves_per_multiprocessor",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "registers_per_thread": "launch__registers_per_thread",
    "shared_static_bytes": "launch__shared_mem_per_block_static",
    "shared_dynamic_bytes": "launch__shared_mem_per_block_dynamic",
    "grid_size": "launch__grid_size",
    "block_size": "launch__block_size",
}
CONTEXT = 512


def ncu_command(rows: int, kernels: int, log: Path, launch: str | None = None, config: str | None = None,
                context: int = CONTEXT) -> list[str]:
    """ncu over this script's `--target` part for the `rows`-row step at `context` cached tokens: every kernel node
    of the bracketed replay, or the first `kernels`; with `launch`, that one GEMV launch (and `config`), its source
    counters and a report file beside `log`. Its CSV and its own messages go to `log`."""
    command = ["ncu", "--clock-control", "none", "--graph-profiling", "node", "--profile-from-start", "off",
               "--print-units", "base", "--csv", "--page", "raw", "--log-file", str(log),
               "--metrics", ",".join(EXTRA_METRICS)]
    for section in SECTIONS:
        command += ["--section", section]
    target = [sys.executable, __file__, "--target", "--rows", str(rows)]
    if launch:
        command += ["--section", "SourceCounters", "--import-source", "yes", "--kernel-name",
                    "regex:_linear_kernel|_qkv_rope_kernel", "--export", str(log.with_suffix("")), "--force-overwrite"]
        return command + target + ["--launch", launch] + (["--config", config] if config else [])
    if kernels > 0:
        command += ["--launch-count", str(kernels)]
    return command + target + ["--context", str(context)]


def number(text: str) -> float | str:
    """A raw-page cell as a number where it is one ("1,234.5" -> 1234.5), else the text."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return text


def parse_raw_csv(text: str) -> list[dict]:
    """ncu's `--csv --page raw` output -> one dict per profiled kernel (metric -> value); lines ncu prints
    before the header (==PROF== notes) are skipped, and the units row after it."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    reader = csv.reader(io.StringIO("\n".join(lines[start:])))
    header = next(reader)
    rows = [row for row in reader if len(row) == len(header)]
    if rows and not rows[0][0].strip():  # the units row (its ID cell is empty)
        rows = rows[1:]
    return [{name: number(cell) for name, cell in zip(header, row, strict=True)} for row in rows]


STALL = ("smsp__average_warps_issue_stalled_", "_per_issue_active.ratio")  # WarpStateStats: stall cycles per issue


def _sum(*values) -> float:
    return sum(v for v in values if isinstance(v, float))


def top_stall(kernel: dict) -> str | None:
    """The warp state a kernel's warps wait in most (e.g. long_scoreboard: on global memory), from WarpStateStats."""
    stalls = {name[len(STALL[0]):-len(STALL[1])]: value for name, value in kernel.items()
              if name.startswith(STALL[0]) and name.endswith(STALL[1]) and isinstance(value, float)}
    stalls.pop("selected", None)  # issuing, not waiting
    return max(stalls, key=stalls.get) if stalls else None


def launch_table(kernels: list[dict], copy_tb_s: float, rows: int) -> list[dict]:
    """The table's columns per kernel of the `rows`-row step, with the DRAM rate against the copy rate (what a
    stream could reach); no rate where ncu gave no time or no byte count."""
    table = []
    for kernel in kernels:
        entry = {"rows": rows, "kernel": str(kernel.get("Kernel Name", "?"))}
        entry |= {key: kernel.get(metric) for key, metric in COLUMNS.items()}
        time_ns = entry["time_ns"]
        counted = any(isinstance(entry[key], float) for key in ("dram_read_bytes", "dram_write_bytes"))
        seconds = time_ns * 1e-9 if isinstance(time_ns, float) and time_ns > 0 and counted else None
        entry["dram_tb_s"] = _sum(entry["dram_read_bytes"], entry["dram_write_bytes"]) / seconds / 1e12 \
            if seconds else None
        entry["fraction_of_copy_rate"] = entry["dram_tb_s"] / copy_tb_s if seconds else None
        entry["top_stall"] = top_stall(kernel)
        table.append(entry)
    return table


def print_table(table: list[dict]) -> None:
    def cell(value, fmt: str) -> str:
        return format(value, fmt) if isinstance(value, float) else "-"

    print(f"{'T':>2} {'kernel':<34} {'us':>7} {'MB':>7} {'TB/s':>5} {'copy':>5} {'dram%':>5} {'waves':>5} {'occ%':>5} "
          f"{'regs':>4} {'smem KB':>7} {'grid':>6}  top stall")
    for r in table:
        us = r["time_ns"] / 1e3 if isinstance(r["time_ns"], float) else None
        mb = _sum(r["dram_read_bytes"], r["dram_write_bytes"]) / 1e6 if r["dram_tb_s"] is not None else None
        smem = _sum(r["shared_static_bytes"], r["shared_dynamic_bytes"]) / 1024
        print(f"{r['rows']:2d} {r['kernel'][:34]:<34} {cell(us, '7.1f')} {cell(mb, '7.2f')} "
              f"{cell(r['dram_tb_s'], '5.2f')} {cell(r['fraction_of_copy_rate'], '5.2f')} "
              f"{cell(r['dram_pct_of_peak'], '5.1f')} "
              f"{cell(r['waves_per_sm'], '5.2f')} {cell(r['achieved_occupancy_pct'], '5.1f')} "
              f"{cell(r['registers_per_thread'], '4.0f')} {smem:7.1f} {cell(r['grid_size'], '6.0f')}  "
              f"{r['top_stall'] or '-'}")


def profiled_part(rows: int, context: int = CONTEXT) -> None:
    """Inside ncu: capture the `rows`-row step graph at `context` cached tokens, replay it once warm, then once
    between cudaProfilerStart/Stop (the replay ncu profiles)."""
    gm = GraphModel(random_model(SHAPES["qwen2.5-coder-1.5b"]), compile_blocks=False, fused_layers=True)
    gm.ensure_cache(context + rows)
    graph = step_graph(gm, rows, context)
    graph.replay()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    graph.replay()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def profiled_launch(rows: int, launch: str, config: dict | None) -> None:
    """Inside ncu: one fused GEMV launch (gpu_rows.launch_of) on random weights of its shape, called 3 times warm,
    then once between cudaProfilerStart/Stop (the call ncu profiles)."""
    cfg = SHAPES["qwen2.5-coder-1.5b"]
    n, k, opts = shapes(cfg)[launch]
    weight = torch.randn(2 * n if opts.get("swiglu") else n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    call = launch_of(cfg, launch, n, k, opts, rows)
    for _ in range(3):
        call(weight, config)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    call(weight, config)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def launch_config(launch: str, config: dict | None) -> dict:
    """The block sizes the profiled launch runs: `config` over this GPU's table (`block_sizes.adopt_gpu_table`), so
    a partial --config is recorded with the values it took from the table."""
    block_sizes.adopt_gpu_table(torch.cuda.get_device_name())
    n, k, _ = shapes(SHAPES["qwen2.5-coder-1.5b"])[launch]
    return {**block_sizes.linear_config(n, k), **(config or {})}


def block_config(text: str) -> dict:
    """--config: a JSON object of block sizes (keys of a block-size table), e.g. '{"BK": 128}'."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError:
        config = None
    if not isinstance(config, dict) or not config or set(config) - set(BLOCK_KEYS):
        raise argparse.ArgumentTypeError(f"{text!r}: give a JSON object of {', '.join(BLOCK_KEYS)} (whole numbers), "
                                         "e.g. '{\"BK\": 128}'")
    for key, value in config.items():
        if rule := block_value_rule(key, value):
            raise argparse.ArgumentTypeError(f"{text!r}: {key} values are {rule}")
    return config


def config_tag(config: dict | None) -> str:
    """'_BK128_num_stages3' for {"BK": 128, "num_stages": 3} (file names: runs of one launch with other block sizes
    side by side in one folder); '' for the shipped block sizes."""
    return "".join(f"_{key}{value}" for key, value in sorted((config or {}).items()))


def ncu_message(log: str, stderr: str) -> str:
    """Why ncu profiled nothing, in one line: its last ==ERROR== line, else its last ==WARNING== (e.g. no kernel
    matched --kernel-name), else the program's last stderr line, else ncu's last ==PROF== line."""
    lines = log.splitlines()
    errors = [line for line in lines if line.startswith("==ERROR==")]
    warnings = [line for line in lines if line.startswith("==WARNING==")]
    notes = [line for line in lines if line.startswith("==PROF==")]
    return (errors or warnings or stderr.strip().splitlines() or notes or ["no kernel was profiled"])[-1]


def profile(rows: int, kernels: int, out: Path, copy_tb_s: float, launch: str | None = None,
            config: dict | None = None, context: int = CONTEXT) -> list[dict]:
    """One ncu run over the `rows`-row step at `context`, or `launch` alone -> its table (exits with ncu's message
    where nothing was profiled)."""
    step = f"ncu_step_T{rows}" + (f"_ctx{context}" if context != CONTEXT else "")
    log = out / (f"ncu_launch_{launch}{config_tag(config)}_T{rows}.csv" if launch else f"{step}.csv")
    command = ncu_command(rows, kernels, log, launch, json.dumps(config) if config else None, context)
    done = subprocess.run(command, capture_output=True, text=True,
                          env={**os.environ, "LC_ALL": "C"})  # "1,234.5", not "1.234,5"
    text = log.read_text() if log.exists() else ""
    kernels_seen = parse_raw_csv(text)
    if done.returncode != 0 or not kernels_seen:
        what = f"the {launch} launch at T = {rows}" if launch else f"the {rows}-row step"
        sys.exit(f"ncu failed on {what} (exit {done.returncode}): {ncu_message(text, done.stderr)}")
    return launch_table(kernels_seen, copy_tb_s, rows)


def default_copy_tb_s() -> tuple[float, str]:
    """This GPU's copy rate where this workplace measured one (else the H200's), and the GPU's name."""
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA GPU"
    return copy_tb_s(name), name


def main(argv: list[str] | None = None) -> None:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=".")
    p.add_argument("--rows", default="1", type=row_counts,
                   help="row counts of the profiled steps, one ncu run each (default 1)")
    p.add_argument("--kernels", type=int, default=24,
                   help="profile the first N kernels only (0: all; a step has ~170, each replayed once per pass; "
                   "not with --launch, which profiles its one kernel)")
    p.add_argument("--copy-tb-s", type=float, default=None,
                   help="the copy rate the DRAM rate is compared with (default: this GPU's as measured here: "
                   "H100 3.0, H200 4.3 TB/s)")
    p.add_argument("--launch", choices=tuple(shapes(SHAPES["qwen2.5-coder-1.5b"])),
                   help="profile this one GEMV launch instead of the step, with its source counters")
    p.add_argument("--config", type=block_config, help="with --launch: its block sizes, e.g. '{\"BK\": 128}'")
    p.add_argument("--context", type=int, default=CONTEXT,
                   help=f"cached tokens of the profiled step (default {CONTEXT}; the target's limit is 32,768)")
    p.add_argument("--target", action="store_true", help=argparse.SUPPRESS)  # the part ncu runs
    args = p.parse_args(argv)
    if args.config and not args.launch:
        p.error("--config goes with --launch")
    if not 1 <= args.context <= 32768 - 64 or (args.launch and args.context != CONTEXT):
        p.error(f"--context must be in 1..32704 (a step of up to 64 rows fits 32,768), without --launch; got "
                f"{args.context}")
    if args.target:
        [rows] = args.rows
        if args.launch:
            profiled_launch(rows, args.launch, args.config)
        else:
            profiled_part(rows, args.context)
        return
    if shutil.which("ncu") is None:
        sys.exit("ncu_step.py needs Nsight Compute's ncu on the PATH (it is on the device machines, not here)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    copy_tb_s, gpu = (args.copy_tb_s, None) if args.copy_tb_s else default_copy_tb_s()
    table = [entry for rows in args.rows
             for entry in profile(rows, args.kernels, out, copy_tb_s, args.launch, args.config, args.context)]
    print_table(table)
    step = "ncu_step" + (f"_ctx{args.context}" if args.context != CONTEXT else "")
    name = f"ncu_launch_{args.launch}{config_tag(args.config)}.json" if args.launch else f"{step}.json"
    (out / name).write_text(json.dumps(
        {"gpu": gpu, "rows": args.rows, "context": None if args.launch else args.context, "launch": args.launch,
         "config": args.config, "config_used": launch_config(args.launch, args.config) if args.launch else None,
         "kernels_profiled": len(table), "sections": SECTIONS,
         "copy_tb_s": copy_tb_s, "launches": table,
         "provenance": "measured (Nsight Compute, each kernel alone, serialized)"}, indent=1))

if __name__ == "__main__":
    main()
