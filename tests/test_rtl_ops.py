"""Every op of the integer datapath run by its RTL kernel at the shipped draft's sizes, bit-exact vs Python.

The shipped draft (drafts/qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768): D = 512, 8 query heads and 2 KV
heads of head_dim 64, intermediate 1536, a 32,768-row LM head. Each test packs random operands (plus edge
cases) into beats, simulates the kernel in Icarus (fpga/sim testbenches, fpga/rtl kernels, tiles P = W = 16)
and compares with dfvg/fpga/datapath (fixed_point.py, integer_model.py). Wall times here (2 shared cores):
most tests 1-10 s; the 32,768-row head ~2 min (132 s) (marked slow: DFVG_SLOW=1).
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import torch

from dfvg.fpga.datapath import fixed_point as fp
from dfvg.fpga.datapath.integer_model import INT32_MAX, INT32_MIN, requantize_int32, rmsnorm_wide
from dfvg.fpga.rtlsim import ops
from dfvg.fpga.rtlsim.icarus import Icarus

pytestmark = pytest.mark.skipif(shutil.which("iverilog") is None, reason="needs Icarus Verilog")
D, HEADS, KV, HD, INTER, HEAD_ROWS = 512, 8, 2, 64, 1536, 32768
TILES = ops.Tiles(16, 16, 16)


@pytest.fixture(scope="module")
def sim():
    simulator = Icarus()
    yield simulator
    simulator.close()


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _int8(shape, g) -> torch.Tensor:
    return torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)


def _row_multipliers(n: int, g, lo: float, hi: float) -> tuple[torch.Tensor, torch.Tensor]:
    return fp.quantize_multipliers(lo + (hi - lo) * torch.rand(n, generator=g, dtype=torch.float64))


def test_gemv_int8_requant_at_wqkv_size(sim):
    """wqkv: 768 x 512 int8, Qwen2's int32 bias, per-row (M, S) -> int8; two token rows."""
    g = _gen(1)
    x, w = _int8((2, D), g), _int8(((HEADS + 2 * KV) * HD, D), g)
    x[1] = -128
    w[:16] = -128  # the largest products: +2**14 each, 512 of them
    m, s = _row_multipliers(w.shape[0], g, 1e-5, 1e-3)
    bias = torch.randint(-(1 << 20), 1 << 20, (w.shape[0],), generator=g)
    out = ops.gemv(sim, "t", ops.GemvJobs(x.numpy(), w.numpy(), m.numpy(), s.numpy(), bias.numpy()), TILES)
    assert np.array_equal(out["y8"], fp.requantize(fp.int8_matmul(x, w), m, s, bias).numpy())


def test_gemv_residual_requant32_at_w2_size(sim):
    """w2: 512 x 1536 -> requant32 + the residual add, saturating at int32 both ways."""
    g = _gen(2)
    x, w = _int8((1, INTER), g), _int8((D, INTER), g)
    m, s = _row_multipliers(D, g, 1e-2, 4.0)
    res = torch.randint(INT32_MIN, INT32_MAX, (1, D), generator=g)
    res[0, :8] = INT32_MAX  # saturation up
    res[0, 8:16] = INT32_MIN
    out = ops.gemv(sim, "t", ops.GemvJobs(x.numpy(), w.numpy(), m.numpy(), s.numpy(), res=res.numpy()), TILES)
    want = (res + requantize_int32(fp.int8_matmul(x, w), m, s)).clamp(INT32_MIN, INT32_MAX)
    assert np.array_equal(out["y32"], want.numpy())
    assert (out["y32"] == INT32_MAX).any() and (out["y32"] == INT32_MIN).any()


