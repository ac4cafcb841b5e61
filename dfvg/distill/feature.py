"""Distilling a feature head (dfvg.feature_head): its start, its loss, and its greedy acceptance.

What this module owns: `init_projections` (the head's `fuse` and `predict` start from the draft's PCA
basis of the target), `feature_loss` (the batch loss `dfvg.distill.train.train` runs) and
`feature_acceptance` (the steps greedy decoding takes with the head, simulated on held-out continuations).
The body, the data, the head vocabulary and the loop are the standalone draft's (pipeline.py).

The loss of a teacher-forced batch (EAGLE's recipe on DFVG's token loss):
- pass 0 reads the target's features f_{p-1}: the token loss (`distill_loss`, continuation positions) plus
  FEATURE_WEIGHT x smooth L1 between the predicted f^_p and f_p, both divided by the features' RMS;
- passes 1 .. UNROLL-1 read the previous pass's f^_{p-1} instead, and add their token loss. Inside a block
  the head reads its own f^ from the second draft on; training on it keeps those drafts accurate (EAGLE-3's
  training-time test, simplified: there the earlier positions' keys come from the target's features, here
  from the same pass's predictions).
The target's features are computed by the frozen target on the same batch at every step (bf16 on a GPU),
never cached: 3 KB per token at H = 1536.

Why the acceptance is simulated and not teacher forced: the standalone draft's shortcut (evaluate.py)
holds because a block's drafts see exactly the teacher-forced prefix. A feature head's drafts after the
first see f^, not f, so `feature_steps` replays each block as `FeatureDrafter` drafts it: the target's
features up to the block's start (one teacher-forced target pass gives them all, since greedy output is
the target's greedy continuation), the head's own predictions inside it. A test checks it step for step
against `dfvg.generate` with the real drafter.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dfvg.distill.evaluate import steps_table
from dfvg.distill.teacher import TeacherSequence
from dfvg.distill.train import BatchLoss, distill_loss, make_batch
from dfvg.feature_head import FeatureHead
from dfvg.generate import step_length
from dfvg.model import Transformer
from dfvg.stats import StepRecord

FEATURE_WEIGHT = 1.0
UNROLL = 2


@torch.no_grad()
def init_projections(head: FeatureHead, basis: Tensor | None, seed: int) -> None:
    """`fuse` = [basis^T | identity]: the embedding passes through as in a standalone draft, the feature lands
    on the directions the body's embedding was projected on; `predict` = basis. Without a basis (--init
    random) the feature parts are N(0, 0.02) and the identity stays."""
    d = head.body.config.hidden_size
    if basis is None:
        generator = torch.Generator().manual_seed(seed + 1)
        basis = torch.randn(head.target_hidden_size, d, generator=generator) * 0.02
    head.fuse.weight.copy_(torch.cat([basis.T, torch.eye(d)], dim=1))
    head.predict.weight.copy_(basis)


@torch.no_grad()
def target_features(target: Transformer, ids: Tensor, positions: Tensor) -> Tensor:
    """The target's final-norm outputs f [B, T, H] in float32 (teacher forced; right padding is garbage)."""
    target.setup_cache(ids.shape[0], ids.shape[1])
    return target.norm(target.run_layers(target.embed(ids), positions)).float()


def shifted(features: Tensor) -> Tensor:
    """f_{p-1} at each position p: [B, T, H] moved one position right, zeros at position 0."""
    return F.pad(features[:, :-1], (0, 0, 1, 0))


def feature_loss(target: Transformer, in_head: Tensor, unroll: int = UNROLL,
                 weight: float = FEATURE_WEIGHT) -> BatchLoss:
    """The batch loss of the module docstring, with `target` frozen."""
    def loss(head: FeatureHead, ids: Tensor, positions: Tensor, mask: Tensor, topk_ids: Tensor,
             topk_probs: Tensor) -> Tensor:
        features = target_features(target, ids, positions)
        scale = features[mask].pow(2).mean().sqrt().clamp_min(1e-6)
        inputs, total, regression = shifted(features), 0.0, 0.0
        for unrolled in range(unroll):
            head.body.max_batch = head.body.max_seq_len = 0  # a fresh cache: no autograd history across passes
            head.body.setup_cache(ids.shape[0], ids.shape[1])
            logits, predicted = head(ids, positions, inputs)
            total = total + distill_loss(logits[mask], topk_ids, topk_probs, in_head)
            if unrolled == 0:
                regression = F.smooth_l1_loss(predicted[mask] / scale, features[mask] / scale)
            inputs = shifted(predicted)
        return total / unroll + weight * regression
    return loss


@torch.no_grad()
def feature_steps(head: FeatureHead, features: Tensor, seq: TeacherSequence, k: int,
                  max_new_tokens: int | None = None) -> list[StepRecord]:
    """The greedy steps over one continuation: features [len(prompt) + len(continuation) - 1, H] (the target's
    f_p by position). Mirrors `FeatureDrafter.propose` and `dfvg.generate.decode`'s step lengths."""
    tokens, prompt_len = seq.prompt + seq.continuation, len(seq.prompt)
    total = len(seq.continuation) if max_new_tokens is None else max_new_tokens
    device = head.fuse.weight.device
    true_inputs = shifted(features.to(device, head.fuse.weight.dtype)[None])[0]  # row p: f_{p-1}
    head.body.setup_cache(1, len(tokens) + k + 1)

    def feed(ids: list[int], start: int, inputs: Tensor) -> tuple[Tensor, Tensor]:
        positions = torch.arange(start, start + len(ids), device=device)[None]
        logits, predicted = head(torch.tensor([ids], device=device), positions, inputs[None])
        return logits[0, -1], predicted[0, -1]

    if prompt_len > 1:
        feed(tokens[: prompt_len - 1], 0, true_inputs[: prompt_len - 1])
    steps, n, true_len = [], prompt_len, prompt_len - 1
    while n - prompt_len < len(seq.continuation):
        step_k = step_length(k, n - prompt_len, total)
        logits, predicted = feed(tokens[true_len:n], true_len, true_inputs[true_len:n])
        true_len, accepted = n, 0
        for i in range(step_k):
            draft = int(logits.argmax())
            if n + i >= len(tokens) or draft != tokens[n + i]:
                break
            accepted += 1
            if i < step_k - 1:
                logits, predicted = feed([draft], n + i, predicted[None])
        steps.append(StepRecord(step_k, accepted))
        n += accepted + 1
    return steps


def feature_acceptance(head: FeatureHead, target: Transformer, sequences: list[TeacherSequence], ks: list[int],
                       max_new_tokens: int | None = None, batch_size: int = 8) -> dict[int, dict]:
    """`steps_table` of the head's greedy steps over `sequences` at each k (the target's features come from
    one teacher-forced pass per batch of sequences)."""
    steps: dict[int, list[StepRecord]] = {k: [] for k in ks}
    device = head.fuse.weight.device
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start: start + batch_size]
        ids, positions, _, _, _ = make_batch(chunk, device)
        features = target_features(target, ids, positions)
        for row, seq in enumerate(chunk):
            fed = len(seq.prompt) + len(seq.continuation) - 1
            for k in ks:
                steps[k] += feature_steps(head, features[row, :fed], seq, k, max_new_tokens)
    return steps_table(steps)
