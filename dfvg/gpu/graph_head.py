"""A feature head (dfvg.feature_head) under CUDA graphs: `GraphFeatureDrafter`, its block graph and prompt-chunk
graph, and the head's rows on the graph model's layers (`head_rows`), which the fused device step
(`dfvg.gpu.fast`) and the device tree (`dfvg.gpu.tree_device`) share.

A block feature head (its body a block drafter) drafts its block in one pass of the same graph shape: the c
committed positions with the target's features, then k - 1 mask rows reading zeros (`feature_block_pass`).
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from dfvg.drafter import DraftBlock, fit_vocab
from dfvg.feature_head import BlockFeatureDrafter, FeatureDrafter, FeatureHead, with_mask_rows
from dfvg.gpu.graph_drafter import mask_tokens, take_drafts
from dfvg.gpu.graphs import PREFILL_CHUNK, SCRATCH, GraphModel
from dfvg.gpu.tree_rows import TreeRows
from dfvg.sampling import SamplingParams


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
        self.block_size = head.body.config.block_size  # a block feature head: one pass of at most this many
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
        for k in range(1, min(max_k, SCRATCH // 2, self.block_size or max_k) + 1):
            for c in range(1, k + 2):
                self._graph(c, k)
        if not self._eager_feeds:
            self._chunk_graph()  # the prompt's too (`_fill`)

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> DraftBlock:
        start = time.perf_counter()
        length, k = len(context), min(k, self.block_size or k)
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
        self.true_len, self.cached_len = length, length + (0 if self.block_size else k - 1)  # masks: overwritten
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
        self.masks = mask_tokens(gm, k) if drafter.block_size else None  # the captured graph reads this memory
        self.graph, _ = gm.capture(("feature-draft-graph", c, k), lambda: feature_draft_body(
            drafter.head, gm, self.state, drafter.inputs, self.drafts, drafter.vocab_size, self.masks))


def feature_draft_body(head: FeatureHead, gm: GraphModel, state: Tensor, inputs: Tensor, drafts: Tensor,
                       vocab: int, masks: Tensor | None = None) -> Tensor:
    """Device-only drafting of one block (see `GraphFeatureDrafter`) from state [1, c + 1] and inputs[:c]; with a
    block feature head's `masks`, in one pass (`feature_block_pass`)."""
    c = state.shape[1] - 1
    pos = state[0, c] + torch.arange(c, device=state.device)
    if masks is not None:
        return feature_block_pass(head, gm, state[0, :c], pos, inputs[:c], masks, drafts, vocab)
    return feature_block(head, gm, state[0, :c], pos, inputs[:c], drafts, vocab)


def feature_block_pass(head: FeatureHead, gm: GraphModel, ids: Tensor, pos: Tensor, features: Tensor, masks: Tensor,
                       drafts: Tensor, vocab: int) -> Tensor:
    """A block feature head's block in one pass: the c committed rows ids [c] at pos [c] with the target's
    features [c, H], then the k - 1 masks [k - 1] at the next positions reading zeros; drafts [1, k] <- the
    argmax of the last real row and of each mask row. Shared by its block graph and the fused device step."""
    c, k = ids.shape[0], drafts.shape[1]
    rows = torch.cat([ids, masks[: k - 1]])
    positions = pos[0] + torch.arange(c + k - 1, device=ids.device)
    logits, _ = head_rows(head, gm, rows, with_mask_rows(features, k), positions, last_only=False)
    take_drafts(logits[None, c - 1:, :vocab], drafts, None, 0)
    return drafts


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


class GraphBlockFeatureDrafter(GraphFeatureDrafter, BlockFeatureDrafter):
    """A block feature head under CUDA graphs: `GraphFeatureDrafter`'s graphs, each block one pass
    (`feature_block_pass`), and `BlockFeatureDrafter`'s eager pass where no graph applies (sampling): its
    `propose` is the one `GraphFeatureDrafter.propose` falls back on, by the method order."""