def test_gemv_int4_group_scales_at_wqkv_size(sim):
    """The int4 path: 768 x 512 weights in [-8, 7], uint8 scales per group of 128 -> 48-bit acc -> int8."""
    g = _gen(3)
    x = _int8((1, D), g)
    w4 = torch.randint(-8, 8, ((HEADS + 2 * KV) * HD, D), generator=g, dtype=torch.int8)
    gs = torch.randint(1, 256, (w4.shape[0], D // 128), generator=g)
    w4[:4], gs[:4] = -8, 255  # extremes
    m, s = _row_multipliers(w4.shape[0], g, 1e-6, 1e-4)
    jobs = ops.GemvJobs(x.numpy(), w4.numpy(), m.numpy(), s.numpy(), gs=gs.numpy(), acc_w=48)
    out = ops.gemv(sim, "t", jobs, TILES)
    acc = fp.int4_group_matmul(x, fp.int4_group_layout(w4, 128), gs)
    assert np.array_equal(out["y8"], fp.requantize(acc, m, s).numpy())
    assert np.array_equal(out["y32"], requantize_int32(acc, m, s).numpy())


def test_rmsnorm_wide_on_int32_residual_rows(sim):
    """The row-shift RMSNorm at D = 512: rows of every magnitude, incl. -2**31 and an all-zero row."""
    g = _gen(4)
    x = torch.randint(INT32_MIN, INT32_MAX, (6, D), generator=g) >> torch.randint(0, 31, (6, 1), generator=g)
    x[0], x[1, 7], x[2] = 0, INT32_MIN, 3
    gamma = torch.randint(-32767, 32768, (D,), generator=g)
    c = fp.rmsnorm_setup(torch.rand(D, generator=g, dtype=torch.float64) + 0.5, 1e-4, 0.03, 1e-6)
    params = (c["multiplier"], c["shift"], c["eps_term"])
    y = ops.rmsnorm(sim, "t", x, gamma, params, TILES)
    assert np.array_equal(y, rmsnorm_wide(x, gamma, params).numpy())


def test_qk_norm_per_head(sim):
    """Qwen3's per-head q/k norm: int8 rows of head_dim 64 through the same kernel (shift 0)."""
    g = _gen(5)
    q = _int8((HEADS, HD), g).to(torch.int64)
    gamma = torch.randint(-32767, 32768, (HD,), generator=g)
    c = fp.rmsnorm_setup(torch.rand(HD, generator=g, dtype=torch.float64) + 0.5, 0.05, 0.03, 1e-6)
    params = (c["multiplier"], c["shift"], c["eps_term"])
    assert np.array_equal(ops.rmsnorm(sim, "t", q, gamma, params, TILES), fp.rmsnorm(q, gamma, *params).numpy())


def test_attention_scores_softmax_pv_one_group(sim):
    """One GQA group at a 200-position cache: 4 query heads x 2 rows (prefill), causal prefix mask.
    q.k on gemv_tile with the identity requant32 and argmax_stream for each row's max, softmax_row,
    then P.V (Q0.15 x int8, 48-bit accumulators) -> int8, each compared with fixed_point."""
    g, length = _gen(6), 200
    q, k, v = _int8((8, HD), g), _int8((length, HD), g), _int8((length, HD), g)
    valid = torch.tensor([199, 199, 199, 199, 200, 200, 200, 200])
    keep = torch.arange(length)[None] < valid[:, None]
    m, s = ops.IDENTITY
    sc = ops.gemv(sim, "t", ops.GemvJobs(q.numpy(), k.numpy(), np.array([m]), np.array([s]), valid=valid.numpy()),
                  TILES)
    scores = fp.int_matmul(q, k)
    assert np.array_equal(sc["y32"], scores.numpy())
    assert np.array_equal(sc["argmax"][:, 1], torch.where(keep, scores, -(1 << 40)).max(-1).values.numpy())
    sm = fp.softmax_setup(0.02 * 0.02 / 8)
    probs = ops.softmax(sim, "t", sc["y32"], sc["argmax"][:, 1], valid.numpy(), sm, TILES)
    want = fp.softmax_q15(scores, *sm, keep)
    assert np.array_equal(probs, want.numpy())
    pm, ps = fp.quantize_multiplier(0.05 / 32768 / 0.02)
    out = ops.gemv(sim, "t", ops.GemvJobs(probs, v.numpy().T, np.array([pm]), np.array([ps]), x_w=17, acc_w=48),
                   TILES)
    assert np.array_equal(out["y8"], fp.requantize(fp.int_matmul(want, v.T), pm, ps).numpy())


def test_rope_all_heads(sim):
    """RoPE at head_dim 64 (32 pairs per beat), 8 q heads + 2 k heads at a far position."""
    g = _gen(7)
    x = _int8((HEADS + KV, HD), g)
    x[0] = -128
    ang = torch.rand(1, HD // 2, generator=g, dtype=torch.float64) * 3000
    cq, sq = fp.rope_tables_q14(ang.cos().expand(x.shape[0], -1), ang.sin().expand(x.shape[0], -1))
    assert np.array_equal(ops.rope(sim, "t", x, cq, sq), fp.rope_apply(x, cq, sq).numpy())


def test_swiglu_at_intermediate_size(sim):
    """h = requant(silu_lut(gate) * up) over I = 1536, every gate byte included."""
    g = _gen(8)
    gate, up = _int8((1, INTER), g), _int8((1, INTER), g)
    gate[0, :256] = torch.arange(-128, 128, dtype=torch.int8)
    table, ms = fp.silu_table(0.04, 0.02), fp.quantize_multiplier(0.02 * 0.03 / 0.05)
    want = fp.requantize(fp.lut_apply(gate, table).to(torch.int64) * up.to(torch.int64), *ms)
    assert np.array_equal(ops.swiglu(sim, "t", gate, up, table, ms, TILES), want.numpy())


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("DFVG_SLOW") != "1", reason="set DFVG_SLOW=1 (~2 min of Icarus)")
def test_lm_head_32768_rows_gemv_requant32_argmax(sim):
    """The whole 32,768 x 512 LM head streamed through one gemv_tile -> requant32 -> argmax_stream run,
    over the first 30,000 rows only (a target vocabulary limit), with a planted tie below it."""
    g = _gen(9)
    x, w = _int8((1, D), g), _int8((HEAD_ROWS, D), g)
    w[29_999], w[12_345] = 127, 127  # equal logits when x is positive there: lowest index wins
    x[0] = x[0].abs().clamp(max=127)
    m, s = _row_multipliers(HEAD_ROWS, g, 1e-3, 1e-2)
    m[29_999], s[29_999], m[12_345], s[12_345] = m[0], s[0], m[0], s[0]
    jobs = ops.GemvJobs(x.numpy(), w.numpy(), m.numpy(), s.numpy(), valid=np.array([30_000]))
    out = ops.gemv(sim, "head", jobs, TILES)
    logits = requantize_int32(fp.int8_matmul(x, w), m, s)[0]
    assert np.array_equal(out["y32"][0], logits.numpy())
    assert out["argmax"][0].tolist() == [int(fp.argmax_lowest(logits[:30_000])), int(logits[:30_000].max())]
    assert out["argmax"][0, 0] == 12_345
