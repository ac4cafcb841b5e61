"""Fixed-point primitives against float64 references, exactness properties, and CPU == CUDA."""

import math

import pytest
import torch

from dfvg.errors import UserError
from dfvg.fpga.datapath import fixed_point as fp


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _i8(*shape: int, g: torch.Generator) -> torch.Tensor:
    return torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)


# ----------------------------------------------------------------------------------------- basics
def test_rounding_is_half_up_everywhere():
    x = torch.tensor([5, -5, 3, -3, 7, -7, 0])  # /2: 2.5 -1.5 ... -> 3, -2, 2, -1, 4, -3, 0
    assert fp.rounding_shift(x, 1).tolist() == [3, -2, 2, -1, 4, -3, 0]
    assert fp.rounding_shift(torch.tensor([6, -6, 5]), 2).tolist() == [2, -1, 1]  # 1.5->2, -1.5->-1
    assert fp.rounding_shift(x, 0).tolist() == x.tolist()
    per_channel = fp.rounding_shift(torch.tensor([[5, 5]]), torch.tensor([1, 2]))
    assert per_channel.tolist() == [[3, 1]]


@pytest.mark.parametrize("scale", [1e-9, 3.1e-5, 0.0123, 0.5, 0.75, 0.99999, 1.0, 3.7, 1000.0])
def test_quantize_multiplier(scale):
    m, s = fp.quantize_multiplier(scale)
    assert 1 << 14 <= m < 1 << 15 and 1 <= s <= 62
    assert abs(m * 2.0 ** -s / scale - 1) <= 2.0 ** -15


def test_quantize_multiplier_rejects_bad_scale():
    for bad in (0.0, -1.0, float("inf"), 1e5):
        with pytest.raises(UserError):
            fp.quantize_multiplier(bad)


def test_requantize_matches_float_and_saturates():
    g = _gen(1)
    acc = torch.randint(-(1 << 20), 1 << 20, (4096,), generator=g)
    bias = torch.randint(-1000, 1000, (4096,), generator=g)
    scale = 3.3e-5
    m, s = fp.quantize_multiplier(scale)
    y = fp.requantize(acc, m, s, bias)
    assert y.dtype == torch.int8
    ref = ((acc + bias).double() * scale).clamp(-128, 127)
    assert (y.double() - ref).abs().max() <= 0.5 + 128 * 2.0 ** -15
    big = torch.tensor([2**31 - 1, -(2**31), 0])
    assert fp.requantize(big, m, s).tolist() == [127, -128, 0]
    # exact half: acc * M / 2**S = k + 0.5 rounds up, for negatives too
    assert fp.requantize(torch.tensor([5, -5]), 1 << 14, 15).tolist() == [3, -2]


def test_argmax_lowest_index_tie_break():
    x = torch.tensor([[1, 7, 3, 7], [0, 0, 0, 0], [-5, -2, -2, -9]])
    assert fp.argmax_lowest(x).tolist() == [1, 0, 1]
    g = _gen(2)
    r = torch.randint(-4, 4, (1000, 33), generator=g)  # many ties
    want = [row.tolist().index(max(row.tolist())) for row in r]
    assert fp.argmax_lowest(r).tolist() == want


# --------------------------------------------------------------------------------------- matmuls
def _ref_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.long().unsqueeze(-2) * b.long()).sum(-1)


def test_int8_matmul_exact_including_extremes():
    g = _gen(3)
    x, w = _i8(5, 2500, g=g), _i8(40, 2500, g=g)
    assert torch.equal(fp.int8_matmul(x, w).long(), _ref_dot(x, w))
    # worst case magnitude: every product is +2**14; 2500 of them crosses 2**24 several times
    xm = torch.full((2, 2500), -128, dtype=torch.int8)
    assert torch.equal(fp.int8_matmul(xm, xm).long(), torch.full((2, 2), 2500 * 2**14))
    assert torch.equal(fp.int_matmul(xm, xm), torch.full((2, 2), 2500 * 2**14))
    assert torch.equal(fp.int_matmul(x, w), _ref_dot(x, w))


def test_int_matmul_float_paths_are_exact():
    g = _gen(4)
    # Q0.15 probabilities x int8 values: fp64 path
    p = torch.randint(0, 32769, (3, 777), generator=g)
    v = torch.randint(-128, 128, (9, 777), generator=g)
    assert torch.equal(fp.int_matmul(p, v), _ref_dot(p, v))
    # an adversarial sum whose fp32 rounding would be visible if the chunking were wrong
    a = torch.full((1, 4096), 127)
    b = torch.full((1, 4096), 127)
    b[0, ::2] = 126
    assert int(fp.int_matmul(a, b)) == 127 * (127 * 2048 + 126 * 2048)


