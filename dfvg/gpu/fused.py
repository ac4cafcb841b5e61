"""Fused Triton kernels for a decoder layer at 1 to 64 new tokens, with every row computed alike.

Why: at batch 1 a 1.5B decode step reads 3 GB of weights (0.72 ms at 4.3 TB/s), but a compiled block
replays ~20 kernels per layer; inside a CUDA graph each still costs microseconds. Here a layer is

1. `qkv_rope`:     RMSNorm -> x Wqkv^T + b -> RoPE on q and k -> q to a buffer, k and v into the cache at pos
2. `attention`:    per (kv head, cache split, token group) partial softmax, then the merge
3. `linear_then_scaled`: x + attn Wo^T (+ b), which also writes x * g and x's sums of squares per output block
4. `fused_linear`: silu(xg Wg^T) * (xg Wu^T), each sum scaled by 1/RMS of launch 3's block sums (`FACTORED_NORM`;
   off: RMSNorm first, in this launch or, over 16 rows, by launch 3's `linear_then_norm`)
5. `fused_linear`: x + h W2^T

and the LM head is one more `fused_linear` (RMSNorm -> x Wout^T). Each is a GEMV-shaped stream over its
weight matrix with the small prologue/epilogue work folded in.

**Batch-invariant rows.** Speculative decoding is lossless only if a verify step's row computes what a
one-token decode step computes for that token: in bf16 the same bits, or a near-tie in the argmax flips (13/20
prompts matched plain decoding when verify rows took other kernels than the T = 1 step). So every row count
runs the same code per row:

- rows go through tensor-core tiles (`TILE_ROWS`, `TALL_TILES_ABOVE`); a row's products and their summation
  order do not depend on the tile's other rows or height; a tile is its own program next to the others
  (the weight tile each loads comes from HBM once and from L2 after; `dfvg.gpu.gemv_stream`);
- block sizes and split-K depend on the weight shape only (`dfvg.gpu.block_sizes`), never on T;
- split-K partial sums are added in split order by the last program to finish (a per-tile counter);
- RMSNorm's 1/RMS is a first pass over the row in fixed steps, the same for every row count; gate/up's adds launch
  3's block sums in block order, elementwise (any tile height);
- attention packs the GQA heads of one row into a fixed 16-row tile at a fixed place; splits past a row's
  position add exact zeros.

`tests/test_gpu_fused.py` checks rows of T = 1..64 against T = 1 bit for bit on the GPU. Arithmetic follows `dfvg.model`
(float32 sums and softmax, bf16 rounding), not bit for bit; `gpu/check_kernels.py` and GPU tests bound the gap.

Not covered (callers fall back to the compiled block): Qwen3's per-head q/k norm, head_dim not a power of
two >= 16, GQA groups over 16 heads, more than `MAX_ROWS` rows, machines without Triton.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from dfvg.gpu.block_sizes import adopt_gpu_table, linear_config
from dfvg.gpu.decode_attention import INTERPRETED, attention, early_trigger_on, pdl_on
from dfvg.gpu.gemv_stream import ROW_COUNTERS, new_counters, row_counters, split_buffers, split_columns
from dfvg.gpu.kernels import HAVE_TRITON
from dfvg.gpu.tree_rows import TreeRows
from dfvg.gpu.weight_tiles import aligned_rows, describable, weight_descriptor

# Rows of one tensor-core tile: 16, the smallest MMA height (read at each launch; a captured graph keeps its own).
TILE_ROWS = 16
MAX_ROWS = 64  # new tokens per launch (MAX_ROWS / TILE_ROWS row tiles, or one tall tile)
# Under PDL, each GEMV program asks L2 for the first PREFETCH_COLUMNS columns of its weight rows before its wait
# (`gemv_stream._prefetch_weights`; 0: none; same bits). Off: 1.02x per step (H100, RESULTS.md 2026-12-05).
PREFETCH_COLUMNS = 0
# With SWAP_AB, a pair's two weight blocks (gate and up; a RoPE head's halves) are one MMA operand per K step, waited
# for once. Unstacked: H100 1.02-1.03x at T = 1, 1.06x at T = 64; H200 1.047x at T = 1 (RESULTS.md, 2026-12-06).
STACKED_PAIR = True
# Each GEMV launch loads its epilogue's inputs (residual, bias; RoPE's positions, cos, sin, slots) right after its wait;
# same bits. On against off: H100 0.994x at T = 1 unstacked, 1.005x and 0.999x with STACKED_PAIR (2026-12-06).
EPILOGUE_FIRST = False
# Launches of more rows than this take gate/up's input normalized by the O launch (`linear_then_norm`; None: never, 0:
# all) where both sum a row's squares alike (`_norms_alike`). T = 17 0.979x (H100), 0.958x (H200); T = 64 0.938x,
# 0.924x; for all (0): 1.016x at T = 1 (H100: the O launch's serial tail outweighs the saving). RESULTS.md, 2026-12-06.
# Read only with FACTORED_NORM off.
NORM_IN_PRODUCER_ABOVE: int | None = 16
# Launches of more rows than this with rows as the MMA's N side (SWAP_AB), no RMSNorm on either side (down; gate/up, LM
# head on their producer's rows) take one tile of up to 64 rows (`_tile_rows`; None: never), so one program streams
# each weight tile. Rows equal one-row launches (tests). H100, ctx 512: T = 64 0.959x; T = 33, 48 1.018x (2026-12-06).
TALL_TILES_ABOVE: int | None = 48
# RMSNorm's 1/RMS pass loads every step's x tile before summing any (`gemv_stream._inv_rms`; O's tail also loads the
# rows and g together to normalize): the sm_90 PTX otherwise waits one L2 round trip per 512-column step. Same bits
# (GPU test). H100, ctx 512: T = 1 0.988x, T = 17 0.979x, T = 64 0.984x (RESULTS.md, 2026-12-06 15:12 UTC).
RMS_LOADS_FIRST = True
# The O launch stores its output times ffn_norm's g and each row's sum of squares per output block, and gate/up streams
# that as it is and scales its sums by 1/RMS from the blocks' sums (`gemv_stream._scaled_block_out`, `_block_sums`):
# no 1/RMS pass or per-step scaling in gate/up's programs, no serial tail in O's. Every row count (so other bits than
# RMSNorm first, the same for every T: GPU tests). Against off (H100, ctx 512, RESULTS.md 2026-12-06 18:27 UTC): T = 1
# 0.960x, T = 16 0.963x, T = 17 0.938x, T = 64 0.944x; 32k 0.975-0.990x. Off: NORM_IN_PRODUCER_ABOVE decides.
FACTORED_NORM = True
# The same for QKV's and the LM head's RMSNorm: each layer's down launch stores its output times the next norm's g
# (the next layer's attention norm; after the last layer, the final norm) and its block sums, and the next QKV launch
# or the LM head scales by 1/RMS of them (`dfvg.gpu.fused_stack` carries them); layer 0's QKV keeps its own norm (its
# input is the embedding). Other bits, the same for every T (GPU tests). Against off (H200, RESULTS.md 2026-12-06 20:51
# UTC): ctx 512 T = 1 0.958x, T = 17 0.943x, T = 64 0.912x; T = 1..64 at 2k 0.929-0.965x, at 32k 0.976-0.985x.
FACTORED_QKV_NORM = True
# Swapped, stacked launches (SWAP_AB with STACKED_PAIR: every launch on Hopper) take each K step's weight tile
# by one TMA copy through a descriptor instead of per-thread cp.async loads (`dfvg.gpu.weight_tiles`); same products,
# same order (GPU test). H100, ctx 512 (RESULTS.md, 2026-12-07 15:52 UTC): T <= 17 1.01x, T >= 33 0.98-0.99x; so off.
TMA_WEIGHTS = False
# A swapped, stacked launch without TMA whose split is at most this many K steps (0: none) loads them all before its
# wait (`steps_ahead`): the target's QKV and O (3 steps of 128). With the shipped triggers (H100, 2026-12-07 18:17 UTC,
# RESULTS.md): T = 1 1.005x at 512 tokens, 0.990x at 2k, 0.984x at 8k, 0.973x at 32k, T = 5 1.003x, 0.982x, 0.990x,
# 1.013x; over 16 rows (no trigger before it, no pipelined loop) 1.01-1.05x. Same bits (tests). Off: no gain at 512.
WEIGHTS_AHEAD = 0

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from dfvg.gpu.decode_attention import _after_previous_launch, _let_next_launch_start
    from dfvg.gpu.epilogues import _linear_inputs, _linear_out, _rope_inputs, _rope_out
    from dfvg.gpu.gemv_stream import (
        _block_sums,
        _normalize_rows,
        _prefetch_weights,
        _program,
        _reduce_splits,
        _rstd_of_sums,
        _scaled_block_out,
        _stream,
    )
    from dfvg.gpu.weight_tiles import _tiles_ahead

    @triton.jit(do_not_specialize=["rows"])
    def _linear_kernel(x_ptr, x_stride, g_ptr, w_ptr, b_ptr, res_ptr, out_ptr, part_ptr, count_ptr, rows, N,
                       K: tl.constexpr, k_len, eps, NORM: tl.constexpr, SWIGLU: tl.constexpr, HAS_BIAS: tl.constexpr,
                       HAS_RES: tl.constexpr, F32: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr,
                       BK: tl.constexpr, SPLIT_K: tl.constexpr, SWAP_AB: tl.constexpr, STACK: tl.constexpr,
                       PDL: tl.constexpr, PREFETCH: tl.constexpr, TRIGGER: tl.constexpr, THREADS: tl.constexpr,
                       EARLY: tl.constexpr, xn_ptr, gn_ptr, row_count_ptr, NORM_OUT: tl.constexpr,
                       LOADS_FIRST: tl.constexpr, sq_ptr, ROW_SCALE: tl.constexpr, SCALE_OUT: tl.constexpr,
                       w_desc, TMA: tl.constexpr, AHEAD: tl.constexpr):
        """out [rows, N] = res + (norm?(x) W[:N]^T + b), or silu(. W[:N]^T) * (. W[N:2N]^T) with SWIGLU; with
        NORM_OUT (= N; 0: none), also xn = RMSNorm(out) * gn (`gemv_stream._normalize_rows`). `FACTORED_NORM`: with
        SCALE_OUT, also xn = out * gn and out's sums of squares per block to sq; with ROW_SCALE (the producer's
        blocks a row), x is such an xn and the sums are scaled by 1/RMS of sq's rows. AHEAD: K steps of weight tiles
        loaded before the wait (`WEIGHTS_AHEAD`)."""
        block, split, t0, tile = _program(tl.program_id(0), rows, SPLIT_K, BT)
        n0 = block * BN
        n_rows = 2 * N if SWIGLU else N
        ahead = _tiles_ahead(w_ptr, n0, N + n0, n_rows, K, split * k_len, SWIGLU, BN, BK, AHEAD)
        _prefetch_weights(w_ptr, n0, N + n0, n_rows, K, split * k_len, k_len, t0, SWIGLU, BN, THREADS, PREFETCH)
        _after_previous_launch(PDL)
        if EARLY:  # `EPILOGUE_FIRST`: their round trip overlaps the weight stream
            bias, res = _linear_inputs(t0, n0, b_ptr, res_ptr, rows, N, True, HAS_BIAS, HAS_RES, BT, BN)
        if ROW_SCALE:  # loaded before the stream, added after it
            sums = _block_sums(sq_ptr, t0, rows, ROW_SCALE, BT)
        acc, acc_up = _stream(x_ptr, x_stride, g_ptr, w_ptr, n0, N + n0, n_rows, rows, t0, split * k_len, k_len, K,
                              eps, NORM, SWIGLU, F32, BT, BN, BK, SWAP_AB, STACK, LOADS_FIRST, w_desc, 0, n0, TMA,
                              ahead)
        _let_next_launch_start(TRIGGER)
        last = True
        if SPLIT_K > 1:
            acc, acc_up, last = _reduce_splits(acc, acc_up, part_ptr, count_ptr, tile, split, rows - t0, SWIGLU,
                                               SPLIT_K, BT, BN)
        if not EARLY:
            bias, res = _linear_inputs(t0, n0, b_ptr, res_ptr, rows, N, last, HAS_BIAS, HAS_RES, BT, BN)
        if ROW_SCALE:
            rstd = _rstd_of_sums(sums, sq_ptr, t0, rows, K, eps, ROW_SCALE, BT)[:, None]
            acc, acc_up = acc * rstd, acc_up * rstd
        stored = _linear_out(acc, acc_up, bias, res, t0, n0, out_ptr, rows, N, last, SWIGLU, HAS_BIAS, HAS_RES, BT,
                             BN)
        if SCALE_OUT:
            _scaled_block_out(stored, t0, n0, gn_ptr, xn_ptr, sq_ptr, rows, N, last, BT, BN)
        if NORM_OUT:
            _normalize_rows(out_ptr, xn_ptr, gn_ptr, row_count_ptr, rows, t0, NORM_OUT, eps, last, tl.cdiv(N, BN),
                            BT, LOADS_FIRST)

    @triton.jit(do_not_specialize=["rows"])
    def _qkv_rope_kernel(x_ptr, g_ptr, w_ptr, b_ptr, pos_ptr, slot_ptr, cos_ptr, sin_ptr, q_ptr, kc_ptr, vc_ptr,
                         part_ptr, count_ptr, rows, K: tl.constexpr, k_len, eps, HEADS: tl.constexpr,
                         KV_HEADS: tl.constexpr, HD: tl.constexpr, HAS_BIAS: tl.constexpr, F32: tl.constexpr,
                         BT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr,
                         SWAP_AB: tl.constexpr, STACK: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr,
                         TRIGGER: tl.constexpr, THREADS: tl.constexpr, EARLY: tl.constexpr,
                         LOADS_FIRST: tl.constexpr, sq_ptr, ROW_SCALE: tl.constexpr, w_desc, TMA: tl.constexpr,
                         AHEAD: tl.constexpr):
        """Output block (head, chunk): columns c..c+BN of both halves of one q/k/v head, so RoPE's pairs
        (d, d + HD/2) meet in one program; q -> q_ptr [rows, HEADS, HD], k/v -> cache [S, KV, HD] at slot (the
        position on a chain; a token tree's nodes of one depth share a position but not a slot). ROW_SCALE (the
        producer's blocks a row, `FACTORED_QKV_NORM`): x is times g, its sums scaled by 1/RMS of sq. AHEAD: ditto."""
        HALF: tl.constexpr = HD // 2
        chunks: tl.constexpr = HALF // BN
        block, split, t0, tile = _program(tl.program_id(0), rows, SPLIT_K, BT)
        head = block // chunks
        lo = (block % chunks) * BN + tl.arange(0, BN)  # column within the head's first half
        row_lo = head * HD + (block % chunks) * BN
        ahead = _tiles_ahead(w_ptr, row_lo, row_lo + HALF, (HEADS + 2 * KV_HEADS) * HD, K, split * k_len, True, BN, BK,
                             AHEAD)
        _prefetch_weights(w_ptr, row_lo, row_lo + HALF, (HEADS + 2 * KV_HEADS) * HD, K, split * k_len, k_len, t0,
                          True, BN, THREADS, PREFETCH)
        _after_previous_launch(PDL)
        if EARLY:  # `EPILOGUE_FIRST`: the position -> cos/sin chain of round trips overlaps the weight stream
            side = _rope_inputs(t0, head, lo, b_ptr, pos_ptr, slot_ptr, cos_ptr, sin_ptr, rows, True, HEADS,
                                KV_HEADS, HD, HAS_BIAS, BT, BN)
        if ROW_SCALE:  # loaded before the stream, added after it
            sums = _block_sums(sq_ptr, t0, rows, ROW_SCALE, BT)
        acc_lo, acc_hi = _stream(x_ptr, K, g_ptr, w_ptr, row_lo, row_lo + HALF, (HEADS + 2 * KV_HEADS) * HD,
                                 rows, t0, split * k_len, k_len, K, eps, ROW_SCALE == 0, True, F32, BT, BN, BK,
                                 SWAP_AB, STACK, LOADS_FIRST, w_desc, head, (block % chunks) * BN, TMA, ahead)
        _let_next_launch_start(TRIGGER)
        last = True
        if SPLIT_K > 1:
            acc_lo, acc_hi, last = _reduce_splits(acc_lo, acc_hi, part_ptr, count_ptr, tile, split, rows - t0, True,
                                                  SPLIT_K, BT, BN)
        if not EARLY:
            side = _rope_inputs(t0, head, lo, b_ptr, pos_ptr, slot_ptr, cos_ptr, sin_ptr, rows, last, HEADS,
                                KV_HEADS, HD, HAS_BIAS, BT, BN)
        if ROW_SCALE:
            rstd = _rstd_of_sums(sums, sq_ptr, t0, rows, K, eps, ROW_SCALE, BT)[:, None]
            acc_lo, acc_hi = acc_lo * rstd, acc_hi * rstd
        b_lo, b_hi, cos_lo, sin_lo, cos_hi, sin_hi, slot = side
        _rope_out(acc_lo, acc_hi, b_lo, b_hi, cos_lo, sin_lo, cos_hi, sin_hi, slot, t0, head, lo, q_ptr, kc_ptr,
                  vc_ptr, rows, last, HEADS, KV_HEADS, HD, HAS_BIAS, BT, BN)


@functools.cache
def _gpu_name(index: int | None) -> str:
    return torch.cuda.get_device_name(index)


def _config(n: int, k: int, device: torch.device, config: dict | None) -> dict:
    """Block sizes of a launch on weight shape (n, k): `config` over the table of this GPU (`block_sizes`)."""
    if device.type == "cuda":
        adopt_gpu_table(_gpu_name(device.index))
    return {**linear_config(n, k), **(config or {})}


def _tile_rows(rows: int, cfg: dict, normalizes: bool) -> int:
    """Rows of a launch's row tiles (`TALL_TILES_ABOVE`): a normalizing launch keeps `TILE_ROWS` because its 1/RMS
    sums must split a row as the one-row launch does, and so does a factored norm's producer, whose per-block sums
    of squares (`gemv_stream._scaled_block_out`) reduce over a tile's columns in the tile's layout; an mma.sync (no
    SWAP_AB) would take the rows as its M side."""
    if TALL_TILES_ABOVE is None or rows <= TALL_TILES_ABOVE or normalizes or not cfg.get("SWAP_AB"):
        return TILE_ROWS
    return max(TILE_ROWS, min(MAX_ROWS, 1 << (rows - 1).bit_length()))


def _launch_options(x: Tensor, weight: Tensor, cfg: dict, pair: bool, tile_rows: int, groups: int = 1,
                    attention_next: bool = False) -> dict:
    """Keyword arguments of a fused GEMV launch: its block sizes, programmatic dependent launch where the GPU has it,
    and with it the weight prefetch and early trigger where switched on. A prefetch asks for whole 16-byte units of
    aligned rows (`aligned_rows`), a piece per thread, so not for more rows per program (two blocks of BN with `pair`)
    than it has threads. `_weight_tiles`: the TMA descriptor (`groups` of blocks: QKV's heads), the steps ahead.
    attention_next (QKV): the trigger takes the attention's row bound, not a GEMV's (`triggers_early`)."""
    pdl = pdl_on(x.device)
    threads = 32 * cfg["num_warps"]
    can_prefetch = pdl and aligned_rows(weight) and (2 if pair else 1) * cfg["BN"] <= threads
    return {"BT": tile_rows, "BN": cfg["BN"], "BK": cfg["BK"], "SPLIT_K": cfg["SPLIT_K"],
            "SWAP_AB": bool(cfg.get("SWAP_AB", 0)), "STACK": STACKED_PAIR, "num_warps": cfg["num_warps"],
            "num_stages": cfg["num_stages"], "PDL": pdl, "launch_pdl": pdl, "THREADS": threads,
            "PREFETCH": PREFETCH_COLUMNS // 8 * 8 if can_prefetch else 0, "EARLY": EPILOGUE_FIRST,
            "TRIGGER": early_trigger_on(x.device, len(x), gemv=not attention_next), "LOADS_FIRST": RMS_LOADS_FIRST,
            **_weight_tiles(weight, cfg, pair, groups)}


def _weight_tiles(weight: Tensor, cfg: dict, pair: bool, groups: int) -> dict:
    """A launch's w_desc, TMA and AHEAD: the weight's descriptor where `TMA_WEIGHTS` is on, the launch is swapped and
    stacked, and TMA can describe the weight (`weight_tiles.describable`), else None, False and `steps_ahead`."""
    if not (TMA_WEIGHTS and cfg.get("SWAP_AB") and STACKED_PAIR and describable(weight, groups, pair)):
        return {"w_desc": None, "TMA": False, "AHEAD": steps_ahead(weight.shape[1], cfg)}
    return {"w_desc": weight_descriptor(weight, groups, pair, cfg["BN"], cfg["BK"]), "TMA": True, "AHEAD": 0}


def steps_ahead(k: int, cfg: dict) -> int:
    """K steps a launch without TMA over K = k loads before its wait: all its split's, where it is swapped and stacked
    and `WEIGHTS_AHEAD` covers them (`weight_tiles._tiles_ahead`), else 0 (gpu/compile_sm90.py asks too)."""
    steps = -(-split_columns(k, cfg["SPLIT_K"], cfg["BK"]) // cfg["BK"])
    return steps if cfg.get("SWAP_AB") and STACKED_PAIR and steps <= WEIGHTS_AHEAD else 0


def fused_linear(x: Tensor, weight: Tensor, *, norm: Tensor | None = None, bias: Tensor | None = None,
                 residual: Tensor | None = None, swiglu: bool = False, eps: float = 1e-6,
                 out_dtype: torch.dtype | None = None, config: dict | None = None,
                 counters: Tensor | None = None, row_sums: Tensor | None = None) -> Tensor:
    """x [T, K] bf16 -> [T, N]: residual + (RMSNorm?(x) W^T + bias), or the SwiGLU pair of W's halves.

    weight [N, K] ([2N, K] with swiglu: gate rows then up rows, as `FeedForward.w13`); norm is the RMSNorm
    weight; residual [T, N]; counters: a zeroed int32 scratch for split-K (`new_counters`; one per forward);
    row_sums [T, B]: x is RMSNorm's input times its g and these its rows' sums of squares in B pieces
    (`linear_then_scaled`), so the sums are scaled by 1/RMS (`FACTORED_NORM`).
    One launch; T <= MAX_ROWS; x's rows must be contiguous."""
    return _linear(x, weight, norm, bias, residual, swiglu, eps, out_dtype, config, counters, None, row_sums)[0]


def linear_then_norm(x: Tensor, weight: Tensor, next_norm: Tensor, *, bias: Tensor | None = None,
                     residual: Tensor | None = None, eps: float = 1e-6, config: dict | None = None,
                     counters: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """`fused_linear` (no input norm, no SwiGLU) that also returns RMSNorm(out) * next_norm, the next launch's
    input (`NORM_IN_PRODUCER_ABOVE`): (out [T, N], normalized [T, N] bf16), its own norm's bits where `_norms_alike`."""
    return _linear(x, weight, None, bias, residual, False, eps, None, config, counters, next_norm)[:2]


def linear_then_scaled(x: Tensor, weight: Tensor, next_norm: Tensor, *, bias: Tensor | None = None,
                       residual: Tensor | None = None, config: dict | None = None,
                       counters: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """`fused_linear` (no input norm, no SwiGLU) that also returns out * next_norm (bf16) and out's rows' sums of
    squares per output block [T, B]: the next launch's x and `row_sums` (`FACTORED_NORM`)."""
    return _linear(x, weight, None, bias, residual, False, 1e-6, None, config, counters, next_norm, factored=True)


def _linear(x: Tensor, weight: Tensor, norm, bias, residual, swiglu: bool, eps: float, out_dtype, config,
            counters: Tensor | None, next_norm: Tensor | None, row_sums: Tensor | None = None,
            factored: bool = False) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The launch behind `fused_linear`, `linear_then_norm` and `linear_then_scaled`: (out, the next launch's x or
    None, its row sums or None)."""
    rows, k = x.shape
    counts_rows = next_norm is not None and not factored  # `_normalize_rows`' tail: a counter per row tile
    if counts_rows and triton.cdiv(rows, TILE_ROWS) > ROW_COUNTERS:
        raise ValueError(f"linear_then_norm takes at most {ROW_COUNTERS * TILE_ROWS} rows a launch, got {rows}")
    n = weight.shape[0] // 2 if swiglu else weight.shape[0]
    cfg = _config(n, k, x.device, config)
    blocks = triton.cdiv(n, cfg["BN"])
    tile = _tile_rows(rows, cfg, norm is not None or next_norm is not None)
    k_len, parts, split_counters = split_buffers(cfg, blocks, rows, k, x.device, counters, tile)
    out = torch.empty(rows, n, dtype=out_dtype or x.dtype, device=x.device)
    normed = torch.empty_like(out) if next_norm is not None else None
    row_count = row_counters(counters, x.device) if counts_rows else split_counters  # (unread without the tail)
    sums = torch.empty(rows, blocks, dtype=torch.float32, device=x.device) if factored else row_sums
    _linear_kernel[(blocks * cfg["SPLIT_K"] * triton.cdiv(rows, tile),)](  # (weight block, K split, row tile)
        x, x.stride(0), norm if norm is not None else weight, weight, bias if bias is not None else weight,
        residual if residual is not None else weight, out, parts, split_counters, rows, n, k, k_len, eps,
        NORM=norm is not None, SWIGLU=swiglu, HAS_BIAS=bias is not None, HAS_RES=residual is not None,
        F32=INTERPRETED, **_launch_options(x, weight, cfg, swiglu, tile), xn_ptr=out if normed is None else normed,
        gn_ptr=weight if next_norm is None else next_norm, row_count_ptr=row_count,
        NORM_OUT=0 if next_norm is None or factored else n, sq_ptr=sums if sums is not None else out,
        ROW_SCALE=0 if row_sums is None else row_sums.shape[1], SCALE_OUT=factored)
    return out, normed, (sums if factored else None)


def qkv_rope(x: Tensor, norm: Tensor, weight: Tensor, bias: Tensor | None, pos: Tensor, cos: Tensor,
             sin: Tensor, kc: Tensor, vc: Tensor, dims: tuple, config: dict | None = None,
             counters: Tensor | None = None, slots: Tensor | None = None, row_sums: Tensor | None = None) -> Tensor:
    """RMSNorm + QKV projection + RoPE at pos; writes k/v into kc/vc [S, KV, hd] at slots (default: pos);
    returns q [T, H*hd]. row_sums [T, B]: x is already times the norm's g, and these its rows' block sums
    (`linear_then_scaled`; `FACTORED_QKV_NORM`)."""
    heads, kv_heads, hd, _, eps = dims
    rows, k = x.shape
    cfg = _config(weight.shape[0], k, x.device, config)
    cfg["BN"] = min(cfg["BN"], hd // 2)
    blocks = (heads + 2 * kv_heads) * (hd // 2 // cfg["BN"])
    k_len, parts, counters = split_buffers(cfg, blocks, rows, k, x.device, counters, TILE_ROWS)
    q = torch.empty(rows, heads * hd, dtype=x.dtype, device=x.device)
    _qkv_rope_kernel[(blocks * cfg["SPLIT_K"] * triton.cdiv(rows, TILE_ROWS),)](
        x, norm, weight, bias if bias is not None else weight, pos, pos if slots is None else slots, cos, sin, q,
        kc, vc, parts, counters, rows, k, k_len, eps, HEADS=heads, KV_HEADS=kv_heads, HD=hd, HAS_BIAS=bias is not None,
        F32=INTERPRETED, **_launch_options(x, weight, cfg, True, TILE_ROWS, heads + 2 * kv_heads, attention_next=True),
        sq_ptr=q if row_sums is None else row_sums, ROW_SCALE=0 if row_sums is None else row_sums.shape[1])
    return q


def _norms_alike(wo: Tensor, w13: Tensor, device: torch.device) -> bool:
    """(With `FACTORED_NORM` off.) Whether the O launch's 1/RMS sums a row as gate/up's does: with 2 warps or more
    and rows of whole 16-element pieces (gate/up's x stride), each splits a row's 512 columns as 8 a thread x 32
    lanes x 2 warps (the sm_90 layouts Triton picks; tests/test_gpu_tools.py compiles both). Anything else keeps
    gate/up's own norm."""
    shapes = ((wo.shape[0], wo.shape[1]), (w13.shape[0] // 2, w13.shape[1]))
    return wo.shape[0] % 16 == 0 and all(_config(n, k, device, None)["num_warps"] >= 2 for n, k in shapes)


def layer_forward(x: Tensor, pos: Tensor, cos: Tensor, sin: Tensor, kc: Tensor, vc: Tensor, w: tuple,
                  dims: tuple, counters: Tensor | None = None, tree: TreeRows | None = None,
                  given: tuple[Tensor, Tensor] | None = None,
                  next_norm: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """One decoder layer on x [T, D] (bf16) at positions pos [T]: the launches of the module docstring.

    w as `dfvg.gpu.block.layer_weights` (q/k norm must be None); kc/vc [S, KV, hd]; cos/sin [S, hd] fp32;
    tree: the rows are token-tree nodes (their own cache slots, attention over their ancestors). With
    `FACTORED_QKV_NORM` (`dfvg.gpu.fused_stack`): given, the previous layer's (x times this attention norm's g, block
    sums) for QKV; next_norm, the next RMSNorm's g, and then the layer returns (x, x times it, x's block sums)."""
    attn_norm, wqkv, wqkv_b, wo, wo_b, _q_norm, _k_norm, ffn_norm, w13, w2 = w
    eps = dims[4]
    counters = counters if counters is not None else new_counters(x.device)
    slots, links = (tree.slots, (tree.root, tree.ancestors)) if tree is not None else (None, None)
    q = qkv_rope(x if given is None else given[0], attn_norm, wqkv, wqkv_b, pos, cos, sin, kc, vc, dims,
                 counters=counters, slots=slots, row_sums=None if given is None else given[1])
    attended = attention(q, kc, vc, pos, dims, links)
    if FACTORED_NORM:
        x, scaled, sums = linear_then_scaled(attended, wo, ffn_norm, bias=wo_b, residual=x, counters=counters)
        h = fused_linear(scaled, w13, swiglu=True, eps=eps, counters=counters, row_sums=sums)
    elif NORM_IN_PRODUCER_ABOVE is not None and x.shape[0] > NORM_IN_PRODUCER_ABOVE and _norms_alike(wo, w13, x.device):
        x, normed = linear_then_norm(attended, wo, ffn_norm, bias=wo_b, residual=x, eps=eps, counters=counters)
        h = fused_linear(normed, w13, swiglu=True, counters=counters)
    else:
        x = fused_linear(attended, wo, bias=wo_b, residual=x, counters=counters)
        h = fused_linear(x, w13, norm=ffn_norm, swiglu=True, eps=eps, counters=counters)
    if next_norm is not None:
        return linear_then_scaled(h, w2, next_norm, residual=x, counters=counters)
    return fused_linear(h, w2, residual=x, counters=counters)


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
    if cfg.num_heads // cfg.num_kv_heads > 16:
        return f"{cfg.num_heads // cfg.num_kv_heads} query heads per kv head is over the attention tile's 16"
    return None
