"""The QKV launch's epilogue (`dfvg.gpu.fused._qkv_rope_kernel`): bias and RoPE on one row tile's q/k/v columns, then
q to its buffer and k and v into the cache at each row's slot.

Why its own file: the rotation's inputs (positions -> cos/sin rows, slots) and its stores are the one part of the
QKV launch that the plain GEMV launch does not share; the weight stream under both is `dfvg.gpu.gemv_stream`.
"""

from __future__ import annotations

from dfvg.gpu.kernels import HAVE_TRITON

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _rope_inputs(t0, head, lo, b_ptr, pos_ptr, slot_ptr, cos_ptr, sin_ptr, rows, need, HEADS: tl.constexpr,
                     KV_HEADS: tl.constexpr, HD: tl.constexpr, HAS_BIAS: tl.constexpr, BT: tl.constexpr,
                     BN: tl.constexpr):
        """The epilogue's inputs of one row tile's q/k/v columns lo: bias of both halves [1, BN], cos and sin of
        both halves at each row's position [BT, BN] in bf16 (q and k heads; zeros for v heads, which are not
        rotated, and where `need` is false), and each row's cache slot [BT]."""
        HALF: tl.constexpr = HD // 2
        t = t0 + tl.arange(0, BT)
        live = (t < rows) & need
        b_lo = tl.zeros((1, BN), tl.float32)
        b_hi = tl.zeros((1, BN), tl.float32)
        if HAS_BIAS:
            b_lo = tl.load(b_ptr + head * HD + lo, mask=need, other=0.0).to(tl.float32)[None, :]
            b_hi = tl.load(b_ptr + head * HD + HALF + lo, mask=need, other=0.0).to(tl.float32)[None, :]
        pos = tl.load(pos_ptr + t, mask=live, other=0).to(tl.int32)
        rotated = live[:, None] & (head < HEADS + KV_HEADS)
        at = pos[:, None] * HD + lo[None, :]
        cos_lo = tl.load(cos_ptr + at, mask=rotated, other=0.0).to(tl.bfloat16)  # bf16, as the reference rounds
        sin_lo = tl.load(sin_ptr + at, mask=rotated, other=0.0).to(tl.bfloat16)  # them (and half the registers)
        cos_hi = tl.load(cos_ptr + at + HALF, mask=rotated, other=0.0).to(tl.bfloat16)
        sin_hi = tl.load(sin_ptr + at + HALF, mask=rotated, other=0.0).to(tl.bfloat16)
        slot = tl.load(slot_ptr + t, mask=live, other=0).to(tl.int32)
        return b_lo, b_hi, cos_lo, sin_lo, cos_hi, sin_hi, slot

    @triton.jit
    def _rope_out(acc_lo, acc_hi, b_lo, b_hi, cos_lo, sin_lo, cos_hi, sin_hi, slot, t0, head, lo, q_ptr, kc_ptr,
                  vc_ptr, rows, last, HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HD: tl.constexpr,
                  HAS_BIAS: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr):
        """Bias and RoPE (`_rope_inputs`) on one row tile's q/k/v columns lo (both halves of the head), then the
        store: q to its buffer, k and v into the cache at each row's slot."""
        HALF: tl.constexpr = HD // 2
        if HAS_BIAS:
            acc_lo += b_lo
            acc_hi += b_hi
        x_lo = acc_lo.to(tl.bfloat16).to(tl.float32)  # the projection's bf16 output, as the reference has it
        x_hi = acc_hi.to(tl.bfloat16).to(tl.float32)
        t = t0 + tl.arange(0, BT)
        live = t < rows
        if head < HEADS + KV_HEADS:  # q and k heads are rotated; v heads are stored as they are
            y_lo = x_lo * cos_lo.to(tl.float32) - x_hi * sin_lo.to(tl.float32)
            y_hi = x_hi * cos_hi.to(tl.float32) + x_lo * sin_hi.to(tl.float32)
        else:
            y_lo = x_lo
            y_hi = x_hi
        mask = live[:, None] & (lo[None, :] < HALF) & last
        if head < HEADS:
            at = t[:, None] * (HEADS * HD) + head * HD + lo[None, :]
            dest = q_ptr
        elif head < HEADS + KV_HEADS:
            at = slot[:, None] * (KV_HEADS * HD) + (head - HEADS) * HD + lo[None, :]
            dest = kc_ptr
        else:
            at = slot[:, None] * (KV_HEADS * HD) + (head - HEADS - KV_HEADS) * HD + lo[None, :]
            dest = vc_ptr
        tl.store(dest + at, y_lo.to(tl.bfloat16), mask=mask)
        tl.store(dest + at + HALF, y_hi.to(tl.bfloat16), mask=mask)
