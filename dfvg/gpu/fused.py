"""Fused Triton kernels for a decoder layer at up to 16 new tokens: 5-6 launches per layer.

Why: at batch 1 a 1.5B decode step reads 3 GB of weights (0.72 ms at 4.3 TB/s), but the compiled block
of `dfvg.gpu.graphs` replays ~20 kernels per layer (578 per step), and inside a CUDA graph each still
costs microseconds of launch and tail; its float32 attention matmuls over the whole cache were the
largest single item (benchmarks/RESULTS.md, H200 kernel tables). Here a layer is

1. `qkv_rope`:     RMSNorm -> x Wqkv^T + b -> RoPE on q and k -> q to a buffer, k and v into the cache at pos
2. `attention`:    per (kv head, 64-slot split) partial softmax, then the merge (`dfvg.gpu.decode_attention`)
3. `fused_linear`: x + attn Wo^T (+ b)
4. `fused_linear`: RMSNorm -> silu(x Wg^T) * (x Wu^T)
5. `fused_linear`: x + h W2^T (cuBLAS + add for T > 1, where it measured faster)

and the LM head stays cuBLAS (`Transformer.logits`: 115 us against the fused kernel's 136 us for 152k
rows). Each fused kernel is a GEMV-shaped stream over its weight matrix with the small prologue/epilogue
work folded in, so weights are read once and activations make no extra round trip. Rows (T) are the new
tokens: 1 for plain decode, k + 1 for a verify step, 2 for the draft's catch-up, 16 for a prefill chunk.
With T = 1 the products are multiply-and-sum reduced once after the loop, and a fused RMSNorm scales the
finished dot products by 1/RMS(x), whose sum of squares is gathered in the same pass over x (a separate
first pass cost the launch a serial L2 round trip before any weight load: gate/up 18.2 us on the H200,
against 22.7 us for the two-pass kernel in an earlier session's sweep, not side by side); with T > 1 they
are `tl.dot` on rows padded to 16, on rows normalized in a first pass.

Positions come from a device tensor, so a captured graph replays at any position without a host sync.
Arithmetic follows `dfvg.model` (float32 accumulation and softmax, bf16 rounding where the reference
rounds, except the T = 1 RMSNorm above, which keeps the normalized row in float32), not bit for bit:
`gpu/check_kernels.py` and the gpu-marked tests bound the difference.

What this module does not cover (callers fall back to the compiled block): Qwen3's per-head q/k norm,
head_dim not a power of two, more than `MAX_ROWS` rows, and machines without Triton.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dfvg.gpu.decode_attention import INTERPRETED, attention
from dfvg.gpu.kernels import HAVE_TRITON

MAX_ROWS = 16  # new tokens per launch (the padded tile height of the T > 1 path)

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from dfvg.gpu.decode_attention import _dot

    @triton.jit
    def _x_tile(x_ptr, x_stride, rows, K, k0, BT: tl.constexpr, BK: tl.constexpr):
        """Columns k0..k0+BK of the first `rows` rows of x, float32 [BT, BK] (zeros past rows and K)."""
        t = tl.arange(0, BT)
        k = k0 + tl.arange(0, BK)
        return tl.load(x_ptr + t[:, None] * x_stride + k[None, :], mask=(t[:, None] < rows) & (k[None, :] < K),
                       other=0.0).to(tl.float32)

    @triton.jit
    def _g_tile(g_ptr, K, k0, BK: tl.constexpr):
        """Columns k0..k0+BK of the RMSNorm weight, float32 [1, BK]."""
        k = k0 + tl.arange(0, BK)
        return tl.load(g_ptr + k, mask=k < K, other=0.0).to(tl.float32)[None, :]

    @triton.jit
    def _w_tile(w_ptr, row0, n_rows, K, k0, BN: tl.constexpr, BK: tl.constexpr):
        n = row0 + tl.arange(0, BN)
        k = k0 + tl.arange(0, BK)
        return tl.load(w_ptr + n[:, None] * K + k[None, :], mask=(n[:, None] < n_rows) & (k[None, :] < K),
                       other=0.0, eviction_policy="evict_first")

    @triton.jit
    def _stream(x_ptr, x_stride, g_ptr, w_ptr, row0, row1, n_rows, rows, K, eps, NORM: tl.constexpr,
                PAIR: tl.constexpr, USE_DOT: tl.constexpr, F32: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr,
                BK: tl.constexpr, UNROLL: tl.constexpr):
        """A [rows, K] times weight rows row0..row0+BN (and row1.. with PAIR) over all of K -> 2x [BT, BN];
        with NORM, A is RMSNorm(x) * g.

        The weight stream is the whole cost, so the T = 1 path keeps elementwise partial products [BN, BK]
        and reduces once after the loop: no cross-thread reduction per tile, so the loads of successive
        tiles overlap (UNROLL of them in flight). Its RMSNorm uses RMSNorm(x) W^T = diag(1/RMS(x)) (x * g) W^T:
        the sum of squares is gathered in the same pass as the weights and 1/RMS applied last, instead of a
        pass over x to find the RMS first while no weight load is in flight."""
        if USE_DOT:
            # Tensor-core tiles take the normalized rows, 1/RMS found in a first pass over x: scaling after
            # the dot, with the sum in the same loop, measured ~1.5x slower at T = 5 (H200, 2026-12-03,
            # against the previous session's sweep: not side by side).
            rstd = tl.full((BT,), 1.0, tl.float32)
            if NORM:
                sum_sq = tl.zeros((BT,), tl.float32)
                for k0 in range(0, K, BK):
                    x = _x_tile(x_ptr, x_stride, rows, K, k0, BT, BK)
                    sum_sq += tl.sum(x * x, axis=1)
                rstd = tl.rsqrt(sum_sq / K + eps)
            acc0 = tl.zeros((BT, BN), tl.float32)
            acc1 = tl.zeros((BT, BN), tl.float32)
            for k0 in tl.range(0, K, BK, loop_unroll_factor=UNROLL):
                a = _x_tile(x_ptr, x_stride, rows, K, k0, BT, BK)
                if NORM:  # rounded as `dfvg.model.RMSNorm` rounds
                    a = (a * rstd[:, None]).to(tl.bfloat16).to(tl.float32) * _g_tile(g_ptr, K, k0, BK)
                a = a.to(tl.bfloat16)
                acc0 += _dot(a, tl.trans(_w_tile(w_ptr, row0, n_rows, K, k0, BN, BK)), F32)
                if PAIR:
                    acc1 += _dot(a, tl.trans(_w_tile(w_ptr, row1, n_rows, K, k0, BN, BK)), F32)
        else:
            part0 = tl.zeros((BN, BK), tl.float32)
            part1 = tl.zeros((BN, BK), tl.float32)
            squares = tl.zeros((BT, BK), tl.float32)  # sum of squares kept elementwise, summed once
            for k0 in tl.range(0, K, BK, loop_unroll_factor=UNROLL):
                x = _x_tile(x_ptr, x_stride, rows, K, k0, BT, BK)
                a = x
                if NORM:
                    squares += x * x
                    a = x * _g_tile(g_ptr, K, k0, BK)
                part0 += _w_tile(w_ptr, row0, n_rows, K, k0, BN, BK).to(tl.float32) * a
                if PAIR:
                    part1 += _w_tile(w_ptr, row1, n_rows, K, k0, BN, BK).to(tl.float32) * a
            acc0 = tl.sum(part0, axis=1)[None, :]
            acc1 = tl.sum(part1, axis=1)[None, :]
            if NORM:
                rstd = tl.rsqrt(tl.sum(squares, axis=1) / K + eps)[:, None]
                acc0 = acc0 * rstd
                acc1 = acc1 * rstd
        return acc0, acc1

    @triton.jit
    def _linear_kernel(x_ptr, x_stride, g_ptr, w_ptr, b_ptr, res_ptr, out_ptr, rows, N, K, eps,
                       NORM: tl.constexpr, SWIGLU: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                       USE_DOT: tl.constexpr, F32: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr,
                       BK: tl.constexpr, UNROLL: tl.constexpr):
        """out [rows, N] = res + (norm?(x) W[:N]^T + b), or silu(. W[:N]^T) * (. W[N:2N]^T) with SWIGLU."""
        n0 = tl.program_id(0) * BN
        n_rows = 2 * N if SWIGLU else N
        acc, acc_up = _stream(x_ptr, x_stride, g_ptr, w_ptr, n0, N + n0, n_rows, rows, K, eps, NORM, SWIGLU,
                              USE_DOT, F32, BT, BN, BK, UNROLL)
        t = tl.arange(0, BT)
        n = n0 + tl.arange(0, BN)
        if HAS_BIAS:
            acc += tl.load(b_ptr + n, mask=n < N, other=0.0).to(tl.float32)[None, :]
        if SWIGLU:  # the reference rounds gate and up to bf16, then computes silu(gate) * up in bf16
            gate = acc.to(tl.bfloat16).to(tl.float32)
            acc = (gate / (1.0 + tl.exp(-gate))).to(tl.bfloat16).to(tl.float32) * acc_up.to(tl.bfloat16).to(
                tl.float32)
        where = t[:, None] * N + n[None, :]
        valid = (t[:, None] < rows) & (n[None, :] < N)
        if HAS_RES:
            acc = acc.to(tl.bfloat16).to(tl.float32) + tl.load(res_ptr + where, mask=valid, other=0.0).to(tl.float32)
        tl.store(out_ptr + where, acc.to(out_ptr.dtype.element_ty), mask=valid)

    @triton.jit
    def _qkv_rope_kernel(x_ptr, g_ptr, w_ptr, b_ptr, pos_ptr, cos_ptr, sin_ptr, q_ptr, kc_ptr, vc_ptr,
                         rows, K, eps, HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HD: tl.constexpr,
                         HAS_BIAS: tl.constexpr, USE_DOT: tl.constexpr, F32: tl.constexpr, BT: tl.constexpr,
                         BN: tl.constexpr, BK: tl.constexpr, UNROLL: tl.constexpr):
        """Program (head, chunk): columns c..c+BN of both halves of one q/k/v head, so RoPE's pairs
        (d, d + HD/2) meet in one program; q -> q_ptr [rows, HEADS, HD], k/v -> cache [S, KV, HD] at pos."""
        HALF: tl.constexpr = HD // 2
        chunks: tl.constexpr = HALF // BN
        head = tl.program_id(0) // chunks
        lo = (tl.program_id(0) % chunks) * BN + tl.arange(0, BN)  # column within the head's first half
        row_lo = head * HD + (tl.program_id(0) % chunks) * BN
        acc_lo, acc_hi = _stream(x_ptr, K, g_ptr, w_ptr, row_lo, row_lo + HALF, (HEADS + 2 * KV_HEADS) * HD,
                                 rows, K, eps, True, True, USE_DOT, F32, BT, BN, BK, UNROLL)
        if HAS_BIAS:
            acc_lo += tl.load(b_ptr + head * HD + lo).to(tl.float32)[None, :]
            acc_hi += tl.load(b_ptr + head * HD + HALF + lo).to(tl.float32)[None, :]
        x_lo = acc_lo.to(tl.bfloat16).to(tl.float32)  # the projection's bf16 output, as the reference has it
        x_hi = acc_hi.to(tl.bfloat16).to(tl.float32)
        t = tl.arange(0, BT)
        live = t < rows
        pos = tl.load(pos_ptr + t, mask=live, other=0)
        if head < HEADS + KV_HEADS:  # q and k heads are rotated; v heads are stored as they are
            cos_lo = tl.load(cos_ptr + pos[:, None] * HD + lo[None, :], mask=live[:, None], other=0.0)
            sin_lo = tl.load(sin_ptr + pos[:, None] * HD + lo[None, :], mask=live[:, None], other=0.0)
            cos_hi = tl.load(cos_ptr + pos[:, None] * HD + HALF + lo[None, :], mask=live[:, None], other=0.0)
            sin_hi = tl.load(sin_ptr + pos[:, None] * HD + HALF + lo[None, :], mask=live[:, None], other=0.0)
            cos_lo, sin_lo = cos_lo.to(tl.bfloat16).to(tl.float32), sin_lo.to(tl.bfloat16).to(tl.float32)
            cos_hi, sin_hi = cos_hi.to(tl.bfloat16).to(tl.float32), sin_hi.to(tl.bfloat16).to(tl.float32)
            y_lo = x_lo * cos_lo - x_hi * sin_lo
            y_hi = x_hi * cos_hi + x_lo * sin_hi
        else:
            y_lo = x_lo
            y_hi = x_hi
        mask = live[:, None] & (lo[None, :] < HALF)
        if head < HEADS:
            q_at = t[:, None] * (HEADS * HD) + head * HD + lo[None, :]
            tl.store(q_ptr + q_at, y_lo.to(tl.bfloat16), mask=mask)
            tl.store(q_ptr + q_at + HALF, y_hi.to(tl.bfloat16), mask=mask)
        elif head < HEADS + KV_HEADS:
            k_at = pos[:, None] * (KV_HEADS * HD) + (head - HEADS) * HD + lo[None, :]
            tl.store(kc_ptr + k_at, y_lo.to(tl.bfloat16), mask=mask)
            tl.store(kc_ptr + k_at + HALF, y_hi.to(tl.bfloat16), mask=mask)
        else:
            v_at = pos[:, None] * (KV_HEADS * HD) + (head - HEADS - KV_HEADS) * HD + lo[None, :]
            tl.store(vc_ptr + v_at, y_lo.to(tl.bfloat16), mask=mask)
            tl.store(vc_ptr + v_at + HALF, y_hi.to(tl.bfloat16), mask=mask)


def _tiles(rows: int) -> tuple[bool, int]:
    """(use tensor-core dot, padded tile height): T = 1 multiply-and-sum; T > 1 `tl.dot` on 16-row tiles.

    (Multiply-and-sum over [T, BN, BK] partials for T > 1 was measured 1.5-16x slower on the H200: the
    partials spill out of registers; benchmarks/RESULTS.md.)"""
    return (False, 1) if rows == 1 else (True, MAX_ROWS)


def rows_bucket(rows: int) -> int:
    """The row counts that share tuned block sizes: 1 (decode), 2..8 (k <= 7 verify, catch-up), 9..16."""
    return 1 if rows == 1 else (8 if rows <= 8 else 16)


# Per-shape block sizes measured best on the H200 (benchmarks/gpu_decode.py --sweep --quick, 2026-12-03, the
# sweep that the real-pair run of benchmarks/RESULTS.md applied; Qwen2.5-Coder-1.5B shapes; the LM head rows
# of that sweep are left out: the head stays cuBLAS): (N, K, rows_bucket) -> config. Other shapes take
# `linear_config`'s defaults.
TUNED: dict[tuple[int, int, int], dict] = {
    (1536, 1536, 1): {"BN": 2, "BK": 1024, "UNROLL": 2, "num_warps": 4},
    (8960, 1536, 1): {"BN": 4, "BK": 256, "UNROLL": 4, "num_warps": 4},
    (1536, 8960, 1): {"BN": 2, "BK": 1024, "UNROLL": 2, "num_warps": 4},
    (1536, 1536, 8): {"BN": 16, "BK": 256, "UNROLL": 1, "num_warps": 4},
    (8960, 1536, 8): {"BN": 32, "BK": 128, "UNROLL": 1, "num_warps": 4},
    (1536, 8960, 8): {"BN": 16, "BK": 256, "UNROLL": 1, "num_warps": 4},
    (1536, 1536, 16): {"BN": 16, "BK": 256, "UNROLL": 1, "num_warps": 4},
    (8960, 1536, 16): {"BN": 32, "BK": 128, "UNROLL": 1, "num_warps": 4},
    (1536, 8960, 16): {"BN": 16, "BK": 256, "UNROLL": 1, "num_warps": 4},
}


def tuned_rows() -> list[list]:
    """`TUNED` as JSON-able rows [N, K, rows_bucket, config] (gpu_decode.py --sweep writes them)."""
    return [[n, k, bucket, config] for (n, k, bucket), config in TUNED.items()]


def apply_tuned(rows: list[list]) -> None:
    """Put rows of `tuned_rows` (e.g. a sweep made on this machine) into `TUNED`."""
    for n, k, bucket, config in rows:
        TUNED[(n, k, bucket)] = config


def linear_config(n: int, k: int, rows: int) -> dict:
    """Block sizes of a GEMV-shaped launch: the tuned entry for this shape, else a default that suits
    the H200 sweep's shapes. BN weight rows per program, BK columns per tile, UNROLL tiles in flight."""
    tuned = TUNED.get((n, k, rows_bucket(rows)))
    if tuned is not None:
        return tuned
    if rows == 1:
        return {"BN": 2, "BK": 1024, "UNROLL": 2, "num_warps": 4} if n <= 4096 else {
            "BN": 4, "BK": 512, "UNROLL": 2, "num_warps": 4}
    return {"BN": 32 if n > 4096 else 16, "BK": 128 if n > 4096 else 256, "UNROLL": 1, "num_warps": 4}


