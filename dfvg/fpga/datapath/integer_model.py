"""The integer forward pass of the FPGA draft engine, with its own position-indexed int8 KV cache.

What this module owns: running a quantized draft (the tensors `quantize.py` produces) on token ids, in
integers only, through the primitives of `fixed_point.py` (int8 matmul with int32 accumulation, int4
group matmul, requantization by multiplier + shift with round-half-up and saturation, fixed-point RMSNorm,
softmax, SiLU table, RoPE, lowest-index argmax). It gives the same integers on CPU and CUDA because every
step is exact integer arithmetic (the float matmul paths of `fixed_point.int_matmul` are exact by
construction). What it does not own: choosing scales (the quantizer) or the drafting loop (`drafter.py`).

Dataflow of one decoder layer (T tokens, residual r int32 at the model-wide residual scale):
    a = rmsnorm(r) int8 -> qkv = requant(a @ wqkv + b) int8 -> [Qwen3: q, k = rmsnorm per head]
    -> rope(q), rope(k) -> cache[k, v at pos]
    p = softmax_q15(q k^T) -> o = requant(p v) int8 -> r += requant32(o @ wo)
    f = rmsnorm(r) int8 -> g, u = requant(f @ w13) -> h = requant(silu_lut(g) * u) -> r += requant32(h @ w2)
Two additions to fixed_point.py live here: `requantize_int32` (the residual-bound requantization, same
rounding, int32 saturation) and a per-row pre-shift in front of RMSNorm, so a 32-bit residual meets the
norm's 16-bit input port (RMSNorm is scale-invariant; only its eps term moves, by 4**shift).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dfvg.devices import tf32_matmuls
from dfvg.fpga.datapath import fixed_point as fp
from dfvg.model import ModelConfig, rope_table

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
NORM_INPUT_BITS = 14  # |x >> shift| <= 2**14 < 2**15 after rounding: inside rmsnorm's input range


def requantize_int32(acc: Tensor, multiplier: Tensor, shift: Tensor, bias: Tensor | None = None) -> Tensor:
    """Accumulator [..., N] -> int64 values saturated to int32: sat32(round((acc + bias) * M / 2**S))."""
    acc = acc.to(torch.int64)
    if bias is not None:
        acc = acc + bias.to(torch.int64)
    return fp.rounding_shift(acc * multiplier.to(torch.int64), shift).clamp(INT32_MIN, INT32_MAX)


def leading_one_shift(x: Tensor, bits: int) -> Tensor:
    """Per row of x [T, N], the right shift [T, 1] that leaves its largest |value| at most `bits` bits long
    (0 when it already is): a leading-one detector on the row's max (|max| clamped to >= 1)."""
    top = x.abs().amax(dim=-1, keepdim=True).clamp(min=1)  # [T, 1]
    length = torch.frexp(top.to(torch.float64))[1].to(torch.int64)  # bit length
    return (length - bits).clamp(min=0)


def rmsnorm_wide(x: Tensor, gamma: Tensor, params: tuple[int, int, int]) -> Tensor:
    """int32 residual [T, D] -> int8 [T, D]: shift each row into 15 bits, then `fixed_point.rmsnorm`.

    Example: a row with max |x| = 3_000_000 (22 bits) is shifted right by 8 (round half up) and its eps
    term eps_term0 / 4**8; a row with max |x| < 2**14 is left as is.
    """
    multiplier, shift, eps0 = params
    row_shift = leading_one_shift(x, NORM_INPUT_BITS)
    x16 = fp.rounding_shift(x, row_shift)
    eps = fp.rounding_shift(torch.full_like(row_shift, eps0), 2 * row_shift)
    return fp.rmsnorm(x16, gamma, multiplier, shift, eps)


@dataclass(frozen=True)
class TreeLayout:
    """Where rows go: RoPE positions [T], cache slots [T], and keep [T, L] (row t attends to slot s)."""

    positions: Tensor
    slots: Tensor
    keep: Tensor


def chain_layout(start: int, rows: int, device: torch.device) -> TreeLayout:
    """Consecutive tokens at positions start.. in the same slots, each seeing every slot up to its own."""
    positions = torch.arange(start, start + rows, device=device)
    keep = torch.arange(start + rows, device=device)[None, :] <= positions[:, None]
    return TreeLayout(positions, positions, keep)


