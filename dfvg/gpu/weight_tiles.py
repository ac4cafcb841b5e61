"""How a fused GEMV program's weight tile reaches it: per-thread masked loads (cp.async on sm_90), or one tensor-memory
copy (TMA) a stage through a descriptor of the weight (`fused.TMA_WEIGHTS`).

Why two ways: a decode step is a stream of weight tiles, and with per-thread loads each 128 x 128 bf16 tile is 2,048
16-byte copies whose addresses and masks every thread computes at every K step; a TMA copy is one instruction from
one thread, zero-filled past the block's edge (where the masks differ, for a pair's first block past its N rows, only
columns no launch stores differ), and lands in shared memory where the swapped MMA
(`gemv_stream._stream`, SWAP_AB) reads it. The products and their order are the same either way, so a row's bits do
not depend on the way (GPU tests check that).

A descriptor sees every weight as [groups, 2, rows, K], a block [1, 2 or 1, BN, BK]: a stacked pair's two blocks
(gate and up of `FeedForward.w13`, or the halves of a RoPE head in the QKV weight) come in one copy as the
[2 BN, BK] operand `_stacked_tile` gathers row by row.
"""

from __future__ import annotations

from torch import Tensor

from dfvg.gpu.kernels import HAVE_TRITON

if HAVE_TRITON:
    import triton
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor

    @triton.jit
    def _w_tile(w_ptr, row0, n_rows, K, k0, BN: tl.constexpr, BK: tl.constexpr):
        """Weight rows row0..row0+BN, columns k0..k0+BK (zeros past n_rows and K): the unstacked stream's tile."""
        n = row0 + tl.arange(0, BN)
        k = k0 + tl.arange(0, BK)
        return tl.load(w_ptr + n[:, None] * K + k[None, :], mask=(n[:, None] < n_rows) & (k[None, :] < K),
                       other=0.0, eviction_policy="evict_first")

    @triton.jit
    def _stacked_tile(w_ptr, row0, row1, n_rows, K, k0, PAIR: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        """Weight rows row0..row0+BN, then (with PAIR) row1..row1+BN, as one [2 BN, BK] tile ([BN, BK] without);
        zeros past n_rows and K."""
        GROUPS: tl.constexpr = 2 if PAIR else 1
        r = tl.arange(0, GROUPS * BN)
        n = tl.where(r < BN, row0 + r, row1 + r - BN)
        k = k0 + tl.arange(0, BK)
        return tl.load(w_ptr + n[:, None] * K + k[None, :], mask=(n[:, None] < n_rows) & (k[None, :] < K),
                       other=0.0, eviction_policy="evict_first")

    @triton.jit
    def _tiles_ahead(w_ptr, row0, row1, n_rows, K, k_lo, PAIR: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     STEPS: tl.constexpr):
        """The `_stacked_tile`s of STEPS K steps from column k_lo (a program's split: whole BK steps,
        `gemv_stream.split_columns`), loads issued and nothing computed on them, so a program can call this before it
        waits for the launch before it (`fused.WEIGHTS_AHEAD`): weights are never written during a step. Past K
        (the last split's rest, or an empty split) a tile is zeros."""
        tiles = ()
        for i in tl.static_range(STEPS):
            tiles = tiles + (_stacked_tile(w_ptr, row0, row1, n_rows, K, k_lo + i * BK, PAIR, BN, BK),)
        return tiles

    @triton.jit
    def _described_tile(w_desc, group, row, k0, PAIR: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        """`_stacked_tile` by one TMA copy: rows row..row+BN of the group's block(s) (`weight_descriptor`)."""
        GROUPS: tl.constexpr = 2 if PAIR else 1
        return tl.reshape(w_desc.load([group, 0, row, k0]), (GROUPS * BN, BK))


def weight_descriptor(weight: Tensor, groups: int, pair: bool, block_n: int, block_k: int) -> object:
    """A TMA descriptor of weight [groups * (2 if pair else 1) * rows, K] as [groups, 2 or 1, rows, K], a block of
    [1, 2 or 1, block_n, block_k] (`_described_tile`). TMA needs a 16-byte aligned base and rows of whole 16 bytes;
    callers check `describable` first."""
    halves = 2 if pair else 1
    rows, k = weight.shape[0] // (groups * halves), weight.shape[1]
    return TensorDescriptor(weight, [groups, halves, rows, k], [halves * rows * k, rows * k, k, 1],
                            [1, halves, block_n, block_k])


def aligned_rows(weight: Tensor) -> bool:
    """Whether a 2-byte weight's rows start at 16-byte boundaries and hold whole 16-byte units (a 16-byte aligned
    base, K a multiple of 8): what a TMA descriptor needs, and the L2 prefetch's per-thread pieces
    (`gemv_stream._prefetch_weights`)."""
    return weight.data_ptr() % 16 == 0 and weight.shape[1] % 8 == 0


def describable(weight: Tensor, groups: int, pair: bool) -> bool:
    """Whether `weight_descriptor` can describe this weight: contiguous bf16/fp16 rows of whole 16-byte units from a
    16-byte aligned base (`aligned_rows`), split evenly into its groups and halves."""
    return (weight.is_contiguous() and weight.element_size() == 2 and aligned_rows(weight)
            and weight.shape[0] % (groups * (2 if pair else 1)) == 0)