def fused_linear(x: Tensor, weight: Tensor, *, norm: Tensor | None = None, bias: Tensor | None = None,
                 residual: Tensor | None = None, swiglu: bool = False, eps: float = 1e-6,
                 out_dtype: torch.dtype | None = None, config: dict | None = None) -> Tensor:
    """x [T, K] bf16 -> [T, N]: residual + (RMSNorm?(x) W^T + bias), or the SwiGLU pair of W's halves.

    weight [N, K] ([2N, K] with swiglu: gate rows then up rows, as `FeedForward.w13`); norm is the RMSNorm
    weight; residual [T, N]. One launch; T <= MAX_ROWS; x's rows must be contiguous."""
    rows, k = x.shape
    n = weight.shape[0] // 2 if swiglu else weight.shape[0]
    cfg = {**linear_config(n, k, rows), **(config or {})}
    use_dot, bt = _tiles(rows)
    out = torch.empty(rows, n, dtype=out_dtype or x.dtype, device=x.device)
    dummy = weight
    _linear_kernel[(triton.cdiv(n, cfg["BN"]),)](
        x, x.stride(0), norm if norm is not None else dummy, weight, bias if bias is not None else dummy,
        residual if residual is not None else dummy, out, rows, n, k, eps,
        NORM=norm is not None, SWIGLU=swiglu, HAS_BIAS=bias is not None, HAS_RES=residual is not None,
        USE_DOT=use_dot, F32=INTERPRETED, BT=bt, BN=cfg["BN"], BK=cfg["BK"], UNROLL=cfg["UNROLL"],
        num_warps=cfg["num_warps"])
    return out


