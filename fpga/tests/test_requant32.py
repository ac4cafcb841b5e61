"""requant32 RTL vs integer_model.requantize_int32 + the residual add (int32 saturation), bit for bit.

ACC_W = 48 covers both users: the int8 GEMV's int32 accumulators (sign-extended) and the int4 GEMV's 48-bit ones."""

import cocotb
import torch
from stream import num_vectors, record_cycles, start, stream

from dfvg.fpga.datapath import fixed_point as fp
from dfvg.fpga.datapath.integer_model import INT32_MAX, INT32_MIN, requantize_int32


@cocotb.test()
async def requant32_matches_python(dut):
    acc_w = int(dut.ACC_W.value)
    n = num_vectors()
    g = torch.Generator().manual_seed(17)
    top = 1 << (acc_w - 2)
    acc = torch.randint(-top, top, (n,), generator=g) >> torch.randint(0, 40, (n,), generator=g)
    bias = torch.randint(INT32_MIN, INT32_MAX, (n,), generator=g) >> torch.randint(0, 31, (n,), generator=g)
    mult, shift = fp.quantize_multipliers(torch.exp(torch.empty(n, dtype=torch.float64).uniform_(-30, 8, generator=g)))
    res = torch.randint(INT32_MIN, INT32_MAX, (n,), generator=g) >> torch.randint(0, 31, (n,), generator=g)
    res[:4] = torch.tensor([INT32_MAX, INT32_MIN, 0, 0])
    acc[2], bias[2], mult[2], shift[2] = 5, 0, 1 << 14, 15  # 2.5 -> 3 (round half up)
    acc[3], bias[3], mult[3], shift[3] = -5, 0, 1 << 14, 15  # -2.5 -> -2
    want = (res + requantize_int32(acc, mult, shift, bias)).clamp(INT32_MIN, INT32_MAX)
    assert want[2] == 3 and want[3] == -2
    mask = lambda v, w: int(v) & ((1 << w) - 1)  # noqa: E731
    beats = [{"in_valid": 1, "acc": mask(acc[i], acc_w), "bias": mask(bias[i], 32), "mult": int(mult[i]),
              "shift": int(shift[i]), "res": mask(res[i], 32)} for i in range(n)]
    await start(dut, reset_cycles=0)
    recs, in_cyc = await stream(dut, beats, {"in_valid": 0}, "out_valid", ["y"], n)
    got = [r["y"] - (1 << 32) if r["y"] >> 31 else r["y"] for r in recs]
    assert got == want.tolist()
    lat = recs[0]["cycle"] - in_cyc[0]
    record_cycles("requant32", {"ACC_W": acc_w}, lat, recs[1]["cycle"] - recs[0]["cycle"], 1)
    dut._log.info("requant32: %d values bit-exact, latency %d", n, lat)
