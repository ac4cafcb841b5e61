"""Drafts under CUDA graphs: `GraphDrafter` (a standalone draft model, the `Drafter` protocol) and its k-step
draft graph, and `GraphBlockDrafter` (a block drafter, dfvg.block_draft) and its one-pass graph. A feature head's
are in `dfvg.gpu.graph_head`.

Why a graph of all k steps: a greedy block of k draft tokens is k tiny forward passes whose launches,
from Python, cost more than their arithmetic; one replay of a graph that feeds each argmax back on the
device costs one launch and one device-to-host copy. `draft_body` is also the draft half of the fused
device step (`dfvg.gpu.fast`). Built on `dfvg.gpu.graphs.GraphModel`.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from dfvg.block_draft import BlockDrafter
from dfvg.drafter import DraftBlock, TorchDrafter
from dfvg.gpu.graphs import SCRATCH, GraphModel
from dfvg.model import Transformer
from dfvg.sampling import SamplingParams


class GraphDrafter:
    """Draft model on CUDA: greedy drafting replays one graph of all k steps; sampling runs eagerly."""

    def __init__(self, model: Transformer, target_vocab_size: int | None = None, compile_blocks: bool = True,
                 cache_len: int = 1024, fused_layers: bool = True):
        self.gm = GraphModel(model, compile_blocks, fused_layers)
        self.model = model
        self.device = self.gm.device
        self.vocab_size = target_vocab_size or model.config.vocab_size
        self.eager = TorchDrafter(model, self.vocab_size)  # sampling path and catch-up of long gaps
        self.min_cache_len = cache_len
        self.cached_len = 0
        self.confidence_wanted = False  # blocks carry top probabilities (`ConfidenceProbe`: hooks see no replay)

    def prefill(self, prompt_ids: list[int], max_seq_len: int) -> None:
        self.gm.ensure_cache(max(max_seq_len, self.min_cache_len))
        self.cached_len = 0
        if len(prompt_ids) > 1:
            self.gm.prefill(prompt_ids[:-1])
            self.cached_len = len(prompt_ids) - 1

    def rollback(self, num_valid: int) -> None:
        self.cached_len = min(self.cached_len, num_valid)

    def prepare(self, max_k: int, confidence: bool = False) -> None:
        """Capture the draft graphs for k = 1..max_k now (warm-up; overlap drafts up to k + 1), with `confidence`
        also those an adaptive threshold's probe replays; over a cache of at least `min_cache_len` positions (a later
        prefill that fits it keeps the graphs)."""
        self.gm.ensure_cache(self.min_cache_len)
        for k in range(1, min(max_k, SCRATCH - 1) + 1):
            for wanted in {False, confidence}:
                draft_graph(self.gm, k, self.vocab_size, wanted)

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> DraftBlock:
        """Greedy: feed context[-2:] then k-1 drafts inside one graph replay; one device-to-host copy."""
        start = time.perf_counter()
        length = len(context)
        if not sampling.greedy or length < 2 or length + k > self.gm.scratch_pos or k < 1:
            return self._eager_propose(context, k, sampling, generator)
        self._catch_up(context, length - 2)  # the graph feeds the last two tokens
        graph = draft_graph(self.gm, k, self.vocab_size, self.confidence_wanted)
        graph.state.copy_(torch.tensor([[context[-2], context[-1], length - 1]]))
        graph.graph.replay()
        self.cached_len = length + k - 1
        return graph.block(start)

    def _eager_propose(self, context: list[int], k: int, sampling: SamplingParams,
                       generator: torch.Generator | None) -> DraftBlock:
        """The eager drafter's block, on the same model and cache (sampling, and what no graph covers)."""
        self.eager.cached_len = self.cached_len
        block = self.eager.propose(context, k, sampling, generator)
        self.cached_len = self.eager.cached_len
        return block

    def _catch_up(self, context: list[int], upto: int) -> None:
        """Feed context[cached_len:upto] eagerly: a gap longer than a graph's own catch-up (a drafter taking over
        mid-generation)."""
        if self.cached_len < upto:
            self.eager.cached_len = self.cached_len
            self.eager._next_logits(context[self.cached_len : upto], self.cached_len)


class _Drafts:
    """A draft graph's outputs: drafts [1, k], and with `confidence` each one's top probability [1, k]."""

    def __init__(self, gm: GraphModel, k: int, confidence: bool):
        self.drafts = torch.zeros(1, k, dtype=torch.long, device=gm.device)
        self.confidence = torch.zeros(1, k, device=gm.device) if confidence else None

    def block(self, start: float) -> DraftBlock:
        """The replayed block (one device-to-host copy each), timed from `start`."""
        block = DraftBlock(self.drafts[0].tolist(), None, time.perf_counter() - start)
        block.confidence = None if self.confidence is None else self.confidence[0].tolist()
        return block


class _DraftGraph(_Drafts):
    """k greedy draft steps in one graph: state [1, 3] = [prev_token, last_token, last_pos] -> drafts [1, k]."""

    def __init__(self, gm: GraphModel, k: int, vocab: int, confidence: bool = False):
        super().__init__(gm, k, confidence)
        self.state = torch.tensor([[0, 0, gm.scratch_pos + 1]], dtype=torch.long, device=gm.device)
        self.graph, _ = gm.capture(("draft", k, confidence), lambda: draft_body(
            gm, self.state, self.drafts, vocab, self.confidence))


def graph_drafter(model: Transformer, target_vocab_size: int | None = None, **options) -> GraphDrafter:
    """The graph drafter of a standalone draft: a block drafter's (`config.block_size`) or a chain's."""
    kind = GraphBlockDrafter if model.config.block_size else GraphDrafter
    return kind(model, target_vocab_size, **options)