def test_int4_pack_roundtrip_and_group_matmul():
    g = _gen(5)
    w4 = torch.randint(-8, 8, (24, 256), generator=g)
    packed = fp.int4_pack(w4)
    assert packed.dtype == torch.uint8 and packed.shape == (24, 128)
    assert int(packed[0, 0]) == (int(w4[0, 0]) & 15) | ((int(w4[0, 1]) & 15) << 4)
    assert torch.equal(fp.int4_unpack(packed).long(), w4)
    scales = torch.randint(1, 256, (24, 8), generator=g)
    x = _i8(3, 256, g=g)
    wg = fp.int4_group_layout(fp.int4_unpack(packed), 32)
    assert wg.shape == (8, 24, 32)
    acc = fp.int4_group_matmul(x, wg, scales)
    ref = (x.long().view(3, 1, 8, 32) * w4.view(1, 24, 8, 32)).sum(-1).mul(scales).sum(-1)
    assert torch.equal(acc, ref)
    extreme = torch.full((1, 256), -128, dtype=torch.int8)
    w_ext = fp.int4_group_layout(torch.full((2, 256), -8), 32)
    s_ext = torch.full((2, 8), 255)
    assert fp.int4_group_matmul(extreme, w_ext, s_ext).tolist() == [[256 * 1024 * 255] * 2]
    with pytest.raises(UserError):
        fp.int4_group_matmul(x, wg, scales[:, :4])


def test_int4_group_matmul_float_path_matches_int_mm_path():
    """The non-_int_mm path (used on CUDA) gives the same integers: feed it int64 activations."""
    g = _gen(12)
    w4 = torch.randint(-8, 8, (16, 128), generator=g)
    wg = fp.int4_group_layout(w4, 64)
    scales = torch.randint(1, 256, (16, 2), generator=g)
    x = _i8(4, 128, g=g)
    assert torch.equal(fp.int4_group_matmul(x, wg, scales), fp.int4_group_matmul(x.long(), wg, scales))


# --------------------------------------------------------------------------------------- RMSNorm
def test_rsqrt_q15_relative_error():
    g = _gen(6)
    v = torch.cat([torch.arange(1, 5000), torch.randint(1, 1 << 47, (20000,), generator=g)])
    r, k = fp.rsqrt_q15(v)
    approx = r.double() * torch.pow(2.0, -(30 + k).double())
    assert (approx * v.double().sqrt() - 1).abs().max() < 4e-5


@pytest.mark.parametrize("bits", [8, 16])
def test_rmsnorm_vs_float(bits):
    g = _gen(7)
    lim = 1 << (bits - 1)
    x = torch.randint(-lim + 1, lim, (64, 896), generator=g)
    gamma = torch.rand(896, generator=g, dtype=torch.float64) * 3 + 0.05
    in_scale, out_scale, eps = 4.0 / lim, 0.04, 1e-6
    c = fp.rmsnorm_setup(gamma, in_scale, out_scale, eps)
    y = fp.rmsnorm(x, **c)
    xr = x.double() * in_scale
    ref = (xr * torch.rsqrt((xr**2).mean(-1, keepdim=True) + eps) * gamma / out_scale).clamp(-128, 127)
    # error budget: 0.5 LSB rounding + gamma int16 rounding + rsqrt (4e-5) on outputs up to 128
    assert (y.double() - ref).abs().max() <= 0.5 + 128 * (4e-5 + 2 * 2.0**-15)
    zeros = fp.rmsnorm(torch.zeros(2, 896, dtype=torch.int64), **c)
    assert zeros.abs().max() == 0
    extreme = torch.full((1, 896), -lim + 1)
    assert fp.rmsnorm(extreme, **c).min() >= -128


# --------------------------------------------------------------------------------------- softmax
def test_exp_table_and_softmax_exp():
    lut = fp.exp2_table()
    assert lut[0] == 32768 and lut.shape == (256,) and int(lut[-1]) == round(32768 * 2 ** (-255 / 256))
    d = torch.arange(-20000, 1)
    m, s = fp.softmax_setup(0.001)
    e = fp.softmax_exp(d, m, s)
    ref = torch.exp(d.double() * 0.001) * 32768
    assert int(e[-1]) == 32768  # d = 0 is exactly 1.0
    assert ((e.double() - ref).abs() <= ref * 2e-3 + 1).all()
    assert int(fp.softmax_exp(torch.tensor([-(1 << 32)]), m, s)) == 0


