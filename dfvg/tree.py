"""Token trees: the tree shape a user asks for, the tree a drafter proposes, and how a tree is accepted.

What this module owns: `TreeSpec` (`--tree 2,2,1` static branching per depth, or `dynamic:N`, a node budget
filled EAGLE-2 style by cumulative draft probability), `DraftTree`, the attention mask and positions a tree
is verified with, multi-candidate acceptance (`accept_tree`, a pure tensor function like
`dfvg.acceptance.accept`) and the KV compaction after it. What it does not own: running the models
(`dfvg.tree_step`).

Layout of one verify pass over a tree of N nodes after a committed sequence of length L (the target's cache
holds slots 0..L-2; the last committed token, the root, is fed now):

    row    token        position (RoPE)      cache slot   attends to
    0      seq[-1]      L-1                  L-1          slots <= L-1
    1+i    tokens[i]    L-1+depth[i]         L+i          slots <= L-1 and L+j for j ancestor-or-self of i

Nodes of one depth share a position but never a slot. After acceptance the accepted path's K/V move from
their tree slots to slots L.. (its positions), so the cache is exactly what a chain would have written.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dfvg.acceptance import residual_distribution
from dfvg.errors import UserError
from dfvg.gpu.kernels import tree_attention_mask
from dfvg.model import Transformer
from dfvg.sampling import sample_from

MAX_TREE_NODES = 256  # Sequoia's largest GPU trees are ~128 nodes; more is a typo, not a plan
DYNAMIC_WIDTH = 4  # dynamic trees: children scored per expanded node, and nodes expanded per depth


@dataclass(frozen=True)
class TreeSpec:
    """Static: `branching[d]` children for every node at depth d (1,1,1,1 is the k=4 chain).
    Dynamic: `budget` nodes kept of the candidates grown `depth` deep (depth = the run's draft length)."""

    branching: tuple[int, ...] = ()
    budget: int = 0

    @property
    def dynamic(self) -> bool:
        return self.budget > 0

    def depth(self, draft_length: int) -> int:
        """Deepest node: the static shape's depth, or the draft length for a dynamic tree."""
        return draft_length if self.dynamic else len(self.branching)

    def max_candidates(self, depth: int) -> int:
        """Upper bound on the nodes a drafter grows before pruning (its cache scratch slots)."""
        if self.dynamic:
            return DYNAMIC_WIDTH + max(depth - 1, 0) * DYNAMIC_WIDTH * DYNAMIC_WIDTH
        return static_nodes(self.branching)

    def label(self) -> str:
        return f"dynamic:{self.budget}" if self.dynamic else ",".join(map(str, self.branching))


def static_nodes(branching: tuple[int, ...]) -> int:
    """Nodes of a static tree: 2,2,1 -> 2 + 4 + 4 = 10."""
    total, width = 0, 1
    for b in branching:
        width *= b
        total += width
    return total


def parse_tree_spec(text: str) -> TreeSpec:
    """`2,2,1` or `dynamic:16` -> TreeSpec; anything else is a UserError naming what is allowed."""
    allowed = f"--tree must be branching factors >= 1 per depth (e.g. 2,2,1) or dynamic:N (N in [1, " \
              f"{MAX_TREE_NODES}]), got {text!r}"
    head, _, rest = text.strip().partition(":")
    try:
        if head == "dynamic":
            spec = TreeSpec(budget=int(rest))
            ok = 1 <= spec.budget <= MAX_TREE_NODES
        else:
            spec = TreeSpec(branching=tuple(int(part) for part in text.split(",")))
            ok = bool(spec.branching) and min(spec.branching) >= 1 and not rest
    except ValueError:
        raise UserError(allowed) from None
    if not ok:
        raise UserError(allowed)
    if not spec.dynamic and static_nodes(spec.branching) > MAX_TREE_NODES:
        raise UserError(f"--tree {text} has {static_nodes(spec.branching)} nodes; at most {MAX_TREE_NODES}")
    return spec


@dataclass
class DraftTree:
    """N proposed nodes, parents before children (parent -1 = the root, the last committed token).

    probs [N, V]: the draft distribution node i was drawn from, i.i.d. with its siblings (SpecInfer); None when
    the children are chosen deterministically (top-k), which acceptance treats as one-hot at the token."""

    tokens: list[int]
    parents: list[int]
    probs: Tensor | None
    elapsed_s: float = 0.0
    modeled_s: float | None = None  # modeled board time of growing it (the FPGA datapath's trees)

    def depths(self) -> list[int]:
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent < 0 else depths[parent] + 1)
        return depths


