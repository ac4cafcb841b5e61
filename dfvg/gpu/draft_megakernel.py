"""A GPU draft's whole greedy block in one persistent launch: k tokens, every layer, the head and the argmax.

Why: the distilled draft (4 layers of 512, a 32k head, 58 MB of weights) moves ~14 us of bytes per token on
an H200, but its fused forward is ~30 launches a token (six per layer, the head, the vocabulary scatter, the
argmax), each a few microseconds of launch, ramp and tail: a 4-token block took 0.63 ms, 0.37 of a target
step (benchmarks/RESULTS.md, 2026-12-04 18:06 UTC). Here one launch of one program per SM runs the block's
phases in order, a grid-wide barrier between phases instead of a kernel boundary:

    per draft step s:  tokens -> for each layer: QKV + RoPE, attention split, merge, O, gate/up, down -> head

- **tokens**: step 0 embeds the last two committed tokens at their positions (the two-token catch-up of
  `dfvg.gpu.graphs.draft_body`); step s > 0 reduces step s-1's per-block head maxima to the drafted token
  (the first of equal maxima, as `torch.argmax`), records it and embeds it at the next position.
- **layers**: the work items of the fused launches (`fused._qkv_rope_item`, `decode_attention._split_items`,
  `_combine_item`, `fused._linear_item`) with the block sizes the launches take for these shapes, so each
  value is computed as the per-launch draft computes it, bit for bit.
- **head**: RMSNorm + the head's GEMV per weight block, each block keeping its own maximum and where it is,
  instead of a [V] logits row that the next launch would scatter and scan.

The same kernel also runs one launch per phase (`persistent=False`): Triton's CPU interpreter runs programs
one after another, so a grid barrier would wait forever there; tests compare that mode with the reference
model on the CPU and with the persistent launch on a GPU.

Every program must be resident at once for the barrier to return: the launch has one program per SM and
asks for nothing that keeps two from fitting... one is all it needs. The barrier's counter rises by one per
program and phase; a second counter counts the programs that are done, and the last of them zeroes both for
the next launch (zeroing at the last arrival instead hung a replay on the H200: a program still polling the
last barrier then saw zero and waited forever).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dfvg.gpu import fused
from dfvg.gpu.block import layer_weights
from dfvg.gpu.block_sizes import linear_config
from dfvg.gpu.decode_attention import ATTENTION_SPLIT, INTERPRETED, TILE, _multiprocessors
from dfvg.gpu.kernels import HAVE_TRITON

PHASES_PER_LAYER = 6  # QKV + RoPE, attention split, merge, O, gate/up, down
COMBINE_COLUMNS = 32  # columns of one merge item (as `decode_attention.attention` launches it)
MERGE_SPLITS = 64  # splits one merge step reads (its NS)
ARGMAX_CHUNK = 1024  # head-block maxima one step of the token reduction reads

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from dfvg.gpu.decode_attention import _combine_item, _split_items
    from dfvg.gpu.fused import _linear_item, _qkv_rope_item
    from dfvg.gpu.gemv_stream import _program, _reduce_splits, _stream

    _PER_LAYER: tl.constexpr = tl.constexpr(PHASES_PER_LAYER)
    _CHUNK: tl.constexpr = tl.constexpr(ARGMAX_CHUNK)
    _BD: tl.constexpr = tl.constexpr(COMBINE_COLUMNS)
    _NS: tl.constexpr = tl.constexpr(MERGE_SPLITS)
    _BS: tl.constexpr = tl.constexpr(ATTENTION_SPLIT)
    _TILE: tl.constexpr = tl.constexpr(TILE)

    @triton.jit
    def _grid_barrier(bar_ptr, target):
        """Wait until every program has arrived `target` times in all (arrivals count up over the launch).
        Each program's writes before it happen before every program's reads after it (release, acquire)."""
        tl.debug_barrier()
        seen = tl.atomic_add(bar_ptr, 1, sem="acq_rel", scope="gpu") + 1
        while seen < target:  # polled with acquiring atomics: the compiler drops an unused one after a plain poll
            seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()

    @triton.jit
    def _drafted_token(val_ptr, idx_ptr, head_ids_ptr, blocks, HEAD_IDS: tl.constexpr):
        """The token of the largest head logit from the per-block maxima (the first block on ties)."""
        best = -float("inf")
        best_block = 0
        for c0 in range(0, blocks, _CHUNK):
            b = c0 + tl.arange(0, _CHUNK)
            vals = tl.load(val_ptr + b, mask=b < blocks, other=-float("inf"), cache_modifier=".cg")
            top = tl.max(vals, axis=0)
            best_block = tl.where(top > best, c0 + tl.argmax(vals, axis=0), best_block)
            best = tl.maximum(best, top)
        token = tl.load(idx_ptr + best_block, cache_modifier=".cg").to(tl.int64)  # the head row
        if HEAD_IDS:
            token = tl.load(head_ids_ptr + token)
        return token

    @triton.jit
    def _tokens_phase(s, state_ptr, drafts_ptr, embed_ptr, token_rows_ptr, head_ids_ptr, val_ptr, idx_ptr, x_ptr,
                      pos_ptr, blocks, steps, D: tl.constexpr, EMBED_ROWS: tl.constexpr,
                      HEAD_IDS: tl.constexpr):
        """Step s's input rows: the catch-up pair at s = 0, else the token step s-1 drafted (recorded)."""
        t = tl.arange(0, 2)
        last_pos = tl.load(state_ptr + 2)
        if s == 0:
            tokens = tl.load(state_ptr + t)
            positions = last_pos - 1 + t
            live = t < 2
        else:
            token = _drafted_token(val_ptr, idx_ptr, head_ids_ptr, blocks, HEAD_IDS)
            tl.store(drafts_ptr + s - 1, token)
            tokens = tl.zeros((2,), tl.int64) + token
            positions = last_pos + s + t * 0
            live = t < 1
        if s < steps:
            rows = tokens
            if EMBED_ROWS:
                rows = tl.load(token_rows_ptr + tokens, mask=live, other=0)
            for d0 in tl.static_range(0, D, 128):
                d = d0 + tl.arange(0, 128)
                m = live[:, None] & (d[None, :] < D)
                tl.store(x_ptr + t[:, None] * D + d[None, :],
                         tl.load(embed_ptr + rows[:, None] * D + d[None, :], mask=m, other=0.0), mask=m)
            tl.store(pos_ptr + t, positions, mask=live)

    @triton.jit
    def _head_item(item, x_ptr, g_ptr, w_ptr, part_ptr, count_ptr, val_ptr, idx_ptr, n_valid, eps,
                   D: tl.constexpr, F32: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   SPLIT_K: tl.constexpr, K_LEN: tl.constexpr):
        """RMSNorm + head rows of one weight block for one row: its largest logit (rounded to bf16 as the head's
        output is) and that row, the first of equal ones."""
        block, split, t0, tile = _program(item, 1, SPLIT_K, BT)
        n0 = block * BN
        acc, acc_unused = _stream(x_ptr, D, g_ptr, w_ptr, n0, n0, n_valid, 1, t0, split * K_LEN, K_LEN, D, eps,
                                  True, False, F32, BT, BN, BK)
        last = True
        if SPLIT_K > 1:
            acc, acc_unused, last = _reduce_splits(acc, acc_unused, part_ptr, count_ptr, tile, split, False, SPLIT_K,
                                                   BT, BN)
        r = tl.arange(0, BT)
        n = n0 + tl.arange(0, BN)
        logits = tl.where((r[:, None] == 0) & (n[None, :] < n_valid), acc.to(tl.bfloat16).to(tl.float32),
                          -float("inf"))
        column = tl.max(logits, axis=0)
        tl.store(val_ptr + block, tl.max(column, axis=0), mask=last)
        tl.store(idx_ptr + block, n0 + tl.argmax(column, axis=0), mask=last)

    @triton.jit
    def _layer_phase(kind, layer, pid, nprog, rows, x_ptr, q_ptr, attn_ptr, h_ptr, pos_ptr, attn_norm_ptr,
                     wqkv_ptr, bqkv_ptr, wo_ptr, bo_ptr, ffn_norm_ptr, w13_ptr, w2_ptr, kc_ptr, vc_ptr, layer_kv,
                     cos_ptr, sin_ptr, m_ptr, l_ptr, acc_ptr, part_ptr, count_ptr, wanted, scale, eps,
                     D: tl.constexpr, FFN: tl.constexpr, HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
                     HD: tl.constexpr, QKV_BIAS: tl.constexpr, O_BIAS: tl.constexpr, F32: tl.constexpr,
                     CFG_QKV: tl.constexpr, CFG_O: tl.constexpr, CFG_UP: tl.constexpr, CFG_DOWN: tl.constexpr):
        """This program's turns of one layer phase (`PHASES_PER_LAYER` kinds) at rows 0..rows-1.
        CFG_*: (BN, BK, SPLIT_K, K_LEN) of each GEMV, as the per-launch path sizes it."""
        QKV: tl.constexpr = (HEADS + 2 * KV_HEADS) * HD
        layer = layer.to(tl.int64)
        kc = kc_ptr + layer * layer_kv
        vc = vc_ptr + layer * layer_kv
        if kind == 0:
            for item in range(pid, (QKV // 2 // CFG_QKV[0]) * CFG_QKV[2], nprog):
                _qkv_rope_item(item, x_ptr, attn_norm_ptr + layer * D, wqkv_ptr + layer * (QKV * D),
                               bqkv_ptr + layer * QKV, pos_ptr, pos_ptr, cos_ptr, sin_ptr, q_ptr, kc, vc, part_ptr,
                               count_ptr, rows, D, CFG_QKV[3], eps, HEADS, KV_HEADS, HD, QKV_BIAS, F32, _TILE,
                               CFG_QKV[0], CFG_QKV[1], CFG_QKV[2])
        elif kind == 1:
            _split_items(pid, nprog, q_ptr, kc, vc, pos_ptr, pos_ptr, pos_ptr, m_ptr, l_ptr, acc_ptr, rows, wanted,
                         scale, HEADS, KV_HEADS, HD, F32, _TILE, _BS, False, 1)
        elif kind == 2:
            per_head = rows * (HD // _BD)
            for item in range(pid, HEADS * per_head, nprog):
                head = item // per_head
                row_block = item - head * per_head  # row * (HD // _BD) + column block
                _combine_item(head, row_block // (HD // _BD), row_block - row_block // (HD // _BD) * (HD // _BD),
                              pos_ptr, m_ptr, l_ptr, acc_ptr, attn_ptr, rows, HEADS, KV_HEADS, HD, _TILE, _BS, _NS,
                              _BD)
        elif kind == 3:
            for item in range(pid, tl.cdiv(D, CFG_O[0]) * CFG_O[2], nprog):
                _linear_item(item, attn_ptr, HEADS * HD, wo_ptr, wo_ptr + layer * (D * HEADS * HD),
                             bo_ptr + layer * D, x_ptr, x_ptr, part_ptr, count_ptr, rows, D, HEADS * HD, CFG_O[3],
                             eps, False, False, O_BIAS, True, F32, _TILE, CFG_O[0], CFG_O[1], CFG_O[2])
        elif kind == 4:
            for item in range(pid, tl.cdiv(FFN, CFG_UP[0]) * CFG_UP[2], nprog):
                _linear_item(item, x_ptr, D, ffn_norm_ptr + layer * D, w13_ptr + layer * (2 * FFN * D), w13_ptr,
                             x_ptr, h_ptr, part_ptr, count_ptr, rows, FFN, D, CFG_UP[3], eps, True, True, False,
                             False, F32, _TILE, CFG_UP[0], CFG_UP[1], CFG_UP[2])
        else:
            for item in range(pid, tl.cdiv(D, CFG_DOWN[0]) * CFG_DOWN[2], nprog):
                _linear_item(item, h_ptr, FFN, w2_ptr, w2_ptr + layer * (D * FFN), w2_ptr, x_ptr, x_ptr, part_ptr,
                             count_ptr, rows, D, FFN, CFG_DOWN[3], eps, False, False, False, True, F32, _TILE,
                             CFG_DOWN[0], CFG_DOWN[1], CFG_DOWN[2])

    @triton.jit
    def _head_phase(s, pid, nprog, rows, state_ptr, drafts_ptr, embed_ptr, token_rows_ptr, head_ids_ptr, norm_ptr,
                    head_ptr, x_ptr, pos_ptr, part_ptr, count_ptr, val_ptr, idx_ptr, tok_count_ptr, n_valid, eps,
                    steps, D: tl.constexpr, EMBED_ROWS: tl.constexpr, HEAD_IDS: tl.constexpr,
                    F32: tl.constexpr, CFG_HEAD: tl.constexpr):
        """Step s's head items (`_head_item`); the program that finishes the last one also makes step s+1's
        input (`_tokens_phase`), so no phase of its own waits for that."""
        blocks = tl.cdiv(n_valid, CFG_HEAD[0])
        items = blocks * CFG_HEAD[2]
        for item in range(pid, items, nprog):
            _head_item(item, x_ptr + (rows - 1) * D, norm_ptr, head_ptr, part_ptr, count_ptr, val_ptr, idx_ptr,
                       n_valid, eps, D, F32, _TILE, CFG_HEAD[0], CFG_HEAD[1], CFG_HEAD[2], CFG_HEAD[3])
            tl.debug_barrier()
            if tl.atomic_add(tok_count_ptr, 1, sem="acq_rel", scope="gpu") == items - 1:
                tl.atomic_xchg(tok_count_ptr, 0)
                _tokens_phase(s + 1, state_ptr, drafts_ptr, embed_ptr, token_rows_ptr, head_ids_ptr, val_ptr,
                              idx_ptr, x_ptr, pos_ptr, blocks, steps, D, EMBED_ROWS, HEAD_IDS)

    @triton.jit(do_not_specialize=["phase_lo", "phase_hi", "steps"])
    def _draft_block_kernel(state_ptr, drafts_ptr, embed_ptr, token_rows_ptr, head_ids_ptr, attn_norm_ptr, wqkv_ptr,
                            bqkv_ptr, wo_ptr, bo_ptr, ffn_norm_ptr, w13_ptr, w2_ptr, norm_ptr, head_ptr, kc_ptr,
                            vc_ptr, layer_kv, cos_ptr, sin_ptr, x_ptr, q_ptr, attn_ptr, h_ptr, pos_ptr, m_ptr, l_ptr,
                            acc_ptr, part_ptr, count_ptr, val_ptr, idx_ptr, tok_count_ptr, bar_ptr, n_valid, wanted,
                            scale, eps, phase_lo, phase_hi, steps, LAYERS: tl.constexpr,
                            D: tl.constexpr, FFN: tl.constexpr, HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
                            HD: tl.constexpr, QKV_BIAS: tl.constexpr, O_BIAS: tl.constexpr,
                            EMBED_ROWS: tl.constexpr, HEAD_IDS: tl.constexpr, F32: tl.constexpr,
                            CFG_QKV: tl.constexpr, CFG_O: tl.constexpr, CFG_UP: tl.constexpr, CFG_DOWN: tl.constexpr,
                            CFG_HEAD: tl.constexpr, PERSISTENT: tl.constexpr):
        """Phases phase_lo..phase_hi-1 of the block: 0 makes step 0's input; then per step, the layers' phases
        and the head's. With PERSISTENT, a grid barrier after each phase, and the last program out resets the
        barrier's counters."""
        PER_STEP: tl.constexpr = _PER_LAYER * LAYERS + 1
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        for phase in range(phase_lo, phase_hi):
            if phase == 0:
                if pid == 0:
                    _tokens_phase(0, state_ptr, drafts_ptr, embed_ptr, token_rows_ptr, head_ids_ptr, val_ptr,
                                  idx_ptr, x_ptr, pos_ptr, 0, steps, D, EMBED_ROWS, HEAD_IDS)
            else:
                s = (phase - 1) // PER_STEP
                p = phase - 1 - s * PER_STEP  # (no %: the interpreter's constexpr lacks __rmod__)
                rows = tl.where(s == 0, 2, 1)
                if p == PER_STEP - 1:
                    _head_phase(s, pid, nprog, rows, state_ptr, drafts_ptr, embed_ptr, token_rows_ptr, head_ids_ptr,
                                norm_ptr, head_ptr, x_ptr, pos_ptr, part_ptr, count_ptr, val_ptr, idx_ptr,
                                tok_count_ptr, n_valid, eps, steps, D, EMBED_ROWS, HEAD_IDS, F32, CFG_HEAD)
                else:
                    layer = p // _PER_LAYER
                    _layer_phase(p - layer * _PER_LAYER, layer, pid, nprog, rows, x_ptr, q_ptr, attn_ptr, h_ptr,
                                 pos_ptr, attn_norm_ptr, wqkv_ptr, bqkv_ptr, wo_ptr, bo_ptr, ffn_norm_ptr, w13_ptr,
                                 w2_ptr, kc_ptr, vc_ptr, layer_kv, cos_ptr, sin_ptr, m_ptr, l_ptr, acc_ptr, part_ptr,
                                 count_ptr, wanted, scale, eps, D, FFN, HEADS, KV_HEADS, HD, QKV_BIAS, O_BIAS, F32,
                                 CFG_QKV, CFG_O, CFG_UP, CFG_DOWN)
            if PERSISTENT:
                if phase + 1 < phase_hi:
                    _grid_barrier(bar_ptr, (phase + 1 - phase_lo) * nprog)
        if PERSISTENT:  # the last program out, when every other is past its last wait, zeroes both counters
            done = tl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu") == nprog - 1
            tl.atomic_xchg(bar_ptr, 0, mask=done)
            tl.atomic_xchg(bar_ptr + 1, 0, mask=done)

ENABLED = True  # GPU drafts of one sequence take the one-launch block (benchmarks set False to compare)
# Drafts of more weight than this keep the per-launch steps: one program per SM streams a 0.5B draft's 1 GB
# 1.45x slower than the launches' many programs do (benchmarks/draft_block.py, H200, 2026-12-04).
MAX_WEIGHT_BYTES = 256 * 2**20


def unsupported(model) -> str | None:
    """None when the one-launch block can run a model whose fused layers apply (`fused.supported`), else why
    not (one line)."""
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if weight_bytes > MAX_WEIGHT_BYTES:
        return f"{weight_bytes / 2**20:.0f} MiB of weights stream faster through the per-launch steps"
    if model.config.head_dim < COMBINE_COLUMNS:
        return f"head_dim {model.config.head_dim} is under the merge's {COMBINE_COLUMNS} columns"
    if model.output.bias is not None:
        return "an LM head with a bias is not fused"
    return None


def latency_config(n: int, k: int) -> dict:
    """Block sizes of a draft GEMV inside the block kernel: no split-K, since its partial sums cost a store, an
    atomic and a reload in a row of dependent steps, and a draft's phases are that chain, not bandwidth (a
    distilled draft's GEMV is 0.5-3 MB). 16 weight rows per item, 32 for a head's many rows; a function of the
    shape only, like `linear_config`."""
    return {"BN": 32 if n >= 4096 else 16, "BK": min(256, 1 << (k - 1).bit_length()), "SPLIT_K": 1,
            "num_warps": 4, "num_stages": 3}


def _shapes(model) -> list[tuple[int, int]]:
    """(N, K) of the QKV, O, gate/up (N: one half), down and head GEMVs."""
    cfg = model.config
    d, ffn = cfg.hidden_size, cfg.intermediate_size
    return [(cfg.qkv_size, d), (d, cfg.num_heads * cfg.head_dim), (ffn, d), (d, ffn), (model.output.weight.shape[0], d)]


def gemv_configs(model, policy: str = "latency") -> dict[tuple[int, int], dict]:
    """(N, K) -> block sizes of the block kernel's GEMVs: `latency_config`, or "launch": the sizes the
    per-launch fused steps take (`linear_config`). Installed in `block_sizes.TUNED`, they make the per-launch
    steps compute what the block kernel computes (tests compare the two bit for bit)."""
    size = linear_config if policy == "launch" else latency_config
    return {shape: size(*shape) for shape in _shapes(model)}


def _gemv(config: dict, k: int, half_width: int | None = None) -> tuple[int, int, int, int]:
    """(BN, BK, SPLIT_K, K per split) of a launch config, as `fused` sizes the launch."""
    block_n = min(config["BN"], half_width) if half_width else config["BN"]
    k_len = fused._cdiv(fused._cdiv(k, config["SPLIT_K"]), config["BK"]) * config["BK"]
    return block_n, config["BK"], config["SPLIT_K"], k_len


def _stacked(weights: list[tuple], index: int) -> Tensor | None:
    """One [L, ...] tensor of every layer's weight `index` (`layer_weights` order); None when it is None."""
    if weights[0][index] is None:
        return None
    return torch.stack([w[index] for w in weights]).contiguous()


class DraftMegakernel:
    """The block kernel over one model, its stacked layer weights and the buffers its phases pass on.

    Built for one draft length (`steps`) and one cache; `dfvg.gpu.graphs.draft_body` keeps one per draft
    length in the model's graph table, dropped with the graphs when the cache is reallocated."""

    def __init__(self, model, steps: int, vocab: int, programs: int | None = None, gemv: str = "latency"):
        cfg = model.config
        device = model.tok_embeddings.weight.device
        self.model, self.steps = model, steps
        weights = [layer_weights(layer) for layer in model.layers]
        self.layer_weights = [_stacked(weights, i) for i in (0, 1, 2, 3, 4, 7, 8, 9)]
        caches = [layer.attention.kv_cache for layer in model.layers]
        self.kc, self.vc = caches[0].k[0], caches[0].v[0]
        self.layer_kv = caches[0].k.numel() if len(caches) > 1 else 0
        if any(c.k.data_ptr() != self.kc.data_ptr() + i * self.layer_kv * self.kc.element_size()
               for i, c in enumerate(caches)):
            raise ValueError("the layers' K/V caches are not slices of one tensor; allocate them with "
                             "Transformer.setup_cache")
        heads, kv_heads, hd, width = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
        head_rows = model.output.weight.shape[0]
        configs = gemv_configs(model, gemv)
        sizes = [configs[shape] for shape in _shapes(model)]
        self.configs = {"CFG_QKV": _gemv(sizes[0], width, hd // 2), "CFG_O": _gemv(sizes[1], heads * hd),
                        "CFG_UP": _gemv(sizes[2], width), "CFG_DOWN": _gemv(sizes[3], cfg.intermediate_size),
                        "CFG_HEAD": _gemv(sizes[4], width)}
        if cfg.head_vocab_size:
            self.n_valid = int((model.head_token_ids < vocab).sum().item())  # ascending ids: a prefix
        else:
            self.n_valid = min(head_rows, vocab)
        # one program per SM on a GPU (all resident, or the barrier never returns); a few under the interpreter
        self.programs = programs or (_multiprocessors(device) if device.type == "cuda" else 8)
        self._buffers(device, cfg.qkv_size, heads * hd, cfg.intermediate_size, kv_heads, hd)

    def _buffers(self, device, qkv: int, q_width: int, ffn: int, kv_heads: int, hd: int) -> None:
        """The rows passed between phases, attention's partial states, split-K scratch and the head maxima."""
        bf16, width = torch.bfloat16, self.model.config.hidden_size
        self.x = torch.zeros(2, width, dtype=bf16, device=device)
        self.q = torch.zeros(2, q_width, dtype=bf16, device=device)
        self.attn = torch.zeros(2, q_width, dtype=bf16, device=device)
        self.h = torch.zeros(2, ffn, dtype=bf16, device=device)
        self.pos = torch.zeros(2, dtype=torch.long, device=device)
        splits = -(-self.kc.shape[0] // ATTENTION_SPLIT)
        self.m = torch.zeros(splits, kv_heads, 2, TILE, dtype=torch.float32, device=device)
        self.l_sum = torch.zeros_like(self.m)
        self.acc = torch.zeros(splits, kv_heads, 2, TILE, hd, dtype=torch.float32, device=device)
        parts = max(-(-n // bn) * split * 2 * fused.TILE_ROWS * bn for n, (bn, _, split, _) in
                    zip((qkv // 2, width, ffn, width, self.n_valid), self.configs.values(), strict=True))
        self.parts = torch.zeros(parts, dtype=torch.float32, device=device)
        self.counters = fused.new_counters(device)
        head_blocks = -(-self.n_valid // self.configs["CFG_HEAD"][0])
        self.block_max = torch.zeros(head_blocks, dtype=torch.float32, device=device)
        self.block_row = torch.zeros(head_blocks, dtype=torch.int32, device=device)
        self.head_done = torch.zeros(1, dtype=torch.int32, device=device)  # head items finished (per step)
        self.barrier = torch.zeros(2, dtype=torch.int32, device=device)  # arrivals, programs finished

    @property
    def phases(self) -> int:
        """Step 0's input, then per step every layer's phases and the head's."""
        return 1 + self.steps * (PHASES_PER_LAYER * len(self.model.layers) + 1)

    def __call__(self, state: Tensor, drafts: Tensor, persistent: bool | None = None) -> Tensor:
        """state [1, 3] = [prev_token, last_token, last_pos] -> drafts [1, steps] (written in place).
        persistent: one launch (default on a GPU), else one launch per phase (the interpreter's mode)."""
        if persistent is None:
            persistent = state.device.type == "cuda" and not INTERPRETED
        spans = [(0, self.phases)] if persistent else [(p, p + 1) for p in range(self.phases)]
        for lo, hi in spans:
            self._launch(state, drafts, lo, hi, persistent)
        return drafts

    def _launch(self, state: Tensor, drafts: Tensor, lo: int, hi: int, persistent: bool) -> None:
        m, cfg = self.model, self.model.config
        norm_a, wqkv, bqkv, wo, bo, norm_f, w13, w2 = self.layer_weights
        _draft_block_kernel[(self.programs,)](
            state, drafts, m.tok_embeddings.weight, m.token_rows if cfg.embed_rows else state,
            m.head_token_ids if cfg.head_vocab_size else state, norm_a, wqkv, wqkv if bqkv is None else bqkv, wo,
            wo if bo is None else bo, norm_f, w13, w2, m.norm.weight, m.output.weight, self.kc, self.vc,
            self.layer_kv, m.rope_cos, m.rope_sin, self.x, self.q, self.attn, self.h, self.pos, self.m, self.l_sum,
            self.acc, self.parts, self.counters, self.block_max, self.block_row, self.head_done, self.barrier,
            self.n_valid,
            2 * self.programs, cfg.head_dim ** -0.5, cfg.rms_norm_eps, lo, hi, self.steps,
            LAYERS=len(m.layers), D=cfg.hidden_size, FFN=cfg.intermediate_size, HEADS=cfg.num_heads,
            KV_HEADS=cfg.num_kv_heads, HD=cfg.head_dim, QKV_BIAS=bqkv is not None, O_BIAS=bo is not None,
            EMBED_ROWS=bool(cfg.embed_rows), HEAD_IDS=bool(cfg.head_vocab_size), F32=INTERPRETED,
            PERSISTENT=persistent, num_warps=4, num_stages=3, **self.configs)
