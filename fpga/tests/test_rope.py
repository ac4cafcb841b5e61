"""rope RTL vs dfvg.fpga.datapath.fixed_point.rope_apply, bit for bit."""

import cocotb
import torch
from stream import num_vectors, pack, record_cycles, start, stream, unpack

from dfvg.fpga.datapath import fixed_point as fp


@cocotb.test()
async def rope_matches_python(dut):
    W = int(dut.W.value)
    n = num_vectors()
    g = torch.Generator().manual_seed(3)
    ang = torch.rand(n, W, generator=g, dtype=torch.float64) * 6.2832 * 50  # any position, any freq
    cq, sq = fp.rope_tables_q14(ang.cos(), ang.sin())
    x = torch.randint(-128, 128, (n, 2 * W), generator=g)
    cq[0], sq[0], x[0] = 16384, 0, -128  # identity rotation at max magnitude
    cq[1], sq[1], x[1, :W], x[1, W:] = 11585, 11585, 127, -128  # 45 degrees: saturates
    cq[2], sq[2] = -16384, -16384  # table extremes
    x[3] = 0
    cq[4], sq[4], x[4] = 8192, 0, torch.tensor([1, -1, 3, -3] * (W // 2))  # cos 0.5: exact ties
    want = fp.rope_apply(x, cq, sq)
    assert want[4, :4].tolist() == [1, 0, 2, -1]  # 0.5 -> 1, -0.5 -> 0, 1.5 -> 2, -1.5 -> -1
    beats = [{"in_valid": 1, "x1": pack(x[i, :W], 8), "x2": pack(x[i, W:], 8),
              "cos_q": pack(cq[i], 16), "sin_q": pack(sq[i], 16)} for i in range(n)]
    await start(dut)
    recs, in_cyc = await stream(dut, beats, {"in_valid": 0}, "out_valid", ["o1", "o2"], n)
    for i, r in enumerate(recs):
        assert unpack(r["o1"], 8, W) + unpack(r["o2"], 8, W) == want[i].tolist(), f"vector {i}"
    lat = recs[0]["cycle"] - in_cyc[0]
    ii = recs[1]["cycle"] - recs[0]["cycle"]
    record_cycles("rope", {"W": W}, lat, ii, 2 * W)
    dut._log.info("rope: %d vectors bit-exact, latency %d, II %d", n, lat, ii)
