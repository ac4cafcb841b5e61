"""Triton kernels for the verify step, each with the PyTorch reference it must match.

What this module owns: (1) fused greedy acceptance — the argmax of every verified row, the length of the
accepted draft prefix and the token that follows, computed on the device so a speculative step needs one
small device-to-host copy instead of a logits round trip; (2) verification attention with an explicit
tree mask over the new tokens, so token trees can replace the chain later without a new kernel.

Triton is imported under a guard: on a machine without it (CPU CI) `HAVE_TRITON` is False and callers use
the reference functions, which are plain tensor code and run anywhere. `gpu/check_kernels.py` compares
each kernel with its reference on fresh random inputs on the GPU.

Output layout of greedy acceptance (int64, length T + 2 for T verified rows, k = T - 1 drafts):
`[num_accepted, next_token, argmax_0, ..., argmax_{T-1}]`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

try:  # Triton ships with CUDA builds of torch only.
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_TRITON = False

ARGMAX_BLOCK = 4096  # vocabulary entries per program: 38 programs per row for a 152k vocabulary
MAX_ROWS = 16  # verified rows (k + 1) the acceptance kernel handles in one program


def greedy_accept_reference(logits: Tensor, draft_tokens: Tensor) -> Tensor:
    """logits [T, V], draft_tokens [T-1] long -> int64 [T+2] (layout in the module docstring).

    Device-only tensor ops (no .item()), so it can live inside a CUDA graph. Ties go to the lowest index,
    as `torch.argmax` and `dfvg.sampling.one_hot_argmax` do.
    """
    top = logits.argmax(dim=-1)  # [T]
    k = draft_tokens.shape[0]
    matches = (top[:k] == draft_tokens).long().cumprod(dim=0)  # [k]
    num_accepted = matches.sum().reshape(1)  # [1]
    next_token = top.gather(0, num_accepted)  # [1]
    return torch.cat([num_accepted, next_token, top])


def tree_attention_mask(start: int, tree_mask: Tensor, cache_len: int) -> Tensor:
    """Bool [T, cache_len]: query t sees every slot < start, and new slot start+j iff tree_mask[t, j]."""
    t = tree_mask.shape[0]
    mask = torch.zeros(t, cache_len, dtype=torch.bool, device=tree_mask.device)
    mask[:, :start] = True
    mask[:, start : start + t] = tree_mask.bool()
    return mask


def chain_tree_mask(t: int, device: torch.device | str = "cpu") -> Tensor:
    """The chain (causal) case of a tree mask: query t sees new tokens 0..t. [T, T] bool."""
    return torch.ones(t, t, dtype=torch.bool, device=device).tril()


def verify_attention_reference(q: Tensor, k_cache: Tensor, v_cache: Tensor, start: int, tree_mask: Tensor) -> Tensor:
    """q [T, H, hd]; k/v_cache [S, KV, hd] holding the T new tokens at slots start..; -> [T, H, hd].

    Float32 softmax attention with GQA (head h reads kv head h // (H / KV)), through SDPA's math.
    """
    t, heads, hd = q.shape
    group = heads // k_cache.shape[1]
    used = start + t
    keys = k_cache[:used].float().repeat_interleave(group, dim=1).transpose(0, 1)  # [H, used, hd]
    values = v_cache[:used].float().repeat_interleave(group, dim=1).transpose(0, 1)
    mask = tree_attention_mask(start, tree_mask, used)  # [T, used]
    out = torch.nn.functional.scaled_dot_product_attention(q.float().transpose(0, 1), keys, values, attn_mask=mask)
    return out.transpose(0, 1).to(q.dtype)  # [T, H, hd]


if HAVE_TRITON:

    @triton.jit
    def _argmax_partials_kernel(logits_ptr, row_stride, vocab, part_val_ptr, part_idx_ptr, num_splits,
                                BLOCK: tl.constexpr):
        """Program (row, split): max and first arg-max of one BLOCK of one row."""
        row = tl.program_id(0)
        split = tl.program_id(1)
        offs = split * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(logits_ptr + row * row_stride + offs, mask=offs < vocab, other=-float("inf")).to(tl.float32)
        best = tl.max(x, axis=0)
        first = tl.min(tl.where(x == best, offs, vocab), axis=0)
        tl.store(part_val_ptr + row * num_splits + split, best)
        tl.store(part_idx_ptr + row * num_splits + split, first)

    @triton.jit
    def _greedy_accept_kernel(part_val_ptr, part_idx_ptr, draft_ptr, out_ptr, rows, num_splits,
                              BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr):
        """One program: reduce the partials per row, then the accepted prefix and the next token."""
        t = tl.arange(0, BLOCK_T)
        s = tl.arange(0, BLOCK_S)
        valid = (t[:, None] < rows) & (s[None, :] < num_splits)
        where = t[:, None] * num_splits + s[None, :]
        vals = tl.load(part_val_ptr + where, mask=valid, other=-float("inf"))
        idx = tl.load(part_idx_ptr + where, mask=valid, other=2**30)
        row_max = tl.max(vals, axis=1)
        top = tl.min(tl.where(vals == row_max[:, None], idx, 2**30), axis=1)  # [BLOCK_T] first arg-max
        k = rows - 1
        drafts = tl.load(draft_ptr + t, mask=t < k, other=-1)
        mismatch = (t < k) & (drafts != top)
        num_accepted = tl.min(tl.where(mismatch | (t >= k), t, k), axis=0)
        next_token = tl.sum(tl.where(t == num_accepted, top, 0), axis=0)
        tl.store(out_ptr + 2 + t, top.to(tl.int64), mask=t < rows)
        tl.store(out_ptr, num_accepted.to(tl.int64))
        tl.store(out_ptr + 1, next_token.to(tl.int64))


def greedy_accept_triton(logits: Tensor, draft_tokens: Tensor, out: Tensor | None = None) -> Tensor:
    """Triton version of `greedy_accept_reference`: two launches, no host sync, graph-capturable."""
    rows, vocab = logits.shape
    if rows > MAX_ROWS:
        raise ValueError(f"greedy_accept_triton handles at most {MAX_ROWS} rows, got {rows}")
    splits = triton.cdiv(vocab, ARGMAX_BLOCK)
    part_val = torch.empty(rows, splits, dtype=torch.float32, device=logits.device)
    part_idx = torch.empty(rows, splits, dtype=torch.int32, device=logits.device)
    out = torch.empty(rows + 2, dtype=torch.int64, device=logits.device) if out is None else out
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    _argmax_partials_kernel[(rows, splits)](logits, logits.stride(0), vocab, part_val, part_idx, splits,
                                            BLOCK=ARGMAX_BLOCK)
    drafts = draft_tokens if draft_tokens.numel() else torch.zeros(1, dtype=torch.long, device=logits.device)
    _greedy_accept_kernel[(1,)](part_val, part_idx, drafts, out, rows, splits, BLOCK_T=MAX_ROWS,
                                BLOCK_S=triton.next_power_of_2(splits))
    return out


def greedy_accept(logits: Tensor, draft_tokens: Tensor) -> Tensor:
    """Fused greedy acceptance: the Triton kernel on CUDA when Triton is present, else the reference."""
    if HAVE_TRITON and logits.is_cuda:
        return greedy_accept_triton(logits, draft_tokens)
    return greedy_accept_reference(logits, draft_tokens)


if HAVE_TRITON:

    @triton.jit
    def _verify_attention_kernel(q_ptr, k_ptr, v_ptr, tree_ptr, out_ptr, start, rows, scale,
                                 q_st, q_sh, k_ss, k_sh, o_st, o_sh,
                                 GROUP: tl.constexpr, HD: tl.constexpr, BLOCK_T: tl.constexpr,
                                 BLOCK_S: tl.constexpr):
        """Program h: rows new queries of head h against slots [0, start + rows) with online softmax."""
        head = tl.program_id(0)
        kv = head // GROUP
        t = tl.arange(0, BLOCK_T)
        d = tl.arange(0, HD)
        q = tl.load(q_ptr + t[:, None] * q_st + head * q_sh + d[None, :], mask=t[:, None] < rows, other=0.0)
        m_i = tl.full((BLOCK_T,), -float("inf"), tl.float32)
        l_i = tl.zeros((BLOCK_T,), tl.float32)
        acc = tl.zeros((BLOCK_T, HD), tl.float32)
        for s0 in range(0, start + rows, BLOCK_S):
            s = s0 + tl.arange(0, BLOCK_S)
            in_range = s < start + rows
            keys = tl.load(k_ptr + s[:, None] * k_ss + kv * k_sh + d[None, :], mask=in_range[:, None], other=0.0)
            scores = tl.dot(q, tl.trans(keys)).to(tl.float32) * scale  # [BLOCK_T, BLOCK_S]
            j = s - start
            tree = tl.load(tree_ptr + t[:, None] * rows + j[None, :],
                           mask=(t[:, None] < rows) & (j[None, :] >= 0) & in_range[None, :], other=0)
            visible = ((s[None, :] < start) | (tree != 0)) & in_range[None, :]
            scores = tl.where(visible, scores, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=1))
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            p = tl.exp(scores - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            values = tl.load(v_ptr + s[:, None] * k_ss + kv * k_sh + d[None, :], mask=in_range[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(values.dtype), values).to(tl.float32)
            m_i = m_new
        out = acc / tl.where(l_i == 0, 1.0, l_i)[:, None]
        tl.store(out_ptr + t[:, None] * o_st + head * o_sh + d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=t[:, None] < rows)


def verify_attention_triton(q: Tensor, k_cache: Tensor, v_cache: Tensor, start: int, tree_mask: Tensor) -> Tensor:
    """Triton version of `verify_attention_reference` (same shapes). T <= 16; head_dim a power of two."""
    rows, heads, hd = q.shape
    if rows > MAX_ROWS or hd & (hd - 1):
        raise ValueError(f"verify_attention_triton needs T <= {MAX_ROWS} and a power-of-two head_dim")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("verify_attention_triton needs k/v caches of one layout, last dim contiguous")
    out = torch.empty_like(q)
    tree = tree_mask.to(torch.int8).contiguous()
    _verify_attention_kernel[(heads,)](
        q, k_cache, v_cache, tree, out, start, rows, 1.0 / math.sqrt(hd),
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), out.stride(0), out.stride(1),
        GROUP=heads // k_cache.shape[1], HD=hd, BLOCK_T=MAX_ROWS, BLOCK_S=64,
    )
    return out
