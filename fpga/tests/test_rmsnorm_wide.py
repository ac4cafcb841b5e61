"""rmsnorm_wide RTL (row pre-shift + rmsnorm) vs integer_model.rmsnorm_wide, bit for bit, on int32 rows."""

import cocotb
import torch
from stream import num_vectors, pack, record_cycles, start, stream, unpack

from dfvg.fpga.datapath import fixed_point as fp
from dfvg.fpga.datapath.integer_model import INT32_MAX, INT32_MIN, rmsnorm_wide


@cocotb.test()
async def rmsnorm_wide_matches_python(dut):
    D, W = int(dut.D.value), int(dut.W.value)
    n = num_vectors()
    g = torch.Generator().manual_seed(23)
    x = torch.randint(INT32_MIN, INT32_MAX, (n, D), generator=g) >> torch.randint(0, 32, (n, 1), generator=g)
    x[0], x[1], x[2] = 0, INT32_MIN, INT32_MAX  # zero row, the extremes
    x[3] = 0
    x[3, 5] = 1 << 14  # the shift boundary: bit length 15 -> shift 1
    gamma = torch.randint(-32767, 32768, (D,), generator=g)
    c = fp.rmsnorm_setup(torch.rand(D, generator=g, dtype=torch.float64) + 0.5, 1e-4, 0.03, 1e-6)
    params = (c["multiplier"], c["shift"], min(c["eps_term"], INT32_MAX))
    want = rmsnorm_wide(x, gamma, params)
    dut.mult.value, dut.shift.value, dut.eps0.value = params
    beats = [{"in_valid": 1, "in_last": int(b == D // W - 1), "x": pack(x[i, b * W:(b + 1) * W], 32),
              "gamma": pack(gamma[b * W:(b + 1) * W], 16)} for i in range(n) for b in range(D // W)]
    await start(dut)
    recs, in_cyc = await stream(dut, beats, {"in_valid": 0, "in_last": 0}, "out_valid", ["y"], n * D // W)
    got = [v for r in recs for v in unpack(r["y"], 8, W)]
    for i in range(n):
        assert got[i * D:(i + 1) * D] == want[i].tolist(), f"row {i}"
    lat = recs[0]["cycle"] - in_cyc[D // W - 1]
    ii = recs[D // W]["cycle"] - recs[0]["cycle"]
    record_cycles("rmsnorm_wide", {"D": D, "W": W}, lat, ii, W)
    dut._log.info("rmsnorm_wide: %d rows bit-exact, latency %d, II %d", n, lat, ii)
