"""`resource_utilization.log`: an FPGA resource estimate for a configured draft design on one board.

Owns: reading the per-kernel cell counts that `make -C fpga synth-oss` writes to
`fpga/reports/yosys_cells.json` (Yosys `synth_xilinx -family xcup`), scaling them to the configured array
size, adding the on-chip storage for resident weights and the KV cache and the board shell's fixed
overhead, and rendering counts and % of the board, each line with its provenance.

Does not own: the RTL or the synthesis flow (`fpga/`), the residency decision (`latency.place`).

Why "estimated": Yosys maps to UltraScale+ primitives but does no placement, routing or timing; Vivado's
post-route numbers differ (typically more LUTs for routing/replication, fewer after cross-boundary
optimisation). Over-capacity designs are flagged, never clipped.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from dfvg.errors import UserError
from dfvg.fpga.board.boards import BRAM36_BYTES, URAM288_BYTES, Board
from dfvg.fpga.board.latency import DesignParams, DraftWorkload, place

DEFAULT_CELLS_FILE = Path(__file__).resolve().parents[3] / "fpga" / "reports" / "yosys_cells.json"
RESOURCES = ("LUT", "FF", "CARRY8", "DSP48E2", "RAMB36E2", "URAM288")
# Kernels that form the MAC array: replicated until the design's DSP budget is spent. Every other
# kernel (norm, softmax, rope, ...) is one shared unit on the layer's critical path.
MAC_ARRAY_KEYS = ("gemv", "matvec", "mac")
LANE_PARAM_KEYS = ("MACS_PER_CYCLE", "LANES", "N_LANES", "NUM_LANES")


@dataclass(frozen=True)
class ResourceLine:
    """One row of the report: what it is, how many of each resource, and where the numbers come from."""

    item: str
    counts: dict[str, float]
    provenance: str


@dataclass(frozen=True)
class ResourceReport:
    board: Board
    lines: tuple[ResourceLine, ...]
    total: dict[str, float]
    over_capacity: tuple[str, ...]  # resources whose total exceeds the board


def load_yosys_cells(path: Path | None = None) -> dict:
    """Read yosys_cells.json; a missing or malformed file is a one-line UserError saying how to make it."""
    path = Path(path) if path is not None else DEFAULT_CELLS_FILE
    if not path.is_file():
        raise UserError(f"{path} not found; run `make -C fpga synth-oss` to synthesize the kernels with Yosys")
    try:
        data = json.loads(path.read_text())
        for name, kernel in data["kernels"].items():
            unknown = set(kernel["cells"]) - set(RESOURCES)
            if unknown:
                raise ValueError(f"kernel {name!r} has unknown cell types {sorted(unknown)}")
        data["yosys_version"] = str(data.get("yosys_version", "unknown"))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"{path}: not a yosys_cells.json ({exc}); re-run `make -C fpga synth-oss`") from exc
    return data


def kernel_instances(cells: dict, design: DesignParams) -> dict[str, float]:
    """How many copies of each synthesized kernel the configured design holds.

    MAC-array kernels fill the DSP budget: copies = dsps_used / (DSP48E2 per copy); a kernel that Yosys
    mapped to LUTs only is scaled by MACs per cycle instead: copies = dsps_used x MACs/DSP / (MACs/cycle).
    Example: gemv with LANES=16 synthesized to 16 DSP48E2, dsps_used=4096 -> 256 copies.
    """
    counts = {}
    for name, kernel in cells["kernels"].items():
        if not any(key in name.lower() for key in MAC_ARRAY_KEYS):
            counts[name] = 1.0
            continue
        dsp = kernel["cells"].get("DSP48E2", 0)
        lanes = _macs_per_cycle(kernel.get("params", {}))
        if dsp > 0:
            counts[name] = design.dsps_used / dsp
        elif lanes:
            counts[name] = design.dsps_used * design.macs_per_dsp / float(lanes)
        else:
            raise UserError(f"kernel {name!r} in yosys_cells.json has no DSP48E2 and no lane parameter "
                            f"({'/'.join(LANE_PARAM_KEYS)} or P and W); cannot scale it to the design")
    return counts


def _macs_per_cycle(params: dict) -> float | None:
    """MACs one kernel copy does per cycle: an explicit lane count, or gemv_tile's P lanes x W elements."""
    for key in LANE_PARAM_KEYS:
        if key in params:
            return float(params[key])
    return float(params["P"]) * float(params["W"]) if "P" in params and "W" in params else None


