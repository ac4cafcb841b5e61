"""Decode/verify attention for the fused layers: split over cache slots (flash decoding), then merged.

Why split: one program per query head walks ~400 cache slots one tile after another (16.6 us per layer on
the H200); with one program per (kv head, 64-slot split: `ATTENTION_SPLIT`) every program reads one K and one V
tile, and a second launch merges the partial softmax states. The GQA query heads of one token share a tile. A verify
step's tokens share a split's K/V load when the context alone fills the GPU (`SHARE_KV`), so K/V are read once
per step; at a short context the tokens spread over more work items (more parallel work, K/V from L2).

One token per tile, at the same tile rows whatever the row count: a verify row is then computed exactly as
a one-token decode step computes it (`dfvg.gpu.fused`, batch-invariant rows). Packing several tokens into
a tile put a token at different tile rows for different T, and a CPU BLAS already rounded those
differently. Positions come from a device tensor (graph replays at any position); query t sees cache slots
<= pos[t] (causal chain). Float32 scores and softmax, bf16 P @ V.
"""

from __future__ import annotations

import math
import os

import torch
from torch import Tensor

from dfvg.gpu.kernels import HAVE_TRITON

# Triton's CPU interpreter (TRITON_INTERPRET=1, how CPU tests run these kernels) gets bf16 arithmetic
# wrong, so under it every dot takes float32 operands; on a GPU `tl.dot` takes the bf16 tiles. (It also
# rounds float32 -> bf16 toward zero, not to nearest: errors measured under it are ~2x a GPU's.)
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

# Programmatic dependent launch (Hopper and later): each fused launch (attention here, the GEMVs in fused.py)
# is set up while the one before it drains and waits in griddepcontrol.wait before it touches anything that
# launch wrote, so the gaps between a step's ~170 small launches shrink: -1.4 % per 1.5B step on the H200,
# logits bit-identical (benchmarks/RESULTS.md, 2026-12-04 evening). Benchmarks set it False to compare.
PDL = not INTERPRETED
try:  # griddepcontrol came with Triton 3.3; an older Triton runs every launch without PDL
    from triton.language.extra.cuda import gdc_wait as _gdc_wait  # noqa: F401

    HAVE_GDC = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_GDC = False


# Under PDL, whether a launch lets the next one start before it drains (griddepcontrol.launch_dependents; the next
# still waits for this one to finish before it reads anything): a GEMV after its weight loop, so the next
# launch's programs take the SMs this one frees (and, with `fused.WEIGHTS_AHEAD` or `fused.PREFETCH_COLUMNS`, load or
# prefetch their weights) while this one's last programs reduce and store; and the attention merge at once, so the O
# projection after it is resident during the merge (48 short programs at T = 1). (A trigger right after the wait in
# every launch measured slower, 1.01-1.17x per step on 2026-12-04.) Against the implicit trigger at exit (H100,
# 2026-12-07 18:04-18:19 UTC, RESULTS.md), with the bounds of then (16 rows for every launch): T = 1 0.958x at 512
# tokens, 0.963x at 2k, 0.971x at 8k, 0.977x at 32k; T = 5 0.962-0.982x; never over 1.002x at any row count. Same bits.
EARLY_TRIGGER = True
# Launches of more rows than this keep the implicit trigger at their exit (None: every row count triggers early):
# there the next launch's waiting programs take SM slots from work that needs them (the attention of many rows; every
# row count triggering: T = 64 1.039x at 2k tokens, 1.040x at 8k, same lease).
EARLY_TRIGGER_ROWS: int | None = 16
# The same bound for the GEMV launches but QKV (`fused_linear`'s: O, gate/up, down, the LM head; None: every row
# count); QKV, which the attention split follows, keeps EARLY_TRIGGER_ROWS. Every launch triggering early at every row
# count gained at 512 tokens (T = 64 0.983x) and lost at 2k-8k (1.04x); every GEMV, QKV among them: T = 64 0.970x at 512
# tokens, 1.039x at 2k, 1.041x at 8k; all but QKV (None, against 16): T = 33-64 0.984-0.993x at 512, 0.978-0.993x at
# 2k, 0.994-0.996x at 8k, T <= 17 0.997-1.003x (H100, 2026-12-07 21:12 and 21:51 UTC, RESULTS.md). Same bits.
GEMV_TRIGGER_ROWS: int | None = None
# With EARLY_TRIGGER, the split launch too lets the merge start at once where the step's positions fill at most this
# many splits (0: never; decided in the kernel from the positions, so a graph replayed at a longer context keeps the
# implicit trigger): the merge's programs are then resident, waiting, while the split runs, and the O launch (at the
# merge's trigger, after its wait) follows the split at once. At every context it lost at 32k (1.02-1.06x at every
# T); up to 128 splits (8,192 tokens) it gains 0.6-1.4 % at T <= 16 and 512 tokens over the GEMVs' trigger alone,
# 0.8-1.6 % at 2k, 0.7-0.9 % at 8k (same lease).
SPLIT_TRIGGER_SPLITS = 128