def qkv_rope(x: Tensor, norm: Tensor, weight: Tensor, bias: Tensor | None, pos: Tensor, cos: Tensor,
             sin: Tensor, kc: Tensor, vc: Tensor, dims: tuple, config: dict | None = None) -> Tensor:
    """RMSNorm + QKV projection + RoPE; writes k/v into kc/vc [S, KV, hd] at pos; returns q [T, H*hd]."""
    heads, kv_heads, hd, _, eps = dims
    rows, k = x.shape
    cfg = {**linear_config(weight.shape[0], k, rows), **(config or {})}
    use_dot, bt = _tiles(rows)
    block_n = min(cfg["BN"], hd // 2)
    q = torch.empty(rows, heads * hd, dtype=x.dtype, device=x.device)
    grid = ((heads + 2 * kv_heads) * (hd // 2 // block_n),)
    _qkv_rope_kernel[grid](x, norm, weight, bias if bias is not None else weight, pos, cos, sin, q, kc, vc,
                           rows, k, eps, HEADS=heads, KV_HEADS=kv_heads, HD=hd, HAS_BIAS=bias is not None,
                           USE_DOT=use_dot, F32=INTERPRETED, BT=bt, BN=block_n, BK=cfg["BK"],
                           UNROLL=cfg["UNROLL"], num_warps=cfg["num_warps"])
    return q


def layer_forward(x: Tensor, pos: Tensor, cos: Tensor, sin: Tensor, kc: Tensor, vc: Tensor, w: tuple,
                  dims: tuple) -> Tensor:
    """One decoder layer on x [T, D] (bf16) at positions pos [T]: the launches of the module docstring.

    w as `dfvg.gpu.block.layer_weights` (q/k norm must be None); kc/vc [S, KV, hd]; cos/sin [S, hd] fp32."""
    attn_norm, wqkv, wqkv_b, wo, wo_b, _q_norm, _k_norm, ffn_norm, w13, w2 = w
    eps = dims[4]
    q = qkv_rope(x, attn_norm, wqkv, wqkv_b, pos, cos, sin, kc, vc, dims)
    x = fused_linear(attention(q, kc, vc, pos, dims), wo, bias=wo_b, residual=x)
    h = fused_linear(x, w13, norm=ffn_norm, swiglu=True, eps=eps)
    if CUBLAS_DOWN_PROJECTION and x.shape[0] > 1:
        return x + torch.nn.functional.linear(h, w2)
    return fused_linear(h, w2, residual=x)


# With T > 1 rows cuBLAS streams the long-K down projection (8960 x 1536) in 12 us against the fused
# kernel's 21 us on the H200 (at T = 1 the fused one wins, 9.4 vs 11.9 us); the residual add is then one
# more small launch. benchmarks/RESULTS.md has the sweep.
CUBLAS_DOWN_PROJECTION = True


def supported(model) -> str | None:
    """None when `layer_forward` can run this model on this machine, else why not (one line)."""
    cfg = model.config
    if not HAVE_TRITON:
        return "Triton is not installed"
    if model.tok_embeddings.weight.device.type != "cuda":
        return "the model is not on a CUDA device"
    if model.tok_embeddings.weight.dtype != torch.bfloat16:
        return "fused kernels are written for bf16 weights"
    if cfg.qk_norm:
        return "per-head q/k RMSNorm (Qwen3) is not fused"
    if cfg.head_dim & (cfg.head_dim - 1) or cfg.head_dim < 16:
        return f"head_dim {cfg.head_dim} is not a power of two >= 16"
    return None
