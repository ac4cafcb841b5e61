"""Greedy token-tree speculation as one CUDA-graph replay: draft a tree, verify it, accept a path, compact.

Why: the eager tree step (`dfvg.tree_step.TreeStep`) launches every draft forward, the target's tree pass
and the acceptance from Python, so on a GPU its steps cost several decode steps. Here the whole step is
captured once per tree shape and replayed; the host copies back 2 + D + K integers.

A feature head (`GraphFeatureDrafter`) grows its trees in the same replay through a `FeatureFeeder`: its
catch-up rows read the target's features of the positions before them, each node its parent's predicted
feature; the verify then writes the root's and the accepted path's features at their positions.

One replay (tree depth D, K nodes verified; every shape static, so the graph is fixed):
1. Draft catch-up: the draft refeeds the last D + 1 committed tokens at their positions. A step commits at
   most D + 1 tokens, so this rewrites every draft cache slot the previous tree left stale, and gives the
   root's logits.
2. Per depth: the top-c children of every frontier node, scored by cumulative draft probability as
   `dfvg.tree_step.TreeDrafter` scores them. The frontier (every node of a static tree's depth; the
   `DYNAMIC_WIDTH` best of a dynamic tree's) is fed at its own cache slots with tree attention (`TreeRows`).
3. The verified tree: every candidate of a static tree; the `budget` best of a dynamic one. The sort is
   stable over nodes in creation order, so a tie keeps the shallower node and the kept set holds every
   kept node's ancestors.
4. The target scores the root and the K nodes in one pass. Each node row attends over the committed slots
   and its ancestors *at their sequence positions* (`decode_attention._source_slots`), so on the fused
   kernels a node's row is computed bit for bit as plain decoding computes the same token: greedy output
   equals plain decoding on the GPU, as the chain's does.
5. Greedy acceptance down the tree on the device; the accepted path's K/V move to the sequential slots
   after the root; the committed history and the root position advance.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from dfvg.drafter import DraftBlock
from dfvg.generate import Outcome
from dfvg.gpu.graph_drafter import GraphDrafter
from dfvg.gpu.graph_head import GraphFeatureDrafter, head_rows
from dfvg.gpu.graphs import GraphModel, GraphVerifier
from dfvg.gpu.tree_rows import TreeRows
from dfvg.tree import DYNAMIC_WIDTH, TreeSpec, move_slots


@dataclass(frozen=True)
class TreeShape:
    """The static shape of a device tree: children per frontier node and frontier size at each depth."""

    children: tuple[int, ...]  # children of every frontier node, per level (level l makes depth l + 1)
    frontier: tuple[int, ...]  # nodes expanded per level (level 0: the root alone)
    keep: int  # nodes verified
    dynamic: bool

    @property
    def depth(self) -> int:
        return len(self.children)

    def made(self, level: int) -> int:
        return self.frontier[level] * self.children[level]

    def offset(self, level: int) -> int:
        return sum(self.made(i) for i in range(level))

    @property
    def candidates(self) -> int:
        return self.offset(self.depth)


def tree_shape(spec: TreeSpec, draft_length: int) -> TreeShape:
    """The device shape of `spec` at this draft length (a dynamic tree is `draft_length` deep)."""
    depth = spec.depth(draft_length)
    if spec.dynamic:
        children = (DYNAMIC_WIDTH,) * depth
        shape = TreeShape(children, (1,) + (DYNAMIC_WIDTH,) * (depth - 1), 0, True)
        return TreeShape(children, shape.frontier, min(spec.budget, shape.candidates), True)
    frontier = [1]
    for b in spec.branching[:-1]:
        frontier.append(frontier[-1] * b)
    shape = TreeShape(tuple(spec.branching), tuple(frontier), 0, False)
    return TreeShape(shape.children, shape.frontier, shape.candidates, False)


def tree_room(spec: TreeSpec, draft_length: int) -> int:
    """Slots to add to `max_seq_len(prompt, new, draft_length)` so that a device tree step's caches fit: its
    candidates, the root's, and its depth (the loop sizes a tree's generation by depth, not draft length)."""
    shape = tree_shape(spec, draft_length)
    return shape.candidates + 1 + shape.depth


class TreeBuffers:
    """The step's static device tensors: committed history and root (state), candidates, the record, and the
    step's constants (index ranges and the root's frontier made once: a replay launches no arange for them).

    Candidate i sits in cache slot `root + 1 + i` and the root is candidate -1, so `root + 1 + c` is the slot
    of any candidate or of the root: one add per slot tensor, no select."""

    def __init__(self, shape: TreeShape, device: torch.device):
        d, m, long = shape.depth, shape.candidates, torch.long
        self.history = torch.zeros(d + 1, dtype=long, device=device)  # last D + 1 committed tokens, root last
        self.root = torch.zeros(1, dtype=long, device=device)  # position of the root (last committed token)
        self.tokens = torch.zeros(m, dtype=long, device=device)
        self.parents = torch.zeros(m, dtype=long, device=device)  # candidate index, -1: the root
        self.scores = torch.zeros(m, dtype=torch.float32, device=device)
        self.ancestors = torch.zeros(m, max(d, 1), dtype=long, device=device)  # candidate index per depth, -1 pad
        self.depths = torch.tensor([lvl + 1 for lvl in range(d) for _ in range(shape.made(lvl))], device=device)
        self.record = torch.zeros(2 + d + shape.keep, dtype=long, device=device)  # n, next, path, tree tokens
        # a feature head's f^ (`FeatureFeeder`): row 0 the root's, row 1 + i candidate i's, so a node's parent's
        # row is its parent index + 1, the root's included
        self.predicted_rows: Tensor | None = None
        # constants
        self.candidate_ids = torch.arange(m, device=device)  # the nodes a level makes: a slice of it
        self.steps = torch.arange(d + 1, device=device)
        self.catch_up = self.steps - d  # the draft refeeds positions root - D .. root
        self.kept_rows = torch.arange(shape.keep + 1, device=device)  # kept node i verifies in row i + 1
        self.level_pos = torch.arange(d, device=device)[:, None].expand(d, max(shape.frontier)).contiguous()
        self.root_frontier = torch.full((1,), -1, dtype=long, device=device)
        self.root_scores = torch.ones(1, device=device)
        self.root_ancestors = torch.full((1, max(d, 1)), -1, dtype=long, device=device)
        self.root_match = torch.ones(1, dtype=torch.bool, device=device)  # acceptance's entry for the -1 pad
        self.renumbered = torch.zeros(m + 1, dtype=long, device=device)  # 1 + candidate -> kept index, or -1


class TokenFeeder:
    """How a standalone draft reads the tree's rows: token ids (its catch-up and every level)."""

    def __init__(self, draft: GraphModel):
        self.draft = draft

    def catch_up(self, buf: TreeBuffers, pos: Tensor) -> Tensor:
        return self.draft.forward(buf.history[None], pos, last_only=True)

    def feed(self, buf: TreeBuffers, frontier: Tensor, pos: Tensor, rows: TreeRows) -> Tensor:
        return self.draft.forward(buf.tokens[frontier][None], pos, tree=rows)


