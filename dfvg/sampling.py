"""Logits processing and sampling as pure tensor functions.

The randomness is passed in as uniforms in [0, 1), so tests can pin it and every device computes the same
draw. Greedy decoding is the temperature-0 case: the processed distribution is one-hot at the argmax
(lowest index on ties), and sampling from a one-hot picks that token whatever the uniform is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from dfvg.errors import UserError


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 = greedy; top_k 0 = off; top_p 1.0 = off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not 0 <= self.temperature < math.inf:  # NaN fails this too
            raise UserError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k < 0:
            raise UserError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise UserError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def one_hot_argmax(logits: Tensor) -> Tensor:
    """[..., V] -> one-hot float32 at the first maximal index."""
    index = logits.argmax(dim=-1, keepdim=True)
    return torch.zeros_like(logits, dtype=torch.float32).scatter_(-1, index, 1.0)


def processed_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """The distribution a token is drawn from: temperature, then top-k, then top-p. [..., V] -> [..., V]."""
    if params.greedy:
        return one_hot_argmax(logits)
    scaled = logits.float() / params.temperature
    if params.top_k and params.top_k < scaled.shape[-1]:
        kth = scaled.topk(params.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the token crossing it is kept).
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample_from(probs: Tensor, uniform: Tensor) -> Tensor:
    """Inverse-CDF draw: probs [..., V], uniform [...] in [0, 1) -> token ids [...].

    Example: probs [0.2, 0.0, 0.8], u = 0.2 -> the CDF is [0.2, 0.2, 1.0]; the first entry > 0.2 is index 2,
    so a zero-probability token is never returned.
    """
    cdf = probs.float().cumsum(dim=-1)
    target = (uniform.to(cdf.device) * cdf[..., -1]).unsqueeze(-1)
    index = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return index.clamp_(max=probs.shape[-1] - 1)
