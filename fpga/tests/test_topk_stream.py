"""topk_stream RTL vs dfvg.fpga.datapath.fixed_point.topk_lowest, bit for bit (K indices and their values).

The tie rule is the point: most rows draw from a range of 5 values, so nearly every rank is decided by the
lower index winning; full-range rows and rows of int32's extremes check the signed compare. Vectors go back
to back, so the array's restart at a vector's first beat is tested every time.
"""

import cocotb
import torch
from stream import num_vectors, record_cycles, start, stream, unpack

from dfvg.fpga.datapath import fixed_point as fp


def _rows(n: int, length: int, val_w: int) -> torch.Tensor:
    """[n, length] int64: a third full range, the rest full of ties, then hand-made edge rows."""
    g = torch.Generator().manual_seed(123)
    lo, hi = -(1 << (val_w - 1)), 1 << (val_w - 1)
    v = torch.randint(-2, 3, (n, length), generator=g)
    v[: n // 3] = torch.randint(lo, hi, (n // 3, length), generator=g)
    v[0] = 0  # all equal: indices 0, 1, 2, ...
    v[1] = lo  # all the most negative
    v[2] = hi - 1  # all the largest
    v[3] = lo
    v[3, -1], v[3, -2] = hi - 1, lo + 1  # the winners arrive last
    v[4] = torch.arange(length)  # ascending: every beat displaces rank 0
    v[5] = -torch.arange(length)  # descending: nothing displaces, ranks fill in order
    v[6] = torch.where(torch.arange(length) % 2 == 0, hi - 1, lo)  # two extremes, interleaved
    return v


@cocotb.test()
async def topk_matches_python(dut):
    K, VAL_W, IDX_W = int(dut.K.value), int(dut.VAL_W.value), int(dut.IDX_W.value)
    N = 8 * K
    n = max(num_vectors(), 8)
    v = _rows(n, N, VAL_W)
    want = fp.topk_lowest(v, K)
    mask = (1 << VAL_W) - 1
    beats = [{"in_valid": 1, "in_last": int(b == N - 1), "val": int(v[i, b]) & mask}
             for i in range(n) for b in range(N)]
    await start(dut)
    recs, in_cyc = await stream(dut, beats, {"in_valid": 0, "in_last": 0}, "out_valid",
                                ["out_index", "out_value"], n)
    for i, r in enumerate(recs):
        idx = unpack(r["out_index"], IDX_W, K, signed=False)
        assert idx == want[i].tolist(), f"vector {i}: rtl {idx} != topk_lowest {want[i].tolist()}"
        assert unpack(r["out_value"], VAL_W, K) == v[i, want[i]].tolist(), f"vector {i}: values"
    lat = recs[0]["cycle"] - in_cyc[N - 1]
    ii = recs[1]["cycle"] - recs[0]["cycle"]
    record_cycles("topk_stream", {"K": K, "VAL_W": VAL_W, "IDX_W": IDX_W, "N": N}, lat, ii, 1)
    dut._log.info("topk_stream: %d vectors of %d bit-exact, latency %d, II %d", n, N, lat, ii)
