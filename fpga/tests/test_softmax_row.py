"""softmax_row RTL (max-subtract, mask, exp, normalise) vs fixed_point.softmax_q15 with a prefix mask."""

import cocotb
import torch
from stream import num_vectors, pack, record_cycles, start, stream, unpack

from dfvg.fpga.datapath import fixed_point as fp


@cocotb.test()
async def softmax_row_matches_python(dut):
    L, W = int(dut.L.value), int(dut.W.value)
    n = num_vectors()
    g = torch.Generator().manual_seed(29)
    scores = torch.randint(-(1 << 21), 1 << 21, (n, L), generator=g) >> torch.randint(0, 20, (n, 1), generator=g)
    valid = torch.randint(1, L + 1, (n,), generator=g)
    valid[0], valid[1] = 1, L  # one kept position (p = 1.0), every position
    scores[2] = 7  # all equal: 1/valid each
    keep = torch.arange(L)[None] < valid[:, None]
    smax = torch.where(keep, scores, -(1 << 40)).max(-1).values  # argmax_stream's out_value in the design
    mult, shift = fp.softmax_setup(0.02 * 0.02 / 8)
    want = fp.softmax_q15(scores, mult, shift, keep)
    dut.mult.value, dut.shift.value = mult, shift
    beats = [{"in_valid": 1, "in_last": int(b == L // W - 1), "s": pack(scores[i, b * W:(b + 1) * W], 32),
              "keep": pack(keep[i, b * W:(b + 1) * W], 1), "smax": int(smax[i]) & 0xFFFFFFFF}
             for i in range(n) for b in range(L // W)]
    await start(dut)
    recs, in_cyc = await stream(dut, beats, {"in_valid": 0, "in_last": 0}, "out_valid", ["p"], n * L // W)
    got = [v for r in recs for v in unpack(r["p"], 16, W, signed=False)]
    for i in range(n):
        assert got[i * L:(i + 1) * L] == want[i].tolist(), f"row {i}"
    lat = recs[0]["cycle"] - in_cyc[L // W - 1]
    ii = recs[L // W]["cycle"] - recs[0]["cycle"]
    record_cycles("softmax_row", {"L": L, "W": W}, lat, ii, W)
    dut._log.info("softmax_row: %d rows bit-exact, latency %d, II %d", n, lat, ii)
