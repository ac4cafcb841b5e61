"""softmax_exp RTL vs dfvg.fpga.datapath.fixed_point.softmax_exp, bit for bit."""

import cocotb
import torch
from stream import num_vectors, pack, record_cycles, start, stream, unpack

from dfvg.fpga.datapath import fixed_point as fp


@cocotb.test()
async def softmax_exp_matches_python(dut):
    W, D_W = int(dut.W.value), int(dut.D_W.value)
    n = num_vectors()
    g = torch.Generator().manual_seed(5)
    mult, shift = fp.softmax_setup(2.0e-3)
    d = -torch.randint(0, 1 << 13, (n, W), generator=g)  # the interesting range: e from 1.0 down to 0
    d[n // 2:] = -torch.randint(0, 1 << (D_W - 1), (n - n // 2, W), generator=g)  # mostly underflow
    d[0] = 0  # exactly 1.0
    d[1] = -(1 << (D_W - 1))  # most negative input
    d[2] = -torch.arange(W)  # tiny differences
    e = fp.softmax_exp(d, mult, shift)
    beats = [{"in_valid": 1, "d": pack(d[i], D_W)} for i in range(n)]
    dut.mult.value = mult
    dut.shift.value = shift
    await start(dut)
    recs, in_cyc = await stream(dut, beats, {"in_valid": 0}, "out_valid", ["e"], n)
    for i, r in enumerate(recs):
        assert unpack(r["e"], 16, W, signed=False) == e[i].tolist(), f"vector {i}"
    lat = recs[0]["cycle"] - in_cyc[0]
    ii = recs[1]["cycle"] - recs[0]["cycle"]
    record_cycles("softmax_exp", {"W": W, "D_W": D_W}, lat, ii, W)
    dut._log.info("softmax_exp: %d vectors bit-exact, latency %d, II %d", n, lat, ii)
