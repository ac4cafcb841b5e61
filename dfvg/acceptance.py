"""Speculative acceptance (Leviathan et al. 2023; Chen et al. 2023) as a pure tensor function.

Draft token d_i, drawn from the draft's processed distribution `draft_probs[i]`, is accepted with probability
min(1, target_probs[i][d_i] / draft_probs[i][d_i]). At the first rejection the next token is drawn from the
normalised residual max(0, target_probs[i] - draft_probs[i]); if all k are accepted, a bonus token is drawn
from target_probs[k]. The output is then distributed exactly as the target's processed distribution.

Greedy is the same rule with one-hot distributions: the ratio is 1 on agreement and 0 otherwise, and the
residual is the target's argmax. A greedy drafter passes `draft_probs=None` (one-hot at its tokens).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dfvg.sampling import SamplingParams, processed_probs, sample_from


def draft_token_probs(draft_tokens: Tensor, draft_probs: Tensor | None) -> Tensor:
    """q_i(d_i) for each draft position [k]; 1.0 for a one-hot (greedy) drafter."""
    if draft_probs is None:
        return torch.ones(draft_tokens.shape[0], dtype=torch.float32, device=draft_tokens.device)
    rows = torch.arange(draft_tokens.shape[0], device=draft_tokens.device)
    return draft_probs[rows, draft_tokens].float()


def residual_distribution(target_row: Tensor, draft_row: Tensor | None, draft_token: int) -> Tensor:
    """normalise(max(0, p - q)) at a rejected position; p itself if rounding left no mass."""
    if draft_row is None:
        draft_row = torch.zeros_like(target_row)
        draft_row[draft_token] = 1.0
    residual = (target_row.float() - draft_row.float()).clamp_(min=0.0)
    total = residual.sum()
    return residual / total if total > 0 else target_row.float()


def accept(
    draft_tokens: Tensor, draft_probs: Tensor | None, target_probs: Tensor, uniforms: Tensor
) -> tuple[int, int]:
    """Number of accepted drafts and the token that follows them.

    draft_tokens [k] long; draft_probs [k, V] or None (greedy drafter); target_probs [k+1, V];
    uniforms [k+1] in [0, 1): uniforms[:k] decide acceptance, uniforms[k] draws the final token.

    Example (greedy, k=3): drafts [5, 7, 2], target argmaxes [5, 7, 9, 4] -> (2, 9): two accepted, then
    the target's own token at the first disagreement.
    """
    k = draft_tokens.shape[0]
    device = target_probs.device
    draft_tokens = draft_tokens.to(device)
    uniforms = uniforms.to(device)
    rows = torch.arange(k, device=device)
    ratio = target_probs[rows, draft_tokens].float() / draft_token_probs(draft_tokens, draft_probs).to(device)
    accepted = (uniforms[:k] < ratio).int().cumprod(dim=0)
    num_accepted = int(accepted.sum().item())
    if num_accepted == k:
        final = target_probs[k].float()
    else:
        draft_row = None if draft_probs is None else draft_probs[num_accepted].to(device)
        final = residual_distribution(target_probs[num_accepted], draft_row, int(draft_tokens[num_accepted]))
    return num_accepted, int(sample_from(final, uniforms[k]).item())


def accept_block(
    draft_tokens: list[int], draft_probs: Tensor | None, target_logits: Tensor, sampling: SamplingParams,
    rng: torch.Generator,
) -> tuple[int, int]:
    """`accept` on raw target logits [k+1, V] under the sampling parameters; draws k+1 uniforms from rng."""
    target_probs = processed_probs(target_logits, sampling)
    draft_probs = None if draft_probs is None else draft_probs.to(target_probs.device)
    uniforms = torch.rand(len(draft_tokens) + 1, generator=rng)
    return accept(torch.tensor(draft_tokens, dtype=torch.long), draft_probs, target_probs, uniforms)
