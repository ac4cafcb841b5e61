"""`resource_utilization.log`: the FPGA resource estimate and what the GPUs and host used during the run.

Sections: [fpga] is `dfvg.fpga.board.resources` for the draft model on the configured board (estimated from
Yosys cell counts; or the one-line reason it cannot be made here); [gpu] is NVML samples taken while each
variant ran (memory used, utilization, SM and memory clocks, power; min / mean / max, measured), or the
reason there are none; [host] is this process's peak resident memory and the CPU it ran on. Every line
says where its numbers come from.
"""

from __future__ import annotations

import statistics

from dfvg.energy import GpuSample
from dfvg.errors import UserError
from dfvg.host.records import RunResults

GPU_FIELDS = (("memory_used_b", "memory used", 1 / 2**20, "MiB"), ("utilization_pct", "utilization", 1, "%"),
              ("sm_clock_mhz", "SM clock", 1, "MHz"), ("mem_clock_mhz", "memory clock", 1, "MHz"),
              ("power_w", "power", 1, "W"))


def fpga_section(results: RunResults) -> list[str]:
    from dfvg.fpga.board.resources import estimate_resources, render

    lines = ["[fpga] draft engine resource estimate (dfvg.fpga.board.resources)"]
    if results.fpga_workload is None or results.board is None:
        return lines + ["not available: no draft model the FPGA datapath implements in this experiment"]
    try:
        report = estimate_resources(results.fpga_workload, results.board, results.fpga_design)
    except UserError as err:
        return lines + [f"not available: {err}"]
    return lines + render(report)


def gpu_lines(name: str, index: int, samples: list[GpuSample]) -> list[str]:
    mine = [s for s in samples if s.index == index]
    if not mine:
        return [f"  gpu:{index} {name}: no samples (the variant ran shorter than one sampling interval)"]
    out = [f"  gpu:{index} {name}: {len(mine)} samples"]
    for attr, label, scale, unit in GPU_FIELDS:
        values = [getattr(s, attr) * scale for s in mine]
        out.append(f"    {label:<14} min {min(values):10.1f}  mean {statistics.fmean(values):10.1f}  "
                   f"max {max(values):10.1f} {unit}  [measured: NVML]")
    return out


def gpu_section(results: RunResults) -> list[str]:
    lines = ["[gpu] measured during the run (NVML, sampled every 0.1 s per variant)"]
    if results.gpu_reason:
        return lines + [f"not measured: {results.gpu_reason}"]
    for v in results.ran():
        lines.append(f" variant {v.name} (verify on {v.verify_device}, draft on {v.draft_device})")
        for index, name in enumerate(results.gpu_names):
            lines += gpu_lines(name, index, v.gpu_samples)
    return lines


def host_section(results: RunResults, cpu_model: str) -> list[str]:
    return ["[host]",
            f"peak resident memory {results.peak_rss_b / 2**30:.2f} GiB  [measured: getrusage ru_maxrss; "
            "includes file pages of memory-mapped checkpoints read while loading]",
            f"cpu {cpu_model}  [measured: /proc/cpuinfo]"]


def resource_log(results: RunResults, cpu_model: str) -> str:
    sections = [fpga_section(results), gpu_section(results), host_section(results, cpu_model)]
    header = [f"# resource_utilization.log for run {results.run_id}",
              "# provenance: estimated = Yosys pre-place-and-route; modeled = placement model; "
              "measured = NVML / getrusage on this machine"]
    return "\n".join(header + [line for section in sections for line in ["", *section]]) + "\n"