def pdl_on(device: torch.device) -> bool:
    """Whether launches on `device` use programmatic dependent launch (PDL, a Triton that has it, sm_90+)."""
    return PDL and HAVE_GDC and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def early_trigger_on(device: torch.device, rows: int, gemv: bool = False) -> bool:
    """Whether launches of `rows` rows on `device` let the next one start early: `triggers_early`, under PDL."""
    return pdl_on(device) and triggers_early(rows, gemv)


def triggers_early(rows: int, gemv: bool = False) -> bool:
    """The rule without the device (gpu/compile_sm90.py compiles by it): `EARLY_TRIGGER` up to `EARLY_TRIGGER_ROWS`
    rows, a GEMV that a GEMV follows (`gemv`) up to `GEMV_TRIGGER_ROWS`."""
    bound = GEMV_TRIGGER_ROWS if gemv else EARLY_TRIGGER_ROWS
    return EARLY_TRIGGER and (bound is None or rows <= bound)


if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _dot(a, b, F32: tl.constexpr):
        """a [M, K] @ b [K, N] in float32 (bf16 tiles on the GPU; float32 tiles in the interpreter)."""
        if F32:
            return tl.dot(a.to(tl.float32), b.to(tl.float32))
        return tl.dot(a, b)

    @triton.jit
    def _after_previous_launch(PDL: tl.constexpr):
        """Under programmatic dependent launch this program may start before the previous launch has finished:
        wait until it has and its writes are visible (before any read or write of activations, caches or
        counters). Without `_let_next_launch_start` a program that exits counts as the trigger, so the next launch
        starts as this one drains (an early trigger right after the wait in every launch measured slower: dependents'
        programs then take SM slots while they wait; the merge and, at a short context, the split trigger there, the
        GEMVs after their weight loop: QKV up to `EARLY_TRIGGER_ROWS` rows, the others up to `GEMV_TRIGGER_ROWS`)."""
        if PDL:
            tl.extra.cuda.gdc_wait()

    @triton.jit
    def _let_next_launch_start(TRIGGER: tl.constexpr):
        """With TRIGGER (`EARLY_TRIGGER`, under PDL): the next launch may start once every program of this one
        has come here or exited; it still waits for this launch to finish before it reads what this wrote."""
        if TRIGGER:
            tl.extra.cuda.gdc_launch_dependents()

    @triton.jit
    def _source_slots(s, t, pos, root_ptr, anc_ptr, TREE: tl.constexpr, DEPTH: tl.constexpr):
        """Cache slot that holds sequence position s for token t: s itself on a chain; in a tree, positions past
        the root are token t's ancestors at their depths (anc [T, DEPTH] slots, self last)."""
        if TREE:
            root = tl.load(root_ptr)
            beyond = (s > root) & (s <= pos)
            return tl.where(beyond, tl.load(anc_ptr + t * DEPTH + (s - root - 1), mask=beyond, other=0), s).to(tl.int32)
        return s

    @triton.jit
    def _token_split(q_ptr, keys, values, s, t, pos_ptr, m_ptr, l_ptr, acc_ptr, rows, scale, kv, split,
                     HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HD: tl.constexpr, F32: tl.constexpr,
                     BM: tl.constexpr):
        """Token t's GROUP query heads (tile rows 0..GROUP-1, padded to BM) against one split's keys and values
        [BS, HD] at positions s: its partial softmax state (m, l, acc) for the split, live tile rows only."""
        GROUP: tl.constexpr = HEADS // KV_HEADS
        r = tl.arange(0, BM)
        live = r < GROUP
        d = tl.arange(0, HD)
        q = tl.load(q_ptr + t * (HEADS * HD) + (kv * GROUP + r)[:, None] * HD + d[None, :], mask=live[:, None],
                    other=0.0)
        pos = tl.load(pos_ptr + t)
        scores = _dot(q, tl.trans(keys), F32) * scale  # [BM, BS] float32
        scores = tl.where(s[None, :] <= pos, scores, -float("inf"))
        m = tl.max(scores, axis=1)
        p = tl.exp(scores - tl.where(m == -float("inf"), 0.0, m)[:, None])
        state = ((split * KV_HEADS + kv) * rows + t) * BM + r
        tl.store(m_ptr + state, m, mask=live)
        tl.store(l_ptr + state, tl.sum(p, axis=1), mask=live)
        tl.store(acc_ptr + state[:, None] * HD + d[None, :], _dot(p.to(values.dtype), values, F32),
                 mask=live[:, None])

    @triton.jit
    def _split_tokens(q_ptr, kc_ptr, vc_ptr, pos_ptr, root_ptr, anc_ptr, m_ptr, l_ptr, acc_ptr, rows, scale, kv,
                      split, first, groups, end, HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HD: tl.constexpr,
                      F32: tl.constexpr, BM: tl.constexpr, BS: tl.constexpr, TREE: tl.constexpr,
                      DEPTH: tl.constexpr):
        """One split's K and V tile of kv head `kv`, loaded once, against tokens first, first + groups, ..
        (`_token_split` each). With TREE, a split with positions past the root is loaded per token: those
        positions read the token's ancestors' slots (`_source_slots`)."""
        d = tl.arange(0, HD)
        s = split * BS + tl.arange(0, BS)
        offs = s[:, None] * (KV_HEADS * HD) + kv * HD + d[None, :]
        shared_keys = tl.load(kc_ptr + offs, mask=(s < end)[:, None], other=0.0)
        shared_values = tl.load(vc_ptr + offs, mask=(s < end)[:, None], other=0.0)
        for t in range(first, rows, groups):
            keys = shared_keys
            values = shared_values
            if TREE:
                if split * BS + BS - 1 > tl.load(root_ptr):  # some of these positions are ancestors' slots
                    src = _source_slots(s, t, tl.load(pos_ptr + t), root_ptr, anc_ptr, TREE, DEPTH)
                    at = src[:, None] * (KV_HEADS * HD) + kv * HD + d[None, :]
                    keys = tl.load(kc_ptr + at, mask=(s < end)[:, None], other=0.0)
                    values = tl.load(vc_ptr + at, mask=(s < end)[:, None], other=0.0)
            _token_split(q_ptr, keys, values, s, t, pos_ptr, m_ptr, l_ptr, acc_ptr, rows, scale, kv, split,
                         HEADS, KV_HEADS, HD, F32, BM)

    @triton.jit(do_not_specialize=["rows", "wanted"])
    def _attention_split_kernel(q_ptr, kc_ptr, vc_ptr, pos_ptr, root_ptr, anc_ptr, m_ptr, l_ptr, acc_ptr, rows,
                                wanted, scale, HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HD: tl.constexpr,
                                F32: tl.constexpr, BM: tl.constexpr, BS: tl.constexpr, TREE: tl.constexpr,
                                DEPTH: tl.constexpr, PDL: tl.constexpr, TRIGGER: tl.constexpr):
        """Work items (kv head, live split, token group g), taken by the launch's programs in turn: each loads
        the split's K and V tile once for tokens g, g + G, .. (`_split_tokens`), where G keeps about `wanted`
        items: at a short context a few tokens per item (one up to ~16 rows at 512 tokens), at a long one every
        token of the step in one item (the cache is then read once per step, not once per token). A token's
        arithmetic does not depend on G or on which program takes the item.

        Split over slots (flash decoding) because one program per head walks ~400 slots in sequence; here
        each item reads one tile of K and V, and `_attention_combine_kernel` merges the splits. Items, not a
        grid over the cache's capacity: a graph replays at any position, so the grid cannot know the context,
        and a 32k cache at a 512-token context left 97 % of a (kv, split, token) grid idle (the T = 16 step's
        attention took 17 us a layer against 3.8 at T = 1, H200, 2026-12-04 night). TRIGGER: `SPLIT_TRIGGER_SPLITS`
        (0: none)."""
        _after_previous_launch(PDL)
        end = tl.load(pos_ptr + rows - 1) + 1  # positions ascend: the last row sees the most slots
        live = tl.cdiv(end, BS)
        if TRIGGER > 0:
            if live <= TRIGGER:
                _let_next_launch_start(True)
        groups = tl.minimum(rows, tl.maximum(1, tl.cdiv(wanted, KV_HEADS * live)))
        for item in range(tl.program_id(0), KV_HEADS * live * groups, tl.num_programs(0)):
            item = tl.cast(item, tl.int32)  # (positions are int64; slots and splits stay int32, as at T = 1)
            _split_tokens(q_ptr, kc_ptr, vc_ptr, pos_ptr, root_ptr, anc_ptr, m_ptr, l_ptr, acc_ptr, rows, scale,
                          item % KV_HEADS, (item // KV_HEADS) % live.to(tl.int32),
                          item // (KV_HEADS * live.to(tl.int32)), groups.to(tl.int32), end,
                          HEADS, KV_HEADS, HD, F32, BM, BS, TREE, DEPTH)

    @triton.jit
    def _merge_splits(m_ptr, l_ptr, acc_ptr, rows, t, kv, row_in_tile, splits, d, KV_HEADS: tl.constexpr,
                      HD: tl.constexpr, BM: tl.constexpr, NS: tl.constexpr, BD: tl.constexpr):
        """One query row's partial softmax states (m, l, acc at columns d) of splits 0..splits-1, merged NS splits a
        step in split order -> (l, acc [BD]). One loop for both widths (`COMBINE_SHORT`), so they differ only in NS."""
        m_run = -float("inf")
        l_run = 0.0
        acc = tl.zeros((BD,), tl.float32)
        for s0 in range(0, splits, NS):
            sp = s0 + tl.arange(0, NS)
            live = sp < splits
            state = ((sp * KV_HEADS + kv) * rows + t) * BM + row_in_tile
            m = tl.load(m_ptr + state, mask=live, other=-float("inf"))
            l_part = tl.load(l_ptr + state, mask=live, other=0.0)
            part = tl.load(acc_ptr + state[:, None] * HD + d[None, :], mask=live[:, None], other=0.0)
            m_run, l_run, acc = _merge_step(m_run, l_run, acc, m, l_part, part, live)
        return l_run, acc

    @triton.jit
    def _merge_step(m_run, l_run, acc, m, l_part, part, live):
        """One merge step: the running (max, sum, acc [BD]) and NS splits' (m, l, acc [NS, BD]) -> the new ones."""
        m_new = tl.maximum(m_run, tl.max(m, axis=0))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        w = tl.where(live, tl.exp(m - m_safe), 0.0)
        scale_old = tl.exp(m_run - m_safe)
        l_run = l_run * scale_old + tl.sum(w * l_part, axis=0)
        acc = acc * scale_old + tl.sum(w[:, None] * part, axis=0)
        return m_new, l_run, acc

    @triton.jit
    def _merge_head_at_once(m_ptr, l_ptr, acc_ptr, out_ptr, rows, t, head, kv, row_in_tile, splits,
                            HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HD: tl.constexpr, BM: tl.constexpr,
                            NS: tl.constexpr, BD: tl.constexpr):
        """A row's head whose splits (at most NS) fit one merge step: every BD-column piece merged as
        `_merge_splits` merges it in one step (the same operations, so the same bits), but all pieces' loads issued
        before any is used, by one program (`MERGE_HEAD_AT_ONCE`)."""
        sp = tl.arange(0, NS)
        live = sp < splits
        state = ((sp * KV_HEADS + kv) * rows + t) * BM + row_in_tile
        m = tl.load(m_ptr + state, mask=live, other=-float("inf"))
        l_part = tl.load(l_ptr + state, mask=live, other=0.0)
        parts = ()
        for piece in tl.static_range(HD // BD):
            d = piece * BD + tl.arange(0, BD)
            parts = parts + (tl.load(acc_ptr + state[:, None] * HD + d[None, :], mask=live[:, None], other=0.0),)
        for piece in tl.static_range(HD // BD):
            _, l_run, acc = _merge_step(-float("inf"), 0.0, tl.zeros((BD,), tl.float32), m, l_part, parts[piece],
                                        live)
            _store_merged(out_ptr, t, head, piece * BD + tl.arange(0, BD), l_run, acc, HEADS, HD)

    @triton.jit
    def _store_merged(out_ptr, t, head, d, l_run, acc, HEADS: tl.constexpr, HD: tl.constexpr):
        """A merged row's columns d of one head: acc / l (0 where no slot was live), bf16, into out [rows, HEADS*HD]."""
        out = acc / tl.where(l_run == 0, 1.0, l_run)
        tl.store(out_ptr + t * (HEADS * HD) + head * HD + d, out.to(tl.bfloat16))

    @triton.jit(do_not_specialize=["rows"])
    def _attention_combine_kernel(pos_ptr, m_ptr, l_ptr, acc_ptr, out_ptr, rows, HEADS: tl.constexpr,
                                  KV_HEADS: tl.constexpr, HD: tl.constexpr, BM: tl.constexpr, BS: tl.constexpr,
                                  NS: tl.constexpr, SHORT: tl.constexpr, BD: tl.constexpr, PDL: tl.constexpr,
                                  TRIGGER: tl.constexpr, AT_ONCE: tl.constexpr):
        """Program (head, row, BD columns): merge the splits that hold the row's positions -> out [rows, HEADS*HD]:
        SHORT at a time where they are at most SHORT, else NS at a time (SHORT = NS: always NS). Columns in
        separate programs so a 32k context (512 splits) is not a few long serial loops. Both the split count and the
        step width follow the row's own position, never the step's other rows (later splits of a T-row step hold
        m = -inf for this row and would add exact zeros), so the sum is the one a T = 1 step makes. AT_ONCE
        (`MERGE_HEAD_AT_ONCE`): where they are at most SHORT, the head's first program merges all its columns and
        the others exit."""
        GROUP: tl.constexpr = HEADS // KV_HEADS
        _after_previous_launch(PDL)
        _let_next_launch_start(TRIGGER)
        head = tl.program_id(0)
        t = tl.program_id(1)
        own_splits = (tl.load(pos_ptr + t) + BS) // BS
        d = tl.program_id(2) * BD + tl.arange(0, BD)
        kv, row_in_tile = head // GROUP, head % GROUP
        if AT_ONCE and own_splits <= SHORT:
            if tl.program_id(2) == 0:
                _merge_head_at_once(m_ptr, l_ptr, acc_ptr, out_ptr, rows, t, head, kv, row_in_tile, own_splits, HEADS,
                                    KV_HEADS, HD, BM, SHORT, BD)
        else:
            if own_splits <= SHORT:
                l_run, acc = _merge_splits(m_ptr, l_ptr, acc_ptr, rows, t, kv, row_in_tile, own_splits, d, KV_HEADS,
                                           HD, BM, SHORT, BD)
            else:
                l_run, acc = _merge_splits(m_ptr, l_ptr, acc_ptr, rows, t, kv, row_in_tile, own_splits, d, KV_HEADS,
                                           HD, BM, NS, BD)
            _store_merged(out_ptr, t, head, d, l_run, acc, HEADS, HD)


# Cache slots a split. Compiled for sm_90 (`gpu/compile_sm90.py --attention`): 48 KiB of shared memory and 128
# registers a program at 64, so 4 programs an SM hold 128 KiB of K/V in flight; 128 slots take 80 KiB (2 an SM, the
# same bytes in flight) with half the partial states to write and merge. 128 against 64 (H100, 2026-12-07, RESULTS.md):
# 0.89-0.98x at T >= 33 from 2k tokens, but 1.00-1.02x at 512 and 1.01-1.02x at T = 1 below 32k; so 64.
ATTENTION_SPLIT = 64
# The merge launch: splits a program merges per loop step (COMBINE_SHORT where a row's positions fill at most that
# many splits, else COMBINE_SPLITS; the two equal: always that), and head columns per program. They group a row's sums
# by its own position, never by T. Against 64 at every context (H100, context 512): 16 a step 0.989x at T = 1, 0.977x
# at T = 64, but 1.13x at T = 1 at a 32k context, hence two (RESULTS.md, 2026-12-06 afternoon). At a 32k context a
# merge program's 512 splits are dependent loop steps, latency bound (ncu: 27 us a layer at T = 1); 256 a step
# against 64: whole step 0.853x at T = 1, 0.865x at T = 5, 0.89-0.93x to T = 64 (H100, 2026-12-07 10:13; a 512-token
# context does not take that path). gpu_modes.py times.
COMBINE_SPLITS = 256
COMBINE_SHORT = 16
COMBINE_COLUMNS = 32
# The width is the same at every row count: a launch's columns change the order in which a program sums its splits.
# 16 columns a program for one-row launches and 32 for larger ones gave 15 of 64 rows other bits than their
# one-row steps at a 1,100-token context (H100, 2026-12-07 09:46, RESULTS.md), so the merge width never follows T.
# Where a row's positions fill at most COMBINE_SHORT splits, one program merges all of a head's column pieces (the
# same operations on the same [splits, columns] tiles, so the same bits), their loads issued together, and the head's
# other programs exit: at T = 64 the launch's 3,072 programs of 4 warps are 1.45 waves of 16 a SM, each a chain of
# dependent loads. Built 2026-12-07, not yet timed or run on a GPU: off (gpu_modes.py times it).
MERGE_HEAD_AT_ONCE = False


TILE = 16  # query rows of one attention tile: one token's GQA heads, padded (the smallest MMA height)
# Whether a split's program takes several tokens of a verify step when the context alone fills the GPU, so the
# cache is read once per step, not once per token (benchmarks set False to compare). Bits are the same.
SHARE_KV = True


# Programs of the attention split launch per SM, each taking work items in turn (None: one program per
# (kv head, split, token) of the cache's capacity, most of them idle at a short context; benchmarks compare). 4 of
# them fit a SM at once (`gpu/compile_sm90.py --attention`: 48 KiB of shared memory, 128 registers); 8 dispatched
# twice that, half of them waiting for a slot. Same bits. 4 against 8 (H100, 2026-12-07 15:53 UTC, RESULTS.md):
# 1.000-1.002x at 512 tokens, 0.992-1.004x at 32k, 0.965-0.995x at T = 17-64 from 2k to 8k, 1.007x at worst; a
# second run agrees (8 against 4 at 8k, T = 64: 1.038x).
SPLIT_PROGRAMS_PER_SM: int | None = 4


def _multiprocessors(device: torch.device) -> int:
    """SMs of `device`; an H200's 132 off CUDA (the interpreter, on the CPU)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


def _split_programs(device: torch.device) -> int:
    """Programs of the split launch on `device` (`SPLIT_PROGRAMS_PER_SM`)."""
    if SPLIT_PROGRAMS_PER_SM is None:
        return 2 ** 31 - 1
    return SPLIT_PROGRAMS_PER_SM * _multiprocessors(device)


# Work items the split launch aims at per SM (`_programs_wanted`): at a short context a verify step's tokens spread
# over about this many items a SM, a few tokens each. Against 2 (H100, context 512): 0.982x at T = 64, T <= 17 alike;
# 8: 1.014x at T = 48 and 1.02-1.06x at 32k (RESULTS.md, 2026-12-06 afternoon; gpu_modes.py times others).
ITEMS_PER_SM = 4


def _programs_wanted(device: torch.device) -> int:
    """About how many attention work items keep `device` busy (`ITEMS_PER_SM`); with SHARE_KV off, no limit."""
    if not SHARE_KV:
        return 2 ** 30
    return ITEMS_PER_SM * _multiprocessors(device)


def attention(q: Tensor, kc: Tensor, vc: Tensor, pos: Tensor, dims: tuple,
              tree: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """q [T, H*hd] (rotated) over cache kc/vc [S, KV, hd] at slots <= pos[t] -> [T, H*hd] bf16.

    tree = (root [1], anc [T, D]) for token-tree rows (`dfvg.gpu.tree_device`): positions past root[0] read
    the slots anc[t, position - root - 1]. The last row must have the highest position. Two launches: per
    (kv head, split of ATTENTION_SPLIT slots, token group) partial softmax, then the merge per (head, token, 32
    columns)."""
    heads, kv_heads, hd, _, _ = dims
    rows = q.shape[0]
    splits = triton.cdiv(kc.shape[0], ATTENTION_SPLIT)
    m = torch.empty(splits, kv_heads, rows, TILE, dtype=torch.float32, device=q.device)
    l_sum = torch.empty_like(m)
    acc = torch.empty(splits, kv_heads, rows, TILE, hd, dtype=torch.float32, device=q.device)
    root, anc = tree if tree is not None else (pos, pos)
    pdl, trigger = pdl_on(q.device), early_trigger_on(q.device, rows)
    grid = (min(kv_heads * splits * rows, _split_programs(q.device)),)
    _attention_split_kernel[grid](q, kc, vc, pos, root, anc, m, l_sum, acc, rows, _programs_wanted(q.device),
                                  1.0 / math.sqrt(hd), HEADS=heads, KV_HEADS=kv_heads, HD=hd, F32=INTERPRETED,
                                  BM=TILE, BS=ATTENTION_SPLIT, TREE=tree is not None,
                                  DEPTH=anc.shape[-1] if tree else 1, PDL=pdl,
                                  TRIGGER=SPLIT_TRIGGER_SPLITS if trigger else 0, num_warps=4, launch_pdl=pdl)
    out = torch.empty_like(q)
    block_d = min(hd, COMBINE_COLUMNS)
    _attention_combine_kernel[(heads, rows, hd // block_d)](
        pos, m, l_sum, acc, out, rows, HEADS=heads, KV_HEADS=kv_heads, HD=hd, BM=TILE, BS=ATTENTION_SPLIT,
        NS=COMBINE_SPLITS, SHORT=COMBINE_SHORT, BD=block_d, PDL=pdl, TRIGGER=trigger, AT_ONCE=MERGE_HEAD_AT_ONCE,
        num_warps=4, launch_pdl=pdl)
    return out
