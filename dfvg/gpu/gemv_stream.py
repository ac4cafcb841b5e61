"""The weight stream under every fused GEMV launch (`dfvg.gpu.fused`): the K loop, RMSNorm's prologue (or, with a
factored norm, its two halves: the producer's scaled block and block sums, the consumer's 1/RMS from them) and the
fixed-order split-K reduction, for one tile of rows per program (16 rows, or one tall tile:
`fused.TALL_TILES_ABOVE`); and the scratch buffers those reductions count in.

Why here and not in `fused`: both launches (QKV + RoPE, and the plain/SwiGLU/residual linear) run this same
loop and differ only in their epilogues; the rules that make rows batch-invariant live in one place:
each row tile is its own program's dot in the same k order, and split-K partial sums are added in split order by
the program that finishes last. (Up to 4 row tiles per program, each its own dot sharing the loaded weight tile,
measured slower above 16 rows and was removed, 2026-12-04 17:48 UTC; one tall tile, a single wgmma of up to 64 rows
as its N side, wins over 48 rows: benchmarks/RESULTS.md.)
"""

from __future__ import annotations

import torch
from torch import Tensor

from dfvg.gpu.kernels import HAVE_TRITON

COUNTERS = 16384  # split-K counters one forward shares (output tiles of its widest split launch)
ROW_COUNTERS = 4  # after them, per row tile of a launch (64 rows at most), its output blocks stored (`_normalize_rows`)

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from dfvg.gpu.decode_attention import _dot
    from dfvg.gpu.weight_tiles import _described_tile, _stacked_tile, _w_tile

    # Columns of x per step of `_inv_rms`'s sum of squares: gate/up's own norm and the O launch's normalization for
    # it (`_normalize_rows`, with `fused.FACTORED_NORM` off) must step alike for a row's 1/RMS to have the same bits.
    RMS_STEP = tl.constexpr(512)
    # `fused.FACTORED_NORM`: up to this many producer blocks a row (the 1.5B target's O launch has 24), gate/up loads
    # their sums before its weight stream (`_block_sums`); more would hold a register each through it.
    EARLY_SUMS = tl.constexpr(32)

    @triton.jit
    def _x_tile(x_ptr, x_stride, rows, t0, K, k0, BT: tl.constexpr, BK: tl.constexpr, FROM_L2: tl.constexpr = False):
        """Rows t0..t0+BT, columns k0..k0+BK of x as float32 (zeros past rows and K); FROM_L2: past L1, for rows
        other programs of this launch wrote (`_normalize_rows`)."""
        return _x_stored(x_ptr, x_stride, rows, t0, K, k0, BT, BK, FROM_L2).to(tl.float32)

    @triton.jit
    def _x_stored(x_ptr, x_stride, rows, t0, K, k0, BT: tl.constexpr, BK: tl.constexpr, FROM_L2: tl.constexpr):
        """`_x_tile` in x's own dtype: `_x_tiles` holds every step's tile at once, in half the registers so."""
        t = t0 + tl.arange(0, BT)
        k = k0 + tl.arange(0, BK)
        return tl.load(x_ptr + t[:, None] * x_stride + k[None, :], mask=(t[:, None] < rows) & (k[None, :] < K),
                       other=0.0, cache_modifier=".cg" if FROM_L2 else "")

    @triton.jit
    def _unstack(acc, PAIR: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr):
        """[2 BN, BT] sums of a stacked pair (`_stacked_tile`) -> its two blocks' [BT, BN]; without PAIR, [BN, BT]
        -> the block's [BT, BN], twice (the second output is unused then)."""
        if PAIR:
            first, second = tl.split(tl.permute(tl.reshape(acc, (2, BN, BT)), (1, 2, 0)))
            out0, out1 = tl.trans(first), tl.trans(second)
        else:
            out0 = tl.trans(acc)
            out1 = out0
        return out0, out1

    @triton.jit
    def _weight_pieces(row0, row1, n_rows, K: tl.constexpr, k_lo, k_len, PAIR: tl.constexpr, BN: tl.constexpr,
                       THREADS: tl.constexpr):
        """A program's weight rows (row0.. and, with PAIR, row1..; BN each) over columns k_lo..k_lo+k_len, in
        THREADS pieces, one per thread: (element offset into W, element count) each. Each row's span is cut in
        THREADS / rows pieces of whole 16-byte units; a piece past its row's span, or of a row past n_rows, is
        empty."""
        GROUPS: tl.constexpr = 2 if PAIR else 1
        PARTS: tl.constexpr = THREADS // (GROUPS * BN)  # pieces per row
        tl.static_assert(PARTS >= 1, "more weight rows than threads in a program")
        i = tl.arange(0, THREADS)
        r = i // PARTS
        row = tl.where(r < BN, row0 + r, row1 + r - BN)
        span = tl.minimum(k_len, K - k_lo)
        piece = tl.cdiv(tl.cdiv(span, PARTS), 8) * 8  # bf16 elements: whole 16-byte units
        start = k_lo + (i % PARTS) * piece
        count = tl.where(row < n_rows, tl.minimum(piece, k_lo + span - start), 0)
        return row.to(tl.int64) * K + start, tl.maximum(count, 0)

    @triton.jit
    def _prefetch_weights(w_ptr, row0, row1, n_rows, K: tl.constexpr, k_lo, k_len, t0, PAIR: tl.constexpr,
                          BN: tl.constexpr, THREADS: tl.constexpr, COLUMNS: tl.constexpr):
        """Ask L2 for the first COLUMNS columns of this program's weights (`_weight_pieces`) before the program
        waits for the previous launch (`fused.PREFETCH_COLUMNS`; 0: nothing; sm_90, never under the
        interpreter). Only the first row tile's program asks: the others of a T-row launch read the same block.

        Why: weights are never written during a step, so nothing forbids streaming them while the launch before
        drains; without this, each of a step's ~110 GEMV launches starts its HBM stream only after the wait, and
        pays the ramp of a cold stream once per launch. An L2 prefetch is a hint, not a load: L2 is the point of
        coherence for every SM, so it cannot make a later load see stale data, and it holds no registers while
        the program waits. One `cp.async.bulk.prefetch.L2` per thread (none for an empty piece)."""
        if COLUMNS > 0:
            if t0 == 0:
                offset, count = _weight_pieces(row0, row1, n_rows, K, k_lo, tl.minimum(k_len, COLUMNS), PAIR, BN,
                                               THREADS)
                tl.inline_asm_elementwise(
                    "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; "
                    "mov.u32 $0, 0; }", "=r,l,r", [w_ptr + offset, count * 2], dtype=tl.int32, is_pure=False,
                    pack=1)

    @triton.jit
    def _x_tiles(x_ptr, x_stride, rows, t0, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                 FROM_L2: tl.constexpr):
        """Every BK-column step's x tile of rows t0..t0+BT in x's dtype (`_x_stored`), all loads issued before any
        is used."""
        tiles = ()
        for k0 in tl.static_range(0, K, BK):
            tiles = tiles + (_x_stored(x_ptr, x_stride, rows, t0, K, k0, BT, BK, FROM_L2),)
        return tiles

    @triton.jit
    def _rms_of_tiles(tiles, K: tl.constexpr, eps, BT: tl.constexpr):
        """1/RMS [BT] of the rows in `_x_tiles`' tiles, summed step by step as `_inv_rms` sums them."""
        sum_sq = tl.zeros((BT,), tl.float32)
        for i in tl.static_range(len(tiles)):
            x = tiles[i].to(tl.float32)
            sum_sq += tl.sum(x * x, axis=1)
        return tl.rsqrt(sum_sq / K + eps)

    @triton.jit
    def _inv_rms(x_ptr, x_stride, rows, t0, K: tl.constexpr, eps, BT: tl.constexpr, BK: tl.constexpr,
                 FROM_L2: tl.constexpr = False, LOADS_FIRST: tl.constexpr = False):
        """1/RMS of rows t0..t0+BT of x [BT], summed in fixed BK steps (the same order for every row count).

        Unrolled (a loop kept each weight load of the launch waiting for one L2 round trip per step). Even so the
        sm_90 PTX issues each step's load only after the previous step's cross-warp sum and its barriers, one L2
        round trip after another; LOADS_FIRST (`fused.RMS_LOADS_FIRST`) loads every step's tile first, then sums them
        in the same order with the same reductions (the same bits). (Summing the squares inside the weight loop and
        scaling after the product measured slower: the QKV launch 15.6 against 11.0 us, H200, 2026-12-04.)"""
        if LOADS_FIRST:
            rstd = _rms_of_tiles(_x_tiles(x_ptr, x_stride, rows, t0, K, BT, BK, FROM_L2), K, eps, BT)
        else:
            sum_sq = tl.zeros((BT,), tl.float32)
            for k0 in tl.static_range(0, K, BK):
                x = _x_tile(x_ptr, x_stride, rows, t0, K, k0, BT, BK, FROM_L2)
                sum_sq += tl.sum(x * x, axis=1)
            rstd = tl.rsqrt(sum_sq / K + eps)
        return rstd

    @triton.jit
    def _row_scales(x_ptr, x_stride, rows, t0, K: tl.constexpr, eps, NORM: tl.constexpr, BT: tl.constexpr,
                    LOADS_FIRST: tl.constexpr):
        """1/RMS of rows t0..t0+BT with NORM (`_inv_rms`), else ones [BT]."""
        rstd = tl.full((BT,), 1.0, tl.float32)
        if NORM:
            rstd = _inv_rms(x_ptr, x_stride, rows, t0, K, eps, BT, RMS_STEP, False, LOADS_FIRST)
        return rstd

    @triton.jit
    def _norm_weights(g_ptr, k0, K, NORM: tl.constexpr, BK: tl.constexpr):
        """RMSNorm's weights g at columns k0..k0+BK as [1, BK] float32 with NORM (zeros past K), else ones."""
        g = tl.full((1, BK), 1.0, tl.float32)
        if NORM:
            k = k0 + tl.arange(0, BK)[None, :]
            g = tl.load(g_ptr + k, mask=k < K, other=0.0).to(tl.float32)
        return g

    @triton.jit
    def _normalize_rows(out_ptr, xn_ptr, g_ptr, row_count_ptr, rows, t0, D: tl.constexpr, eps, last, BLOCKS,
                        BT: tl.constexpr, LOADS_FIRST: tl.constexpr):
        """`fused.NORM_IN_PRODUCER_ABOVE`: once every output block of rows t0..t0+BT of out [rows, D] is stored, the
        program that stored the last of them writes RMSNorm(out) * g of those rows to xn, as `_a_tile` computes
        it, and resets the row tile's counter. `last`: this program stored an output block (the last split).

        Why: the next launch (gate/up) then streams xn as it is. Normalizing there costs it 4.1-4.5 us of its
        ~26 (benchmarks/norm_cost.py, H100): every program of it scales each x tile by 1/RMS and g between two
        barriers in every K step. Here it is done once per row, by one program, after the others' stores are
        visible (the split-K rule: store, barrier, counter; the last reads past L1). This tail is serial (the
        T = 16 -> 17 step's largest cost), so with LOADS_FIRST it reads the rows in two rounds of loads issued
        together, 1/RMS from the first and the normalized rows from the second with g's steps (in turn: one L2 round
        trip per step to sum, again per step to normalize, and per step of g). Holding the first round's tiles for
        the second took the launch to 255 registers (2 programs an SM, not 3), hence two reads."""
        tl.debug_barrier()
        rt = t0 // BT
        done = tl.atomic_add(row_count_ptr + rt, 1, mask=last)
        if last & (done == BLOCKS - 1):
            t = t0 + tl.arange(0, BT)
            if LOADS_FIRST:
                rstd = _rms_of_tiles(_x_tiles(out_ptr, D, rows, t0, D, BT, RMS_STEP, True), D, eps, BT)
                tl.debug_barrier()  # else the compiler merges both rounds into one read held in registers
                tiles = _x_tiles(out_ptr, D, rows, t0, D, BT, RMS_STEP, True)
                gs = ()
                for k0 in tl.static_range(0, D, RMS_STEP):
                    gs = gs + (_norm_weights(g_ptr, k0, D, True, RMS_STEP),)
                for i in tl.static_range(len(tiles)):
                    xn = _rms_scaled(tiles[i].to(tl.float32), rstd, gs[i])
                    _store_rows(xn_ptr, xn, t, rows, D, i * RMS_STEP, RMS_STEP)
            else:
                rstd = _inv_rms(out_ptr, D, rows, t0, D, eps, BT, RMS_STEP, True, False)
                for k0 in tl.static_range(0, D, RMS_STEP):
                    g = _norm_weights(g_ptr, k0, D, True, RMS_STEP)
                    xn = _a_tile(out_ptr, D, rows, t0, D, k0, rstd, g, True, BT, RMS_STEP, True)
                    _store_rows(xn_ptr, xn, t, rows, D, k0, RMS_STEP)
            tl.atomic_xchg(row_count_ptr + rt, 0)

    @triton.jit
    def _scaled_block_out(x, t0, n0, g_ptr, xg_ptr, sq_ptr, rows, N, last, BT: tl.constexpr, BN: tl.constexpr):
        """`fused.FACTORED_NORM`, the producer's side: its stored output block x [BT, BN] (bf16) times the next
        RMSNorm's g, to xg, and each row's sum of squares over the block, to sq [rows, blocks] at the block's column.
        Why: the block is all this program has; 1/RMS needs the whole row, so the consumer finishes it from the
        blocks' sums (`_block_sums`) and no program waits for the row's other blocks."""
        t = t0 + tl.arange(0, BT)
        n = n0 + tl.arange(0, BN)
        g = tl.load(g_ptr + n, mask=n < N, other=0.0).to(tl.float32)[None, :]
        xf = x.to(tl.float32)
        tl.store(xg_ptr + t[:, None] * N + n[None, :], (xf * g).to(tl.bfloat16),
                 mask=(t[:, None] < rows) & (n[None, :] < N) & last)
        tl.store(sq_ptr + t * tl.cdiv(N, BN) + n0 // BN, tl.sum(xf * xf, axis=1), mask=(t < rows) & last)

    @triton.jit
    def _block_sums(sq_ptr, t0, rows, BLOCKS: tl.constexpr, BT: tl.constexpr):
        """`fused.FACTORED_NORM`, the consumer's side: the producer's BLOCKS sums of squares of rows t0..t0+BT
        (`_scaled_block_out`), a [BT] vector each, every load issued before the weight stream (`_rstd_of_sums` adds
        them after it). Over EARLY_SUMS blocks none (a wider model's hidden size): held through the stream they would
        take a register each, so `_rstd_of_sums` loads them itself."""
        t = t0 + tl.arange(0, BT)
        sums = ()
        if BLOCKS <= EARLY_SUMS:
            for b in tl.static_range(BLOCKS):
                sums = sums + (tl.load(sq_ptr + t * BLOCKS + b, mask=t < rows, other=0.0),)
        return sums

    @triton.jit
    def _rstd_of_sums(sums, sq_ptr, t0, rows, D: tl.constexpr, eps, BLOCKS: tl.constexpr, BT: tl.constexpr):
        """1/RMS [BT] from `_block_sums` (or, where it loaded none, from sq itself), added in block order one vector
        at a time: elementwise, so a row's sum has the same bits in any tile height or layout (tall tiles too)."""
        t = t0 + tl.arange(0, BT)
        total = tl.zeros((BT,), tl.float32)
        for b in tl.static_range(BLOCKS):
            if BLOCKS <= EARLY_SUMS:
                total += sums[b]
            else:
                total += tl.load(sq_ptr + t * BLOCKS + b, mask=t < rows, other=0.0)
        return tl.rsqrt(total / D + eps)

    @triton.jit
    def _store_rows(xn_ptr, xn, t, rows, D: tl.constexpr, k0, BK: tl.constexpr):
        """xn [BT, BK] into rows t, columns k0..k0+BK of xn_ptr [rows, D]."""
        k = k0 + tl.arange(0, BK)
        tl.store(xn_ptr + t[:, None] * D + k[None, :], xn, mask=(t[:, None] < rows) & (k[None, :] < D))

    @triton.jit
    def _rms_scaled(x, rstd, g):
        """RMSNorm(x) * g as the bf16 MMA operand, rounded as `dfvg.model.RMSNorm` rounds (x float32)."""
        return ((x * rstd[:, None]).to(tl.bfloat16).to(tl.float32) * g).to(tl.bfloat16)

    @triton.jit
    def _a_tile(x_ptr, x_stride, rows, t0, K, k0, rstd, g, NORM: tl.constexpr, BT: tl.constexpr,
                BK: tl.constexpr, FROM_L2: tl.constexpr = False):
        """Rows t0..t0+BT of A at columns k0..k0+BK as the bf16 MMA operand; with NORM, A = RMSNorm(x) * g,
        rounded as `dfvg.model.RMSNorm` rounds."""
        a = _x_tile(x_ptr, x_stride, rows, t0, K, k0, BT, BK, FROM_L2)
        if NORM:
            return _rms_scaled(a, rstd, g)
        return a.to(tl.bfloat16)

    @triton.jit
    def _stream(x_ptr, x_stride, g_ptr, w_ptr, row0, row1, n_rows, rows, t0, k_lo, k_len, K: tl.constexpr, eps,
                NORM: tl.constexpr, PAIR: tl.constexpr, F32: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr,
                BK: tl.constexpr, SWAP_AB: tl.constexpr, STACK: tl.constexpr, LOADS_FIRST: tl.constexpr,
                w_desc=None, w_group=0, w_row=0, TMA: tl.constexpr = False, ahead=()):
        """Rows t0.. of A times weight rows row0..row0+BN (and row1.. with PAIR) over columns k_lo..k_lo+k_len
        -> float32 [BT, BN] x2; with NORM, A is RMSNorm(x) * g, rounded as `dfvg.model.RMSNorm` rounds.

        SWAP_AB (a launch's block-size entry, `dfvg.gpu.block_sizes`): the MMA computes W x^T, weight rows as its
        M side and the BT rows as N, instead of x W^T. Why: on sm_90 an MMA whose M is >= 64 (BN >= 64) can be a
        wgmma that reads the weight tile from shared memory where cp.async put it, while x W^T, whose M is the
        16-row tile, is an mma.sync that first copies each weight tile into registers (the gate/up launch: 250
        registers, 2 programs per SM). Either way each row's sum runs over k in the same order for every T.
        STACK (with SWAP_AB, `fused.STACKED_PAIR`): a pair's two weight blocks are one [2 BN, BK] operand of one MMA,
        so each K step waits for one group of wgmmas, not two, and 8 warps split it by weight rows. TMA (with both):
        the tiles come through w_desc, at (w_group, w_row) (`dfvg.gpu.weight_tiles`). ahead (with both, no TMA): every
        weight tile of the program's split, loaded before its wait (`weight_tiles._tiles_ahead`)."""
        if SWAP_AB and STACK:
            return _stream_stacked(x_ptr, x_stride, g_ptr, w_ptr, row0, row1, n_rows, rows, t0, k_lo, k_len, K, eps,
                                   NORM, PAIR, F32, BT, BN, BK, LOADS_FIRST, w_desc, w_group, w_row, TMA, ahead)
        rstd = _row_scales(x_ptr, x_stride, rows, t0, K, eps, NORM, BT, LOADS_FIRST)
        acc0 = tl.zeros((BN, BT) if SWAP_AB else (BT, BN), tl.float32)
        acc1 = tl.zeros((BN, BT) if SWAP_AB else (BT, BN), tl.float32)
        for k0 in range(k_lo, tl.minimum(k_lo + k_len, K), BK):
            g = _norm_weights(g_ptr, k0, K, NORM, BK)
            w0 = _w_tile(w_ptr, row0, n_rows, K, k0, BN, BK)
            w1 = w0
            if PAIR:
                w1 = _w_tile(w_ptr, row1, n_rows, K, k0, BN, BK)
            a = _a_tile(x_ptr, x_stride, rows, t0, K, k0, rstd, g, NORM, BT, BK)
            if SWAP_AB:
                acc0 += _dot(w0, tl.trans(a), F32)
                if PAIR:
                    acc1 += _dot(w1, tl.trans(a), F32)
            else:
                acc0 += _dot(a, tl.trans(w0), F32)
                if PAIR:
                    acc1 += _dot(a, tl.trans(w1), F32)
        if SWAP_AB:
            out0, out1 = tl.trans(acc0), tl.trans(acc1)
        else:
            out0, out1 = acc0, acc1
        return out0, out1

    @triton.jit
    def _stream_stacked(x_ptr, x_stride, g_ptr, w_ptr, row0, row1, n_rows, rows, t0, k_lo, k_len, K: tl.constexpr,
                        eps, NORM: tl.constexpr, PAIR: tl.constexpr, F32: tl.constexpr, BT: tl.constexpr,
                        BN: tl.constexpr, BK: tl.constexpr, LOADS_FIRST: tl.constexpr, w_desc, w_group, w_row,
                        TMA: tl.constexpr, ahead):
        """`_stream` with SWAP_AB and STACK: W x^T with the pair's blocks stacked into one MMA operand; with `ahead`
        (every K step of the split, loaded before the wait; past K zeros, which add exact zeros as the loop's absent
        steps add nothing), no loop and so no pipeline buffers. The same products in the same order either way."""
        GROUPS: tl.constexpr = 2 if PAIR else 1
        rstd = _row_scales(x_ptr, x_stride, rows, t0, K, eps, NORM, BT, LOADS_FIRST)
        acc = tl.zeros((GROUPS * BN, BT), tl.float32)
        if len(ahead) > 0:
            for i in tl.static_range(len(ahead)):
                g = _norm_weights(g_ptr, k_lo + i * BK, K, NORM, BK)
                a = _a_tile(x_ptr, x_stride, rows, t0, K, k_lo + i * BK, rstd, g, NORM, BT, BK)
                acc += _dot(ahead[i], tl.trans(a), F32)
        else:
            for k0 in range(k_lo, tl.minimum(k_lo + k_len, K), BK):
                g = _norm_weights(g_ptr, k0, K, NORM, BK)
                if TMA:
                    w = _described_tile(w_desc, w_group, w_row, k0, PAIR, BN, BK)
                else:
                    w = _stacked_tile(w_ptr, row0, row1, n_rows, K, k0, PAIR, BN, BK)
                a = _a_tile(x_ptr, x_stride, rows, t0, K, k0, rstd, g, NORM, BT, BK)
                acc += _dot(w, tl.trans(a), F32)
        return _unstack(acc, PAIR, BT, BN)

    @triton.jit
    def _reduce_splits(acc0, acc1, part_ptr, count_ptr, tile, split, live_rows, PAIR: tl.constexpr,
                       SPLIT_K: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr):
        """Split-K in a fixed order: each split stores its partial sums, and the program that finishes last
        adds splits 0, 1, ... in that order (so the sum does not depend on which finished first) and resets
        the tile's counter for the next launch. Returns (sum0, sum1, is_last). Only the tile's first live_rows
        rows travel (a one-row step's tile is 15 rows of padding; their sums are never stored)."""
        slot = part_ptr + tile * (SPLIT_K * 2 * BT * BN)
        offs = tl.arange(0, BT)[:, None] * BN + tl.arange(0, BN)[None, :]
        live = (tl.arange(0, BT) < live_rows)[:, None]
        tl.store(slot + split * (2 * BT * BN) + offs, acc0, mask=live)
        if PAIR:
            tl.store(slot + split * (2 * BT * BN) + BT * BN + offs, acc1, mask=live)
        tl.debug_barrier()
        last = tl.atomic_add(count_ptr + tile, 1) == SPLIT_K - 1
        sum0 = tl.zeros((BT, BN), tl.float32)
        sum1 = tl.zeros((BT, BN), tl.float32)
        for s in tl.static_range(SPLIT_K):
            at = slot + s * (2 * BT * BN) + offs
            sum0 += tl.load(at, mask=live & last, other=0.0, cache_modifier=".cg")
            if PAIR:
                sum1 += tl.load(at + BT * BN, mask=live & last, other=0.0, cache_modifier=".cg")
        tl.atomic_xchg(count_ptr + tile, 0, mask=last)
        return sum0, sum1, last

    @triton.jit
    def _program(pid, rows, SPLIT_K: tl.constexpr, BT: tl.constexpr):
        """(output block, K split, first row, tile id) of a program: row tiles vary fastest, then splits, so
        the programs that read one weight block run together and share it through L2."""
        row_tiles = tl.cdiv(rows, BT)
        rt = pid % row_tiles
        block = pid // (row_tiles * SPLIT_K)
        return block, (pid // row_tiles) % SPLIT_K, rt * BT, block * row_tiles + rt


def new_counters(device: torch.device | str) -> Tensor:
    """Zeroed counters for one forward (split-K's, then the row tiles'): every launch of it reuses them, and each
    resets what it used."""
    return torch.zeros(COUNTERS + ROW_COUNTERS, dtype=torch.int32, device=device)


def row_counters(counters: Tensor | None, device: torch.device | str) -> Tensor:
    """The row-tile counters of a forward's scratch (`new_counters`), or new zeroed ones where a caller passed none
    or an older, shorter scratch (a launch then counts from zero all the same)."""
    if counters is not None and counters.numel() >= COUNTERS + ROW_COUNTERS:
        return counters[COUNTERS:]
    return torch.zeros(ROW_COUNTERS, dtype=torch.int32, device=device)


def split_columns(k: int, split: int, block_k: int) -> int:
    """K columns per split of a split-K launch: whole BK steps (the last split may be shorter, or empty)."""
    per_split = -(-k // split)
    return -(-per_split // block_k) * block_k


def split_buffers(cfg: dict, blocks: int, rows: int, k: int, device: torch.device | str, counters: Tensor | None,
                  tile_rows: int) -> tuple[int, Tensor, Tensor]:
    """(k_len, partials, counters) of a split-K launch: K columns per split, the float32 partial sums and the
    zeroed per-tile counters (a caller's buffer, reset by the kernel after use, or a new one)."""
    split, tiles = cfg["SPLIT_K"], blocks * -(-rows // tile_rows)
    k_len = split_columns(k, split, cfg["BK"])
    if split == 1:
        dummy = torch.empty(1, dtype=torch.int32, device=device)
        return k_len, dummy, dummy
    parts = torch.empty(tiles * split * 2 * tile_rows * cfg["BN"], dtype=torch.float32, device=device)
    if counters is None or min(counters.numel(), COUNTERS) < tiles:  # (past COUNTERS: the row tiles' own)
        counters = torch.zeros(tiles, dtype=torch.int32, device=device)
    return k_len, parts, counters
