"""The fused GEMV launches' epilogues (`dfvg.gpu.fused`): what each launch does with a row tile's sums once its
weight stream (`dfvg.gpu.gemv_stream`) and split-K reduction are done.

- the linear launch: bias, SwiGLU and the residual, then the store (`_linear_inputs`, `_linear_out`);
- the QKV launch: bias and RoPE on one row tile's q/k/v columns, then q to its buffer and k and v into the cache at
  each row's slot (`_rope_inputs`, `_rope_out`).

Why their own file: the weight stream is shared; these are where the launches differ.
"""

from __future__ import annotations

from dfvg.gpu.kernels import HAVE_TRITON

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _linear_inputs(t0, n0, b_ptr, res_ptr, rows, N, need, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                       BT: tl.constexpr, BN: tl.constexpr):
        """The epilogue's inputs of one row tile: bias [1, BN] and residual [BT, BN] (zeros where absent or where
        `need` is false: a split that does not finish the sum needs none)."""
        t = t0 + tl.arange(0, BT)
        n = n0 + tl.arange(0, BN)
        bias = tl.zeros((1, BN), tl.float32)
        if HAS_BIAS:
            bias = tl.load(b_ptr + n, mask=(n < N) & need, other=0.0).to(tl.float32)[None, :]
        res = tl.zeros((BT, BN), tl.bfloat16)
        if HAS_RES:  # in its own dtype (bf16 in a layer: half the registers), widened where it is added
            res = tl.load(res_ptr + t[:, None] * N + n[None, :], mask=(t[:, None] < rows) & (n[None, :] < N) & need,
                          other=0.0)
        return bias, res

    @triton.jit
    def _linear_out(acc, acc_up, bias, res, t0, n0, out_ptr, rows, N, last, SWIGLU: tl.constexpr,
                    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr):
        """Bias, SwiGLU and residual (`_linear_inputs`) on one row tile's sums, then the store of rows t0..t0+BT."""
        t = t0 + tl.arange(0, BT)
        n = n0 + tl.arange(0, BN)
        if HAS_BIAS:
            acc += bias
        if SWIGLU:  # the reference rounds gate and up to bf16, then computes silu(gate) * up in bf16
            gate = acc.to(tl.bfloat16).to(tl.float32)
            acc = (gate / (1.0 + tl.exp(-gate))).to(tl.bfloat16).to(tl.float32) * acc_up.to(tl.bfloat16).to(
                tl.float32)
        where = t[:, None] * N + n[None, :]
        valid = (t[:, None] < rows) & (n[None, :] < N) & last
        if HAS_RES:
            acc = acc.to(tl.bfloat16).to(tl.float32) + res.to(tl.float32)
        stored = acc.to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + where, stored, mask=valid)
        return stored

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
