"""resource_utilization.log: scaling Yosys counts to the design, storage, shell, provenance, capacity."""

import json
from pathlib import Path

import pytest

from dfvg.errors import UserError
from dfvg.fpga.board.boards import get_board
from dfvg.fpga.board.latency import DesignParams, DraftWorkload
from dfvg.fpga.board.resources import estimate_resources, kernel_instances, render, write_resource_log

U280 = get_board("u280")
NO_CYCLES = Path("/nonexistent/kernel_cycles.json")

# The schema `make -C fpga synth-oss` writes; numbers are a plausible 16-lane int8 GEMV tile.
CELLS = {
    "yosys_version": "0.23",
    "family": "xcup",
    "kernels": {
        "gemv_int8": {"params": {"LANES": 16, "ACC_BITS": 32},
                      "cells": {"LUT": 900, "FF": 1400, "CARRY8": 40, "DSP48E2": 16, "RAMB36E2": 0,
                                "URAM288": 0}},
        "rmsnorm": {"params": {"D": 896},
                    "cells": {"LUT": 3000, "FF": 2500, "CARRY8": 120, "DSP48E2": 4, "RAMB36E2": 2,
                              "URAM288": 0}},
    },
}


@pytest.fixture
def cells_path(tmp_path):
    path = tmp_path / "yosys_cells.json"
    path.write_text(json.dumps(CELLS))
    return path


def _tiny(**kw) -> DraftWorkload:
    return DraftWorkload(2, 512, 1408, 8, 2, 64, 151936, weight_bits=8, **kw)


def test_mac_array_is_scaled_to_the_dsp_budget(cells_path):
    design = DesignParams(dsps_used=4096, cycles_file=NO_CYCLES)
    assert kernel_instances(json.loads(cells_path.read_text()), design) == {"gemv_int8": 256.0, "rmsnorm": 1.0}
    report = estimate_resources(_tiny(), U280, design, cells_path)
    assert report.total["DSP48E2"] == 4096 + 4
    assert report.total["LUT"] == 256 * 900 + 3000 + U280.shell_lut


def test_storage_and_shell_lines_carry_their_own_provenance(cells_path):
    report = estimate_resources(_tiny(), U280, DesignParams(cycles_file=NO_CYCLES), cells_path)
    by_item = {line.item.split(" (")[0]: line for line in report.lines}
    assert by_item["resident weights"].provenance.startswith("modeled")
    assert by_item["KV cache"].provenance.startswith("modeled")
    assert by_item["shell"].provenance.startswith("estimated (platform")
    assert by_item["shell"].counts["RAMB36E2"] == 195.5
    kernel_lines = [line for line in report.lines if " x " in line.item]
    assert all(line.provenance == "estimated (yosys 0.23, pre-place-and-route)" for line in kernel_lines)
    # the tiny draft's weights spill from URAM (960 x 36 KiB = 35.4 MB) into BRAM36
    assert by_item["resident weights"].counts["URAM288"] == 960
    assert by_item["resident weights"].counts["RAMB36E2"] > 0
    assert not report.over_capacity


def test_log_lines_percentages_and_file(cells_path, tmp_path):
    report = estimate_resources(_tiny(residency="none"), U280, DesignParams(cycles_file=NO_CYCLES), cells_path)
    lines = render(report)
    pct_line = next(line for line in lines if line.startswith("% of u280"))
    dsp_pct = 100 * 4100 / 9024
    assert f"{dsp_pct:.1f}%" in pct_line
    assert all("estimated" in line or "modeled" in line for line in lines[3:])
    out = write_resource_log(report, tmp_path / "results" / "resource_utilization.log")
    assert out.read_text().splitlines() == lines


def test_over_capacity_is_flagged_not_clipped(cells_path):
    report = estimate_resources(_tiny(), U280, DesignParams(cycles_file=NO_CYCLES), cells_path,
                                instances={"gemv_int8": 1000})
    assert report.total["DSP48E2"] == 16_000 + 4 and "DSP48E2" in report.over_capacity
    assert any(line.startswith("OVER CAPACITY on u280: DSP48E2") for line in render(report))


def test_missing_json_points_to_make_target(tmp_path):
    with pytest.raises(UserError, match=r"make -C fpga synth-oss"):
        estimate_resources(_tiny(), U280, DesignParams(), tmp_path / "yosys_cells.json")


def test_malformed_json_is_a_user_error(tmp_path):
    path = tmp_path / "yosys_cells.json"
    path.write_text(json.dumps({"kernels": {"gemv": {"params": {}, "cells": {"LUT6": 3}}}}))
    with pytest.raises(UserError, match="unknown cell types"):
        estimate_resources(_tiny(), U280, DesignParams(), path)


def test_lut_only_gemv_is_scaled_by_macs_per_cycle():
    # gemv_tile's own parameters: P output lanes x W elements per beat = 128 MACs per cycle
    cells = {"yosys_version": "0.23", "kernels": {"gemv_tile": {"params": {"P": 8, "W": 16},
                                                                "cells": {"LUT": 9000, "DSP48E2": 0}}}}
    design = DesignParams(dsps_used=4096, macs_per_dsp=2)
    assert kernel_instances(cells, design) == {"gemv_tile": 4096 * 2 / 128}
    cells["kernels"]["gemv_tile"]["params"] = {}
    with pytest.raises(UserError, match="cannot scale"):
        kernel_instances(cells, design)
