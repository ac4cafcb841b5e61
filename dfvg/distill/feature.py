"""Distilling a feature head (dfvg.feature_head): its start, its loss, and its greedy acceptance.

What this module owns: `init_projections` (the head's `fuse` and `predict` start from the draft's PCA
basis of the target), `feature_loss` (the batch loss `dfvg.distill.train.train` runs) and
`sequence_steps` (the steps greedy decoding takes with the head, replayed on held-out continuations).
The body, the data, the head vocabulary and the loop are the standalone draft's (pipeline.py).

The loss of a teacher-forced batch (EAGLE's recipe on DFVG's token loss):
- pass 0 reads the target's features f_{p-1}: the token loss (`distill_loss`, continuation positions) plus
  FEATURE_WEIGHT x smooth L1 between the predicted f^_p and f_p, both divided by the features' RMS;
- passes 1 .. UNROLL-1 read the previous pass's f^_{p-1} instead, and add their token loss. Inside a block
  the head reads its own f^ from the second draft on; training on it keeps those drafts accurate (EAGLE-3's
  training-time test, simplified: there the earlier positions' keys come from the target's features, here
  from the same pass's predictions).
The target's features come from the frozen target (bf16 on a GPU), one sequence at a time, and are kept
(`TargetFeatures`, up to FEATURE_CACHE_BYTES: 3 KB per token at H = 1536): they depend on the sequence only,
and a run passes over its data many times (1,200 steps of 32 sequences is ~8 epochs of the lease's ~4.8k).

Why the acceptance is replayed and not teacher forced: the standalone draft's shortcut (evaluate.py)
holds because a block's drafts see exactly the teacher-forced prefix. A feature head's drafts after the
first see f^, not f, so `rollouts` drafts each block as `FeatureDrafter` drafts it: the target's features
up to the block's start (one teacher-forced target pass gives them all, since greedy output is the target's
greedy continuation), the head's own predictions inside it. `feature_steps` turns those drafts into the
steps `dfvg.generate` takes; a test checks them step for step against real runs with the drafter.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dfvg.distill.teacher import TeacherSequence
from dfvg.distill.train import BatchLoss, distill_loss
from dfvg.feature_head import FeatureHead, load_feature_head
from dfvg.generate import step_length
from dfvg.model import Transformer
from dfvg.stats import StepRecord

FEATURE_WEIGHT = 1.0
UNROLL = 2
FEATURE_CACHE_BYTES = 16 << 30  # most training-sequence features kept across epochs on a GPU (bf16: ~5.6M tokens)


@torch.no_grad()
def init_projections(head: FeatureHead, basis: Tensor | None, seed: int, feature_in: bool = True) -> None:
    """`fuse` = [basis^T | identity]: the embedding passes through as in a standalone draft, the feature lands
    on the directions the body's embedding was projected on; `predict` = basis. Without a basis (--init
    random) the feature parts are N(0, 0.02) and the identity stays. Without `feature_in` (a body trained as
    a standalone draft, --init-from) fuse's feature half is zero: the head starts as exactly that draft."""
    d = head.body.config.hidden_size
    if basis is None:
        generator = torch.Generator().manual_seed(seed + 1)
        basis = torch.randn(head.target_hidden_size, d, generator=generator) * 0.02
    head.fuse.weight.copy_(torch.cat([basis.T if feature_in else torch.zeros(d, basis.shape[0]), torch.eye(d)], dim=1))
    head.predict.weight.copy_(basis)


@torch.no_grad()
def load_projections(head: FeatureHead, directory: str) -> None:
    """`fuse` and `predict` from the feature head in `directory` (--init-from a head: with its body, loaded by
    `train.init_from_draft`, the run starts as exactly that head and trains on)."""
    source = load_feature_head(directory, target_hidden_size=head.target_hidden_size)
    for mine, theirs in ((head.fuse, source.fuse), (head.predict, source.predict)):
        mine.weight.copy_(theirs.weight)


@torch.no_grad()
def final_states(target: Transformer, ids: Tensor, positions: Tensor) -> Tensor:
    """The target's final-norm outputs f [B, T, H] in its own dtype (teacher forced; right padding is
    garbage). Every row starts at position 0 (`make_batch`), so attention is causal over the first T slots: a
    fused kernel, not the whole cache under a mask."""
    target.setup_cache(ids.shape[0], ids.shape[1])
    return target.norm(target.run_layers(target.embed(ids), positions, causal_prefix=True))


