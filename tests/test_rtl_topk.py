"""The token tree's child selection on its RTL kernel: topk_stream vs fixed_point.topk_lowest, bit for bit.

A tree node's children are the K largest int32 logits (requant32's output), largest first, the lower token id
first on ties. Ties are the risk (a kernel that keeps the later of two equal logits still passes random
full-range rows), so most rows here draw from a handful of values; the int32 extremes check the signed
compare; K = 1 must equal argmax_lowest. The real-size row is the shipped draft's 32,768-logit head at K = 4
(about 1 s of Icarus here, so it is always on). File-driven testbench fpga/sim/tb_topk.v via rtlsim.ops.topk.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from dfvg.fpga.datapath import fixed_point as fp
from dfvg.fpga.datapath.integer_model import INT32_MAX, INT32_MIN
from dfvg.fpga.rtlsim import ops
from dfvg.fpga.rtlsim.icarus import Icarus

pytestmark = pytest.mark.skipif(shutil.which("iverilog") is None, reason="needs Icarus Verilog")
HEAD_ROWS = 32768


@pytest.fixture(scope="module")
def sim():
    simulator = Icarus()
    yield simulator
    simulator.close()


def _rows(seed: int, n: int) -> torch.Tensor:
    """int64 [64, n] int32 logits: 16 full-range rows, 40 rows of ties (values in -2..2), 8 edge rows."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-2, 3, (64, n), generator=g)
    x[:16] = torch.randint(INT32_MIN, INT32_MAX + 1, (16, n), generator=g)
    x[56] = INT32_MIN  # all the most negative: indices 0, 1, 2, ...
    x[57] = INT32_MAX
    x[58] = torch.where(torch.arange(n) % 2 == 1, INT32_MAX, INT32_MIN)  # odd indices first
    x[59] = INT32_MIN
    x[59, -3:] = torch.tensor([INT32_MIN + 1, INT32_MAX, INT32_MAX])  # the best arrive last
    x[60] = torch.arange(n)  # ascending: every entry displaces rank 0
    x[61] = -torch.arange(n)  # descending: the ranks fill in arrival order
    x[62], x[63] = 0, torch.randint(-1, 1, (n,), generator=g)
    return x


def _check(sim: Icarus, x: torch.Tensor, k: int) -> np.ndarray:
    """Run the rows through the kernel, assert indices and values equal topk_lowest's; return the indices."""
    idx, val = ops.topk(sim, "topk", x, k)
    want = fp.topk_lowest(x, k)
    bad = np.flatnonzero((idx != want.numpy()).any(-1))
    assert bad.size == 0, f"row {bad[0]}: rtl {idx[bad[0]].tolist()} != topk_lowest {want[bad[0]].tolist()}"
    assert np.array_equal(val, x.gather(-1, want).numpy())
    return idx


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_topk_ties_and_extremes(sim, k):
    """64 rows of 48 entries per K: ties decide most ranks; K = 1 is also argmax_lowest."""
    x = _rows(100 + k, 48)
    idx = _check(sim, x, k)
    if k == 1:
        assert np.array_equal(idx[:, 0], fp.argmax_lowest(x).numpy())
    assert idx[58].tolist() == list(range(1, 2 * k, 2)) and idx[56].tolist() == list(range(k))


def test_topk_rows_back_to_back_of_length_k(sim):
    """Rows exactly K long (the array is full only at the last beat) and a row restart on every K-th beat."""
    x = torch.randint(-1, 2, (200, 4), generator=torch.Generator().manual_seed(7))
    _check(sim, x, 4)


def test_topk_shipped_head_32768_logits(sim):
    """The shipped draft's head: 32,768 int32 logits, K = 4, planted ties at the top and INT32_MIN elsewhere."""
    g = torch.Generator().manual_seed(9)
    x = torch.randint(-(1 << 24), 1 << 24, (2, HEAD_ROWS), generator=g)
    top = int(x.max()) + 1
    x[0, [30_000, 12_345, 29_999, 5]] = top  # equal best logits: ranked by index, 5 first
    x[0, 100] = top  # a fifth equal one: 30,000 is the one that falls off
    x[1, :HEAD_ROWS // 2] = INT32_MIN
    x[1, -1] = INT32_MAX
    before = sim.cycles["topk"]
    idx = _check(sim, x, 4)
    assert idx[0].tolist() == [5, 100, 12_345, 29_999] and idx[1, 0] == HEAD_ROWS - 1
    assert sim.cycles["topk"] - before == 2 * HEAD_ROWS - 1 + 2  # one entry per cycle, then 2 cycles of latency


def test_dynamic_tree_scores_on_softmax_row_for_32768_logits(sim):
    """A dynamic tree scores a node's children by `fp.softmax_q15` of its integer logits (DatapathTreeDrafter):
    softmax_row, the attention softmax's kernel, computes it bit for bit at the head's full width (32,768
    logits at the LM head's scale, max |logit| near 2**20 as the quantizer sets it)."""
    g = torch.Generator().manual_seed(11)
    x = torch.randint(-(1 << 20), 1 << 18, (2, HEAD_ROWS), generator=g)
    x[1, 5:9] = (1 << 20) - torch.arange(4) * 60000  # a peaked row: a few children hold most of the mass
    logit_scale = 24.0 / 2**20  # the real draft's logits reach about 24
    mult_shift = fp.softmax_setup(logit_scale)
    got = ops.softmax(sim, "t", x, x.max(dim=-1).values, np.full(2, HEAD_ROWS), mult_shift, ops.Tiles(16, 16, 16))
    want = fp.softmax_q15(x, *mult_shift)
    assert np.array_equal(got, want.numpy())
    assert int(want[1, 5]) > 2**14  # the peaked row's best child has most of the probability
