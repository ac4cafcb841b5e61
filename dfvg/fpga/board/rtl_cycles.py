"""What the simulated RTL says about the accelerator's cycles: per-layer fixed cycles, the MAC array's efficiency.

Two reports feed the board model (`latency.model_block`): `fpga/reports/kernel_cycles.json` (`make -C fpga sim`:
each kernel's latency and initiation interval in cocotb + Icarus) and `fpga/reports/draft_cycles.json`
(`python -m dfvg.fpga.rtl_run --report`: every op of whole draft tokens run through the RTL in Icarus, with
the cycles and multiply-accumulates of each op). This module owns reading them and the two numbers derived
from them; where a report does not give a number, the number stays an assumption and says so.
Does not own the time model (`latency.py`) or the simulations (`fpga/`, `dfvg/fpga/rtlsim/`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from dfvg.errors import UserError

if TYPE_CHECKING:  # latency.py imports this module; the type is only for annotations
    from dfvg.fpga.board.latency import DesignParams

REPORTS = Path(__file__).resolve().parents[3] / "fpga" / "reports"
DEFAULT_CYCLES_FILE = REPORTS / "kernel_cycles.json"
DEFAULT_RUN_FILE = REPORTS / "draft_cycles.json"
ASSUMED_PHASE_CYCLES = 125.0  # fill + drain of one dependent phase (8 phases -> 1000 cycles per layer)
ASSUMED_EFFICIENCY = 1.0  # the RTL GEMV tiles stream one beat per cycle (II = 1), before fill and padding

# The dependent phases of one decoder layer: (phase, RTL kernel-name substrings, uses per layer).
_LAYER_PHASES = (
    ("gemv", ("gemv", "matvec"), 4),  # wqkv, wo, w13, w2
    ("norm", ("norm",), 2),  # attention_norm, ffn_norm
    ("softmax", ("softmax", "attention"), 1),
    ("elementwise", ("rope", "silu", "swiglu", "elementwise", "residual"), 1),
)


def layer_overhead(design: DesignParams) -> tuple[float, str, str]:
    """Per-layer fixed cycles, with provenance and source.

    A layer has ~8 dependent phases (4 GEMVs, 2 RMSNorms, softmax, the elementwise rope/SiLU/residual
    step), each with a pipeline fill/drain that nothing overlaps. A phase whose RTL kernel appears in
    kernel_cycles.json uses its simulated `latency_cycles`; the others keep the assumed 125 cycles, so a
    partly built RTL gives a mixed (still `assumed`) figure, and only a complete one is `simulated` (at the
    kernel sizes the file names: a latency simulated on a small tile is not the draft's).
    """
    if design.layer_overhead_cycles is not None:
        return design.layer_overhead_cycles, "assumed", "DesignParams.layer_overhead_cycles"
    path = design.cycles_file or DEFAULT_CYCLES_FILE
    kernels = _read_cycles(path) if path.is_file() else {}
    total, measured, assumed = 0.0, [], []
    for phase, keys, uses in _LAYER_PHASES:
        found = [k for name, k in kernels.items() if any(key in name.lower() for key in keys)]
        if found:
            total += uses * max(float(k["latency_cycles"]) for k in found)
            measured.append(phase)
        else:
            total += uses * ASSUMED_PHASE_CYCLES
            assumed.append(phase)
    if not assumed:
        sizes = "; ".join(f"{n} {k.get('params', {})}" for n, k in kernels.items())
        return total, "simulated", f"RTL latency_cycles x uses per layer, {path.name}, at the sizes {sizes}"
    where = (f"RTL-simulated {'/'.join(measured)} from {path.name}; " if measured
             else f"no matching kernel in {path.name}; " if kernels else f"no {path.name}; ")
    return total, "assumed", where + f"assumed {ASSUMED_PHASE_CYCLES:.0f} cycles x uses for {'/'.join(assumed)}"


def _read_cycles(path: Path) -> dict:
    try:
        kernels = json.loads(path.read_text())["kernels"]
        for k in kernels.values():
            float(k["latency_cycles"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"{path}: not a kernel_cycles.json ({exc}); re-run the RTL cycle measurement") from exc
    return kernels


def compute_efficiency(design: DesignParams) -> tuple[float, str, str]:
    """Achieved / peak MACs per MAC-slot of the GEMV tile, with provenance and source.

    From draft_cycles.json: over the one-token passes of the RTL run (the prompt pass when it is the only
    one), efficiency = GEMV MACs / (P x W x GEMV cycles), the GEMV ops being those the report lists
    (`gemv_ops`: every matrix, q.k, P.V, the embedding row and the LM head). It counts each op's pipeline
    fill and drain and the padding of rows and columns to whole tiles, at the simulated tile size and draft.
    Example: 900,000 MACs in 4,000 cycles on a 16 x 16 tile -> 900000 / (256 x 4000) = 0.8789.
    """
    if design.dsp_efficiency is not None:
        return design.dsp_efficiency, "assumed", "DesignParams.dsp_efficiency"
    path = design.rtl_run_file or DEFAULT_RUN_FILE
    if not path.is_file():
        return ASSUMED_EFFICIENCY, "assumed", f"no {path.name}: the GEMV tile's II = 1 streaming, without fill"
    try:
        run = json.loads(path.read_text())
        passes = [p for p in run["passes"] if p["fed_tokens"] == 1] or run["passes"]
        gemv = set(run["gemv_ops"])
        macs = sum(m for p in passes for op, m in p["macs_by_op"].items() if op in gemv)
        cycles = sum(c for p in passes for op, c in p["cycles_by_op"].items() if op in gemv)
        slots = run["tiles"]["P"] * run["tiles"]["W"] * cycles
        efficiency = macs / slots
    except (ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError) as exc:
        raise UserError(f"{path}: not a draft_cycles.json ({exc!r}); re-run python -m dfvg.fpga.rtl_run --report "
                        f"FILE") from exc
    if not 0 < efficiency <= 1:
        raise UserError(f"{path}: GEMV efficiency {efficiency:.3g} is outside (0, 1]; re-run the RTL run")
    tiles = f"{run['tiles']['P']} x {run['tiles']['W']}"
    return efficiency, "simulated", (f"{path.name}: {macs} GEMV MACs in {cycles} cycles on a {tiles} tile, "
                                     f"{len(passes)} pass(es) of {Path(run['draft']).name}, {run['simulator']}")
