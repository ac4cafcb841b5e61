"""RTL kernels seen from pytest: one quick bit-exact cocotb run, and the committed reports' schema.

The full suite (10k vectors per kernel) is `make -C fpga sim`; the resource estimate is
`make -C fpga synth-oss`. Both are run by CI separately; this file only makes RTL breakage visible here.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FPGA = Path(__file__).resolve().parents[1] / "fpga"


def _load_by_path(path: Path):
    """A build script as a module without putting its folder on sys.path (no shadowing, test_no_shadowing.py)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


KERNELS = _load_by_path(FPGA / "scripts" / "rtl_kernels.py").KERNELS

CELL_KEYS = {"LUT", "FF", "CARRY8", "DSP48E2", "RAMB36E2", "URAM288"}


def _have_sim() -> bool:
    try:
        import cocotb  # noqa: F401
    except ImportError:
        return False
    return shutil.which("iverilog") is not None


@pytest.mark.skipif(not _have_sim(), reason="needs iverilog and cocotb")
def test_gemv_tile_rtl_bit_exact_quick(tmp_path):
    env = {**os.environ, "DFVG_RTL_VECTORS": "300", "DFVG_SIM_BUILD": str(tmp_path)}
    subprocess.run([sys.executable, "scripts/gen_luts.py"], cwd=FPGA, check=True, env=env,
                   stdout=subprocess.DEVNULL)
    proc = subprocess.run([sys.executable, "tests/run_sim.py", "gemv_tile"], cwd=FPGA, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[sim] gemv_tile: PASS" in proc.stdout


def test_kernel_cycles_report_schema():
    report = json.loads((FPGA / "reports" / "kernel_cycles.json").read_text())
    assert "Icarus" in report["simulator"]
    assert set(report["kernels"]) == set(KERNELS)
    for name, k in report["kernels"].items():
        assert k["params"].items() >= KERNELS[name]["sim"].items(), name
        assert k["latency_cycles"] >= 1 and k["initiation_interval"] >= 1 and k["elements_per_cycle"] > 0


def test_yosys_cells_report_schema():
    report = json.loads((FPGA / "reports" / "yosys_cells.json").read_text())
    assert report["yosys_version"].startswith("Yosys") and report["family"] == "xcup"
    assert set(report["kernels"]) == set(KERNELS)
    for name, k in report["kernels"].items():
        assert k["params"] == KERNELS[name]["synth"], name
        assert set(k["cells"]) == CELL_KEYS and k["cells"]["LUT"] > 0 and k["cells"]["FF"] > 0
