"""swiglu RTL (SiLU table, then silu * up requantized) vs integer_model's hidden value, bit for bit."""

import cocotb
import torch
from stream import num_vectors, pack, record_cycles, start, stream, unpack
from test_silu_lut import SILU_SCALES

from dfvg.fpga.datapath import fixed_point as fp


@cocotb.test()
async def swiglu_matches_python(dut):
    W = int(dut.W.value)
    n = num_vectors()
    g = torch.Generator().manual_seed(31)
    gate = torch.randint(-128, 128, (n, W), generator=g)
    up = torch.randint(-128, 128, (n, W), generator=g)
    gate[: 256 // W] = torch.arange(-128, 128).reshape(-1, W)  # every table entry
    up[256 // W] = -128
    mult, shift = fp.quantize_multiplier(0.025 * 0.03 / 0.02)
    want = fp.requantize(fp.lut_apply(gate, fp.silu_table(*SILU_SCALES)).to(torch.int64) * up, mult, shift)
    dut.mult.value, dut.shift.value = mult, shift
    beats = [{"in_valid": 1, "gate": pack(gate[i], 8), "up": pack(up[i], 8)} for i in range(n)]
    await start(dut)
    recs, in_cyc = await stream(dut, beats, {"in_valid": 0}, "out_valid", ["y"], n)
    for i, r in enumerate(recs):
        assert unpack(r["y"], 8, W) == want[i].tolist(), f"vector {i}"
    lat = recs[0]["cycle"] - in_cyc[0]
    record_cycles("swiglu", {"W": W}, lat, recs[1]["cycle"] - recs[0]["cycle"], W)
    dut._log.info("swiglu: %d vectors bit-exact, latency %d", n, lat)
