"""Token trees on the FPGA datapath: static trees grown level by level with the integer model's exact top-k.

Why: a tree verifies several candidate continuations in one target pass. On the FPGA the draft grows it
one forward per depth over that depth's nodes (the weights stream once per level, not once per node), and a
node's children are `fixed_point.topk_lowest` of its integer logits: the k largest, the lower token id first
on ties, exactly as the RTL's argmax breaks ties. Integer sums are exact, so a node's row, which attends
over the committed slots and its ancestors' tree slots, is bit for bit the row the chain computes for the
same tokens (`tests/test_fpga_tree.py`).

Greedy and static shapes only: a dynamic tree ranks nodes by draft probability, and a sampled tree needs
the draft's distribution; the datapath computes neither (`dfvg.tree_step.tree_step` refuses both in one
line), and an XRT board's kernel drafts chains. The modeled board time of a tree is one modeled block per
depth (`FpgaDrafter.modeled_block_s` with that depth's rows): modeled, not measured.
"""

from __future__ import annotations

import time

import torch

from dfvg.devices import synchronize
from dfvg.fpga.datapath.drafter import FpgaDrafter
from dfvg.fpga.datapath.fixed_point import topk_lowest
from dfvg.fpga.datapath.integer_model import TreeLayout
from dfvg.sampling import SamplingParams
from dfvg.tree import DraftTree, TreeSpec, tree_inputs


class DatapathTreeDrafter:
    """The `TreeDrafter` interface (`propose`, `accept`, `drafter`) over an emulated `FpgaDrafter`."""

    def __init__(self, drafter: FpgaDrafter, spec: TreeSpec):
        self.drafter, self.spec = drafter, spec
        self.model, self.device = drafter.model, drafter.device
        self.root_pos = 0
        self.fed_nodes = 0  # nodes fed into the draft cache (every level but the last), in creation order

    @torch.inference_mode()
    def propose(self, context: list[int], depth: int, sampling: SamplingParams, rng: torch.Generator) -> DraftTree:
        start = time.perf_counter()
        d = self.drafter
        fed_from = min(d.cached_len, len(context) - 1)
        ids = torch.tensor(context[fed_from:], dtype=torch.long, device=self.device)
        logits = self.model.forward(ids, fed_from)[None]  # [1, V]: after the root
        modeled = d.modeled_block_s(1, fed_from, len(context) - fed_from)
        d.cached_len, self.root_pos = len(context), len(context) - 1
        tokens: list[int] = []
        parents: list[int] = []
        frontier = [-1]
        for level in range(depth):
            added = []
            for parent, row in zip(frontier, logits, strict=True):
                for token in self._children(row, self.spec.branching[level]):
                    added.append(len(tokens))
                    tokens.append(token)
                    parents.append(parent)
            frontier = added
            if level + 1 < depth:
                logits = self._feed(tokens, parents, frontier)
                modeled += d.modeled_block_s(1, self.root_pos + 1, len(frontier))
        self.fed_nodes = len(tokens) - len(frontier)
        synchronize(self.device)
        return DraftTree(tokens, parents, None, time.perf_counter() - start, modeled)

    def _children(self, row: torch.Tensor, count: int) -> list[int]:
        """The `count` best tokens of one node's integer logits (head rows mapped back to token ids)."""
        usable, table = self.model.head_rows(self.drafter.vocab_limit)
        rows = topk_lowest(row[:usable], min(count, usable))
        return (rows if table is None else table[rows]).tolist()

    def _feed(self, tokens: list[int], parents: list[int], frontier: list[int]) -> torch.Tensor:
        """Feed the frontier nodes at their tree slots (root + 1 + index), positions root + depth, each seeing
        the committed slots and its ancestors (`dfvg.tree.tree_inputs`, as `TreeDrafter` feeds); logits [F, V]."""
        positions, slots, mask = tree_inputs(self.root_pos, parents, self.root_pos + 1 + len(tokens), self.device)
        rows = torch.tensor([1 + i for i in frontier], device=self.device)
        layout = TreeLayout(positions[0, rows], slots[0, rows], mask[0, 0, rows])
        ids = torch.tensor([tokens[i] for i in frontier], dtype=torch.long, device=self.device)
        return self.model.tree_logits(ids, layout)

    def accept(self, path: list[int]) -> None:
        """Move the path's leading fed nodes to slots root + 1.. of every layer's int8 cache; the next
        `propose` feeds the rest of the committed tokens, as the chain drafter catches up."""
        kept = [self.root_pos + 1 + node for node in path[: self._fed_prefix(path)]]
        if kept:
            src = torch.tensor(kept, device=self.device)
            dest = torch.arange(self.root_pos + 1, self.root_pos + 1 + len(kept), device=self.device)
            for cache in (*self.model.cache_k, *self.model.cache_v):
                cache[dest] = cache[src]
        self.drafter.cached_len = self.root_pos + 1 + len(kept)

    def _fed_prefix(self, path: list[int]) -> int:
        return next((i for i, node in enumerate(path) if node >= self.fed_nodes), len(path))

