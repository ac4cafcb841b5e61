"""Hardware counters of one decode step, kernel by kernel: where the fused step loses the bandwidth floor.

    python benchmarks/ncu_step.py --out $OUT                       # T = 1, the first 24 kernels of a step
    python benchmarks/ncu_step.py --rows 1,16 --kernels 0 --out $OUT  # every kernel of the T = 1 and 16 steps

Why: issue 16's plain decode runs at 41-45 % of the weight-stream floor, and CUDA-event timings (gpu_rows.py)
say how long each launch takes, not why: whether a GEMV is short of bytes in flight, of occupancy, or is one
wave and a small tail (`launch__waves_per_multiprocessor`). Nsight Compute reads that from the hardware.

The product's own code path, as gpu_rows.py times it: random bf16 weights of the Qwen2.5-Coder-1.5B target's
shapes, `GraphModel.forward` with the fused Triton layers captured in one CUDA graph per row count, at a
512-token context. The script runs itself under `ncu --graph-profiling node` (each kernel of a graph replay is
profiled on its own; the counters bracket one replay with cudaProfilerStart/Stop) and writes

- ncu_step.csv: ncu's raw page (every metric of the sections below, base units);
- ncu_step.json / the printed table: per kernel launch, its time, DRAM bytes and rate against the copy rate,
  the DRAM throughput ncu reports, waves per SM, achieved occupancy, registers and shared memory.

ncu serializes and replays each kernel: times are each kernel alone with cold caches between passes, not the
step's overlapped (PDL) time. Needs ncu's hardware counters: on this workplace's H100s (Firecracker) they work,
on its gVisor H200s they do not ("LibraryNotLoaded"), and the script then stops with ncu's own message.
`--clock-control none` leaves the clocks as they are (the device README's rule).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "MemoryWorkloadAnalysis", "WarpStateStats")
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


def ncu_command(rows: list[int], kernels: int, out: Path) -> list[str]:
    """ncu over this script's `--target` part: every kernel node of the bracketed replays, or the first `kernels`."""
    command = ["ncu", "--clock-control", "none", "--graph-profiling", "node", "--profile-from-start", "off",
               "--print-units", "base", "--csv", "--page", "raw", "--log-file", str(out / "ncu_step.csv")]
    for section in SECTIONS:
        command += ["--section", section]
    if kernels > 0:
        command += ["--launch-count", str(kernels)]
    return command + [sys.executable, __file__, "--target", "--rows", ",".join(map(str, rows))]


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
    return max(stalls, key=stalls.get) if stalls else None


def launch_table(kernels: list[dict], copy_tb_s: float) -> list[dict]:
    """The table's columns per kernel, with the DRAM rate against the copy rate (what a stream could reach)."""
    table = []
    for kernel in kernels:
        entry = {"kernel": str(kernel.get("Kernel Name", "?"))}
        entry |= {key: kernel.get(metric) for key, metric in COLUMNS.items()}
        time_ns = entry["time_ns"]
        seconds = time_ns * 1e-9 if isinstance(time_ns, float) and time_ns > 0 else None
        entry["dram_tb_s"] = _sum(entry["dram_read_bytes"], entry["dram_write_bytes"]) / seconds / 1e12 \
            if seconds else None
        entry["fraction_of_copy_rate"] = entry["dram_tb_s"] / copy_tb_s if seconds else None
        entry["top_stall"] = top_stall(kernel)
        table.append(entry)
    return table


def print_table(table: list[dict]) -> None:
    def cell(value, fmt: str) -> str:
        return format(value, fmt) if isinstance(value, float) else "-"

    print(f"{'kernel':<34} {'us':>7} {'MB':>7} {'TB/s':>5} {'copy':>5} {'dram%':>5} {'waves':>5} {'occ%':>5} "
          f"{'regs':>4} {'smem KB':>7} {'grid':>6}  top stall")
    for r in table:
        us = r["time_ns"] / 1e3 if isinstance(r["time_ns"], float) else None
        mb = _sum(r["dram_read_bytes"], r["dram_write_bytes"]) / 1e6
        smem = _sum(r["shared_static_bytes"], r["shared_dynamic_bytes"]) / 1024
        print(f"{r['kernel'][:34]:<34} {cell(us, '7.1f')} {mb:7.2f} {cell(r['dram_tb_s'], '5.2f')} "
              f"{cell(r['fraction_of_copy_rate'], '5.2f')} {cell(r['dram_pct_of_peak'], '5.1f')} "
              f"{cell(r['waves_per_sm'], '5.2f')} {cell(r['achieved_occupancy_pct'], '5.1f')} "
              f"{cell(r['registers_per_thread'], '4.0f')} {smem:7.1f} {cell(r['grid_size'], '6.0f')}  "
              f"{r['top_stall'] or '-'}")


def profiled_part(rows: list[int]) -> None:
    """Inside ncu: capture one step graph per row count, replay each once warm, then once between
    cudaProfilerStart/Stop (the replay ncu profiles)."""
    import torch

    from benchmarks.gpu_decode import SHAPES, random_model
    from benchmarks.gpu_rows import step_graph
    from dfvg.gpu.graphs import GraphModel

    gm = GraphModel(random_model(SHAPES["qwen2.5-coder-1.5b"]), compile_blocks=False, fused_layers=True)
    gm.ensure_cache(CONTEXT + max(rows))
    graphs = [step_graph(gm, t, CONTEXT) for t in rows]
    for graph in graphs:
        graph.replay()
    torch.cuda.synchronize()
    for graph in graphs:
        torch.cuda.profiler.start()
        graph.replay()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


def row_counts(text: str) -> list[int]:
    try:
        rows = [int(part) for part in text.split(",")]
    except ValueError:
        rows = []
    if not rows or not all(1 <= t <= 64 for t in rows):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of row counts 1..64, e.g. 1,16")
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=".")
    p.add_argument("--rows", default="1", type=row_counts, help="row counts of the profiled steps (default 1)")
    p.add_argument("--kernels", type=int, default=24,
                   help="profile the first N kernels only (0: all; a step has ~170, each replayed once per pass)")
    p.add_argument("--copy-tb-s", type=float, default=None,
                   help="the copy rate the DRAM rate is compared with (default: benchmarks/gpu_report.COPY_TB_S, "
                   "the H200's; an H100 here copies ~3.0 TB/s)")
    p.add_argument("--target", action="store_true", help=argparse.SUPPRESS)  # the part ncu runs
    args = p.parse_args(argv)
    if args.target:
        profiled_part(args.rows)
        return
    if shutil.which("ncu") is None:
        sys.exit("ncu_step.py needs Nsight Compute's ncu on the PATH (it is on the device machines, not here)")
    from benchmarks.gpu_report import COPY_TB_S

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(ncu_command(args.rows, args.kernels, out), capture_output=True, text=True)
    csv_path = out / "ncu_step.csv"
    kernels = parse_raw_csv(csv_path.read_text()) if csv_path.exists() else []
    if done.returncode != 0 or not kernels:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no kernel was profiled"]
        sys.exit(f"ncu failed (exit {done.returncode}): {tail[0]}")
    table = launch_table(kernels, args.copy_tb_s or COPY_TB_S)
    print_table(table)
    (out / "ncu_step.json").write_text(json.dumps(
        {"rows": args.rows, "context": CONTEXT, "kernels_profiled": len(table), "sections": SECTIONS,
         "copy_tb_s": args.copy_tb_s or COPY_TB_S, "launches": table,
         "provenance": "measured (Nsight Compute, each kernel alone, serialized)"}, indent=1))


if __name__ == "__main__":
    main()