def draft_body(gm: GraphModel, state: Tensor, drafts: Tensor, vocab: int, confidence: Tensor | None = None) -> Tensor:
    """Device-only drafting for B rows: each catches up on its [prev, last] at [pos-1, pos], then k-1
    single-token steps. state [B, 3] = [prev_token, last_token, last_pos] per row; drafts [B, k] (and
    `confidence` [B, k], if given, their top probabilities)."""
    pos = state[:, 2:3] - 1 + torch.arange(2, device=state.device)  # [B, 2]
    token = take_drafts(gm.forward_rows(state[:, :2], pos, last_only=True)[:, :, :vocab], drafts, confidence, 0)
    for i in range(1, drafts.shape[1]):
        logits = gm.forward_rows(token[:, None], state[:, 2:3] + i, last_only=True)[:, :, :vocab]
        token = take_drafts(logits, drafts, confidence, i)
    return drafts


def take_drafts(logits: Tensor, drafts: Tensor, confidence: Tensor | None, first: int) -> Tensor:
    """logits [B, n, V] -> drafts[:, first:first + n] (their argmax) and, if given, confidence there (the top
    softmax probability, the adaptive draft length's cut); returns the last column's tokens [B]. Graph-safe."""
    tokens = logits.argmax(-1)
    drafts[:, first: first + tokens.shape[1]].copy_(tokens)
    if confidence is not None:
        confidence[:, first: first + tokens.shape[1]].copy_(torch.softmax(logits.float(), dim=-1).amax(-1))
    return tokens[:, -1]


def draft_graph(gm: GraphModel, k: int, vocab: int, confidence: bool = False) -> _DraftGraph:
    graph = gm.graphs.get(("draft-runner", k, confidence))
    if graph is None:
        graph = _DraftGraph(gm, k, vocab, confidence)
        gm.graphs[("draft-runner", k, confidence)] = graph
    return graph


class GraphBlockDrafter(GraphDrafter):
    """A block draft (dfvg.block_draft) on CUDA: a greedy block is one pass of the last k + 1 committed tokens
    and k - 1 masks, in one graph replay (`block_body`); sampling and a longer catch-up run eagerly.

    Why always k + 1 catch-up tokens: the masks' cache slots must be rewritten with the committed tokens
    that replace them, and after a verify those are 1..k + 1; feeding the last k + 1 (the earlier ones again,
    with the same values) gives one graph shape for every accepted count, as the feature head's catch-up does."""

    def __init__(self, model: Transformer, target_vocab_size: int | None = None, compile_blocks: bool = True,
                 cache_len: int = 1024, fused_layers: bool = True):
        super().__init__(model, target_vocab_size, compile_blocks, cache_len, fused_layers)
        self.eager = BlockDrafter(model, self.vocab_size)
        self.block_size = model.config.block_size

    def prepare(self, max_k: int, confidence: bool = False) -> None:
        self.gm.ensure_cache(self.min_cache_len)
        for k in range(1, min(max_k, self.block_size) + 1):
            for wanted in {False, confidence}:
                self._graph(k, wanted)

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> DraftBlock:
        start, length, k = time.perf_counter(), len(context), min(k, self.block_size)
        if not sampling.greedy or k < 1 or length < k + 1 or length + k > self.gm.scratch_pos:
            return self._eager_propose(context, k, sampling, generator)
        self._catch_up(context, length - k - 1)  # the graph feeds the last k + 1 tokens
        graph = self._graph(k, self.confidence_wanted)
        graph.state.copy_(torch.tensor([context[-k - 1:] + [length - k - 1]]))
        graph.graph.replay()
        self.cached_len = length
        return graph.block(start)

    def _graph(self, k: int, confidence: bool = False) -> _BlockGraph:
        graph = self.gm.graphs.get(("block-runner", k, confidence))
        if graph is None:
            graph = _BlockGraph(self.gm, k, self.vocab_size, confidence)
            self.gm.graphs[("block-runner", k, confidence)] = graph
        return graph


class _BlockGraph(_Drafts):
    """One greedy block in one graph: state [1, k + 2] = [the last k + 1 committed tokens, the first one's
    position] -> drafts [1, k]."""

    def __init__(self, gm: GraphModel, k: int, vocab: int, confidence: bool = False):
        super().__init__(gm, k, confidence)
        self.state = torch.tensor([[0] * (k + 1) + [gm.scratch_pos]], dtype=torch.long, device=gm.device)
        self.masks = mask_tokens(gm, k)
        self.graph, _ = gm.capture(("block-draft", k, confidence), lambda: block_body(
            gm, self.state[:, :-1], self.state[:, -1:], self.masks, self.drafts, vocab, self.confidence))


def mask_tokens(gm: GraphModel, k: int) -> Tensor:
    """A block drafter's k - 1 mask ids on its device, made before a capture (a copy from the host is not
    allowed inside one)."""
    return torch.tensor(gm.model.config.mask_ids[: k - 1], dtype=torch.long, device=gm.device)


def block_body(gm: GraphModel, ids: Tensor, first_pos: Tensor, masks: Tensor, drafts: Tensor, vocab: int,
               confidence: Tensor | None = None) -> Tensor:
    """A block drafter's pass for B rows: ids [B, c] at first_pos [B, 1].., then the k - 1 masks [k - 1] after
    them, in one forward; drafts [B, k] <- the argmax of the last real row and of each mask row (and
    `confidence`, if given, their top probabilities). Graph-safe."""
    c, k = ids.shape[1], drafts.shape[1]
    rows = torch.cat([ids, masks.expand(ids.shape[0], k - 1)], dim=1)
    pos = first_pos + torch.arange(c + k - 1, device=ids.device)
    take_drafts(gm.forward_rows(rows, pos)[:, c - 1:, :vocab], drafts, confidence, 0)
    return drafts