class FeatureFeeder:
    """How a feature head (`GraphFeatureDrafter`) reads them: its catch-up rows with the target's features of
    the positions before them (`target.features`, written by every verify), each tree node with its parent's
    predicted f^ (the root's from the catch-up), as `dfvg.tree_step.FeatureTreeDrafter` grows a tree."""

    def __init__(self, drafter: GraphFeatureDrafter, target: GraphModel):
        self.head, self.gm, self.target = drafter.head, drafter.gm, target

    def catch_up(self, buf: TreeBuffers, pos: Tensor) -> Tensor:
        logits, predicted = head_rows(self.head, self.gm, buf.history, self.target.features[pos - 1], pos)
        buf.predicted_rows[:1].copy_(predicted)
        return logits

    def feed(self, buf: TreeBuffers, frontier: Tensor, pos: Tensor, rows: TreeRows) -> Tensor:
        features = buf.predicted_rows[buf.parents[frontier] + 1]
        logits, predicted = head_rows(self.head, self.gm, buf.tokens[frontier], features, pos, rows, False)
        buf.predicted_rows[frontier + 1] = predicted.to(buf.predicted_rows.dtype)
        return logits


def grow(feeder: TokenFeeder | FeatureFeeder, shape: TreeShape, buf: TreeBuffers, vocab: int) -> Tensor:
    """Steps 1-2 of the module docstring: fill the candidate buffers from the draft. Returns root + 1, the slot
    of candidate 0 (`TreeBuffers`), for `verify`."""
    d, root = shape.depth, buf.root
    first = root + 1
    logits = feeder.catch_up(buf, root + buf.catch_up)
    frontier, scores, ancestors = buf.root_frontier, buf.root_scores, buf.root_ancestors
    for level, count in enumerate(shape.children):
        probs, tokens = torch.softmax(logits[:, :vocab].float(), -1).topk(count, dim=-1)  # [F, c]
        base, made, width = shape.offset(level), shape.made(level), shape.frontier[level]
        new = buf.candidate_ids[base : base + made]
        grown = buf.ancestors[base : base + made]  # each new node: its parent's ancestors, then itself
        buf.tokens[base : base + made].view(width, count).copy_(tokens)
        torch.mul(scores[:, None], probs, out=buf.scores[base : base + made].view(width, count))
        buf.parents[base : base + made].view(width, count).copy_(frontier[:, None].expand(width, count))
        grown.view(width, count, -1).copy_(ancestors[:, None].expand(width, count, ancestors.shape[1]))
        grown[:, level] = new
        if level + 1 == d:
            break
        if shape.dynamic:
            frontier = base + buf.scores[base : base + made].topk(shape.frontier[level + 1]).indices
            scores, ancestors = buf.scores[frontier], buf.ancestors[frontier]
        else:  # every new node grows: the frontier is the level's range
            frontier, scores, ancestors = new, buf.scores[base : base + made], grown
        rows = TreeRows(first + frontier, root, first + ancestors)
        pos = first + buf.level_pos[level, : frontier.shape[0]]  # contiguous: the kernels index it by row
        logits = feeder.feed(buf, frontier, pos, rows)
    return first


