"""`RtlDraftModel`: the integer draft forward pass with every op run by the simulated RTL kernels.

It is `IntegerDraftModel` (same forward structure, same KV cache, same artifact tensors) with each
arithmetic hook replaced by a kernel run (`ops.py`): the GEMVs (int8, int4, attention's q.k and P.V),
requantization to int8 and to the int32 residual with the residual add, the row-shift RMSNorm, RoPE,
softmax, SwiGLU, the embedding row's scaling, and the LM head's argmax. What stays in Python is the
controller's part: addressing (which cache rows, which embedding row), splitting and concatenating
vectors, and the causal mask as a count of valid rows. tests/test_rtl_run.py checks the tokens against
the Python datapath. Simulated cycles accumulate in `sim.cycles` per op.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from dfvg.fpga.datapath import fixed_point as fp
from dfvg.fpga.datapath.integer_model import IntegerDraftModel
from dfvg.fpga.rtlsim import ops
from dfvg.fpga.rtlsim.icarus import Icarus
from dfvg.model import ModelConfig


def _t(a: np.ndarray, dtype: torch.dtype) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).to(dtype)


class RtlDraftModel(IntegerDraftModel):
    """A quantized draft whose arithmetic comes out of Icarus simulations of `fpga/rtl/` (CPU only)."""

    def __init__(self, tensors: dict[str, Tensor], config: ModelConfig, bits: int, sim: Icarus,
                 tiles: ops.Tiles | None = None):
        super().__init__(tensors, config, bits, "cpu")
        self.sim, self.tiles = sim, tiles or ops.Tiles()

    def _split_int4(self) -> None:
        """gemv_int4 reads the int4 values and group scales themselves: unpack the nibbles once, keep the scales."""
        for name in [n for n in self.t if n.endswith(".weight_packed")]:
            base = name[: -len(".weight_packed")]
            self.t[base + ".weight4"] = fp.int4_unpack(self.t.pop(name).view(torch.uint8))
            self.t[base + ".group_scales"] = self.t[base + ".group_scales"].view(torch.uint8).to(torch.int64)

    # ------------------------------------------------------------------------------------------ GEMVs
    def _gemv(self, x: Tensor, name: str, **extra) -> dict[str, np.ndarray]:
        t, int8 = self.t, name + ".weight" in self.t
        jobs = ops.GemvJobs(ops.as_np(x), ops.as_np(t[name + (".weight" if int8 else ".weight4")]),
                            ops.as_np(t[name + ".multiplier"]), ops.as_np(t[name + ".shift"]),
                            ops.as_np(t[name + ".bias"]) if name + ".bias" in t else None,
                            gs=None if int8 else ops.as_np(t[name + ".group_scales"]), acc_w=32 if int8 else 48,
                            **extra)
        return ops.gemv(self.sim, name.split(".")[-1], jobs, self.tiles)

    def _linear8(self, x: Tensor, name: str) -> Tensor:
        return _t(self._gemv(x, name)["y8"], torch.int8)

    def _linear32(self, x: Tensor, name: str) -> Tensor:
        return _t(self._gemv(x, name)["y32"], torch.int64)

    def _residual(self, r: Tensor, x: Tensor, name: str) -> Tensor:
        return _t(self._gemv(x, name, res=ops.as_np(r))["y32"], torch.int64)

    def embed(self, ids: Tensor) -> Tensor:
        """Each token's int8 row through the requant32 lanes at the row's (M, S): a 1-element GEMV with x = 1."""
        if "tok_embeddings.token_rows" in self.t:
            ids = self.t["tok_embeddings.token_rows"][ids].to(torch.long)
        rows, d = self.t["tok_embeddings.weight"][ids], self.config.hidden_size  # [T, D]
        per_row = lambda name: ops.as_np(self.t[name][ids]).repeat(d)  # noqa: E731
        jobs = ops.GemvJobs(np.ones((1, 1), np.int64), ops.as_np(rows).reshape(-1, 1),
                            per_row("tok_embeddings.multiplier"), per_row("tok_embeddings.shift"))
        return _t(ops.gemv(self.sim, "embed", jobs, self.tiles)["y32"].reshape(-1, d), torch.int64)

    # ---------------------------------------------------------------------------------- other kernels
    def _norm(self, x: Tensor, name: str) -> Tensor:
        return _t(ops.rmsnorm(self.sim, "rmsnorm", x, self.t[name + ".gamma"], self.params[name + ".params"],
                              self._lanes(x.shape[-1])), torch.int8)

    def _head_norm(self, x: Tensor, name: str) -> Tensor:
        y = ops.rmsnorm(self.sim, "qk_norm", x.reshape(-1, x.shape[-1]), self.t[name + ".gamma"],
                        self.params[name + ".params"], self._lanes(x.shape[-1]))
        return _t(y.reshape(x.shape), torch.int8)

    def _lanes(self, d: int) -> ops.Tiles:
        """Norm lanes dividing D (the kernel streams whole rows of D/W beats)."""
        return ops.Tiles(self.tiles.p, self.tiles.w, math.gcd(d, self.tiles.lanes))

    def _rope(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        half = x.shape[-1] // 2
        cos, sin = (c.expand(*x.shape[:-1], half).reshape(-1, half) for c in (cos, sin))
        return _t(ops.rope(self.sim, "rope", x.reshape(-1, x.shape[-1]), cos, sin).reshape(x.shape), torch.int8)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, keep: Tensor, p: str) -> Tensor:
        """q.k (gemv_tile, identity requant32, argmax_stream for each row's max) -> softmax_row -> P.V."""
        valid = keep.sum(dim=-1)
        if not torch.equal(keep, torch.arange(keep.shape[1])[None] < valid[:, None]):
            raise ValueError("the RTL attention takes a causal (prefix) mask")
        m, s = ops.IDENTITY
        scores = ops.gemv(self.sim, "scores", ops.GemvJobs(ops.as_np(q), ops.as_np(k), np.array([m]), np.array([s]),
                                                           valid=ops.as_np(valid)), self.tiles)
        probs = ops.softmax(self.sim, "softmax", scores["y32"], scores["argmax"][:, 1], ops.as_np(valid),
                            self.params[p + ".softmax"], self.tiles)
        pm, ps = self.params[p + ".pv"]
        pv = ops.GemvJobs(probs, ops.as_np(v).T, np.array([pm]), np.array([ps]), x_w=17, acc_w=48)
        return _t(ops.gemv(self.sim, "pv", pv, self.tiles)["y8"], torch.int8)

    def _swiglu(self, gate: Tensor, up: Tensor, p: str) -> Tensor:
        return _t(ops.swiglu(self.sim, "swiglu", gate, up, self.t[p + ".silu_table"], self.params[p + ".hidden"],
                             self.tiles), torch.int8)

    def next_token(self, ids: Tensor, start_pos: int, vocab_limit: int | None = None) -> int:
        """Layers, final norm, then the LM head's GEMV -> requant32 -> argmax_stream in one kernel run."""
        if start_pos + ids.shape[0] > self.max_seq_len:
            raise ValueError(f"positions up to {start_pos + ids.shape[0] - 1} exceed the cache; call setup_cache")
        x = self._norm(self.layers(ids, start_pos)[-1:], "norm")
        usable, table = self.head_rows(vocab_limit)
        row = int(self._gemv(x, "output", valid=np.array([usable]))["argmax"][0, 0])
        return row if table is None else int(table[row])
