"""Token-tree speculation under the engine's one loop: draft a tree, verify it in one pass, keep a path.

`TreeStep` implements `dfvg.generate.Step`, so `decode` runs it unchanged: propose (the torch draft grows a
tree, one draft forward per depth) -> verify (every node in one eager target pass with the tree mask of
`dfvg.tree`) -> accept (`accept_tree`: greedy follows the target's argmax, sampling is SpecInfer's
multi-candidate rule) -> commit (both caches compact the accepted path to its sequential slots).

Its `Outcome.block` lists the accepted path first and the other nodes after it, so `num_accepted` counts
the path and `StepRecord.num_drafted` is the tree size (acceptance rate = path nodes / tree nodes).

What it does not own: the tree's shape rules and acceptance (`dfvg.tree`), greedy trees on CUDA-graph
models (`dfvg.gpu.tree_device.DeviceTreeStep`, one captured step; the engine picks it), and the FPGA
datapath's tree drafter (`dfvg.fpga.datapath.tree_drafter`, greedy trees with an exact integer top-k).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from dfvg.block_draft import BlockDrafter
from dfvg.devices import synchronize
from dfvg.drafter import DraftBlock, Drafter, TorchDrafter, fit_vocab
from dfvg.errors import UserError
from dfvg.feature_head import FeatureDrafter
from dfvg.fpga.datapath.drafter import FpgaDrafter
from dfvg.fpga.datapath.feature_drafter import FpgaFeatureDrafter
from dfvg.fpga.datapath.tree_drafter import DatapathFeatureTreeDrafter, DatapathTreeDrafter
from dfvg.generate import Outcome
from dfvg.gpu.graph_drafter import GraphDrafter
from dfvg.gpu.graphs import GraphVerifier
from dfvg.sampling import SamplingParams, processed_probs, sample_from
from dfvg.tree import (
    DYNAMIC_WIDTH,
    DraftTree,
    TreeSpec,
    accept_tree,
    best_nodes,
    compact_cache,
    fed_prefix,
    tree_inputs,
)
from dfvg.verifier import TorchVerifier, Verifier


@dataclass
class Candidates:
    """The tree as the drafter grows it: nodes in creation order (parents first), their cumulative draft
    probability (the dynamic tree's ranking) and the draft's K/V slot of each node it fed (-1: not fed)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    probs: list[Tensor] = field(default_factory=list)
    fed: set[int] = field(default_factory=set)

    def add(self, token: int, parent: int, score: float, probs: Tensor | None) -> None:
        self.tokens.append(token)
        self.parents.append(parent)
        self.scores.append(score)
        if probs is not None:
            self.probs.append(probs)


def choose_children(logits: Tensor, count: int, sampling: SamplingParams, iid: bool,
                    rng: torch.Generator) -> tuple[list[int], Tensor, Tensor | None]:
    """`count` children of one node from its draft logits [V]: (tokens, draft probs [V], q or None).

    iid (static trees when sampling): drawn independently from q, as SpecInfer's rule needs; q is returned.
    Otherwise the `count` most likely tokens (lowest index first on ties), q = None (one-hot at each)."""
    probs = processed_probs(logits, sampling) if not sampling.greedy else torch.softmax(logits.float(), -1)
    if iid:
        uniforms = torch.rand(count, generator=rng)
        return [int(sample_from(probs, u)) for u in uniforms], probs, probs
    order = torch.sort(logits.float(), descending=True, stable=True).indices[:count]
    return order.tolist(), probs, None


class TreeDrafter:
    """A `TorchDrafter` that proposes trees; keeps the drafter's cache contract (`cached_len`, catch-up)."""

    def __init__(self, drafter: TorchDrafter, spec: TreeSpec):
        self.drafter, self.spec = drafter, spec
        self.model, self.device = drafter.model, drafter.device
        self.slots: list[int] = []  # the draft cache slot of each proposed node, -1 where never fed
        self.root_pos = 0

    @torch.inference_mode()
    def propose(self, context: list[int], depth: int, sampling: SamplingParams, rng: torch.Generator) -> DraftTree:
        start = time.perf_counter()
        self.root_pos = len(context) - 1
        logits = self._root(context)  # [1, V] after the root
        grown, frontier = Candidates(), [-1]
        for level in range(depth):
            added = self._expand(grown, frontier, logits, level, sampling, rng)
            frontier = added if not self.spec.dynamic else \
                sorted(added, key=lambda i: -grown.scores[i])[:DYNAMIC_WIDTH]
            if level + 1 < depth and frontier:
                logits = self._feed(grown, frontier)
                grown.fed.update(frontier)
        tree = self._prune(grown)
        synchronize(self.device)
        tree.elapsed_s = time.perf_counter() - start
        return tree

    def _root(self, context: list[int]) -> Tensor:
        """Catch the draft up on the committed tokens it has not fed (as the chain drafter does); the logits
        [1, V] after the root (the last committed token)."""
        d = self.drafter
        fed_from = min(d.cached_len, len(context) - 1)
        logits = d._next_logits(context[fed_from:], fed_from)[None]
        d.cached_len = len(context)
        return logits

    def _expand(self, grown: Candidates, frontier: list[int], logits: Tensor, level: int,
                sampling: SamplingParams, rng: torch.Generator) -> list[int]:
        """Add the children of every frontier node (logits [F, V]); returns their indices."""
        count = DYNAMIC_WIDTH if self.spec.dynamic else self.spec.branching[level]
        iid = not sampling.greedy and not self.spec.dynamic
        added = []
        for parent, row in zip(frontier, fit_vocab(logits, self.drafter.vocab_size), strict=True):
            tokens, probs, q = choose_children(row, count, sampling, iid, rng)
            base = grown.scores[parent] if parent >= 0 else 1.0
            for token in tokens:
                added.append(len(grown.tokens))
                grown.add(token, parent, base * float(probs[token]), q)
        return added

    def _feed(self, grown: Candidates, frontier: list[int]) -> Tensor:
        """Feed the frontier nodes at their tree slots with the tree mask; their logits [F, V]."""
        n = len(grown.tokens)
        positions, slots, mask = tree_inputs(self.root_pos, grown.parents, self.model.max_seq_len, self.device)
        rows = torch.tensor([1 + i for i in frontier], device=self.device)
        ids = torch.tensor([[grown.tokens[i] for i in frontier]], device=self.device)
        assert self.root_pos + n < self.model.max_seq_len, "draft cache too small for the tree"
        return self.model(ids, positions[:, rows], slots=slots[:, rows], mask=mask[:, :, rows])[0]

    def _prune(self, grown: Candidates) -> DraftTree:
        """Static: every node. Dynamic: the `budget` best by cumulative probability (an ancestor never
        scores below its descendant, and ties keep the shallower node, so the kept set is a tree)."""
        keep = list(range(len(grown.tokens)))
        if self.spec.dynamic:
            keep = best_nodes(grown.scores, grown.parents, self.spec.budget)
        index = {old: new for new, old in enumerate(keep)}
        self.slots = [self.root_pos + 1 + old if old in grown.fed else -1 for old in keep]
        probs = torch.stack([grown.probs[i] for i in keep]) if grown.probs and keep else None
        return DraftTree([grown.tokens[i] for i in keep], [index.get(grown.parents[i], -1) for i in keep], probs)

    def accept(self, path: list[int]) -> None:
        """Compact the path's leading fed nodes to slots root_pos+1..; everything else is void (the next
        `propose` feeds the rest of the committed tokens, as the chain drafter catches up)."""
        kept = fed_prefix(path, self.slots)
        compact_cache(self.model, kept, self.root_pos + 1)
        self.drafter.cached_len = self.root_pos + 1 + len(kept)


class FeatureTreeDrafter(TreeDrafter):
    """The trees of a feature head (dfvg.feature_head), grown as EAGLE-2 grows them on `TreeDrafter`'s shapes.

    The root: the committed positions not yet fed with the target's features are fed with them (the chain
    drafter's catch-up), giving the logits after the root and the root's predicted feature f^. Each level:
    every frontier node is fed at its tree slot with its token and its parent's f^ (the target never saw a
    drafted node), attending to the committed positions and its ancestors. A node's first child is the
    head's argmax, so the first-child path is the chain `FeatureDrafter.propose` drafts.
    Nothing a tree fed is kept after the verify: its nodes read predicted features, and only positions fed
    with the target's own features stay (`FeatureDrafter.rollback`); the next catch-up feeds the accepted
    path again with the features the verify wrote (`verify_tree`). Greedy trees on CUDA-graph models grow the
    same way inside one replay (`dfvg.gpu.tree_device.FeatureFeeder`)."""

    def __init__(self, drafter: FeatureDrafter, spec: TreeSpec):
        self.drafter, self.spec = drafter, spec
        self.model, self.device = drafter.head.body, drafter.device
        self.slots: list[int] = []
        self.root_pos = 0
        self.predicted: dict[int, Tensor] = {}  # node index (-1: the root) -> its f^ [H]

    def _root(self, context: list[int]) -> Tensor:
        d = self.drafter
        fed_from = min(d.true_len, len(context) - 1)
        logits, root_feature = d._feed(context[fed_from:], fed_from, d._true_features(fed_from, len(context)))
        d.cached_len = d.true_len = len(context)
        self.predicted = {-1: root_feature}
        return logits[None]

    def _feed(self, grown: Candidates, frontier: list[int]) -> Tensor:
        """Feed the frontier nodes at their tree slots with their parents' f^; their logits [F, V]."""
        assert self.root_pos + len(grown.tokens) < self.model.max_seq_len, "draft cache too small for the tree"
        positions, slots, mask = tree_inputs(self.root_pos, grown.parents, self.model.max_seq_len, self.device)
        rows = torch.tensor([1 + i for i in frontier], device=self.device)
        ids = torch.tensor([[grown.tokens[i] for i in frontier]], device=self.device)
        features = torch.stack([self.predicted[grown.parents[i]] for i in frontier])[None]
        logits, predicted = self.drafter.head(ids, positions[:, rows], features, slots[:, rows], mask[:, :, rows])
        self.predicted.update(zip(frontier, predicted[0], strict=True))
        return fit_vocab(logits[0], self.drafter.vocab_size)

    def accept(self, path: list[int]) -> None:
        self.drafter.rollback(self.root_pos + 1)


def verify_tree(verifier: TorchVerifier, seq: list[int], tree: DraftTree, sampling: SamplingParams,
                rng: torch.Generator) -> tuple[list[int], int]:
    """Score the root and every node in one target pass, accept a path, compact the target's cache."""
    model, device = verifier.model, verifier.device
    root_pos = len(seq) - 1
    positions, slots, mask = tree_inputs(root_pos, tree.parents, model.max_seq_len, device)
    ids = torch.tensor([[seq[-1], *tree.tokens]], device=device)
    with torch.inference_mode():
        hidden = model.run_layers(model.embed(ids), positions, slots, mask)[0]  # [N+1, D]
        target_probs = processed_probs(model.logits(hidden), sampling)
        uniforms = torch.rand(len(tree.tokens) + 1, generator=rng)
        path, next_token = accept_tree(tree.tokens, tree.parents, tree.probs, target_probs, uniforms)
        compact_cache(model, [root_pos + 1 + i for i in path], root_pos + 1)
        if verifier.keep_features:  # a feature head reads the root's and the path's at their new positions
            verifier.store_features(hidden[torch.tensor([0] + [1 + i for i in path], device=device)], root_pos)
    synchronize(device)
    return path, next_token


class TreeStep:
    """`Step` of token-tree speculation: the torch draft proposes a tree, the eager target verifies it."""

    def __init__(self, verifier: TorchVerifier, tree_drafter: TreeDrafter | DatapathTreeDrafter, spec: TreeSpec,
                 sampling: SamplingParams, rng: torch.Generator, draft_length: int):
        self.verifier, self.spec, self.sampling, self.rng = verifier, spec, sampling, rng
        self.tree_drafter = tree_drafter
        self.depth = spec.depth(draft_length)
        self.device = verifier.device

    def prefill(self, prompt_ids: list[int], max_seq_len: int) -> None:
        scratch = self.spec.max_candidates(self.depth) + 1  # tree slots past the committed positions
        self.verifier.prefill(prompt_ids, max_seq_len + scratch)
        self.tree_drafter.drafter.prefill(prompt_ids, max_seq_len + scratch)

    def __call__(self, seq: list[int], k: int) -> Outcome:
        depth = min(k, self.depth)
        tree = self.tree_drafter.propose(seq, depth, self.sampling, self.rng) if depth else DraftTree([], [], None)
        verify_start = time.perf_counter()
        path, next_token = verify_tree(self.verifier, seq, tree, self.sampling, self.rng)
        verify_s = time.perf_counter() - verify_start
        if depth:
            self.tree_drafter.accept(path)
        order = path + [i for i in range(len(tree.tokens)) if i not in set(path)]
        block = DraftBlock([tree.tokens[i] for i in order], None, tree.elapsed_s, tree.modeled_s)
        return Outcome(block, len(path), next_token, verify_s)


def tree_step(verifier: Verifier, drafter: Drafter, spec: TreeSpec, sampling: SamplingParams, seed: int,
              draft_length: int) -> TreeStep:
    """The eager tree step for this pair, or a UserError saying which part cannot run trees yet.

    Graph models that the device tree step cannot take (sampling) run their trees on the eager forward of the
    same model and cache, so a run's other variants keep their graphs. (A greedy prompt too short for the
    device tree is decoded plainly until it fits: `Engine._plain_lead_then_tree`.)"""
    if isinstance(verifier, GraphVerifier):
        verifier = TorchVerifier(verifier.model)
    if isinstance(drafter, GraphDrafter):
        drafter = drafter.eager
    if type(verifier) is not TorchVerifier:
        raise UserError("a token tree verifies on one process's eager target; tensor parallelism has no tree yet")
    rng = torch.Generator().manual_seed(seed)
    if isinstance(drafter, FeatureDrafter):  # the head reads the features this eager verifier writes
        head = FeatureDrafter(drafter.head, verifier, drafter.vocab_size)
        return TreeStep(verifier, FeatureTreeDrafter(head, spec), spec, sampling, rng, draft_length)
    if isinstance(drafter, FpgaFeatureDrafter):  # the head reads the features this eager verifier writes
        tree = DatapathFeatureTreeDrafter(drafter.reading(verifier), check_fpga_tree(drafter, spec, sampling))
        return TreeStep(verifier, tree, spec, sampling, rng, draft_length)
    if isinstance(drafter, FpgaDrafter):
        return TreeStep(verifier, DatapathTreeDrafter(drafter, check_fpga_tree(drafter, spec, sampling)), spec,
                        sampling, rng, draft_length)
    if type(drafter) not in (TorchDrafter, BlockDrafter):  # a block drafter's tree grows on its chain rows
        raise UserError("--tree needs a torch draft (--draft-device cpu/cuda) or the emulated FPGA datapath")
    return TreeStep(verifier, TreeDrafter(drafter, spec), spec, sampling, rng, draft_length)


def check_fpga_tree(drafter: FpgaDrafter | FpgaFeatureDrafter, spec: TreeSpec, sampling: SamplingParams) -> TreeSpec:
    """The spec, or a UserError naming what the FPGA datapath's trees cannot do (`DatapathTreeDrafter`)."""
    if not sampling.greedy:
        raise UserError("--tree on --draft-device fpga is greedy only (a sampled tree needs the draft's "
                        "distribution); drop --temperature or the tree")
    if drafter.engine is not None:
        raise UserError("--tree on --draft-device fpga runs on the emulated datapath (--fpga-mode emulate); the "
                        "board kernel drafts chains")
    return spec