def fed_prefix(path: list[int], slots: list[int]) -> list[int]:
    """The draft cache slots of a path's leading nodes that the drafter fed (slot >= 0), up to the first it did
    not: what a tree drafter keeps after acceptance."""
    kept = []
    for node in path:
        if slots[node] < 0:
            break
        kept.append(slots[node])
    return kept


def best_nodes(scores: list, parents: list[int], budget: int) -> list[int]:
    """A dynamic tree's pruning: the `budget` best nodes by score (ties: the shallower, then the earlier), in
    creation order. The kept set is a tree because a node never scores above its parent."""
    depths = DraftTree([], parents, None).depths()
    return sorted(sorted(range(len(scores)), key=lambda i: (-scores[i], depths[i], i))[:budget])


def ancestor_mask(parents: list[int]) -> Tensor:
    """Bool [N+1, N+1] over (root, nodes): entry [a, b] iff b is a or an ancestor of a.

    Example: parents [-1, -1, 0] (root -> 0, 1; 0 -> 2): row of node 2 (index 3) is [1, 1, 0, 1]."""
    n = len(parents)
    mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    mask[:, 0] = True
    for i, parent in enumerate(parents):
        mask[i + 1] = mask[parent + 1]
        mask[i + 1, i + 1] = True
    return mask


def tree_inputs(root_pos: int, parents: list[int], cache_len: int,
                device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """Positions [1, N+1], cache slots [1, N+1] and attention mask [1, 1, N+1, cache_len] of the rows
    (root, nodes) laid out as in the module docstring, with the root at `root_pos` (= L-1)."""
    depths = DraftTree([], parents, None).depths()
    positions = torch.tensor([[root_pos] + [root_pos + d for d in depths]], device=device)
    slots = torch.arange(root_pos, root_pos + len(parents) + 1, device=device)[None]
    mask = tree_attention_mask(root_pos, ancestor_mask(parents).to(device), cache_len)  # [N+1, S]
    return positions, slots, mask[None, None]


def compact_cache(model: Transformer, sources: list[int], first_dest: int) -> None:
    """Move the K/V at cache slots `sources` (an accepted path, root side first) to first_dest, first_dest+1..

    Sources never lie below their destinations (a node at depth d sits at slot >= L+d-1), and the copy
    gathers before it scatters, so the moves cannot clobber each other."""
    if not sources:
        return
    device = model.tok_embeddings.weight.device
    src = torch.tensor(sources, device=device)
    move_slots(model, src, torch.arange(first_dest, first_dest + len(sources), device=device))


def move_slots(model: Transformer, src: Tensor, dest: Tensor, rows: slice = slice(None)) -> None:
    """K/V of every layer at cache slots src -> slots dest, for the given batch rows (all by default): one
    gather and one scatter over the model's `kv_store`; the gather reads before the scatter writes, so
    overlapping moves are safe. No host sync: the captured tree step (`dfvg.gpu.tree_device.compact`) calls it
    with slots computed on the device."""
    store = model.kv_store[:, :, rows]  # [layers, 2, B, S, kv_heads, hd]
    store.index_copy_(3, dest, store.index_select(3, src))


def accept_tree(tokens: list[int], parents: list[int], draft_probs: Tensor | None, target_probs: Tensor,
                uniforms: Tensor) -> tuple[list[int], int]:
    """Multi-candidate rejection sampling down the tree (SpecInfer): the accepted path and the next token.

    target_probs [N+1, V]: row 0 follows the root, row 1+i follows node i. uniforms [N+1]: uniforms[i]
    decides node i, uniforms[N] draws the final token. At a node, children are tried in order: child c is
    accepted with probability min(1, p(c) / q(c)); on rejection p <- normalise(max(0, p - q)) and the next
    sibling is tried; when all are rejected (or the node is a leaf) the next token is drawn from p. With
    greedy (one-hot) p this follows the target's argmax through the tree.

    Example (greedy): tokens [5, 6, 7], parents [-1, -1, 1], argmaxes after (root, 5, 6, 7) = [6, 9, 7, 3]
    -> node 0 (5) rejected, node 1 (6) accepted, node 2 (7) accepted, a leaf: ([1, 2], 3).
    """
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(parents):
        children.setdefault(parent, []).append(i)
    path, node, p = [], -1, target_probs[0].float()
    while True:
        for child in children.get(node, []):
            q = None if draft_probs is None else draft_probs[child].to(p.device)
            q_token = 1.0 if q is None else float(q[tokens[child]])
            if float(uniforms[child]) < float(p[tokens[child]]) / q_token:
                break
            p = residual_distribution(p, q, tokens[child])
        else:
            return path, int(sample_from(p, uniforms[len(tokens)]))
        path.append(child)
        node, p = child, target_probs[1 + child].float()