def test_softmax_q15_vs_float_and_edges():
    g = _gen(8)
    scores = torch.randint(-30000, 30000, (500, 48), generator=g)
    scale = 1e-3 / math.sqrt(64)
    m, s = fp.softmax_setup(scale * 64)
    p = fp.softmax_q15(scores, m, s)
    ref = torch.softmax(scores.double() * scale * 64, -1) * 32768
    assert ((p.double() - ref).abs() <= ref * 3e-3 + 2).all()
    assert (p.sum(-1) - 32768).abs().max() <= 48
    one = fp.softmax_q15(torch.tensor([[5, -100000]]), m, s)
    assert one.tolist() == [[32768, 0]]
    tie = fp.softmax_q15(torch.tensor([[7, 7, 7, 7]]), m, s)
    assert tie.tolist() == [[8192] * 4]
    mask = torch.tensor([[True, False, True, False]])
    assert fp.softmax_q15(torch.tensor([[1, 10**6, 1, 10**6]]), m, s, mask).tolist() == [[16384, 0, 16384, 0]]
    assert fp.softmax_q15(torch.zeros(1, 3, dtype=torch.int64), m, s, torch.zeros(1, 3, dtype=torch.bool)).sum() == 0


def test_reciprocal_q15_relative_error():
    g = _gen(9)
    v = torch.cat([torch.arange(1 << 15, (1 << 15) + 5000), torch.randint(1 << 15, 1 << 40, (20000,), generator=g)])
    r, k = fp.reciprocal_q15(v)
    assert (r.double() * torch.pow(2.0, -(30 + k).double()) * v.double() - 1).abs().max() < 1e-4


# ------------------------------------------------------------------------------------ SiLU, RoPE
def test_silu_table():
    t = fp.silu_table(0.05, 0.02)
    assert t.dtype == torch.int8 and t.shape == (256,)
    for x in (-128, -1, 0, 1, 50, 127):
        ref = max(-128, min(127, math.floor(x * 0.05 / (1 + math.exp(-x * 0.05)) / 0.02 + 0.5)))
        assert int(fp.lut_apply(torch.tensor([x], dtype=torch.int8), t)) == ref
    assert int(fp.silu_table(0.5, 0.01)[127]) == 127  # saturates


def test_rope_vs_float_and_saturation():
    g = _gen(10)
    hd, t = 64, 50
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = torch.arange(t, dtype=torch.float64)[:, None] * inv  # [T, hd/2]
    cq, sq = fp.rope_tables_q14(ang.cos(), ang.sin())
    x = torch.randint(-128, 128, (t, hd), generator=g)
    y = fp.rope_apply(x, cq, sq)
    xf = x.double()
    rot = torch.cat([-xf[:, hd // 2:], xf[:, :hd // 2]], -1)
    ref = (xf * torch.cat([ang.cos()] * 2, -1) + rot * torch.cat([ang.sin()] * 2, -1)).clamp(-128, 127)
    assert (y.double() - ref).abs().max() <= 0.5 + 256 * 2.0**-14
    c45 = torch.tensor([[11585]])  # cos 45 deg in Q1.14
    assert fp.rope_apply(torch.tensor([[127, -128]]), c45, c45).tolist() == [[127, -1]]


# ----------------------------------------------------------------------------------- CPU == CUDA
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cpu_and_cuda_identical():
    g = _gen(11)
    x, w = _i8(4, 1500, g=g), _i8(64, 1500, g=g)
    scores = torch.randint(-30000, 30000, (16, 40), generator=g)
    m, s = fp.softmax_setup(1e-3)
    c = fp.rmsnorm_setup(torch.rand(1500, generator=g) + 0.1, 0.02, 0.05, 1e-6)
    cq, sq = fp.rope_tables_q14(torch.rand(4, 750, generator=g), torch.rand(4, 750, generator=g))

    def run(dev: str) -> list[torch.Tensor]:
        xd, wd = x.to(dev), w.to(dev)
        cd = {k: v.to(dev) if torch.is_tensor(v) else v for k, v in c.items()}
        return [fp.int8_matmul(xd, wd), fp.softmax_q15(scores.to(dev), m, s), fp.rmsnorm(xd, **cd),
                fp.rope_apply(xd, cq.to(dev), sq.to(dev)), fp.argmax_lowest(fp.int8_matmul(xd, wd))]

    for a, b in zip(run("cpu"), run("cuda"), strict=True):
        assert torch.equal(a, b.cpu())
