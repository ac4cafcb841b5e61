"""The integer forward pass of a feature head on the FPGA datapath, and its greedy drafts replayed.

What this module owns: `IntegerFeatureHead`, the body's `IntegerDraftModel` with the head's two ends in
integers (head_quantize.py's formats): fuse's input (int8 features beside the token's requantized int8
embedding), fuse into the int32 residual, and predict from the last residual back into int8 features. And
`integer_rollouts`, every block's drafts of a sequence at once (dfvg.distill.feature.rollouts's integer
twin), which the acceptance benchmark replays; integer sums are exact, so each row equals the drafter's.

Dataflow for T rows (ids, int8 features f_q at the feature scales):
    e = requant(emb[id]) int8 -> r = requant32([f_q, e] @ fuse) -> decoder layers (integer_model.py)
    logits = requant32(rmsnorm(r) @ output)             the body's final norm and LM head
    f^ = requant_{S - s}((r >> s) @ predict)            s: the row's leading-one shift to predict_bits
"""

from __future__ import annotations

import torch
from torch import Tensor

from dfvg.devices import tf32_matmuls
from dfvg.distill.teacher import TeacherSequence
from dfvg.fpga.datapath import fixed_point as fp
from dfvg.fpga.datapath.integer_model import IntegerDraftModel, TreeLayout, chain_layout, leading_one_shift
from dfvg.model import ModelConfig


class IntegerFeatureHead(IntegerDraftModel):
    """A quantized feature head on one torch device: `setup_cache`, then `step(ids, features, ...)`."""

    def __init__(self, tensors: dict[str, Tensor], config: ModelConfig, bits: int, device: torch.device | str):
        super().__init__(tensors, config, bits, device)
        self.predict_bits = int(tensors["predict.input_bits"][0])

    def fused(self, ids: Tensor, features: Tensor) -> Tensor:
        """ids [T], int8 features [T, H] -> the int32 residual [T, d] the first layer reads. A block feature head's
        mask ids (past the vocabulary) take its int8 mask rows, requantized to fuse's input as embedding rows are."""
        t = self.t
        rows, masks = self.rows_and_masks(ids, "fuse.mask_rows")
        embedded = fp.requantize(t["tok_embeddings.weight"][rows], t["fuse.embed_multiplier"][rows, None],
                                 t["fuse.embed_shift"][rows, None])
        if masks is not None:
            mask = fp.requantize(t["fuse.mask_rows"][masks], t["fuse.mask_multiplier"][masks, None],
                                 t["fuse.mask_shift"][masks, None])
            embedded = torch.where((ids >= self.config.vocab_size)[:, None], mask, embedded)
        return self._linear32(torch.cat([features, embedded], dim=-1), "fuse")

    def predict(self, r: Tensor) -> Tensor:
        """The last layer's int32 residual [T, d] -> int8 predicted features [T, H] at the feature scales."""
        row_shift = leading_one_shift(r, self.predict_bits - 1)  # [T, 1]
        limit = 2 ** (self.predict_bits - 1) - 1
        x = fp.rounding_shift(r, row_shift).clamp(-limit, limit)
        acc = fp.int8_matmul(x.to(torch.int8), self.t["predict.weight"]) if self.predict_bits == 8 else \
            fp.int_matmul(x, self.t["predict.weight"])
        shift = self.t["predict.shift"].to(torch.int64) - row_shift  # >= 0: head_quantize checks the shifts
        return fp.saturate_int8(fp.rounding_shift(acc.to(torch.int64) * self.t["predict.multiplier"].to(torch.int64),
                                                  shift))

    def step(self, ids: Tensor, features: Tensor, start_pos: int = 0, tree: TreeLayout | None = None,
             rows: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Feed ids [T] with int8 features [T, H] at positions start_pos.. (or a `TreeLayout`) -> the integer
        logits [R, Vh] and int8 predictions [R, H] of `rows` (default: every row); K/V of all rows cached."""
        if tree is None and start_pos + ids.shape[0] > self.max_seq_len:
            raise ValueError(f"positions up to {start_pos + ids.shape[0] - 1} exceed the cache; call setup_cache")
        if tree is not None and int(tree.slots.max()) >= self.max_seq_len:
            raise ValueError("tree slots exceed the cache; call setup_cache with room for the tree")
        with tf32_matmuls(False):  # the exact fp32 chunk matmuls of `int_matmul` need full mantissas
            r = self.run_layers(self.fused(ids, features), start_pos, tree)
            if rows is not None:
                r = r[rows]
            return self._linear32(self._norm(r, "norm"), "output"), self.predict(r)


def integer_rollouts(model: IntegerFeatureHead, features: Tensor, seq: TeacherSequence, depth: int,
                     vocab_limit: int | None = None) -> Tensor:
    """`dfvg.distill.feature.rollouts` on the integer head: drafts [len(continuation), depth], row i the
    block drafted after prompt + continuation[:i]. features: int8 [L + n - 1, H], the target's f_p already
    quantized (`head_quantize.quantize_features`). Pass 0 feeds the sequence on the target's features; pass
    j feeds each block's j-th draft in a slot of its own, on the block's previous prediction."""
    device = model.device
    tokens, start = seq.prompt + seq.continuation, len(seq.prompt) - 1
    fed, rows = len(tokens) - 1, len(seq.continuation)
    slots_total = fed + (depth - 1) * rows
    model.setup_cache(slots_total)  # slots another sequence left are never read: `keep` covers this call's
    inputs = torch.cat([features.new_zeros(1, features.shape[1]), features[: fed - 1]]).to(device)
    layout = chain_layout(0, fed, device)
    keep = torch.zeros(fed, slots_total, dtype=torch.bool, device=device)
    keep[:, :fed] = layout.keep
    last = torch.arange(start, start + rows, device=device)  # block i's last true position
    logits, predicted = model.step(torch.tensor(tokens[:fed], device=device), inputs, 0,
                                   TreeLayout(layout.positions, layout.slots, keep), rows=last)
    drafts = [model.tokens(logits, vocab_limit)]
    keep = torch.zeros(rows, slots_total, dtype=torch.bool, device=device)
    keep[:, :fed] = torch.arange(fed, device=device)[None, :] <= last[:, None]
    for j in range(1, depth):
        slots = fed + (j - 1) * rows + torch.arange(rows, device=device)
        keep[torch.arange(rows, device=device), slots] = True  # each block sees its own drafts so far
        logits, predicted = model.step(drafts[-1], predicted, tree=TreeLayout(last + j, slots, keep.clone()))
        drafts.append(model.tokens(logits, vocab_limit))
    return torch.stack(drafts, dim=1).cpu()
