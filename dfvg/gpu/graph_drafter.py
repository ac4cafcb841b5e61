"""Drafts under CUDA graphs: `GraphDrafter` (a standalone draft model, the `Drafter` protocol) and its k-step
draft graph, and `GraphFeatureDrafter` (a feature head, dfvg.feature_head) and its block graph.

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
from dfvg.drafter import DraftBlock, TorchDrafter, fit_vocab
from dfvg.feature_head import FeatureDrafter, FeatureHead
from dfvg.gpu.graphs import PREFILL_CHUNK, SCRATCH, GraphModel
from dfvg.gpu.tree_rows import TreeRows
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

    def prepare(self, max_k: int) -> None:
        """Capture the draft graphs for k = 1..max_k now (warm-up; overlap drafts up to k + 1)."""
        for k in range(1, min(max_k, SCRATCH - 1) + 1):
            draft_graph(self.gm, k, self.vocab_size)

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

    def prepare(self, max_k: int) -> None:
        for k in range(1, min(max_k, self.block_size) + 1):
            self._graph(k)

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


class GraphFeatureDrafter(FeatureDrafter):
    """A feature head drafting under CUDA graphs: a greedy block replays one graph, one device-to-host copy.

    Why: drafting eagerly costs one Python-launched forward per fed position; on the H200 that was 17 ms per
    block against the target's 1.9 ms verify (benchmarks/RESULTS.md, 2026-12-05). The graph of (c, k)
    feeds the c committed positions not yet fed with the target's features (c = accepted + 1 after a
    verify, 1..k + 1), then k - 1 positions that read the head's own f^, each draft's argmax fed back on
    the device. Sampling runs the eager `FeatureDrafter` methods this class inherits, on the same body and
    cache; a prompt and a longer catch-up (a drafter taking over mid-generation) replay a 64-row chunk graph
    (`_fill`)."""

    def __init__(self, head: FeatureHead, verifier, target_vocab_size: int | None = None,
                 compile_blocks: bool = True, cache_len: int = 1024, fused_layers: bool = True):
        super().__init__(head, verifier, target_vocab_size)
        self.gm = GraphModel(head.body, compile_blocks, fused_layers)
        self.min_cache_len = cache_len
        # the catch-up rows' features f_{p-1}, copied from the verifier's buffer before each replay
        self.inputs = torch.zeros(SCRATCH, head.target_hidden_size, dtype=head.fuse.weight.dtype,
                                  device=self.device)

    def prefill(self, prompt_ids: list[int], max_seq_len: int) -> None:
        self.gm.ensure_cache(max(max_seq_len, self.min_cache_len))  # the eager prefill then reuses this cache
        super().prefill(prompt_ids, max_seq_len)

    def prepare(self, max_k: int) -> None:
        """Capture the block graphs of k = 1..max_k, every catch-up length c = 1..k + 1, now (warm-up), over a
        cache of at least `min_cache_len` positions (a later prefill that fits it keeps the graphs)."""
        self.gm.ensure_cache(self.min_cache_len)
        for k in range(1, min(max_k, SCRATCH // 2) + 1):
            for c in range(1, k + 2):
                self._graph(c, k)
        if not self._eager_feeds:
            self._chunk_graph()  # the prompt's too (`_fill`)

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> DraftBlock:
        start = time.perf_counter()
        length = len(context)
        fed_from = min(self.true_len, length - 1)
        # eager: sampling, a one-token prompt, and blocks whose capture would not fit the scratch slots (c + k - 1)
        if not sampling.greedy or fed_from < 1 or not 1 <= k <= SCRATCH // 2 or length + k > self.gm.scratch_pos:
            return super().propose(context, k, sampling, generator)
        if length - fed_from > k + 1:  # a longer gap than a verify leaves: fill it first
            self._fill(context[fed_from: length - 1], fed_from, self._true_features(fed_from, length - 1))
            fed_from = length - 1
        c = length - fed_from
        graph = self._graph(c, k)
        self.inputs[:c].copy_(self._true_features(fed_from, length))
        graph.state.copy_(torch.tensor([context[fed_from:] + [fed_from]]))
        graph.graph.replay()
        tokens = graph.drafts[0].tolist()
        self.true_len, self.cached_len = length, length + k - 1
        return DraftBlock(tokens, None, time.perf_counter() - start)

    def _feed(self, tokens: list[int], start_pos: int, features: Tensor) -> tuple[Tensor, Tensor]:
        """A feed whose outputs are read (the sampling path's) on the graph model's layers, `PREFILL_CHUNK`
        rows at a time: (logits [V] after the last token, its f^ [H]); the head's eager forward where
        `_eager_feeds`, as the target's prefill then does.

        Why: the head's eager forward (scaled_dot_product_attention over the whole cache) cost 55-128 ms per
        prompt on the H200 whenever the prompt's length was new to the drafter, against the target's 8 ms
        prefill; through the fused layers it took 7-20 ms, and the head went from 1.16x to 1.95x plain
        (benchmarks/RESULTS.md, 2026-12-05, the 11:26 and 12:04 leases)."""
        if self._eager_feeds:
            return super()._feed(tokens, start_pos, features)
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        pos = torch.arange(start_pos, start_pos + len(tokens), device=self.device)
        for a in range(0, len(tokens), PREFILL_CHUNK):
            b = a + PREFILL_CHUNK
            logits, predicted = head_rows(self.head, self.gm, ids[a:b], features[a:b], pos[a:b])
        return fit_vocab(logits[-1], self.vocab_size), predicted[-1]

    @torch.inference_mode()
    def _fill(self, tokens: list[int], start_pos: int, features: Tensor) -> None:
        """Feed a prompt (or a long gap) whose outputs nothing reads: each `PREFILL_CHUNK` rows, padded with
        the last, in one replay of the head's chunk graph, as the target's prompt (`graphs.graph_prefill`).
        The padding rows write cache slots past the tokens, which later rows overwrite before any row attends
        to them; on fused layers the real rows are bit for bit the unpadded ones (row-invariant launches),
        on the uncompiled block (CPU tests) within float rounding. Eager (`_feed`) where no graph applies:
        `_eager_feeds`, a chunk reaching the scratch slots.

        Why: fed eagerly through the fused layers, the head's prompt pass cost 13.3 against the target's 7.8 ms
        a request on the H200, ~2.7 ms per 64-row chunk of four layers, most of it launches from Python
        (an estimate: not profiled; benchmarks/RESULTS.md, 2026-12-05, 12:04 lease)."""
        if self._eager_feeds:
            self._feed(tokens, start_pos, features)
            return
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        for a in range(0, len(tokens), PREFILL_CHUNK):
            b, at = min(a + PREFILL_CHUNK, len(tokens)), start_pos + a
            if at + PREFILL_CHUNK > self.gm.scratch_pos:
                head_rows(self.head, self.gm, ids[a:b], features[a:b], torch.arange(at, at + b - a, device=self.device))
                continue
            self._chunk_graph().run(ids[a:b], at, features[a:b])

    @property
    def _eager_feeds(self) -> bool:
        """Compiled but unfused layers: feeds outside the block graphs take the head's eager forward, since the
        compiled block would recompile for every new row count."""
        return self.gm.compiled and not self.gm.fused

    def _chunk_graph(self) -> _HeadChunkGraph:
        graph = self.gm.graphs.get(("feature-prefill-chunk",))
        if graph is None:
            graph = _HeadChunkGraph(self)
            self.gm.graphs[("feature-prefill-chunk",)] = graph
        return graph

    def _graph(self, c: int, k: int) -> _FeatureDraftGraph:
        graph = self.gm.graphs.get(("feature-draft", c, k))
        if graph is None:
            graph = _FeatureDraftGraph(self, c, k)
            self.gm.graphs[("feature-draft", c, k)] = graph
        return graph


class _HeadChunkGraph:
    """One `PREFILL_CHUNK`-row feed of the head's layers (`GraphFeatureDrafter._fill`): static ids [C], their
    positions [C] and features [C, H]; the cache rows it writes are its only output."""

    def __init__(self, drafter: GraphFeatureDrafter):
        gm, head = drafter.gm, drafter.head
        self.ids = torch.zeros(PREFILL_CHUNK, dtype=torch.long, device=gm.device)
        self.offsets = torch.arange(PREFILL_CHUNK, device=gm.device)
        self.pos = self.offsets + gm.scratch_pos  # capture writes the scratch slots only
        self.features = torch.zeros(PREFILL_CHUNK, head.target_hidden_size, dtype=head.fuse.weight.dtype,
                                    device=gm.device)
        self.graph, _ = gm.capture(("feature-prefill-graph",), lambda: head_rows(
            head, gm, self.ids, self.features, self.pos)[0])

    def run(self, ids: Tensor, start_pos: int, features: Tensor) -> None:
        """ids [n], features [n, H] at start_pos.. (n <= PREFILL_CHUNK), padded with the last row."""
        n = ids.shape[0]
        self.ids[:n].copy_(ids)
        self.ids[n:].copy_(ids[-1:].expand(PREFILL_CHUNK - n))
        self.features[:n].copy_(features)
        self.features[n:].copy_(features[-1:].expand(PREFILL_CHUNK - n, -1))
        torch.add(self.offsets, start_pos, out=self.pos)
        self.graph.replay()


class _FeatureDraftGraph:
    """One greedy block of a feature head in one graph: state [1, c + 1] = [the c tokens to feed, the first one's
    position], drafter.inputs[:c] = their features f_{p-1} -> drafts [1, k]."""

    def __init__(self, drafter: GraphFeatureDrafter, c: int, k: int):
        gm = drafter.gm
        self.state = torch.tensor([[0] * c + [gm.scratch_pos]], dtype=torch.long, device=gm.device)
        self.drafts = torch.zeros(1, k, dtype=torch.long, device=gm.device)
        self.graph, _ = gm.capture(("feature-draft-graph", c, k), lambda: feature_draft_body(
            drafter.head, gm, self.state, drafter.inputs, self.drafts, drafter.vocab_size))


def feature_draft_body(head: FeatureHead, gm: GraphModel, state: Tensor, inputs: Tensor, drafts: Tensor,
                       vocab: int) -> Tensor:
    """Device-only drafting of one block (see `GraphFeatureDrafter`) from state [1, c + 1] and inputs[:c]."""
    c = state.shape[1] - 1
    pos = state[0, c] + torch.arange(c, device=state.device)
    return feature_block(head, gm, state[0, :c], pos, inputs[:c], drafts, vocab)


def feature_block(head: FeatureHead, gm: GraphModel, ids: Tensor, pos: Tensor, features: Tensor, drafts: Tensor,
                  vocab: int) -> Tensor:
    """The c catch-up rows ids [c] at positions pos [c] with the target's features [c, H], then k - 1 rows on
    the head's own f^: FeatureHead.forward's arithmetic on the graph model's layers, each draft's argmax and
    f^ feeding the next; drafts [1, k] written. Shared by the head's block graph and the fused device step
    (`dfvg.gpu.fast.feature_step_body`)."""
    for i in range(drafts.shape[1]):
        logits, features = head_rows(head, gm, ids, features, pos)
        ids = logits[:, :vocab].argmax(-1)  # [1]
        drafts[0, i].copy_(ids[0])
        pos = pos[-1:] + 1
    return drafts


def head_rows(head: FeatureHead, gm: GraphModel, ids: Tensor, features: Tensor, pos: Tensor,
              tree: TreeRows | None = None, last_only: bool = True) -> tuple[Tensor, Tensor]:
    """FeatureHead.forward's arithmetic on the graph model's layers: rows ids [T] at pos [T] reading features
    [T, H] -> (logits, predicted f^) of the last row, or of every row without last_only (token-tree rows
    with `tree`). Graph-safe; shared by the chain's block (`feature_block`) and the device tree
    (`dfvg.gpu.tree_device.FeatureFeeder`)."""
    x = head.fuse(torch.cat([features.to(head.fuse.weight.dtype), head.body.embed(ids)], dim=-1))
    logits, hidden = gm.forward_inputs(x, pos, tree, last_only)
    return logits, head.predict(hidden)