class IntegerDraftModel:
    """A quantized draft on one torch device: `setup_cache`, then `forward(ids, start_pos)`."""

    def __init__(self, tensors: dict[str, Tensor], config: ModelConfig, bits: int, device: torch.device | str):
        self.config, self.bits, self.device = config, bits, torch.device(device)
        self.t = {name: t.to(self.device) for name, t in tensors.items()}
        small = (".params", ".softmax", ".pv", ".hidden")  # integer constants read as host ints once
        self.params = {name: tuple(int(v) for v in t.tolist()) for name, t in tensors.items() if name.endswith(small)}
        if bits == 4:
            self._split_int4()
        self.max_seq_len = 0

    def _split_int4(self) -> None:
        """Per int4 matrix, two int8 matrices A, B with w4 * gs = 16 A + B, so x @ (w4 * gs) is exact with two
        int8 matmuls (gs = 16 hi + lo, hi and lo in [0, 15], |w4 * hi| <= 120). Same integers as
        `fixed_point.int4_group_matmul` (tests/test_fpga_quantize.py checks it), without unpacking per call."""
        for name in [n for n in self.t if n.endswith(".weight_packed")]:
            base = name[: -len(".weight_packed")]
            w4 = fp.int4_unpack(self.t.pop(name).view(torch.uint8)).to(torch.int16)  # [N, K]
            gs = self.t.pop(base + ".group_scales").view(torch.uint8).to(torch.int16)  # [N, K/G]
            gs = gs.repeat_interleave(w4.shape[1] // gs.shape[1], dim=1)  # [N, K]
            self.t[base + ".weight_hi"] = (w4 * (gs >> 4)).to(torch.int8)
            self.t[base + ".weight_lo"] = (w4 * (gs & 15)).to(torch.int8)

    def setup_cache(self, max_seq_len: int) -> None:
        """Allocate the int8 K/V cache [layers][S, KV, hd] and the Q1.14 RoPE tables [S, hd/2] once."""
        if max_seq_len <= self.max_seq_len:
            return
        cfg = self.config
        shape = (max_seq_len, cfg.num_kv_heads, cfg.head_dim)
        self.cache_k = [torch.zeros(shape, dtype=torch.int8, device=self.device) for _ in range(cfg.num_layers)]
        self.cache_v = [torch.zeros(shape, dtype=torch.int8, device=self.device) for _ in range(cfg.num_layers)]
        cos, sin = rope_table(cfg, max_seq_len, torch.device("cpu"))  # float tables built on CPU everywhere
        half = cfg.head_dim // 2
        cos_q, sin_q = fp.rope_tables_q14(cos[:, :half], sin[:, :half])
        self.cos_q, self.sin_q = cos_q.to(self.device), sin_q.to(self.device)
        self.max_seq_len = max_seq_len

    # ---------------------------------------------------------------------------------- building blocks
    def _acc(self, x: Tensor, name: str) -> Tensor:
        """int8 x [T, K] @ W[N, K].T -> int64 accumulator [T, N] (int32 range for int8, 48-bit for int4)."""
        if name + ".weight" in self.t:
            return fp.int8_matmul(x, self.t[name + ".weight"]).to(torch.int64)
        hi = fp.int8_matmul(x, self.t[name + ".weight_hi"]).to(torch.int64)
        return 16 * hi + fp.int8_matmul(x, self.t[name + ".weight_lo"]).to(torch.int64)

    def _linear8(self, x: Tensor, name: str) -> Tensor:
        """int8 in -> int8 out at the output site's scale (per-row multipliers)."""
        t = self.t
        return fp.requantize(self._acc(x, name), t[name + ".multiplier"], t[name + ".shift"], t.get(name + ".bias"))

    def _linear32(self, x: Tensor, name: str) -> Tensor:
        """int8 in -> int32 values at the residual (or logit) scale."""
        t = self.t
        return requantize_int32(self._acc(x, name), t[name + ".multiplier"], t[name + ".shift"],
                                t.get(name + ".bias"))

    def _norm(self, x: Tensor, name: str) -> Tensor:
        return rmsnorm_wide(x, self.t[name + ".gamma"], self.params[name + ".params"])

    def _attention(self, i: int, x: Tensor, start: int, tree: TreeLayout | None = None) -> Tensor:
        """int8 [T, D] -> int8 attention output [T, H*hd]; writes K/V at positions start..start+T-1 (a tree:
        at its rows' slots, RoPE at their positions, attention over `tree.keep`)."""
        cfg, p, seq = self.config, f"layers.{i}.attention", x.shape[0]
        heads, kv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        qkv = self._linear8(x, p + ".wqkv")  # [T, (H + 2 KV) hd]
        q, k, v = qkv.split([heads * hd, kv * hd, kv * hd], dim=-1)
        q, k = q.reshape(seq, heads, hd), k.reshape(seq, kv, hd)
        if cfg.qk_norm:  # Qwen3: per-head RMSNorm of int8 q and k (|x| < 2**15, no row shift needed)
            q, k = self._head_norm(q, p + ".q_norm"), self._head_norm(k, p + ".k_norm")
        layout = tree or chain_layout(start, seq, self.device)
        cos, sin = self.cos_q[layout.positions, None], self.sin_q[layout.positions, None]  # [T, 1, hd/2]
        q = self._rope(q, cos, sin)
        self.cache_k[i][layout.slots] = self._rope(k, cos, sin)
        self.cache_v[i][layout.slots] = v.reshape(seq, kv, hd)
        length, rep = layout.keep.shape[1], heads // kv
        keep = layout.keep.repeat_interleave(rep, dim=0)  # rows t * rep + r, as q_g below
        out = []
        for g in range(kv):  # GQA: query heads g*rep .. g*rep+rep-1 read kv head g
            q_g = q[:, g * rep:(g + 1) * rep].reshape(seq * rep, hd)
            o = self._attend(q_g, self.cache_k[i][:length, g], self.cache_v[i][:length, g], keep, p)
            out.append(o.reshape(seq, rep * hd))
        return torch.cat(out, dim=-1)

    def _head_norm(self, x: Tensor, name: str) -> Tensor:
        """Qwen3's qk-norm: int8 [T, heads, hd] -> int8, one RMSNorm per head."""
        return fp.rmsnorm(x, self.t[name + ".gamma"], *self.params[name + ".params"])

    def _rope(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        return fp.rope_apply(x, cos, sin)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, keep: Tensor, p: str) -> Tensor:
        """int8 q [R, hd] over the cached k, v [L, hd] with keep [R, L] -> int8 attention output [R, hd]."""
        scores = fp.int_matmul(q, k)  # [R, L]
        probs = fp.softmax_q15(scores, *self.params[p + ".softmax"], keep)  # Q0.15
        acc = fp.int_matmul(probs, v.T)  # [R, hd]
        return fp.requantize(acc, *self.params[p + ".pv"])

    def _feed_forward(self, i: int, x: Tensor) -> Tensor:
        """int8 [T, D] -> int8 w2 input [T, I]."""
        p = f"layers.{i}.feed_forward"
        gate, up = self._linear8(x, p + ".w13").split(self.config.intermediate_size, dim=-1)
        return self._swiglu(gate, up, p)

    def _swiglu(self, gate: Tensor, up: Tensor, p: str) -> Tensor:
        """int8 gate, up [T, I] -> int8 h = requant(silu_lut(gate) * up)."""
        silu = fp.lut_apply(gate, self.t[p + ".silu_table"]).to(torch.int64)
        return fp.requantize(silu * up.to(torch.int64), *self.params[p + ".hidden"])

    # ------------------------------------------------------------------------------------------ forward
    def embed(self, ids: Tensor) -> Tensor:
        """ids [T] -> int32 residual [T, D] (per-row int8 embedding requantized to the residual scale). A block
        drafter's mask ids (past the vocabulary, `ModelConfig.mask_ids`) take its int8 mask vectors."""
        rows, masks = self.rows_and_masks(ids, "block_masks.weight")
        x = self._table_rows("tok_embeddings", rows)
        if masks is None:
            return x
        return torch.where((ids >= self.config.vocab_size)[:, None], self._table_rows("block_masks", masks), x)

    def rows_and_masks(self, ids: Tensor, mask_table: str) -> tuple[Tensor, Tensor | None]:
        """ids [T] -> (each id's embedding row, each id's row of `mask_table` or None where the artifact has none).
        With masks, ids past the vocabulary (a block drafter's mask ids) read a clamped embedding row that the
        caller replaces by their mask row; without, such an id stays an indexing error."""
        table = self.t.get(mask_table)
        vocab = self.config.vocab_size
        rows = ids.clamp(max=vocab - 1) if table is not None else ids
        if "tok_embeddings.token_rows" in self.t:  # an embedding over the head's rows: id -> row first
            rows = self.t["tok_embeddings.token_rows"][rows].to(torch.long)
        return rows, None if table is None else (ids - vocab).clamp(0, table.shape[0] - 1)

    def _table_rows(self, name: str, rows: Tensor) -> Tensor:
        """Rows of an int8 table with per-row multipliers -> int32 residual values [T, D]."""
        t = self.t
        m, s = t[name + ".multiplier"][rows, None].to(torch.int64), t[name + ".shift"][rows, None]
        return fp.rounding_shift(t[name + ".weight"][rows].to(torch.int64) * m, s).clamp(INT32_MIN, INT32_MAX)

    def forward(self, ids: Tensor, start_pos: int) -> Tensor:
        """Feed ids [T] (long, on this device) at positions start_pos..; -> int32-range logits [V] of the last."""
        return self.last_logits(ids, start_pos, 1)[0]

    def _forward(self, ids: Tensor, start_pos: int, last: int = 1) -> Tensor:
        """Layers, final norm and LM head; the head on the last `last` rows only (its cost is per row)."""
        return self._linear32(self._norm(self.layers(ids, start_pos)[-last:], "norm"), "output")

    def last_logits(self, ids: Tensor, start_pos: int, last: int) -> Tensor:
        """`forward`, with the logits of the last `last` rows [last, V]: a block drafter's pass reads its last
        real row's and every mask row's."""
        if start_pos + ids.shape[0] > self.max_seq_len:
            raise ValueError(f"positions up to {start_pos + ids.shape[0] - 1} exceed the cache; call setup_cache")
        with tf32_matmuls(False):  # the exact fp32 chunk matmuls of `int_matmul` need full mantissas
            return self._forward(ids, start_pos, last)

    def layers(self, ids: Tensor, start_pos: int, tree: TreeLayout | None = None) -> Tensor:
        """Embedding and every decoder layer: ids [T] -> int32 residual [T, D] (K/V written to the cache)."""
        return self.run_layers(self.embed(ids), start_pos, tree)

    def run_layers(self, r: Tensor, start_pos: int, tree: TreeLayout | None = None) -> Tensor:
        """Every decoder layer on an int32 residual [T, D] (the embedding's, or a feature head's fused input)."""
        for i in range(self.config.num_layers):
            p = f"layers.{i}."
            attn = self._attention(i, self._norm(r, p + "attention_norm"), start_pos, tree)
            r = self._residual(r, attn, p + "attention.wo")
            hidden = self._feed_forward(i, self._norm(r, p + "ffn_norm"))
            r = self._residual(r, hidden, p + "feed_forward.w2")
        return r

    def tree_logits(self, ids: Tensor, tree: TreeLayout) -> Tensor:
        """Feed token-tree rows (`TreeLayout`) -> int32-range logits [T, V] of every row. Integer sums are exact,
        so a row's attention over its ancestors equals the chain's over the same tokens, bit for bit."""
        if int(tree.slots.max()) >= self.max_seq_len:
            raise ValueError("tree slots exceed the cache; call setup_cache with room for the tree")
        with tf32_matmuls(False):
            return self._linear32(self._norm(self.layers(ids, 0, tree), "norm"), "output")

    def _residual(self, r: Tensor, x: Tensor, name: str) -> Tensor:
        """r + requant32(x @ W): the residual add, saturated to int32."""
        return (r + self._linear32(x, name)).clamp(INT32_MIN, INT32_MAX)

    def head_rows(self, vocab_limit: int | None) -> tuple[int, Tensor | None]:
        """(rows of the LM head the argmax may pick, row -> token id table or None for the identity)."""
        table = self.t.get("output.token_ids")  # a head over an ascending subset of ids: map back
        if table is None:
            return min(vocab_limit or self.config.vocab_size, self.config.vocab_size), None
        return int((table < (vocab_limit or self.config.vocab_size)).sum()), table

    def next_token(self, ids: Tensor, start_pos: int, vocab_limit: int | None = None) -> int:
        """Greedy draft token after ids: argmax (lowest index on ties) of the integer logits."""
        return int(self.tokens(self.forward(ids, start_pos)[None], vocab_limit)[0])

    def tokens(self, logits: Tensor, vocab_limit: int | None) -> Tensor:
        """Greedy token ids [R] of integer logits [R, Vh]: lowest head row on ties, mapped to token ids."""
        usable, table = self.head_rows(vocab_limit)
        picked = fp.argmax_lowest(logits[:, :usable])
        return picked if table is None else table.to(torch.long)[picked]
