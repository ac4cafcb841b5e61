"""Token trees on the FPGA datapath: trees grown level by level with the integer model's exact top-k.

Why: a tree verifies several candidate continuations in one target pass. On the FPGA the draft grows it
one forward per depth over that depth's nodes (the weights stream once per level, not once per node), and a
node's children are `fixed_point.topk_lowest` of its integer logits: the k largest, the lower token id first
on ties, exactly as the RTL's argmax breaks ties. Integer sums are exact, so a node's row, which attends
over the committed slots and its ancestors' tree slots, is bit for bit the row the chain computes for the
same tokens (`tests/test_fpga_tree.py`).

Static shapes (`2,2,1`) and dynamic ones (`dynamic:N`, EAGLE-2's rule as `dfvg.tree_step.TreeDrafter` runs
it): a dynamic tree scores each node by its cumulative draft probability, here in integers: the node's
probability is `fixed_point.softmax_q15` of its parent's integer logits (the attention softmax's exp LUT and
reciprocal, at the logits' scale), and a score is the parent's times it in Q0.30, rounded half up. Each depth
expands the `DYNAMIC_WIDTH` best new nodes (ties: the earlier), and the `N` best of all (ties: shallower, then
earlier, `dfvg.tree.best_nodes`) are kept. Greedy only: a sampled tree needs the draft's distribution for
SpecInfer's rule, which `tree_step` refuses in one line; an XRT board's kernel drafts chains. The modeled
board time of a tree is one modeled block per depth (`FpgaDrafter.modeled_block_s` with that depth's rows)
plus, per expanded node, a top-k over its logits (`latency.topk_time_s`, `topk_stream.v`'s one logit a cycle)
and for a dynamic tree a softmax row (`latency.softmax_time_s`, `softmax_row.v`): modeled, not measured. A
child whose Q0.15 probability rounds to 0 (below about 1.5e-5) scores 0; ties then go to the shallower and
earlier node, so the integer tree can differ from the float one on such children (lossless either way).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from dfvg.devices import synchronize
from dfvg.fpga.board.latency import softmax_time_s, topk_time_s
from dfvg.fpga.datapath import fixed_point as fp
from dfvg.fpga.datapath.drafter import FpgaDrafter
from dfvg.fpga.datapath.feature_drafter import FpgaFeatureDrafter
from dfvg.fpga.datapath.integer_model import TreeLayout
from dfvg.sampling import SamplingParams
from dfvg.tree import DYNAMIC_WIDTH, DraftTree, TreeSpec, best_nodes, fed_prefix, tree_inputs

SCORE_ONE = 1 << 30  # the root's score: probability 1 in Q0.30


@dataclass
class Grown:
    """The tree as it grows: nodes in creation order (parents first) and their integer scores."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    scores: list[int] = field(default_factory=list)

    def add(self, token: int, parent: int, score: int) -> None:
        self.tokens.append(token)
        self.parents.append(parent)
        self.scores.append(score)


