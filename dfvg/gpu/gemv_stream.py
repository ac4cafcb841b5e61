"""The weight stream under every fused GEMV launch (`dfvg.gpu.fused`): the K loop, RMSNorm's prologue and
the fixed-order split-K reduction, for up to 4 row tiles that share each weight tile a program loads (1 is
shipped: `fused.ROW_TILES_PER_PROGRAM`).

Why here and not in `fused`: both launches (QKV + RoPE, and the plain/SwiGLU/residual linear) run this same
loop and differ only in their epilogues; the rules that make rows batch-invariant live in one place:
each row tile is its own `TILE_ROWS`-row dot in the same k order, and split-K partial sums are added in split
order by the program that finishes last.
"""

from __future__ import annotations

from dfvg.gpu.kernels import HAVE_TRITON

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from dfvg.gpu.decode_attention import _dot

    @triton.jit
    def _x_tile(x_ptr, x_stride, rows, t0, K, k0, BT: tl.constexpr, BK: tl.constexpr):
        """Rows t0..t0+BT, columns k0..k0+BK of x as float32 (zeros past rows and K)."""
        t = t0 + tl.arange(0, BT)
        k = k0 + tl.arange(0, BK)
        return tl.load(x_ptr + t[:, None] * x_stride + k[None, :], mask=(t[:, None] < rows) & (k[None, :] < K),
                       other=0.0).to(tl.float32)

    @triton.jit
    def _w_tile(w_ptr, row0, n_rows, K, k0, BN: tl.constexpr, BK: tl.constexpr):
        n = row0 + tl.arange(0, BN)
        k = k0 + tl.arange(0, BK)
        return tl.load(w_ptr + n[:, None] * K + k[None, :], mask=(n[:, None] < n_rows) & (k[None, :] < K),
                       other=0.0, eviction_policy="evict_first")

    @triton.jit
    def _inv_rms(x_ptr, x_stride, rows, t0, K: tl.constexpr, eps, BT: tl.constexpr, BK: tl.constexpr):
        """1/RMS of rows t0..t0+BT of x [BT], summed in fixed BK steps (the same order for every row count).

        Unrolled, so every load of x is in flight at once: a loop kept each weight load of the launch waiting
        for one L2 round trip per step. (Summing the squares inside the weight loop and scaling after the
        product measured slower still: the QKV launch 15.6 against 11.0 us, H200, 2026-12-04.)"""
        sum_sq = tl.zeros((BT,), tl.float32)
        for k0 in tl.static_range(0, K, BK):
            x = _x_tile(x_ptr, x_stride, rows, t0, K, k0, BT, BK)
            sum_sq += tl.sum(x * x, axis=1)
        return tl.rsqrt(sum_sq / K + eps)

    @triton.jit
    def _a_tile(x_ptr, x_stride, rows, t0, K, k0, rstd, g, NORM: tl.constexpr, BT: tl.constexpr,
                BK: tl.constexpr):
        """Rows t0..t0+BT of A at columns k0..k0+BK as the bf16 MMA operand; with NORM, A = RMSNorm(x) * g,
        rounded as `dfvg.model.RMSNorm` rounds."""
        a = _x_tile(x_ptr, x_stride, rows, t0, K, k0, BT, BK)
        if NORM:
            a = (a * rstd[:, None]).to(tl.bfloat16).to(tl.float32) * g
        return a.to(tl.bfloat16)

    @triton.jit
    def _stream(x_ptr, x_stride, g_ptr, w_ptr, row0, row1, n_rows, rows, t0, k_lo, k_len, K: tl.constexpr, eps,
                NORM: tl.constexpr, PAIR: tl.constexpr, F32: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr,
                BK: tl.constexpr, TILES: tl.constexpr):
        """Row tiles t0, t0+BT, .. (TILES <= 4 of them) of A times weight rows row0..row0+BN (and row1.. with
        PAIR) over columns k_lo..k_lo+k_len -> float32 [BT, BN] accumulators (tile 0 first, PAIR's second).

        Each weight tile is loaded once and multiplied into every row tile of the program. Every tile is its
        own BT-row dot, in the same k order, so a row's sums do not depend on how many tiles share the program
        (batch-invariant rows)."""
        r0 = tl.full((BT,), 1.0, tl.float32)
        r1 = r0
        r2 = r0
        r3 = r0
        if NORM:
            r0 = _inv_rms(x_ptr, x_stride, rows, t0, K, eps, BT, 512)
            if TILES > 1:
                r1 = _inv_rms(x_ptr, x_stride, rows, t0 + BT, K, eps, BT, 512)
            if TILES > 2:
                r2 = _inv_rms(x_ptr, x_stride, rows, t0 + 2 * BT, K, eps, BT, 512)
            if TILES > 3:
                r3 = _inv_rms(x_ptr, x_stride, rows, t0 + 3 * BT, K, eps, BT, 512)
        a0 = tl.zeros((BT, BN), tl.float32)
        b0 = tl.zeros((BT, BN), tl.float32)
        a1 = a0
        b1 = a0
        a2 = a0
        b2 = a0
        a3 = a0
        b3 = a0
        for k0 in range(k_lo, tl.minimum(k_lo + k_len, K), BK):
            g = tl.full((1, BK), 1.0, tl.float32)
            if NORM:
                k = k0 + tl.arange(0, BK)
                g = tl.load(g_ptr + k, mask=k < K, other=0.0).to(tl.float32)[None, :]
            w0 = tl.trans(_w_tile(w_ptr, row0, n_rows, K, k0, BN, BK))
            w1 = w0
            if PAIR:
                w1 = tl.trans(_w_tile(w_ptr, row1, n_rows, K, k0, BN, BK))
            x = _a_tile(x_ptr, x_stride, rows, t0, K, k0, r0, g, NORM, BT, BK)
            a0 += _dot(x, w0, F32)
            if PAIR:
                b0 += _dot(x, w1, F32)
            if TILES > 1:
                x = _a_tile(x_ptr, x_stride, rows, t0 + BT, K, k0, r1, g, NORM, BT, BK)
                a1 += _dot(x, w0, F32)
                if PAIR:
                    b1 += _dot(x, w1, F32)
            if TILES > 2:
                x = _a_tile(x_ptr, x_stride, rows, t0 + 2 * BT, K, k0, r2, g, NORM, BT, BK)
                a2 += _dot(x, w0, F32)
                if PAIR:
                    b2 += _dot(x, w1, F32)
            if TILES > 3:
                x = _a_tile(x_ptr, x_stride, rows, t0 + 3 * BT, K, k0, r3, g, NORM, BT, BK)
                a3 += _dot(x, w0, F32)
                if PAIR:
                    b3 += _dot(x, w1, F32)
        return a0, b0, a1, b1, a2, b2, a3, b3

    @triton.jit
    def _park(acc0, acc1, slot, at, PAIR: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr):
        """Store one row tile's split-K partial sums (both of PAIR's) in partial slot `at`."""
        offs = tl.arange(0, BT)[:, None] * BN + tl.arange(0, BN)[None, :]
        tl.store(slot + at * (2 * BT * BN) + offs, acc0)
        if PAIR:
            tl.store(slot + at * (2 * BT * BN) + BT * BN + offs, acc1)

    @triton.jit
    def _gather(slot, tile, last, PAIR: tl.constexpr, SPLIT_K: tl.constexpr, TILES: tl.constexpr,
                BT: tl.constexpr, BN: tl.constexpr):
        """Row tile `tile`'s sums over splits 0, 1, .. in that order (only the last program reads them)."""
        offs = tl.arange(0, BT)[:, None] * BN + tl.arange(0, BN)[None, :]
        sum0 = tl.zeros((BT, BN), tl.float32)
        sum1 = tl.zeros((BT, BN), tl.float32)
        for s in tl.static_range(SPLIT_K):
            at = slot + (s * TILES + tile) * (2 * BT * BN) + offs
            sum0 += tl.load(at, mask=last, other=0.0, cache_modifier=".cg")
            if PAIR:
                sum1 += tl.load(at + BT * BN, mask=last, other=0.0, cache_modifier=".cg")
        return sum0, sum1

    @triton.jit
    def _reduce_splits(a0, b0, a1, b1, a2, b2, a3, b3, part_ptr, count_ptr, group, split, PAIR: tl.constexpr,
                       SPLIT_K: tl.constexpr, TILES: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr):
        """Split-K in a fixed order: each split stores its partial sums, and the program that finishes last
        adds splits 0, 1, ... in that order (so the sum does not depend on which finished first) and resets
        the group's counter for the next launch. Returns the summed accumulators and is_last."""
        slot = part_ptr + group * (SPLIT_K * TILES * 2 * BT * BN)
        _park(a0, b0, slot, split * TILES, PAIR, BT, BN)
        if TILES > 1:
            _park(a1, b1, slot, split * TILES + 1, PAIR, BT, BN)
        if TILES > 2:
            _park(a2, b2, slot, split * TILES + 2, PAIR, BT, BN)
        if TILES > 3:
            _park(a3, b3, slot, split * TILES + 3, PAIR, BT, BN)
        tl.debug_barrier()
        last = tl.atomic_add(count_ptr + group, 1) == SPLIT_K - 1
        a0, b0 = _gather(slot, 0, last, PAIR, SPLIT_K, TILES, BT, BN)
        if TILES > 1:
            a1, b1 = _gather(slot, 1, last, PAIR, SPLIT_K, TILES, BT, BN)
        if TILES > 2:
            a2, b2 = _gather(slot, 2, last, PAIR, SPLIT_K, TILES, BT, BN)
        if TILES > 3:
            a3, b3 = _gather(slot, 3, last, PAIR, SPLIT_K, TILES, BT, BN)
        tl.atomic_xchg(count_ptr + group, 0, mask=last)
        return a0, b0, a1, b1, a2, b2, a3, b3, last

    @triton.jit
    def _program(pid, rows, SPLIT_K: tl.constexpr, BT: tl.constexpr, TILES: tl.constexpr):
        """(output block, K split, first row, group id) of a program, which takes TILES row tiles: row groups
        vary fastest, then splits, so programs that read one weight block run together and share it in L2."""
        groups = tl.cdiv(rows, BT * TILES)
        rg = pid % groups
        block = pid // (groups * SPLIT_K)
        return block, (pid // groups) % SPLIT_K, rg * BT * TILES, block * groups + rg
