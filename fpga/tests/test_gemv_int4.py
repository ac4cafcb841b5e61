"""gemv_int4 RTL vs fixed_point.int4_group_matmul (48-bit accumulators), bit for bit, at K = 512, G = 128."""

import cocotb
import torch
from stream import num_vectors, pack, record_cycles, start, stream, unpack

from dfvg.fpga.datapath import fixed_point as fp

K, G = 512, 128  # the shipped draft's hidden size, the default int4 group


@cocotb.test()
async def gemv_int4_matches_python(dut):
    P, W = int(dut.P.value), int(dut.W.value)
    n = num_vectors()
    g = torch.Generator().manual_seed(41)
    x = torch.randint(-128, 128, (n, K), generator=g, dtype=torch.int8)
    w4 = torch.randint(-8, 8, (n, P, K), generator=g, dtype=torch.int8)
    gs = torch.randint(1, 256, (n, P, K // G), generator=g)
    x[0], w4[0], gs[0] = -128, -8, 255  # the largest accumulator: 512 * 1024 * 255
    x[1], w4[1] = 127, 7
    acc = torch.stack([fp.int4_group_matmul(x[i:i + 1], fp.int4_group_layout(w4[i], G), gs[i])[0] for i in range(n)])
    beats = []
    for i in range(n):
        for b in range(K // W):
            beats.append({"in_valid": 1, "in_last": int(b == K // W - 1), "in_glast": int((b + 1) * W % G == 0),
                          "x": pack(x[i, b * W:(b + 1) * W], 8), "w": pack(w4[i, :, b * W:(b + 1) * W].reshape(-1), 4),
                          "gs": pack(gs[i, :, b * W // G], 8)})
    await start(dut)
    recs, in_cyc = await stream(dut, beats, {"in_valid": 0, "in_last": 0, "in_glast": 0}, "acc_valid", ["acc"], n)
    for i, r in enumerate(recs):
        assert unpack(r["acc"], 48, P) == acc[i].tolist(), f"tile {i}"
    lat = recs[0]["cycle"] - in_cyc[K // W - 1]
    ii = recs[1]["cycle"] - recs[0]["cycle"]
    record_cycles("gemv_int4", {"P": P, "W": W, "K": K, "G": G}, lat, ii, P * W)
    dut._log.info("gemv_int4: %d tiles bit-exact, latency %d, II %d", n, lat, ii)