def target_features(target: Transformer, ids: Tensor, positions: Tensor) -> Tensor:
    """`final_states` in float32."""
    return final_states(target, ids, positions).float()


def shifted(features: Tensor) -> Tensor:
    """f_{p-1} at each position p: [B, T, H] moved one position right, zeros at position 0."""
    return F.pad(features[:, :-1], (0, 0, 1, 0))


class TargetFeatures:
    """The frozen target's features of sequences, each computed alone (on one device, the same bits whenever it
    is computed: a resumed run equals one run, and evaluation reads what training read) and kept in the target's
    dtype, on its device, until `budget` bytes are kept.

    Why: the target's pass of 32 x 640 tokens took 154 ms (H100, random weights, benchmarks/teacher_speed.py)
    where a training step averaged ~205 ms (2,000 steps in 410 s, same card), and it gives the same features at
    every epoch. Measured on the real pair (H100, 2026-12-06): 0.104 s a step once kept, 0.70 s in the first
    epoch (its one-sequence passes); 2,000 steps in 298 s against 410 s."""

    def __init__(self, target: Transformer, budget: int):
        self.target, self.budget, self.kept, self.kept_bytes = target, budget, {}, 0

    def of(self, tokens: tuple[int, ...]) -> Tensor:
        """f [L, H] of one sequence (its first L tokens at positions 0..L-1), in the target's dtype."""
        found = self.kept.get(tokens)
        if found is not None:
            return found
        device = self.target.tok_embeddings.weight.device
        features = final_states(self.target, torch.tensor([tokens], device=device),
                                torch.arange(len(tokens), device=device)[None])[0]
        size = features.numel() * features.element_size()
        if self.kept_bytes + size <= self.budget:
            self.kept[tokens], self.kept_bytes = features, self.kept_bytes + size
        return features

    def batch(self, ids: Tensor, mask: Tensor) -> Tensor:
        """f [B, T, H] in float32 of a `make_batch` batch (each row's length: its last loss position + 1;
        zeros past it)."""
        if not bool(mask.any(dim=1).all()):
            raise ValueError("every row of a batch needs a loss position (a continuation)")
        lengths = (mask.shape[1] - mask.flip(1).int().argmax(dim=1)).tolist()
        out = torch.zeros(*ids.shape, self.target.config.hidden_size, device=ids.device)
        for row, (tokens, length) in enumerate(zip(ids.tolist(), lengths, strict=True)):
            out[row, :length] = self.of(tuple(tokens[:length])).float()
        return out


