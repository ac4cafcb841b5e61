"""softmax_norm RTL vs dfvg.fpga.datapath.fixed_point.softmax_normalize (after softmax_exp), bit for bit."""

import cocotb
import torch
from stream import num_vectors, pack, record_cycles, start, stream, unpack

from dfvg.fpga.datapath import fixed_point as fp


@cocotb.test()
async def softmax_norm_matches_python(dut):
    L, W = int(dut.L.value), int(dut.W.value)
    n = num_vectors()
    g = torch.Generator().manual_seed(11)
    # real softmax inputs: random int scores -> max-subtract -> softmax_exp
    spread = torch.randint(1, 1 << 16, (n, 1), generator=g)
    scores = torch.randint(-(1 << 16), 1 << 16, (n, L), generator=g) % spread
    mult, shift = fp.softmax_setup(1e-3)
    e = fp.softmax_exp(scores - scores.max(-1, keepdim=True).values, mult, shift)
    e[0] = 0  # all masked: zeros out
    e[1] = 32768  # all equal: 1/L each
    e[2] = 0
    e[2, L - 1] = 32768  # one-hot
    e[3] = 1
    e[3, 0] = 32768  # smallest non-zero entries
    want = fp.softmax_normalize(e)
    beats = [{"in_valid": 1, "in_last": int(b == L // W - 1), "e": pack(e[i, b * W:(b + 1) * W], 16)}
             for i in range(n) for b in range(L // W)]
    await start(dut)
    recs, in_cyc = await stream(dut, beats, {"in_valid": 0, "in_last": 0}, "out_valid", ["p"], n * L // W)
    got = [v for r in recs for v in unpack(r["p"], 16, W, signed=False)]
    for i in range(n):
        assert got[i * L:(i + 1) * L] == want[i].tolist(), f"vector {i}"
    beats_per = L // W
    lat = recs[0]["cycle"] - in_cyc[beats_per - 1]
    ii = recs[beats_per]["cycle"] - recs[0]["cycle"]
    record_cycles("softmax_norm", {"L": L, "W": W}, lat, ii, W)
    dut._log.info("softmax_norm: %d vectors bit-exact, latency %d, II %d", n, lat, ii)
