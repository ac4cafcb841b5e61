"""silu_lut RTL vs dfvg.fpga.datapath.fixed_point.lut_apply(silu_table), bit for bit, all 256 inputs included."""

import os
from pathlib import Path

import cocotb
import torch
from stream import num_vectors, pack, record_cycles, start, stream, unpack

from dfvg.fpga.datapath import fixed_point as fp

SILU_SCALES = (0.05, 0.025)  # must match scripts/gen_luts.py (checked below against the .hex)


@cocotb.test()
async def silu_matches_python(dut):
    W = int(dut.W.value)
    table = fp.silu_table(*SILU_SCALES)
    hex_vals = [int(h, 16) for h in (Path(os.environ["DFVG_LUTS"]) / "silu.hex").read_text().split()]
    assert [v - 256 if v > 127 else v for v in hex_vals] == table.tolist(), "silu.hex is stale: make luts"
    n = num_vectors()
    g = torch.Generator().manual_seed(7)
    x = torch.randint(-128, 128, (n, W), generator=g, dtype=torch.int8)
    x[: 256 // W] = torch.arange(-128, 128, dtype=torch.int8).reshape(-1, W)  # every input once
    y = fp.lut_apply(x, table)
    beats = [{"in_valid": 1, "x": pack(x[i], 8)} for i in range(n)]
    await start(dut)
    recs, in_cyc = await stream(dut, beats, {"in_valid": 0}, "out_valid", ["y"], n)
    for i, r in enumerate(recs):
        assert unpack(r["y"], 8, W) == y[i].tolist(), f"vector {i}"
    lat = recs[0]["cycle"] - in_cyc[0]
    ii = recs[1]["cycle"] - recs[0]["cycle"]
    record_cycles("silu_lut", {"W": W}, lat, ii, W)
    dut._log.info("silu_lut: %d vectors bit-exact, latency %d, II %d", n, lat, ii)