def verify(target: GraphModel, shape: TreeShape, buf: TreeBuffers, vocab: int, first: Tensor) -> None:
    """Steps 3-5: keep the tree, verify it in one target pass, accept greedily, compact, advance."""
    d, k, root = shape.depth, shape.keep, buf.root
    tokens, depths, parents, ancestors = buf.tokens, buf.depths, buf.parents, buf.ancestors
    if shape.dynamic:  # the `keep` best, parents and ancestors renumbered to kept indices (-1 stays -1)
        kept = torch.sort(buf.scores, descending=True, stable=True).indices[:k].sort().values
        buf.renumbered.fill_(-1)
        buf.renumbered[kept + 1] = buf.kept_rows[:k]
        tokens, depths = tokens[kept], depths[kept]
        parents, ancestors = buf.renumbered[parents[kept] + 1], buf.renumbered[ancestors[kept] + 1]
    rows = TreeRows(root + buf.kept_rows, root, torch.cat([root.expand(1, ancestors.shape[1]), first + ancestors]))
    ids = torch.cat([buf.history[-1:], tokens])[None]
    # `forward(tree=rows)`'s arithmetic, keeping the rows for a feature head's features (written below)
    logits, hidden = target.forward_inputs(target.model.embed(ids)[0], torch.cat([root, root + depths]), rows,
                                           last_only=False)
    best = logits[:, :vocab].argmax(-1)  # [K+1]
    n, path = accept(tokens, parents, ancestors, depths, best, buf)
    path_rows = torch.cat([buf.kept_rows[:1], path + 1])  # [D + 1]: the root's verify row, then the path's
    if target.writing:  # root, then the path (rows past n: positions the next verify rewrites)
        target.features.index_copy_(0, root + buf.steps, target.model.norm(hidden[path_rows]))
    # gathers, not tensor[0-dim tensor]: that indexing reads the index on the host, which a graph cannot
    next_token = best.gather(0, path_rows.gather(0, n[None]))  # [1]: the target's token after the deepest row
    compact(target, first, path, n, buf.steps[:d])
    committed = torch.where(buf.steps < n, torch.cat([tokens[path], next_token]), next_token)
    advance = n + 1
    buf.history.copy_(torch.cat([buf.history, committed])[advance + buf.steps])
    buf.root.add_(advance)
    buf.record.copy_(torch.cat([n[None], next_token, path, tokens]))


def accept(tokens: Tensor, parents: Tensor, ancestors: Tensor, depths: Tensor, best: Tensor,
           buf: TreeBuffers) -> tuple[Tensor, Tensor]:
    """Greedy tree acceptance on the device: a node is accepted when its token is the target's argmax after
    its parent and the same holds for every ancestor (siblings are distinct, so the accepted nodes form one
    path). ancestors [K, D]: each node's ancestors by depth, itself at its own, -1 past it.
    Returns (n, path [D]: the accepted node at depth j + 1, for j < n)."""
    depth = ancestors.shape[1]
    match = torch.cat([buf.root_match, tokens == best[parents + 1]])  # entry 0 answers the -1 pad
    accepted = match[ancestors + 1].all(-1)
    path = torch.zeros(depth + 1, dtype=torch.long, device=tokens.device)
    path.scatter_(0, torch.where(accepted, depths - 1, depth), buf.kept_rows[: tokens.shape[0]])
    return accepted.sum(), path[:depth]


def compact(target: GraphModel, first: Tensor, path: Tensor, n: Tensor, steps: Tensor) -> None:
    """Move the accepted nodes' K/V from their tree slots to root + 1.. (their positions); the rest move onto
    themselves (`dfvg.tree.move_slots` on the one sequence's cache row). steps: 0..D-1."""
    move_slots(target.model, first + torch.where(steps < n, path, steps), first + steps, slice(0, 1))