def cache_budget(device: torch.device) -> int:
    """Bytes of features to keep: on a GPU FEATURE_CACHE_BYTES or half its free memory if less, on a CPU 1/8 of
    that (a host's RAM holds the rest of the run too)."""
    if device.type == "cuda":
        return min(FEATURE_CACHE_BYTES, torch.cuda.mem_get_info(device)[0] // 2)
    return FEATURE_CACHE_BYTES // 8


def feature_loss(target: Transformer, rows: Tensor, unroll: int = UNROLL,
                 weight: float = FEATURE_WEIGHT, cache_bytes: int | None = None) -> BatchLoss:
    """The batch loss of the module docstring, with `target` frozen (its features kept up to cache_bytes;
    default `cache_budget`); `rows`: `distill_loss`'s table of head rows."""
    device = target.tok_embeddings.weight.device
    features_of = TargetFeatures(target, cache_budget(device) if cache_bytes is None else cache_bytes)

    def loss(head: FeatureHead, ids: Tensor, positions: Tensor, mask: Tensor, topk_ids: Tensor,
             topk_probs: Tensor) -> Tensor:
        features = features_of.batch(ids, mask)
        scale = features[mask].pow(2).mean().sqrt().clamp_min(1e-6)
        inputs, total, regression = shifted(features), 0.0, 0.0
        for unrolled in range(unroll):
            head.body.max_batch = head.body.max_seq_len = 0  # a fresh cache: no autograd history across passes
            head.body.setup_cache(ids.shape[0], ids.shape[1])
            hidden = head.states(ids, positions, inputs)
            predicted = head.predict(hidden)
            total = total + distill_loss(head.body.head_logits(hidden[mask]), topk_ids, topk_probs, rows)
            if unrolled == 0:
                regression = F.smooth_l1_loss(predicted[mask] / scale, features[mask] / scale)
            inputs = shifted(predicted)
        return total / unroll + weight * regression
    return loss


@torch.no_grad()
def rollouts(head: FeatureHead, features: Tensor, seq: TeacherSequence, depth: int) -> Tensor:
    """The head's greedy drafts [len(continuation), depth] of a block starting at each continuation position:
    row i holds the `depth` drafts `FeatureDrafter.propose` makes after prompt + continuation[:i] (a block of
    k <= depth drafts makes the first k: the drafts do not depend on k).

    features [L + n - 1, H]: the target's f_p by position (teacher forced). All blocks are drafted at once,
    one pass per draft depth: pass 0 feeds the whole sequence with the target's features (one cache slot
    per position); pass j feeds every block's j-th draft in a slot of its own, attending to the positions
    before its block and to its own earlier drafts (a tree of n chains, `Transformer.forward`'s slots/mask).
    """
    tokens, start = seq.prompt + seq.continuation, len(seq.prompt) - 1  # block i's catch-up ends at start + i
    fed, rows = len(tokens) - 1, len(seq.continuation)
    device, dtype = head.fuse.weight.device, head.fuse.weight.dtype
    slots_total = fed + (depth - 1) * rows
    head.body.max_batch = head.body.max_seq_len = 0
    head.body.setup_cache(1, slots_total)
    first = torch.arange(fed, device=device)
    mask = torch.zeros(1, 1, fed, slots_total, dtype=torch.bool, device=device)
    mask[0, 0, :, :fed] = first[None, :] <= first[:, None]
    last = first[start: start + rows]  # block i's last true position
    logits, predicted = head(torch.tensor([tokens[:fed]], device=device), first[None],
                             shifted(features.to(device, dtype)[None]), first[None], mask, rows=last)
    drafts = [logits[0].argmax(-1)]
    predicted = predicted[0]
    mask = torch.zeros(1, 1, rows, slots_total, dtype=torch.bool, device=device)
    mask[0, 0, :, :fed] = first[None, :] <= last[:, None]
    for j in range(1, depth):
        slots = fed + (j - 1) * rows + torch.arange(rows, device=device)
        mask[0, 0, torch.arange(rows, device=device), slots] = True  # each block sees its own drafts so far
        logits, predicted = head(drafts[-1][None], (last + j)[None], predicted[None], slots[None], mask)
        drafts.append(logits[0].argmax(-1))
        predicted = predicted[0]
    return torch.stack(drafts, dim=1).cpu()


def feature_steps(drafted: Tensor, seq: TeacherSequence, k: int, max_new_tokens: int | None = None) -> list[StepRecord]:
    """The greedy steps `dfvg.generate.decode` takes over one continuation with these `rollouts`."""
    total = len(seq.continuation) if max_new_tokens is None else max_new_tokens
    steps, i = [], 0
    while i < len(seq.continuation):
        step_k = step_length(k, i, total)
        accepted = 0
        while accepted < step_k and i + accepted < len(seq.continuation) and \
                int(drafted[i, accepted]) == seq.continuation[i + accepted]:
            accepted += 1
        steps.append(StepRecord(step_k, accepted))
        i += accepted + 1
    return steps


def sequence_steps(head: FeatureHead, target: Transformer, sequences: list[TeacherSequence], ks: list[int],
                   max_new_tokens: int | None = None) -> list[dict[int, list[StepRecord]]]:
    """Per sequence, the head's greedy steps at each k (the target's features from its teacher-forced pass, as
    training computes them: `TargetFeatures`); `evaluate.steps_table` turns any union of them into the metrics."""
    features_of = TargetFeatures(target, budget=0)
    out = []
    for seq in sequences:
        features = features_of.of(tuple((seq.prompt + seq.continuation)[:-1])).float()
        drafted = rollouts(head, features, seq, max(ks))
        out.append({k: feature_steps(drafted, seq, k, max_new_tokens) for k in ks})
    return out