def storage_blocks(nbytes: int, board: Board, urams_taken: int = 0) -> dict[str, float]:
    """URAM288 first (36 KiB each), overflow into BRAM36 (4.5 KiB each); exceeding the board is kept."""
    urams = min(math.ceil(nbytes / URAM288_BYTES), max(0, board.uram - urams_taken))
    rest = max(0, nbytes - urams * URAM288_BYTES)
    return {"URAM288": float(urams), "RAMB36E2": float(math.ceil(rest / BRAM36_BYTES))}


def estimate_resources(workload: DraftWorkload, board: Board, design: DesignParams,
                       cells_path: Path | None = None, instances: dict[str, float] | None = None
                       ) -> ResourceReport:
    """Kernels x copies + on-chip weights + on-chip KV cache + shell, against `board`'s capacity.

    `instances` overrides the copies `kernel_instances` computes, per kernel name.
    """
    cells = load_yosys_cells(cells_path)
    copies = kernel_instances(cells, design) | (instances or {})
    label = f"estimated (yosys {cells['yosys_version']}, pre-place-and-route)"
    lines = [ResourceLine(f"{name} x {copies[name]:g}",
                          {r: k["cells"].get(r, 0) * copies[name] for r in RESOURCES}, label)
             for name, k in cells["kernels"].items()]
    placement = place(workload, board, design)
    weights = storage_blocks(placement.resident_weight_bytes, board)
    lines.append(ResourceLine(f"resident weights ({placement.resident_weight_bytes / 1e6:.1f} MB)", weights,
                              "modeled (on-chip placement, URAM first, full 36 KiB/4.5 KiB packing)"))
    if placement.kv_on_chip:
        kv_bytes = workload.kv_bytes_per_position() * design.max_context
        lines.append(ResourceLine(f"KV cache ({design.max_context} positions, {kv_bytes / 1e6:.1f} MB)",
                                  storage_blocks(kv_bytes, board, int(weights["URAM288"])),
                                  "modeled (on-chip placement)"))
    lines.append(ResourceLine(f"shell ({board.name} platform)",
                              {"LUT": board.shell_lut, "RAMB36E2": board.shell_bram36},
                              f"{board.shell_provenance} (platform static region; see boards.py)"))
    total = {r: sum(line.counts.get(r, 0) for line in lines) for r in RESOURCES}
    over = tuple(r for r, cap in _capacity(board).items() if total[r] > cap)
    return ResourceReport(board, tuple(lines), total, over)


def _capacity(board: Board) -> dict[str, int]:
    return {"LUT": board.lut, "FF": board.ff, "DSP48E2": board.dsp, "RAMB36E2": board.bram36,
            "URAM288": board.uram}


def render(report: ResourceReport) -> list[str]:
    """The log's text lines: one row per item with its provenance, the total, and % of the board."""
    b = report.board
    head = f"{'item':<44}" + "".join(f"{r:>12}" for r in RESOURCES) + "  provenance"
    dsp_note = "" if b.dsp_type == "DSP48E2" else f" ({b.dsp_type} counted as DSP48E2)"
    out = [f"# resource_utilization.log: DFVG FPGA draft engine on {b.name}{dsp_note}",
           "# pre-place-and-route estimate: no timing, no routing; clock and power are assumptions", head]
    for line in report.lines:
        out.append(f"{line.item:<44}" + "".join(_count(line.counts.get(r, 0)) for r in RESOURCES)
                   + f"  {line.provenance}")
    out.append(f"{'total':<44}" + "".join(_count(report.total[r]) for r in RESOURCES)
               + "  estimated (sum of the rows above)")
    cap = _capacity(b)
    pct = "".join(f"{100 * report.total[r] / cap[r]:>11.1f}%" if r in cap else f"{'-':>12}" for r in RESOURCES)
    out.append(f"{'% of ' + b.name:<44}{pct}  estimated")
    if report.over_capacity:
        out.append(f"OVER CAPACITY on {b.name}: {', '.join(report.over_capacity)} exceed the board; "
                   "shrink the array (dsps_used) or keep fewer weights on chip")
    return out


def _count(value: float) -> str:
    return f"{value:>12,.0f}" if float(value).is_integer() else f"{value:>12,.1f}"


def write_resource_log(report: ResourceReport, path: Path) -> Path:
    """Write `resource_utilization.log` (creating the folder); returns the path written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(render(report)) + "\n")
    return path