def tree_body(target: GraphModel, feeder: TokenFeeder | FeatureFeeder, shape: TreeShape, buf: TreeBuffers,
              vocab: int) -> Tensor:
    verify(target, shape, buf, vocab, grow(feeder, shape, buf, vocab))
    return buf.record


class DeviceTreeStep:
    """The engine's `Step` for greedy trees on a graph verifier and graph drafter: one replay per step."""

    def __init__(self, verifier: GraphVerifier, drafter: GraphDrafter | GraphFeatureDrafter, spec: TreeSpec,
                 draft_length: int):
        self.verifier, self.drafter, self.device = verifier, drafter, verifier.device
        self.shape = tree_shape(spec, draft_length)
        self.depth = self.shape.depth
        self.graph = None
        self._cache_ids: tuple = ()

    def _cache_key(self) -> tuple:
        return (self.verifier.gm._cache_id, self.drafter.gm._cache_id)

    def prefill(self, prompt_ids: list[int], max_seq_len: int) -> None:
        """Caches with room for the candidates past the sequence; the graph (captured on first use, its
        warm-up writing the start of the caches); then both prompts and the step's state."""
        room = max_seq_len + self.shape.candidates + 1  # the loop's max_seq_len already counts the depth
        for holder in (self.verifier, self.drafter):
            holder.gm.ensure_cache(max(room, holder.min_cache_len))
        if self.graph is None or self._cache_ids != self._cache_key():
            self._capture()
        self.verifier.prefill(prompt_ids, room)
        self.drafter.prefill(prompt_ids, room)
        self.buf.history.copy_(torch.tensor(prompt_ids[-(self.depth + 1):]))
        self.buf.root.fill_(len(prompt_ids) - 1)

    def _capture(self) -> None:
        self.buf = TreeBuffers(self.shape, self.device)
        feeder: TokenFeeder | FeatureFeeder = TokenFeeder(self.drafter.gm)
        if isinstance(self.drafter, GraphFeatureDrafter):
            feeder = FeatureFeeder(self.drafter, self.verifier.gm)
            head = self.drafter.head  # f^ kept in the head's dtype, as the eager tree keeps it
            self.buf.predicted_rows = torch.zeros(self.shape.candidates + 1, head.target_hidden_size,
                                                  dtype=head.fuse.weight.dtype, device=self.device)

        def reset() -> None:
            self.buf.root.fill_(self.depth + 1)  # a head's catch-up reads the features of root - depth - 1

        body = lambda: tree_body(self.verifier.gm, feeder, self.shape, self.buf,  # noqa: E731
                                 self.verifier.vocab_size)
        self.graph, _ = self.verifier.gm.capture(("tree", self.shape, id(self.drafter)), body, before=reset)
        self._cache_ids = self._cache_key()

    def __call__(self, seq: list[int], k: int) -> Outcome:
        start = time.perf_counter()
        self.graph.replay()
        n, next_token, *rest = self.buf.record.tolist()  # the step's one device-to-host copy
        self.verifier.features_end = len(seq) + self.depth  # with a head: the rows the verify wrote
        path, tokens = rest[: min(n, self.depth)], rest[self.depth :]
        order = path + [i for i in range(len(tokens)) if i not in set(path)]
        return Outcome(DraftBlock([tokens[i] for i in order], None, 0.0), n, next_token,
                       time.perf_counter() - start)


def fits_device_tree(verifier: object, drafter: object, spec: TreeSpec, greedy: bool, prompt_len: int,
                     draft_length: int) -> bool:
    """Whether a tree can run as `DeviceTreeStep`: greedy, graph models (a standalone draft or a feature head),
    and a prompt of at least `device_tree_prompt_len` tokens. Any tree size: more rows than one fused launch
    takes run in chunks."""
    head = isinstance(drafter, GraphFeatureDrafter)
    graphs = isinstance(verifier, GraphVerifier) and (isinstance(drafter, GraphDrafter) or head)
    depth = tree_shape(spec, draft_length).depth
    return greedy and graphs and depth >= 1 and prompt_len >= device_tree_prompt_len(drafter, spec, draft_length)


def device_tree_prompt_len(drafter: object, spec: TreeSpec, draft_length: int) -> int:
    """The shortest prompt `DeviceTreeStep` takes: longer than the tree is deep (the draft catch-up refeeds
    D + 1 tokens), one more for a head (its catch-up also reads the feature before its first row)."""
    depth = tree_shape(spec, draft_length).depth
    return depth + 2 if isinstance(drafter, GraphFeatureDrafter) else depth + 1
