"""gemv_tile RTL vs dfvg.fpga.datapath.fixed_point.int8_matmul + requantize, bit for bit."""

import cocotb
import torch
from stream import num_vectors, pack, record_cycles, start, stream, unpack

from dfvg.fpga.datapath import fixed_point as fp


@cocotb.test()
async def gemv_tile_matches_python(dut):
    P, W = int(dut.P.value), int(dut.W.value)
    K = 4 * W
    n = num_vectors()
    g = torch.Generator().manual_seed(1234)
    x = torch.randint(-128, 128, (n, K), generator=g, dtype=torch.int8)
    w = torch.randint(-128, 128, (n, P, K), generator=g, dtype=torch.int8)
    # edge cases: all-zero, max magnitude (+2**14 products), most negative, saturation both ways
    x[0], w[0] = 0, 0
    x[1], w[1] = -128, -128
    x[2], w[2] = -128, 127
    x[3], w[3] = 127, 127
    bias = torch.randint(-(1 << 20), 1 << 20, (n, P), generator=g)
    scale = torch.exp(torch.empty(n, P, dtype=torch.float64).uniform_(-14, -5, generator=g))
    mult, shift = fp.quantize_multipliers(scale)
    bias[1], mult[1], shift[1] = 0, (1 << 15) - 1, 1  # saturates to +127
    bias[2], mult[2], shift[2] = -(1 << 31), (1 << 15) - 1, 1  # saturates to -128
    acc = torch.stack([fp.int8_matmul(x[i:i + 1], w[i])[0] for i in range(n)]).long()
    # exact rounding ties (acc + bias = odd, scale 1/2): half up, i.e. 2.5 -> 3 and -2.5 -> -2
    odd = torch.tensor([5, -5, 3, -3, 1, -1, 255, -255])[:P]
    bias[4, :len(odd)] = odd - acc[4, :len(odd)]
    mult[4], shift[4] = 1 << 14, 15
    acc_ref = (x.long().unsqueeze(1) * w.long()).sum(-1)
    assert torch.equal(acc, acc_ref)
    y = fp.requantize(acc, mult, shift, bias)
    assert y[4, :len(odd)].tolist() == [(int(v) + 1) // 2 for v in odd]

    beats = []
    for i in range(n):
        rq = {"bias": pack(bias[i], 32), "mult": pack(mult[i], 15), "shift": pack(shift[i], 6)}
        for b in range(K // W):
            beats.append({"in_valid": 1, "in_last": int(b == K // W - 1),
                          "x": pack(x[i, b * W:(b + 1) * W], 8),
                          "w": pack(w[i, :, b * W:(b + 1) * W].reshape(-1), 8), **rq})
    idle = {"in_valid": 0, "in_last": 0}
    await start(dut)
    recs, in_cyc = await stream(dut, beats, idle, "out_valid", ["y"], n)
    for i, r in enumerate(recs):
        assert unpack(r["y"], 8, P) == y[i].tolist(), f"vector {i}: rtl {unpack(r['y'], 8, P)} != {y[i].tolist()}"
    last_in = [in_cyc[(i + 1) * (K // W) - 1] for i in range(n)]
    lat = recs[0]["cycle"] - last_in[0]
    assert all(r["cycle"] - c == lat for r, c in zip(recs, last_in, strict=True))
    ii = recs[1]["cycle"] - recs[0]["cycle"]
    record_cycles("gemv_tile", {"P": P, "W": W, "K": K}, lat, ii, P * W)
    dut._log.info("gemv_tile: %d tiles bit-exact, latency %d, II %d", n, lat, ii)
