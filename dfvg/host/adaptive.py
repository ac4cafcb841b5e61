"""Adaptive draft length: how many tokens the next block drafts, and where a block is cut short.

Owns two rules, usable together; a fixed k (no policy) stays the runtime's default.
- The length heuristic of Hugging Face assisted generation / DuoDecoding: k += grow after a fully accepted
  block, k -= shrink after a rejection, clamped to [k_min, k_max].
- A confidence cut: a block keeps its drafts up to (not including) the first one whose draft distribution
  had a top probability below `threshold` (the first draft is always kept). The decision at position i
  depends only on the draft's distribution there, not on the token drawn, so a cut block is still a valid
  proposal and decoding stays lossless. The drafter still spent its k passes; the cut saves verification
  positions and, more importantly, feeds the length heuristic with honest accept/reject signals.

Confidence comes from the block itself when it carries distributions (sampling: `DraftBlock.probs`), from a
`confidence` attribute a drafter may set on its blocks, or, for a greedy torch drafter, from
`ConfidenceProbe`: a forward hook on the draft model that records softmax(logits).max() of each pass, so the
Drafter protocol and `DraftBlock` stay as they are.

Does not own: the schedule that calls it (dfvg.host.pipeline), its YAML options (dfvg.host.device_config).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dfvg.drafter import DraftBlock, Drafter
from dfvg.errors import UserError


class AdaptiveDraftLength:
    """The draft-length policy of one generation (stateful: make one per prompt)."""

    def __init__(self, k: int = 4, *, k_min: int = 1, k_max: int = 16, grow: int = 2, shrink: int = 1,
                 threshold: float | None = None):
        if not 1 <= k_min <= k_max:
            raise UserError(f"adaptive draft length needs 1 <= k_min <= k_max, got k_min={k_min}, k_max={k_max}")
        if grow < 0 or shrink < 0:
            raise UserError(f"adaptive grow/shrink must be >= 0, got {grow}/{shrink}")
        if threshold is not None and not 0 < threshold < 1:
            raise UserError(f"adaptive threshold must be in (0, 1) or None, got {threshold}")
        self.k_min, self.k_max, self.grow, self.shrink, self.threshold = k_min, k_max, grow, shrink, threshold
        self.k = min(max(k, k_min), k_max)
        self.history: list[int] = []  # the k each step was planned with

    @classmethod
    def from_config(cls, k: int, config: object) -> AdaptiveDraftLength:
        """From a dfvg.host.device_config.AdaptiveConfig (duck-typed)."""
        return cls(k, k_min=config.k_min, k_max=config.k_max, grow=config.grow, shrink=config.shrink,
                   threshold=config.threshold)

    def after(self, num_drafted: int, num_accepted: int) -> int:
        """The k that would follow a step with this outcome (pure: the overlap schedule peeks with it)."""
        if num_drafted == 0:
            return self.k
        if num_accepted == num_drafted:
            return min(self.k + self.grow, self.k_max)
        return max(self.k - self.shrink, self.k_min)

    def update(self, num_drafted: int, num_accepted: int) -> None:
        self.history.append(self.k)
        self.k = self.after(num_drafted, num_accepted)

    def truncate(self, block: DraftBlock, confidence: list[float] | None) -> DraftBlock:
        """Cut the block before its first draft with confidence < threshold (keeping at least one).

        Example: threshold 0.5, confidence [0.9, 0.7, 0.3, 0.8] -> the first two drafts are kept.
        """
        if self.threshold is None or confidence is None or len(block.tokens) <= 1:
            return block
        keep = next((i for i in range(1, len(block.tokens)) if confidence[i] < self.threshold), len(block.tokens))
        if keep == len(block.tokens):
            return block
        probs = None if block.probs is None else block.probs[:keep]
        return DraftBlock(block.tokens[:keep], probs, block.elapsed_s, block.modeled_s)


class ConfidenceProbe:
    """Records the top probability of every forward pass of a torch drafter's model (a context manager).

    TorchDrafter.propose(context, k) runs k passes: pass i's logits give draft i, so after a propose the
    probe holds one value per draft, in order. A drafter without a `model` module records nothing. A CUDA-graph
    drafter's replays run no forward hook: while the probe is entered, such a drafter (`confidence_wanted`, also
    behind a `GuardedDrafter`'s slots) sets its blocks' own `confidence`, which `block_confidence` reads first.
    """

    def __init__(self, drafter: Drafter):
        self.module = getattr(drafter, "model", None)
        self.values: list[float] = []
        self._handle = None
        chain = [drafter, *(slot.drafter for slot in getattr(drafter, "slots", ()))]
        self.graph_drafters = [d for d in chain if hasattr(d, "confidence_wanted")]

    def _hook(self, module: torch.nn.Module, inputs: tuple, logits: Tensor) -> None:
        last = logits[0, -1].float()  # [V]
        self.values.append(float(torch.softmax(last, dim=-1).max()))

    def __enter__(self) -> ConfidenceProbe:
        if isinstance(self.module, torch.nn.Module):
            self._handle = self.module.register_forward_hook(self._hook)
        self._before = [drafter.confidence_wanted for drafter in self.graph_drafters]  # restored at exit (nesting)
        for drafter in self.graph_drafters:
            drafter.confidence_wanted = True
        return self

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        for drafter, before in zip(self.graph_drafters, getattr(self, "_before", ()), strict=False):
            drafter.confidence_wanted = before

    def clear(self) -> None:
        self.values = []

    def take(self, count: int) -> list[float] | None:
        """The last `count` recorded values, or None when the probe saw fewer passes."""
        return self.values[-count:] if count and len(self.values) >= count else None


def block_confidence(block: DraftBlock, probe: ConfidenceProbe | None) -> list[float] | None:
    """Top probability of each draft's distribution [k], from the best source available (None: unknown)."""
    own = getattr(block, "confidence", None)
    if own is not None:
        return list(own)
    if block.probs is not None:
        return block.probs.max(dim=-1).values.tolist()
    return probe.take(len(block.tokens)) if probe is not None else None
