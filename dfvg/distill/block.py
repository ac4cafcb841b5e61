"""Training and exact greedy acceptance of a block drafter (dfvg.block_draft): k tokens from one pass.

What this module owns: the teacher-forced batch with mask rows (`block_batch`), the loss over it
(`block_loss`; a block feature head's: `block_feature_loss`), and the block drafter's exact acceptance on
held-out continuations (`block_matches`, whose rows `evaluate.steps_over` walks as generation steps, and
`block_table`). What it does not own: the training loop (train.py), the data (teacher.py), the target's features
(feature.py).

A block feature head (a `FeatureHead` whose body is a block drafter; dfvg.feature_head.BlockFeatureDrafter)
trains on the same rows: a real row at position p reads the target's f_{p-1}, a mask row reads zeros (no
predicted features), so its drafting pass is teacher forced too and `block_matches` stays exact for it. Its loss
adds the head's feature regression on the real rows (feature.py's pass 0): a block never reads a prediction, but
a token tree grown on the head's chain rows does (depth 2 on), and the regression keeps the hidden states carrying
the target's; there is no unrolled pass.

The objective (PARD's, on DistillSpec's data): every row that predicts a continuation token is an anchor;
after the real rows, each anchor t gets K - 1 mask rows at positions t + 1 .. t + K - 1, and mask j learns
the teacher's distribution at row t + j (the token j places past the one anchor t predicts). An attention
mask gives each mask row exactly what it sees when drafting: the real rows up to its anchor and its
anchor's earlier masks; real rows stay causal among themselves, so one pass trains the chain prediction
and all K - 1 offsets of every anchor. Slots are the row indices (masks of different anchors share
positions), as a token tree's are (`Transformer.run_layers`).

Why the acceptance shortcut is exact: under greedy verification a block drafted after committed prefix
c[:j] is accepted while its drafts equal c[j], c[j+1], ...; the drafter's first token is the chain
prediction at row j and its i-th mask row sees c[:j] only, so both are read off the teacher-forced pass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dfvg.distill.evaluate import steps_over, steps_table
from dfvg.distill.feature import FEATURE_WEIGHT, TargetFeatures, cache_budget, shifted
from dfvg.distill.teacher import TeacherSequence
from dfvg.distill.train import BatchLoss, distill_loss, make_batch
from dfvg.feature_head import FeatureHead
from dfvg.model import Transformer


def block_batch(ids: Tensor, mask: Tensor, block_size: int,
                mask_ids: list[int]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A teacher-forced batch (make_batch's ids, loss mask [B, T]) with mask rows appended ->
    (ids, positions [B, R], attention [B, 1, R, R] (True = may attend), teacher row [B, R] (-1: no loss)).

    Teacher rows index make_batch's top-K rows ((b, t) order of the loss mask). Anchors are the loss mask's
    rows, padded to the batch's most; a padding anchor's masks sit at row 0 and take no loss."""
    batch, width = ids.shape
    device, masks = ids.device, block_size - 1
    teacher = torch.where(mask, mask.flatten().cumsum(0).view(batch, width) - 1, -1)
    count = int(mask.sum(1).max())
    order = torch.sort((~mask).to(torch.int8), dim=1, stable=True).indices[:, :count]  # each row's anchors, first
    real = torch.arange(count, device=device)[None] < mask.sum(1, keepdim=True)  # [B, A]
    anchor = torch.where(real, order, 0)  # [B, A]
    offsets = torch.arange(1, masks + 1, device=device)  # [K-1]
    at = anchor[:, :, None] + offsets  # [B, A, K-1]: the row each mask stands in for
    target = teacher.gather(1, at.clamp(max=width - 1).flatten(1)).view_as(at)
    target = torch.where(real[:, :, None] & (at < width), target, -1)
    out_ids = torch.cat([ids, torch.tensor(mask_ids, device=device).expand(batch, count, masks).flatten(1)], 1)
    positions = torch.cat([torch.arange(width, device=device).expand(batch, width), at.flatten(1)], 1)  # [B, R]
    real_rows = torch.arange(width, device=device)
    rows_anchor = torch.cat([real_rows.expand(batch, width), anchor.repeat_interleave(masks, 1)], 1)
    group = torch.cat([torch.full((width,), -1, device=device),
                       torch.arange(count, device=device).repeat_interleave(masks)])
    offset = torch.cat([torch.zeros(width, dtype=torch.long, device=device), offsets.repeat(count)])
    is_real = group < 0
    slot = torch.arange(width + count * masks, device=device)
    sees_real = is_real[None, None, :] & (slot[None, None, :] <= rows_anchor[:, :, None])  # [B, R, R]
    sees_mask = ((group[:, None] == group[None, :]) & ~is_real[None, :] & (offset[None, :] <= offset[:, None]))[None]
    return out_ids, positions, (sees_real | sees_mask)[:, None], torch.cat([teacher, target.flatten(1)], 1)


