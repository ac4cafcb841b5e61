"""Bit-exact integer primitives of the FPGA draft datapath (the RTL in `fpga/rtl/` matches them bit for bit).

This module owns the arithmetic: formats, rounding, saturation, lookup tables. It does not own a model
(the quantizer and the integer transformer build on these functions) nor any float reference.

Rules used everywhere
- Rounding: every right shift by s >= 1 rounds half up, `(x + 2**(s-1)) >> s` with an arithmetic shift
  (floor). 2.5 -> 3, -2.5 -> -2. In hardware it is one adder in front of the shifter.
- Saturation: clamp to the int8 range [-128, 127] (`saturate_int8`). No wrap-around anywhere.
- Integer ops only; floats appear only when building constant tables and multipliers at setup time,
  and in `int_matmul`, whose float32/float64 path is exact (every partial sum is an integer below the
  mantissa limit; `tests/test_fixed_point.py` proves it against int64 arithmetic).
- Matmul path: on CPU `int8_matmul` / `int4_group_matmul` use `torch._int_mm` (true int8 x int8 ->
  int32, int8 weights stay int8 in memory; measured here 0.03 s for the 151936 x 896 LM head and
  1.6 ms for a 9728 x 896 GEMV, vs 60 ms on the fp32 path, which casts the weights on every call).
  `_int_mm` is private and on CUDA wants M > 16, so CUDA (and any CPU build without it) takes the
  exact fp32 path; both give the same integers.

Formats (name: bits, meaning)
- activations, weights: int8, symmetric, real = q * scale (no zero point).
- int4 weights: signed [-8, 7], stored two per byte (low nibble = even k, `int4_pack`), group scales
  uint8 [1, 255] per group of G columns; the per-row float scale goes into the requantization
  multiplier. For compute they are unpacked once into the group-major layout [K/G, N, G].
- accumulators: int32 for int8 x int8 (exact for K < 2**17); 48 bits (DSP48E2 P register) for the
  int4 group path, returned in int64.
- requantization multiplier: (M, S) with M in [2**14, 2**15) (15 bits, fits a DSP 18-bit port), S in
  [1, 62]; real scale ~= M * 2**-S; y = sat8(round((acc + bias) * M / 2**S)).
- RMSNorm: input int (|x| < 2**15, int8 or an int16 residual), gamma int16 (per-tensor scale),
  rsqrt in Q1.15 (unsigned 16 bits) from a 128-entry seed LUT + 2 Newton steps, output int8.
- softmax: score differences d <= 0 are mapped by (M, S) to a base-2 exponent in Q.8
  (u = round(d * M / 2**S)); 2**u = LUT[frac] >> int with a 256-entry Q1.15 table; probabilities
  are Q0.15 in [0, 32768] (uint16); the reciprocal of the sum is Q1.15 from a 64-entry LUT + 2 Newton.
- SiLU: a 256-entry int8 -> int8 table indexed by the input byte (x & 0xFF), built from the scales.
- RoPE: cos/sin in Q1.14 (int16), half-split rotate_half convention (HF Llama/Qwen), output int8.
"""

from __future__ import annotations

import math

import torch

from dfvg.errors import UserError

INT8_MIN, INT8_MAX = -128, 127
MULT_BITS = 15  # multiplier M in [2**14, 2**15)
EXP_FRAC_BITS = 8  # softmax exponent u in Q.8 (base 2)
EXP_MAX_A = 31 * 256 + 255  # |u| clamp: 2**-31 is 0 in Q1.15, so a 13-bit magnitude suffices
Q15_ONE = 1 << 15
ROPE_FRAC_BITS = 14
RSQRT_SEED_BITS = 7  # 128-entry seed table, entries 32..127 used
RECIP_SEED_BITS = 6  # 64-entry seed table
NEWTON_STEPS = 2