class DatapathTreeDrafter:
    """The `TreeDrafter` interface (`propose`, `accept`, `drafter`) over an emulated `FpgaDrafter`."""

    def __init__(self, drafter: FpgaDrafter, spec: TreeSpec):
        self.drafter, self.spec = drafter, spec
        self.model, self.device = drafter.model, drafter.device
        self.root_pos = 0
        self.slots: list[int] = []  # the draft cache slot of each proposed node, -1 where never fed
        self.softmax = fp.softmax_setup(drafter.meta["scales"]["logits"]) if spec.dynamic else None

    @torch.inference_mode()
    def propose(self, context: list[int], depth: int, sampling: SamplingParams, rng: torch.Generator) -> DraftTree:
        start = time.perf_counter()
        logits, modeled = self._root(context)
        grown, frontier, fed = Grown(), [-1], set()
        for level in range(depth):
            modeled += self._selection_s(len(frontier))
            added = self._expand(grown, frontier, logits, level)
            frontier = added if not self.spec.dynamic else \
                sorted(added, key=lambda i: (-grown.scores[i], i))[:DYNAMIC_WIDTH]
            if level + 1 < depth:
                logits = self._feed(grown.tokens, grown.parents, frontier)
                fed.update(frontier)
                modeled += self._level_block_s(len(frontier))
        keep = best_nodes(grown.scores, grown.parents, self.spec.budget) if self.spec.dynamic else \
            list(range(len(grown.tokens)))
        index = {old: new for new, old in enumerate(keep)}
        self.slots = [self.root_pos + 1 + old if old in fed else -1 for old in keep]
        synchronize(self.device)
        return DraftTree([grown.tokens[i] for i in keep], [index.get(grown.parents[i], -1) for i in keep], None,
                         time.perf_counter() - start, modeled)

    def _expand(self, grown: Grown, frontier: list[int], logits: torch.Tensor, level: int) -> list[int]:
        """Add the children of every frontier node (integer logits [F, V]); returns their indices. A child's
        score is its parent's times its Q0.15 probability (`fixed_point.softmax_q15` of the node's logits),
        in Q0.30 integers rounded half up: the dynamic tree's ranking, exact on every device."""
        count = DYNAMIC_WIDTH if self.spec.dynamic else self.spec.branching[level]
        usable, table = self.model.head_rows(self.drafter.vocab_limit)
        added = []
        for parent, row in zip(frontier, logits, strict=True):
            rows = fp.topk_lowest(row[:usable], min(count, usable))
            tokens = (rows if table is None else table[rows]).tolist()
            probs = fp.softmax_q15(row[:usable], *self.softmax)[rows].tolist() if self.softmax else [0] * len(rows)
            base = grown.scores[parent] if parent >= 0 else SCORE_ONE
            for token, p in zip(tokens, probs, strict=True):
                added.append(len(grown.tokens))
                grown.add(token, parent, (base * p + (1 << 14)) >> 15)  # round half up, as rounding_shift
        return added

    def _level_block_s(self, rows: int) -> float:
        """Modeled board time of feeding one level's `rows` nodes (one block of k = 1)."""
        return self.drafter.modeled_block_s(1, self.root_pos + 1, rows)

    def _selection_s(self, rows: int) -> float:
        """Modeled board time of choosing the children of `rows` expanded nodes: a top-k over each row's
        logits, and for a dynamic tree its softmax too (`latency.topk_time_s`, `softmax_time_s`)."""
        d = self.drafter
        scores = softmax_time_s(d.workload, d.design, rows) if self.spec.dynamic else 0.0
        return topk_time_s(d.workload, d.design, rows) + scores

    def _root(self, context: list[int]) -> tuple[torch.Tensor, float]:
        """Feed the committed ids the cache lacks: (integer logits [1, V] after the root, modeled board time)."""
        d = self.drafter
        fed_from = min(d.cached_len, len(context) - 1)
        ids = torch.tensor(context[fed_from:], dtype=torch.long, device=self.device)
        logits = self.model.forward(ids, fed_from)[None]  # [1, V]: after the root
        d.cached_len, self.root_pos = len(context), len(context) - 1
        return logits, d.modeled_block_s(1, fed_from, len(context) - fed_from)

    def _feed(self, tokens: list[int], parents: list[int], frontier: list[int]) -> torch.Tensor:
        """Feed the frontier nodes at their tree slots; logits [F, V]."""
        ids, layout = self._layout(tokens, parents, frontier)
        return self.model.tree_logits(ids, layout)

    def _layout(self, tokens: list[int], parents: list[int], frontier: list[int]) -> tuple[torch.Tensor, TreeLayout]:
        """The frontier's ids and `TreeLayout`: tree slots root + 1 + index, positions root + depth, each row
        seeing the committed slots and its ancestors (`dfvg.tree.tree_inputs`, as `TreeDrafter` feeds)."""
        positions, slots, mask = tree_inputs(self.root_pos, parents, self.root_pos + 1 + len(tokens), self.device)
        rows = torch.tensor([1 + i for i in frontier], device=self.device)
        ids = torch.tensor([tokens[i] for i in frontier], dtype=torch.long, device=self.device)
        return ids, TreeLayout(positions[0, rows], slots[0, rows], mask[0, 0, rows])

    def accept(self, path: list[int]) -> None:
        """Move the path's leading fed nodes to slots root + 1.. of every layer's int8 cache; the next
        `propose` feeds the rest of the committed tokens, as the chain drafter catches up."""
        kept = fed_prefix(path, self.slots)
        if kept:
            src = torch.tensor(kept, device=self.device)
            dest = torch.arange(self.root_pos + 1, self.root_pos + 1 + len(kept), device=self.device)
            for cache in (*self.model.cache_k, *self.model.cache_v):
                cache[dest] = cache[src]
        self.drafter.cached_len = self.root_pos + 1 + len(kept)


class DatapathFeatureTreeDrafter(DatapathTreeDrafter):
    """A feature head's greedy trees on the datapath (`FpgaFeatureDrafter`): `FeatureTreeDrafter`'s rule in
    integers. The root's catch-up reads the target's int8 features; each frontier node is fed at its tree slot
    with its parent's int8 prediction. Nothing a tree fed is kept after the verify (its nodes read predicted
    features): the next catch-up feeds the accepted path with the features the verify wrote."""

    def __init__(self, drafter: FpgaFeatureDrafter, spec: TreeSpec):
        super().__init__(drafter, spec)
        self.predicted: dict[int, torch.Tensor] = {}  # node index (-1: the root) -> its int8 f^ [H]

    def _root(self, context: list[int]) -> tuple[torch.Tensor, float]:
        d = self.drafter
        fed_from = min(d.true_len, len(context) - 1)
        logits, predicted = d._feed(context[fed_from:], fed_from, d._true_features(fed_from, len(context)))
        d.cached_len = d.true_len = len(context)
        self.root_pos, self.predicted = len(context) - 1, {-1: predicted[0]}
        return logits, d.modeled_block_s(1, fed_from, len(context) - fed_from)

    def _feed(self, tokens: list[int], parents: list[int], frontier: list[int]) -> torch.Tensor:
        ids, layout = self._layout(tokens, parents, frontier)
        features = torch.stack([self.predicted[parents[i]] for i in frontier])
        logits, predicted = self.model.step(ids, features, tree=layout)
        self.predicted.update(zip(frontier, predicted, strict=True))
        return logits

    def _level_block_s(self, rows: int) -> float:
        return self.drafter.modeled_block_s(1, self.root_pos + 1, rows, feature_tokens=0)  # f^ is on the board

    def accept(self, path: list[int]) -> None:
        self.drafter.rollback(self.root_pos + 1)
