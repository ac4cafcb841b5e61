"""Cocotb helpers shared by the kernel tests: clocking, packing, and one back-to-back stream driver.

The driver presents one input beat per cycle (II = 1), samples the outputs every cycle and returns them
with cycle stamps, so each test gets bit-exact outputs plus measured latency / initiation interval.
Results go to $DFVG_CYCLES_DIR/<kernel>.json for run_sim.py to merge into reports/kernel_cycles.json.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge


def pack(values, width: int) -> int:
    """Little-endian lanes: values[i] occupies bits [width*i, width*(i+1)), two's complement."""
    mask = (1 << width) - 1
    out = 0
    for i, v in enumerate(values):
        out |= (int(v) & mask) << (width * i)
    return out


def unpack(word: int, width: int, n: int, signed: bool = True) -> list[int]:
    """Inverse of pack."""
    mask = (1 << width) - 1
    vals = [(word >> (width * i)) & mask for i in range(n)]
    if signed:
        vals = [v - (1 << width) if v >> (width - 1) else v for v in vals]
    return vals


async def start(dut, reset_cycles: int = 5) -> None:
    """Start a 10 ns clock and hold rst (if the design has one) for a few cycles."""
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    has_rst = hasattr(dut, "rst")
    if has_rst:
        dut.rst.value = 1
    for _ in range(reset_cycles):
        await RisingEdge(dut.clk)
    if has_rst:
        dut.rst.value = 0


async def stream(dut, beats: list[dict[str, int]], idle: dict[str, int], valid: str,
                 outputs: list[str], n_out: int, drain: int = 200) -> tuple[list[dict[str, int]], list[int]]:
    """Drive `beats` one per cycle, then `idle`; collect `outputs` whenever `valid` is 1.

    Returns (records, in_cycles): each record has the output values and 'cycle' = the cycle the output
    was presented; in_cycles[i] = the cycle beat i was presented. latency = out cycle - in cycle.
    """
    sigs = {name: getattr(dut, name) for name in set(idle) | {k for b in beats[:1] for k in b}}
    outs = {name: getattr(dut, name) for name in outputs}
    vsig = getattr(dut, valid)
    records: list[dict[str, int]] = []
    in_cycles: list[int] = []
    cycle = 0
    total = len(beats) + drain
    while cycle < total and len(records) < n_out:
        beat = beats[cycle] if cycle < len(beats) else idle
        for name, val in beat.items():
            sigs[name].value = val
        if cycle < len(beats):
            in_cycles.append(cycle)
        await RisingEdge(dut.clk)
        # values seen at this edge were presented during `cycle`
        if vsig.value.is_resolvable and int(vsig.value) == 1:
            rec = {name: int(s.value) for name, s in outs.items()}
            rec["cycle"] = cycle
            records.append(rec)
        cycle += 1
    assert len(records) == n_out, f"expected {n_out} outputs, got {len(records)}"
    return records, in_cycles


def record_cycles(kernel: str, params: dict, latency: int, ii: int, elements_per_cycle: float) -> None:
    """Write this kernel's measured cycle figures for run_sim.py to collect."""
    out_dir = os.environ.get("DFVG_CYCLES_DIR")
    if not out_dir:
        return
    entry = {"params": params, "latency_cycles": latency, "initiation_interval": ii,
             "elements_per_cycle": elements_per_cycle}
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / f"{kernel}.json").write_text(json.dumps(entry, indent=1))


def num_vectors(default: int = 10000) -> int:
    """Random vectors per kernel; DFVG_RTL_VECTORS overrides (pytest uses a quick count)."""
    return int(os.environ.get("DFVG_RTL_VECTORS", default))