# ----------------------------------------------------------------------------------------- basics
def rounding_shift(x: torch.Tensor, shift: torch.Tensor | int) -> torch.Tensor:
    """Right shift with round-half-up; `shift` >= 0 (0 = identity), scalar or broadcastable tensor."""
    x = x.to(torch.int64)
    shift = torch.as_tensor(shift, dtype=torch.int64, device=x.device)
    half = torch.bitwise_right_shift(torch.bitwise_left_shift(torch.ones_like(shift), shift), 1)
    return torch.bitwise_right_shift(x + half, shift)


def saturate_int8(x: torch.Tensor) -> torch.Tensor:
    """Clamp to [-128, 127] and return int8."""
    return x.clamp(INT8_MIN, INT8_MAX).to(torch.int8)


def quantize_multipliers(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Real positive scales [...] -> (M, S) int64 [...] with scale ~= M * 2**-S, M in [2**14, 2**15)."""
    s = torch.as_tensor(scales, dtype=torch.float64)
    if not bool(torch.all(s > 0)) or not bool(torch.all(torch.isfinite(s))):
        raise UserError("requantization scale must be finite and > 0; check the quantizer's scales")
    mant, exp = torch.frexp(s)  # s = mant * 2**exp, mant in [0.5, 1)
    m = torch.floor(mant * (1 << MULT_BITS) + 0.5).to(torch.int64)
    carry = m == (1 << MULT_BITS)  # mantissa rounded up to 1.0
    m = torch.where(carry, m >> 1, m)
    shift = MULT_BITS - (exp.to(torch.int64) + carry.to(torch.int64))
    if int(shift.min()) < 1 or int(shift.max()) > 62:
        raise UserError(f"requantization scale out of range [2**-47, 2**14): {s.min():.3g}..{s.max():.3g}")
    return m, shift


def quantize_multiplier(real_scale: float) -> tuple[int, int]:
    """One real scale -> (multiplier, shift); see `quantize_multipliers`."""
    m, s = quantize_multipliers(torch.tensor([real_scale], dtype=torch.float64))
    return int(m[0]), int(s[0])


def requantize(acc: torch.Tensor, multiplier: torch.Tensor | int, shift: torch.Tensor | int,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """Accumulator [..., N] (|acc + bias| < 2**47) -> int8 [..., N]; M, S per tensor or per channel [N]."""
    acc = acc.to(torch.int64)
    if bias is not None:
        acc = acc + bias.to(torch.int64)
    m = torch.as_tensor(multiplier, dtype=torch.int64, device=acc.device)
    return saturate_int8(rounding_shift(acc * m, shift))


def argmax_lowest(x: torch.Tensor) -> torch.Tensor:
    """Index of the maximum over the last dim, lowest index on ties: int64 [...]."""
    idx = torch.arange(x.shape[-1], device=x.device)
    hit = x == x.max(dim=-1, keepdim=True).values
    return torch.where(hit, idx, x.shape[-1]).min(dim=-1).values


def topk_lowest(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest integers over the last dim, largest first, the lower index first on ties:
    int64 [..., k]. `topk_lowest(x, 1)[..., 0] == argmax_lowest(x)`. Exact: one int64 key per entry,
    value * n - index (|value| < 2**40 for n <= 2**22), ranks values first and indices second.

    Example: [3, 7, 7, 1] with k = 3 -> [1, 2, 0]."""
    n = x.shape[-1]
    if x.dtype.is_floating_point or int(x.abs().max()) >= 2**40 or n > 2**22:
        raise ValueError("topk_lowest ranks integers below 2**40 over at most 2**22 entries")
    key = x.to(torch.int64) * n - torch.arange(n, device=x.device)
    return torch.topk(key, k, dim=-1).indices


# --------------------------------------------------------------------------------------- matmuls
def _probe_int_mm() -> bool:
    """torch._int_mm on CPU: exact int32 accumulation and ~4x faster than float32 here."""
    try:
        a = torch.ones(1, 8, dtype=torch.int8)
        return int(torch._int_mm(a, a.t())[0, 0]) == 8
    except (RuntimeError, AttributeError):
        return False


_CPU_INT_MM = _probe_int_mm()


def int_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact integer a [..., K] @ b[N, K].T -> int64 [..., N] for any integer tensors.

    Path: float32 matmul over K-chunks short enough that every partial sum stays <= 2**24 (exact in
    fp32 whatever the summation order), chunks summed in int64; float64 when that chunk would be
    shorter than 64 (exact while K * max|a| * max|b| <= 2**53).
    """
    # widen first: abs(-128) wraps to -128 in int8 and would understate the bound.
    amax = max(int(a.to(torch.int64).abs().max()) if a.numel() else 0, 1)
    bmax = max(int(b.to(torch.int64).abs().max()) if b.numel() else 0, 1)
    k = a.shape[-1]
    chunk = (1 << 24) // (amax * bmax)
    if chunk >= 64:
        out = torch.zeros(*a.shape[:-1], b.shape[0], dtype=torch.int64, device=a.device)
        for k0 in range(0, k, chunk):
            part = a[..., k0:k0 + chunk].to(torch.float32) @ b[:, k0:k0 + chunk].to(torch.float32).T
            out += part.to(torch.int64)
        return out
    if k * amax * bmax > (1 << 53):
        raise UserError(f"int_matmul operands too large to be exact (K={k}, max {amax} x {bmax})")
    return (a.to(torch.float64) @ b.to(torch.float64).T).to(torch.int64)


def int8_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """int8 x [..., K] @ int8 w [N, K].T -> int32 [..., N], int32 accumulation (K < 2**17).

    CPU: torch._int_mm (integer arithmetic). CUDA / no _int_mm: `int_matmul` (exact fp32 chunks of
    1024: 1024 * 128 * 128 = 2**24). Both give the same integers.
    """
    if x.dtype != torch.int8 or w.dtype != torch.int8:
        raise UserError(f"int8_matmul wants int8 operands, got {x.dtype} and {w.dtype}")
    k = x.shape[-1]
    if k >= (1 << 17):
        raise UserError(f"int8_matmul: K={k} would overflow the int32 accumulator (K < 131072)")
    if x.device.type == "cpu" and _CPU_INT_MM:
        x2 = x.reshape(-1, k)
        return torch._int_mm(x2, w.T).reshape(*x.shape[:-1], w.shape[0])
    return int_matmul(x, w).to(torch.int32)


def int4_pack(w4: torch.Tensor) -> torch.Tensor:
    """Signed int4 values [N, K] in [-8, 7] (K even) -> uint8 [N, K/2], low nibble = even k."""
    if int(w4.min()) < -8 or int(w4.max()) > 7 or w4.shape[-1] % 2:
        raise UserError("int4_pack wants values in [-8, 7] and an even number of columns")
    u = (w4.to(torch.int64) & 0xF).to(torch.uint8)
    return u[..., 0::2] | (u[..., 1::2] << 4)


def int4_unpack(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2] -> int8 [N, K] in [-8, 7] (sign-extended nibbles)."""
    p = packed.to(torch.int64)
    lo, hi = p & 0xF, (p >> 4) & 0xF
    w = torch.stack([lo, hi], dim=-1).reshape(*p.shape[:-1], -1)
    return (w - ((w & 8) << 1)).to(torch.int8)


def int4_group_layout(w4: torch.Tensor, group_size: int) -> torch.Tensor:
    """Unpacked int4 values int8 [N, K] -> group-major int8 [K/G, N, G] (contiguous), done once at load."""
    n, k = w4.shape
    if k % group_size:
        raise UserError(f"int4 groups: K={k} is not a multiple of group_size={group_size}")
    return w4.to(torch.int8).reshape(n, k // group_size, group_size).transpose(0, 1).contiguous()


def int4_group_matmul(x: torch.Tensor, w_groups: torch.Tensor, group_scales: torch.Tensor) -> torch.Tensor:
    """int8 x [..., K] @ int4 weights (group-major [K/G, N, G]) with scales [N, K/G] -> int64 [..., N].

    acc[n] = sum_g s[n, g] * sum_{k in g} x[k] * w[n, k] (a 48-bit accumulator in hardware).
    Group dots: torch._int_mm per group on CPU, else one exact fp32 bmm (|dot| <= G * 1024 < 2**24).
    """
    g, n, gs = w_groups.shape
    k = x.shape[-1]
    if g * gs != k or group_scales.shape != (n, g) or gs > 2048:
        raise UserError(f"int4 groups: x has K={k} but weights are {g} groups of {gs} (<= 2048) "
                        f"and scales must be [{n}, {g}], got {list(group_scales.shape)}")
    x2 = x.reshape(-1, k)
    scales = group_scales.to(torch.int64)
    if x.device.type == "cpu" and _CPU_INT_MM and x.dtype == torch.int8:
        acc = torch.zeros(x2.shape[0], n, dtype=torch.int64)
        for j in range(g):
            acc += torch._int_mm(x2[:, j * gs:(j + 1) * gs], w_groups[j].T).to(torch.int64) * scales[:, j]
    else:
        xg = x2.to(torch.float32).reshape(-1, g, gs).transpose(0, 1)  # [g, B, G]
        part = torch.bmm(xg, w_groups.to(torch.float32).transpose(1, 2)).to(torch.int64)  # [g, B, N]
        acc = (part * scales.T.unsqueeze(1)).sum(dim=0)
    return acc.reshape(*x.shape[:-1], n)


# --------------------------------------------------------------------------------------- RMSNorm
def rsqrt_seed_table() -> torch.Tensor:
    """128 x uint16 Q1.15 seeds: entry i ~ 1/sqrt((i + 0.5) / 64); only i in [32, 128) is used."""
    i = torch.arange(1 << RSQRT_SEED_BITS, dtype=torch.float64).clamp(min=32)
    return torch.floor(Q15_ONE / torch.sqrt((i + 0.5) / 64) + 0.5).to(torch.int64)


def _bit_length(v: torch.Tensor) -> torch.Tensor:
    """floor(log2 v) + 1 for v >= 1 (int64), by binary search on shifts: integer ops only."""
    n = torch.zeros_like(v)
    for step in (32, 16, 8, 4, 2, 1):
        big = torch.bitwise_right_shift(v, n + step) > 0
        n = n + big.to(torch.int64) * step
    return n + 1


def rsqrt_q15(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """v int64 [...] >= 1 (< 2**62) -> (r, k): 1/sqrt(v) ~= r * 2**-(30 + k), r in Q1.15.

    v = m * 4**k with m in [2**29, 2**31); r = rsqrt(m / 2**30) from the seed LUT at m >> 24,
    then Newton r <- r * (3 - m r^2) / 2 with m taken as Q.16 (m >> 14).
    """
    k = torch.div(_bit_length(v) - 1 - 29, 2, rounding_mode="floor")
    m = torch.where(k >= 0, torch.bitwise_right_shift(v, 2 * k.clamp(min=0)),
                    torch.bitwise_left_shift(v, (-2 * k).clamp(min=0)))
    r = rsqrt_seed_table().to(v.device)[torch.bitwise_right_shift(m, 24)]
    mq = torch.bitwise_right_shift(m, 14)  # Q.16, [2**15, 2**17)
    for _ in range(NEWTON_STEPS):
        t = rounding_shift(mq * (r * r), 31)  # m r^2 in Q.15
        r = rounding_shift(r * (3 * Q15_ONE - t), 16)
    return r, k


def rmsnorm_setup(gamma: torch.Tensor, in_scale: float, out_scale: float,
                  eps: float) -> dict[str, torch.Tensor | int]:
    """Float gamma [D] and scales -> integer constants {gamma_q int16 [D], multiplier, shift, eps_term}.

    real y = x_real / rms(x_real) * gamma; in integers the input scale cancels except inside eps, so
    eps_term = round(eps * D / in_scale**2) and (M, S) encode gamma_scale * sqrt(D) / out_scale.
    """
    d = gamma.shape[-1]
    g_scale = max(float(gamma.abs().max()), 1e-30) / 32767
    gamma_q = torch.floor(gamma.to(torch.float64) / g_scale + 0.5).to(torch.int64)
    m, s = quantize_multiplier(g_scale * math.sqrt(d) / out_scale)
    eps_term = math.floor(eps * d / in_scale ** 2 + 0.5)
    if eps_term >= 1 << 47:
        raise UserError(f"rmsnorm: eps / in_scale**2 too large ({eps_term}); raise the input scale")
    return {"gamma_q": gamma_q, "multiplier": m, "shift": s, "eps_term": eps_term}


def rmsnorm(x: torch.Tensor, gamma_q: torch.Tensor, multiplier: int, shift: int,
            eps_term: int) -> torch.Tensor:
    """Fixed-point RMSNorm: int x [..., D] (|x| < 2**15, D < 2**16) -> int8 [..., D].

    v = sum x^2 + eps_term; (r, k) = rsqrt_q15(v); rm = round(r * M / 2**15);
    y = sat8(round(x * gamma_q * rm / 2**T)), T = min(15 + k + S, 62) (beyond 49 the result is 0).
    """
    x = x.to(torch.int64)
    v = (x * x).sum(dim=-1, keepdim=True) + eps_term  # [..., 1], < 2**47
    r, k = rsqrt_q15(v.clamp(min=1))
    rm = rounding_shift(r * multiplier, MULT_BITS)  # < 2**16
    total_shift = (15 + k + shift).clamp(max=62)
    return saturate_int8(rounding_shift(x * gamma_q.to(torch.int64) * rm, total_shift))


# --------------------------------------------------------------------------------------- softmax
def exp2_table() -> torch.Tensor:
    """256 x uint16 Q1.15: entry f = round(2**15 * 2**(-f / 256)); entry 0 is exactly 1.0."""
    f = torch.arange(1 << EXP_FRAC_BITS, dtype=torch.float64)
    return torch.floor(Q15_ONE * torch.exp2(-f / (1 << EXP_FRAC_BITS)) + 0.5).to(torch.int64)


def recip_seed_table() -> torch.Tensor:
    """64 x uint16 Q1.15 seeds: entry i ~ 1 / (1 + (i + 0.5) / 64)."""
    i = torch.arange(1 << RECIP_SEED_BITS, dtype=torch.float64)
    return torch.floor(Q15_ONE / (1 + (i + 0.5) / 64) + 0.5).to(torch.int64)


def softmax_setup(score_scale: float) -> tuple[int, int]:
    """Real scale of the int scores (incl. 1/sqrt(head_dim)) -> (M, S) mapping them to Q.8 log2 units."""
    return quantize_multiplier(score_scale * math.log2(math.e) * (1 << EXP_FRAC_BITS))


def softmax_exp(d: torch.Tensor, multiplier: int, shift: int) -> torch.Tensor:
    """Score differences d <= 0 (int, |d| < 2**32) -> exp in Q1.15, int64 in [0, 32768].

    a = min(-round(d * M / 2**S), 31*256+255); e = round(LUT[a & 255] / 2**(a >> 8)).
    """
    a = (-rounding_shift(d.to(torch.int64) * multiplier, shift)).clamp(max=EXP_MAX_A)
    lut = exp2_table().to(d.device)
    return rounding_shift(lut[a & 0xFF], a >> EXP_FRAC_BITS)


def reciprocal_q15(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """s int64 [...] >= 2**15 -> (r, k): 1/s ~= r * 2**-(30 + k), r in Q1.15 (2**14..2**15).

    m = s >> k in [2**15, 2**16); r from the seed LUT at the 6 bits after the leading one, then
    Newton r <- r * (2 - m r).
    """
    k = _bit_length(s) - 16
    m = torch.bitwise_right_shift(s, k)
    r = recip_seed_table().to(s.device)[torch.bitwise_right_shift(m, 9) & 0x3F]
    for _ in range(NEWTON_STEPS):
        t = rounding_shift(m * r, 15)  # m r in Q.15
        r = rounding_shift(r * (2 * Q15_ONE - t), 15)
    return r, k


def softmax_q15(scores: torch.Tensor, multiplier: int, shift: int,
                mask: torch.Tensor | None = None) -> torch.Tensor:
    """Int scores [..., L] -> probabilities Q0.15 int64 [..., L] in [0, 32768]; mask True = keep.

    max-subtract, softmax_exp, int sum (>= 2**15: the max gives exactly 1.0), reciprocal_q15,
    p = round(e * r / 2**(15 + k)). Rows with nothing kept give all zeros.
    """
    s = scores.to(torch.int64)
    if mask is not None:
        s = torch.where(mask, s, torch.iinfo(torch.int64).min // 2)
    d = s - s.max(dim=-1, keepdim=True).values
    e = softmax_exp(d.clamp(min=-(1 << 32)), multiplier, shift)
    if mask is not None:
        e = torch.where(mask, e, 0)
    return softmax_normalize(e)


def softmax_normalize(e: torch.Tensor) -> torch.Tensor:
    """Exp values Q1.15 [..., L] -> probabilities Q0.15 [..., L]: p = round(e * r / 2**(15 + k)).

    (r, k) = reciprocal_q15(max(sum e, 2**15)); an all-zero row stays zero.
    """
    total = e.sum(dim=-1, keepdim=True)
    r, k = reciprocal_q15(total.clamp(min=Q15_ONE))
    return torch.where(total > 0, rounding_shift(e * r, 15 + k), 0)


# ------------------------------------------------------------------------------------ SiLU, RoPE
def silu_table(in_scale: float, out_scale: float) -> torch.Tensor:
    """256 x int8 table indexed by the input byte (x & 0xFF): sat8(round(silu(x * in) / out))."""
    x = torch.arange(256, dtype=torch.int64)
    x = (x - ((x & 0x80) << 1)).to(torch.float64) * in_scale  # byte -> signed value
    return saturate_int8(torch.floor(torch.nn.functional.silu(x) / out_scale + 0.5))


def lut_apply(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """int8 x [...] -> table[x & 0xFF] [...] (any 256-entry table, e.g. `silu_table`)."""
    return table.to(x.device)[x.to(torch.int64) & 0xFF]


def rope_tables_q14(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float cos/sin half tables [T, hd/2] -> int64 Q1.14 tables [T, hd/2] in [-16384, 16384]."""
    one = 1 << ROPE_FRAC_BITS
    return (torch.floor(cos.to(torch.float64) * one + 0.5).to(torch.int64),
            torch.floor(sin.to(torch.float64) * one + 0.5).to(torch.int64))


def rope_apply(x: torch.Tensor, cos_q: torch.Tensor, sin_q: torch.Tensor) -> torch.Tensor:
    """int x [..., hd] rotated by Q1.14 cos/sin [..., hd/2] (broadcast) -> int8 [..., hd].

    rotate_half: out1 = x1 cos - x2 sin, out2 = x2 cos + x1 sin, with x1 = x[:hd/2], x2 = x[hd/2:].
    """
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h].to(torch.int64), x[..., h:].to(torch.int64)
    c, s = cos_q.to(torch.int64), sin_q.to(torch.int64)
    o1 = rounding_shift(x1 * c - x2 * s, ROPE_FRAC_BITS)
    o2 = rounding_shift(x2 * c + x1 * s, ROPE_FRAC_BITS)
    return saturate_int8(torch.cat([o1, o2], dim=-1))
