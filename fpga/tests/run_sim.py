"""Build and run the cocotb test of each kernel with Icarus; merge measured cycles into a report.

Usage: python tests/run_sim.py [kernel ...]   (default: all). Exit status 1 if any kernel fails.
Writes reports/kernel_cycles.json when all kernels ran. Env DFVG_RTL_VECTORS sets vectors per kernel,
DFVG_SIM_BUILD the build folder (default build/sim).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from cocotb_tools.runner import get_runner
from sim_results import check_results

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "scripts"))
from rtl_kernels import FPGA_DIR, KERNELS, LUTS, sources  # noqa: E402

REPO = FPGA_DIR.parent
REPORT = FPGA_DIR / "reports" / "kernel_cycles.json"
DEFINITIONS = {
    "latency_cycles": "clock cycles from the last input beat of a vector (tile) to its first output beat",
    "initiation_interval": "cycles between the starts of back-to-back vectors (tiles) at one beat per cycle",
    "elements_per_cycle": "input elements (gemv_tile: MACs) consumed per cycle while streaming",
}


def run_kernel(name: str, cycles_dir: Path) -> tuple[bool, str]:
    """Compile one kernel with its simulation parameters and run tests/test_<name>.py against it."""
    spec = KERNELS[name]
    build_dir = Path(os.environ.get("DFVG_SIM_BUILD", FPGA_DIR / "build" / "sim")) / name
    params = {**spec["sim"], **{k: f'"{LUTS / v}"' for k, v in spec.get("files", {}).items()}}
    runner = get_runner("icarus")
    runner.build(sources=sources(name), hdl_toplevel=spec["top"], parameters=params,
                 build_dir=build_dir, always=True, timescale=("1ns", "1ps"))
    env = {"PYTHONPATH": os.pathsep.join([str(HERE), str(REPO), os.environ.get("PYTHONPATH", "")]),
           "DFVG_CYCLES_DIR": str(cycles_dir), "DFVG_LUTS": str(LUTS), "DFVG_KERNEL": name}
    if "vectors" in spec and "DFVG_RTL_VECTORS" not in os.environ:  # real sizes: fewer, longer vectors
        env["DFVG_RTL_VECTORS"] = str(spec["vectors"])
    results = runner.test(hdl_toplevel=spec["top"], test_module=f"test_{name}", build_dir=build_dir,
                          test_dir=HERE, extra_env=env, results_xml=str(build_dir / "results.xml"))
    return check_results(results)


def main(argv: list[str]) -> int:
    names = argv or list(KERNELS)
    unknown = [n for n in names if n not in KERNELS]
    if unknown:
        print(f"unknown kernel(s) {unknown}; known: {', '.join(KERNELS)}")
        return 2
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            t0 = time.time()
            ok, why = run_kernel(name, Path(tmp))
            print(f"[sim] {name}: {'PASS' if ok else 'FAIL'} ({why}) in {time.time() - t0:.1f} s", flush=True)
            if not ok:
                failed.append(name)
        if not failed and names == list(KERNELS):
            kernels = {n: json.loads((Path(tmp) / f"{n}.json").read_text()) for n in names}
            report = {"simulator": "Icarus Verilog 11.0 + cocotb 2.1", "provenance": "simulated",
                      "definitions": DEFINITIONS, "kernels": kernels}
            REPORT.write_text(json.dumps(report, indent=2) + "\n")
            print(f"[sim] wrote {REPORT.relative_to(REPO)}")
    if failed:
        print(f"[sim] FAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
