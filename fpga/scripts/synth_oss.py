"""Open-source resource estimate: Yosys `synth_xilinx -family xcup` per kernel -> reports/yosys_cells.json.

Usage: python scripts/synth_oss.py [kernel ...]   (default: all; the report is written for a full run).
Counts are pre-place-and-route *estimates* (no timing, no power): LUT = LUT1..LUT6, FF = FDRE/FDSE/
FDCE/FDPE, RAMB36E2 counts a RAMB18E2 as 0.5, CARRY8 counts a CARRY4 as 0.5 (Yosys 0.23 still maps
adders to CARRY4 for xcup); "raw_cells" keeps Yosys' own counts (SRL16E/SRLC32E, MUXF7-9 included).
Kernels are synthesized without I/O buffers (they are internal blocks of a larger design) at the
sizes in rtl_kernels.py's "synth" parameters.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rtl_kernels import FPGA_DIR, KERNELS, LUTS, sources  # noqa: E402

REPORT = FPGA_DIR / "reports" / "yosys_cells.json"
FF_CELLS = ("FDRE", "FDSE", "FDCE", "FDPE")


def yosys_script(name: str) -> str:
    """Read, set the synthesis parameters, synthesize for UltraScale+, write the cell statistics."""
    spec = KERNELS[name]
    chparams = " ".join(f"-chparam {k} {v}" for k, v in spec["synth"].items())
    files = " ".join(str(p) for p in sources(name))
    return (f"read_verilog -defer {files}\n"
            f"hierarchy -top {spec['top']} {chparams}\n"
            f"synth_xilinx -family xcup -top {spec['top']} -noiopad -flatten\n"
            "tee -q -o stat.json stat -tech xilinx -json\n")


def cell_summary(by_type: dict[str, int]) -> dict[str, float]:
    """Yosys cell types -> the resource classes a board model needs."""
    lut = sum(n for t, n in by_type.items() if re.fullmatch(r"LUT[1-6]", t))
    return {"LUT": lut, "FF": sum(by_type.get(t, 0) for t in FF_CELLS),
            "CARRY8": by_type.get("CARRY8", 0) + 0.5 * by_type.get("CARRY4", 0), "DSP48E2": by_type.get("DSP48E2", 0),
            "RAMB36E2": by_type.get("RAMB36E2", 0) + 0.5 * by_type.get("RAMB18E2", 0),
            "URAM288": by_type.get("URAM288", 0)}


def synth_kernel(name: str) -> dict:
    """Run Yosys in build/synth/<name> (the LUT .hex files are copied there: $readmemh is relative)."""
    work = FPGA_DIR / "build" / "synth" / name
    work.mkdir(parents=True, exist_ok=True)
    for hex_file in LUTS.glob("*.hex"):
        shutil.copy(hex_file, work)
    (work / "synth.ys").write_text(yosys_script(name))
    subprocess.run(["yosys", "-q", "-l", "yosys.log", "synth.ys"], cwd=work, check=True,
                   stdout=subprocess.DEVNULL)
    stat = json.loads((work / "stat.json").read_text())
    by_type = stat["design"]["num_cells_by_type"]
    return {"params": KERNELS[name]["synth"], "cells": cell_summary(by_type), "raw_cells": by_type}


def yosys_version() -> str:
    return subprocess.run(["yosys", "-V"], capture_output=True, text=True, check=True).stdout.strip()


def main(argv: list[str]) -> int:
    names = argv or list(KERNELS)
    unknown = [n for n in names if n not in KERNELS]
    if unknown:
        print(f"unknown kernel(s) {unknown}; known: {', '.join(KERNELS)}")
        return 2
    if shutil.which("yosys") is None:
        print("yosys not found on PATH: apt-get install yosys (0.23 tested)")
        return 1
    kernels = {}
    for name in names:
        t0 = time.time()
        kernels[name] = synth_kernel(name)
        print(f"[synth-oss] {name}: {kernels[name]['cells']} in {time.time() - t0:.1f} s", flush=True)
    if names == list(KERNELS):
        report = {"yosys_version": yosys_version(), "family": "xcup", "provenance": "estimated",
                  "kernels": kernels}
        REPORT.write_text(json.dumps(report, indent=2) + "\n")
        print(f"[synth-oss] wrote {REPORT.relative_to(FPGA_DIR.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
