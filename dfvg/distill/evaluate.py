"""Greedy acceptance of a draft on held-out target continuations, from one teacher-forced pass.

What this module owns: the exact shortcut that turns "does the draft's argmax equal the target's token at
each position of the target's greedy continuation" into the steps `dfvg.generate` would take, and the
canonical metrics of those steps (dfvg/stats.py). What it does not own: real speculative runs (the H200
recipe also runs `dfvg.generate` end to end as a cross-check).

Why it is exact under greedy decoding: speculative output equals the target's greedy continuation c
(lossless), and a block starting after committed prefix c[:j] drafts c[j] first; while the drafts match,
the draft conditions on exactly the prefix teacher forcing gives it. So a block accepts the run of
matches m[j], m[j+1], ... capped at its draft length, then commits one more token.
Example: matches [1, 1, 0, 1, 1, 1, 1], k = 2, 7 tokens: step 1 at j=0 accepts 2 (+1 bonus) -> j=3;
step 2 accepts 2 -> j=6; step 3 drafts min(2, 7-6-1) = 0 -> j=7. Steps (2, 2), (2, 2), (0, 0).
The one inexact case is the last block of an EOS-ended continuation that runs past the EOS (the data
has no tokens beyond it); a sequence that ends by length is exact.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dfvg.distill.teacher import TeacherSequence
from dfvg.distill.train import make_batch
from dfvg.generate import step_length
from dfvg.model import Transformer
from dfvg.stats import StepRecord, acceptance_rate, mean_accepted_length, per_position_acceptance


@torch.no_grad()  # not inference_mode: its cache tensors would break a later eager prefill
def greedy_matches(model: Transformer, sequences: list[TeacherSequence], batch_size: int = 8) -> list[Tensor]:
    """Per sequence, bool [n]: the draft's greedy token (teacher forced) equals continuation[i]."""
    device = model.tok_embeddings.weight.device
    out = []
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start : start + batch_size]
        ids, positions, mask, _, _ = make_batch(chunk, device)
        model.setup_cache(ids.shape[0], ids.shape[1])
        predicted = model(ids, positions)[mask].argmax(-1).cpu()  # [N] in (b, t) order
        offset = 0
        for seq in chunk:
            n = len(seq.continuation)
            out.append(predicted[offset : offset + n] == torch.tensor(seq.continuation))
            offset += n
    return out


def block_steps(matches: Tensor, k: int, max_new_tokens: int | None = None) -> list[StepRecord]:
    """The steps `generate(..., draft_length=k)` takes over a continuation with these draft matches
    (the engine's own step length, `dfvg.generate.step_length`; tested against real runs in test_distill).
    A chain's block at committed j drafts c[j], c[j+1], ... while its drafts match, so its row j of
    `steps_over` is the window matches[j : j + k]."""
    padded = torch.cat([matches, matches.new_zeros(k)])
    windows = torch.stack([padded[i : i + matches.shape[0]] for i in range(k)], dim=1)  # [n, k]
    return steps_over(windows, k, max_new_tokens)


def steps_over(matches: Tensor, k: int, max_new_tokens: int | None = None) -> list[StepRecord]:
    """The steps of a generation over one continuation from bool matches [n, K]: entry [j, i] says the block
    drafted after committed c[:j] has c[j + i] as its token i. At committed j a step drafts
    step_length(k, j, total) tokens (at most K) and accepts the run of matches[j, :that], then commits one more
    (the module docstring's example)."""
    total = matches.shape[0] if max_new_tokens is None else max_new_tokens
    steps, j = [], 0
    while j < matches.shape[0]:
        step_k = min(step_length(k, j, total), matches.shape[1])
        accepted = 0
        while accepted < step_k and bool(matches[j, accepted]):
            accepted += 1
        steps.append(StepRecord(step_k, accepted))
        j += accepted + 1
    return steps


def acceptance_table(matches: list[Tensor], ks: list[int], max_new_tokens: int | None = None) -> dict[int, dict]:
    """For each k: acceptance rate, mean accepted length (bonus counted), per-position acceptance."""
    table = steps_table({k: [s for m in matches for s in block_steps(m, k, max_new_tokens)] for k in ks})
    for row in table.values():
        row["token_match_rate"] = float(torch.cat(matches).float().mean()) if matches else 0.0
    return table


def steps_table(steps: dict[int, list[StepRecord]]) -> dict[int, dict]:
    """The canonical metrics of each k's steps (a feature head's come from dfvg.distill.feature)."""
    return {k: {"acceptance_rate": acceptance_rate(s), "mean_accepted_length": mean_accepted_length(s),
                "mean_accepted_length_counts_bonus": True, "num_verify_steps": len(s),
                "per_position_acceptance": per_position_acceptance(s)} for k, s in steps.items()}
