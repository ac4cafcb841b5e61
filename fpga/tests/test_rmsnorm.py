"""rmsnorm RTL vs dfvg.fpga.datapath.fixed_point.rmsnorm, bit for bit, for two sets of layer constants.

Also Qwen3's qk-norm (test_qk_norm.py): the same kernel over head_dim lanes of int8 q/k; the cycle figures
go under the kernel name run_sim.py sets (DFVG_KERNEL)."""

import math
import os

import cocotb
import torch
from stream import num_vectors, pack, record_cycles, start, stream, unpack

from dfvg.fpga.datapath import fixed_point as fp


def _vectors(n: int, d: int, in_w: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random x (mixed magnitudes) and int16 gamma, with the edge cases first."""
    lim = 1 << (in_w - 1)
    bits = torch.randint(1, in_w, (n, 1), generator=g)  # magnitude class per vector
    x = torch.randint(-lim, lim, (n, d), generator=g) >> (in_w - bits)
    gamma = torch.randint(-32767, 32768, (n, d), generator=g)
    x[0] = 0  # all zero
    x[1] = -lim  # max magnitude
    x[2] = lim - 1
    x[3] = 0
    x[3, 0] = 1  # one tiny element: v small, k negative
    x[4] = 0
    x[4, -1] = -lim  # one huge element: output saturates
    gamma[:5] = 32767
    return x, gamma


async def _run(dut, x, gamma, mult, shift, eps):
    W, IN_W = int(dut.W.value), int(dut.IN_W.value)
    n, d = x.shape
    want = torch.stack([fp.rmsnorm(x[i], gamma[i], mult, shift, eps) for i in range(n)])
    dut.mult.value, dut.shift.value, dut.eps_term.value = mult, shift, eps
    beats = [{"in_valid": 1, "in_last": int(b == d // W - 1), "x": pack(x[i, b * W:(b + 1) * W], IN_W),
              "gamma": pack(gamma[i, b * W:(b + 1) * W], 16)}
             for i in range(n) for b in range(d // W)]
    recs, in_cyc = await stream(dut, beats, {"in_valid": 0, "in_last": 0}, "out_valid", ["y", "out_last"],
                                n * d // W)
    got = [v for r in recs for v in unpack(r["y"], 8, W)]
    for i in range(n):
        row = got[i * d:(i + 1) * d]
        assert row == want[i].tolist(), f"vector {i}: rtl {row} != {want[i].tolist()}"
    assert [r["out_last"] for r in recs] == [int(b == d // W - 1) for _ in range(n) for b in range(d // W)]
    return recs, in_cyc


@cocotb.test()
async def rmsnorm_matches_python(dut):
    D, W, IN_W = int(dut.D.value), int(dut.W.value), int(dut.IN_W.value)
    n = num_vectors()
    g = torch.Generator().manual_seed(21)
    await start(dut)
    # layer A: realistic constants from rmsnorm_setup; layer B: eps 0 and a large gain (saturation)
    c = fp.rmsnorm_setup(torch.rand(D, generator=g, dtype=torch.float64) + 0.5, 4.0 / (1 << (IN_W - 1)),
                         0.03, 1e-5)
    x, gamma = _vectors(n - n // 4, D, IN_W, g)
    recs, in_cyc = await _run(dut, x, gamma, c["multiplier"], c["shift"], c["eps_term"])
    m, s = fp.quantize_multiplier(math.sqrt(D) * 40 / 32767)
    x, gamma = _vectors(n // 4, D, IN_W, g)
    await _run(dut, x, gamma, m, s, 0)
    beats = D // W
    lat = recs[0]["cycle"] - in_cyc[beats - 1]  # last input beat -> first output beat
    ii = recs[beats]["cycle"] - recs[0]["cycle"]
    kernel = os.environ.get("DFVG_KERNEL", "rmsnorm")
    record_cycles(kernel, {"D": D, "W": W, "IN_W": IN_W}, lat, ii, W)
    dut._log.info(kernel + ": %d vectors bit-exact, latency %d, II %d", n, lat, ii)
