"""argmax_stream RTL vs dfvg.fpga.datapath.fixed_point.argmax_lowest, bit for bit (index and value)."""

import cocotb
import torch
from stream import num_vectors, pack, record_cycles, start, stream

from dfvg.fpga.datapath import fixed_point as fp


@cocotb.test()
async def argmax_matches_python(dut):
    W, VAL_W = int(dut.W.value), int(dut.VAL_W.value)
    N = 4 * W
    n = num_vectors()
    g = torch.Generator().manual_seed(99)
    lo, hi = -(1 << (VAL_W - 1)), (1 << (VAL_W - 1))
    v = torch.randint(lo, hi, (n, N), generator=g)
    v[n // 2:] = torch.randint(-3, 3, (n - n // 2, N), generator=g)  # half the vectors full of ties
    v[0] = 0  # all equal: index 0
    v[1] = lo  # all most-negative
    v[2] = hi - 1  # all max
    v[3, :] = lo
    v[3, N - 1] = hi - 1  # max at the last position
    v[4, :] = 5
    v[4, W + 1] = 6
    v[4, 2 * W + 1] = 6  # tie across beats: the earlier beat wins
    idx = fp.argmax_lowest(v)
    beats = [{"in_valid": 1, "in_last": int(b == N // W - 1), "vals": pack(v[i, b * W:(b + 1) * W], VAL_W)}
             for i in range(n) for b in range(N // W)]
    await start(dut)
    recs, in_cyc = await stream(dut, beats, {"in_valid": 0, "in_last": 0}, "out_valid",
                                ["out_index", "out_value"], n)
    mask = (1 << VAL_W) - 1
    for i, r in enumerate(recs):
        assert r["out_index"] == int(idx[i]), f"vector {i}: rtl {r['out_index']} != {int(idx[i])}"
        assert r["out_value"] == int(v[i, idx[i]]) & mask
    lat = recs[0]["cycle"] - in_cyc[N // W - 1]
    ii = recs[1]["cycle"] - recs[0]["cycle"]
    params = {"W": W, "VAL_W": VAL_W, "IDX_W": int(dut.IDX_W.value), "N": N}
    record_cycles("argmax_stream", params, lat, ii, W)
    dut._log.info("argmax_stream: %d vectors bit-exact, latency %d, II %d", n, lat, ii)