def block_hidden(model: Transformer | FeatureHead, ids: Tensor, mask: Tensor,
                 features: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The draft's final hidden states over a block batch, with a fresh cache: ([B, R, D], teacher rows [B, R],
    positions [B, R]). A block feature head needs `features`, the target's f [B, T, H] of the batch's real rows:
    real row p reads f_{p-1}, every mask row zeros."""
    body = model.body if isinstance(model, FeatureHead) else model
    cfg = body.config
    out_ids, positions, attention, teacher = block_batch(ids, mask, cfg.block_size, cfg.mask_ids)
    rows = out_ids.shape[1]
    body.max_batch = body.max_seq_len = 0  # no autograd history from the last step's cache
    body.setup_cache(ids.shape[0], rows)
    slots = torch.arange(rows, device=ids.device).expand_as(out_ids)
    if not isinstance(model, FeatureHead):
        return model.run_layers(model.embed(out_ids), positions, slots, attention), teacher, positions
    inputs = F.pad(shifted(features), (0, 0, 0, rows - ids.shape[1]))  # the mask rows' features: zeros
    return model.states(out_ids, positions, inputs, slots, attention), teacher, positions


def block_loss(rows: Tensor) -> BatchLoss:
    """The block drafter's loss: `distill_loss` over every real and mask row that has a teacher row."""
    def loss(model: Transformer, ids: Tensor, positions: Tensor, mask: Tensor, topk_ids: Tensor,
             topk_probs: Tensor) -> Tensor:
        hidden, teacher, _ = block_hidden(model, ids, mask)
        keep = teacher >= 0
        index = teacher[keep]
        return distill_loss(model.head_logits(hidden[keep]), topk_ids[index], topk_probs[index], rows)
    return loss


def block_feature_loss(target: Transformer, rows: Tensor, weight: float = FEATURE_WEIGHT,
                       cache_bytes: int | None = None) -> BatchLoss:
    """A block feature head's loss (module docstring): `block_loss`'s token loss over real and mask rows, reading
    the frozen target's features (kept as `feature.feature_loss` keeps them), plus `weight` x the smooth L1 of the
    real rows' predicted features against the target's, both over the features' RMS."""
    device = target.tok_embeddings.weight.device
    features_of = TargetFeatures(target, cache_budget(device) if cache_bytes is None else cache_bytes)

    def loss(head: FeatureHead, ids: Tensor, positions: Tensor, mask: Tensor, topk_ids: Tensor,
             topk_probs: Tensor) -> Tensor:
        features = features_of.batch(ids, mask)
        hidden, teacher, _ = block_hidden(head, ids, mask, features)
        keep = teacher >= 0
        tokens = distill_loss(head.body.head_logits(hidden[keep]), topk_ids[teacher[keep]],
                              topk_probs[teacher[keep]], rows)
        scale = features[mask].pow(2).mean().sqrt().clamp_min(1e-6)
        predicted = head.predict(hidden[:, : ids.shape[1]][mask])
        return tokens + weight * F.smooth_l1_loss(predicted / scale, features[mask] / scale)
    return loss


@torch.no_grad()
def block_matches(model: Transformer | FeatureHead, sequences: list[TeacherSequence], batch_size: int = 8,
                  target: Transformer | None = None) -> list[Tensor]:
    """Per sequence, bool [n, K]: entry [j, i] says the block drafted after committed c[:j] has c[j + i] as
    its token i (i = 0: the chain prediction; False past the continuation's end). A block feature head reads
    `target`'s features of each sequence, as training computes them."""
    head = model if isinstance(model, FeatureHead) else None
    body = model.body if head is not None else model
    features_of = TargetFeatures(target, budget=0) if head is not None else None
    device = body.tok_embeddings.weight.device
    size, out = body.config.block_size, []
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start : start + batch_size]
        ids, _, mask, _, _ = make_batch(chunk, device)
        features = features_of.batch(ids, mask) if head is not None else None
        hidden, teacher, _ = block_hidden(model, ids, mask, features)
        predicted = body.head_logits(hidden).argmax(-1)  # [B, R] head rows (ascending ids: ties as over V)
        if body.config.head_vocab_size:
            predicted = body.head_token_ids[predicted]
        truth = torch.cat([torch.tensor(s.continuation, device=device) for s in chunk])
        right = torch.where(teacher >= 0, predicted == truth[teacher.clamp_min(0)], False)  # [B, R]
        width = ids.shape[1]
        for b, seq in enumerate(chunk):
            n, first = len(seq.continuation), len(seq.prompt) - 1
            chain = right[b, first : first + n]  # anchor j's own row: c[j]
            masks = right[b, width:].view(-1, size - 1)[:n]  # anchor j's masks: c[j+1 ..]
            out.append(torch.cat([chain[:, None], masks], 1).cpu())
    return out


def block_table(matches: list[Tensor], ks: list[int], max_new_tokens: int | None = None) -> dict[int, dict]:
    """For each k: the canonical metrics (evaluate.steps_table) of the block drafter's steps."""
    return steps_table({k: [s for m in matches for s in steps_over(m, k, max_new_tokens)] for k in ks})
