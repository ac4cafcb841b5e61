"""How the rows of one forward pass are laid out when they are token-tree nodes, for the graph models.

Why a type of its own: the fused attention kernel (`dfvg.gpu.decode_attention`) and the block path
(`dfvg.gpu.graphs.GraphModel`) read the same three device tensors, and a CUDA graph captures them as
static buffers that the device tree step (`dfvg.gpu.tree_device`) rewrites at every replay.

Row t is a token at sequence position pos[t], written into cache slot `slots[t]`. Positions up to `root` are
the committed sequence (slot = position). Position root + j (j >= 1) of row t is row t's ancestor at depth j,
held in slot `ancestors[t, j - 1]`; entries past row t's own depth hold the root's slot (never read by the
kernel; already visible to the block path's mask).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class TreeRows:
    slots: Tensor  # [T] long: cache slot of each row
    root: Tensor  # [1] long: position (= slot) of the last committed token
    ancestors: Tensor  # [T, D] long: slots of each row's ancestors at depths 1..D (self at its own depth)

    def rows(self, start: int, end: int) -> TreeRows:
        """Rows start..end-1 of the layout (a chunk of a tree bigger than one fused launch takes)."""
        return TreeRows(self.slots[start:end], self.root, self.ancestors[start:end])

    def mask(self, cache_len: int) -> Tensor:
        """Bool [T, cache_len]: row t sees the committed slots and its ancestors' slots (the block path)."""
        committed = torch.arange(cache_len, device=self.slots.device) <= self.root
        seen = committed.expand(self.slots.shape[0], cache_len).clone()
        return seen.scatter_(1, self.ancestors, True)
