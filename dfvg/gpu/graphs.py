"""CUDA-graph forward passes of DFVG's `Transformer`, and the verifier / drafter built on them.

Why: one decode step of a 1.5B model moves ~3 GB of weights (0.7 ms at 4.3 TB/s) but launches ~1000 small
kernels; launched one by one from Python that costs tens of milliseconds. A CUDA graph replays all of them
with one launch, and `torch.compile` of one transformer block (shared by every layer: the weights are
arguments, not constants) fuses the elementwise work so there are fewer kernels to replay.

What this module owns: `GraphModel` (functional forward + graph capture per input length T over static
buffers, chunked graph prefill) and `GraphVerifier` (the `Verifier` interface, with a captured
verify-and-accept); the draft side, `GraphDrafter`, is `dfvg.gpu.graph_drafter`'s.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch import Tensor

from dfvg.drafter import DraftBlock
from dfvg.gpu import fused
from dfvg.gpu.block import block_forward, layer_weights, raise_recompile_limit
from dfvg.gpu.fused_stack import last_rows, stack_forward, stack_logits
from dfvg.gpu.kernels import MAX_ROWS, greedy_accept
from dfvg.gpu.tree_rows import TreeRows
from dfvg.model import Transformer
from dfvg.sampling import SamplingParams
from dfvg.verifier import verify_on_host

SCRATCH = fused.MAX_ROWS  # last cache slots: warm-up and capture (a query at p attends to slots <= p only)
VERIFY_ROWS = min(SCRATCH, MAX_ROWS)  # rows a captured verify-and-accept takes (the acceptance kernel's limit)


class GraphModel:
    """A Transformer with a functional forward and CUDA graphs captured around callables over it."""

    def __init__(self, model: Transformer, compile_blocks: bool = True, fused_layers: bool = True):
        self.model = model
        self.device = model.tok_embeddings.weight.device
        cfg = model.config
        self.dims = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size, cfg.rms_norm_eps)
        self.weights = [layer_weights(layer) for layer in model.layers]
        self.compiled = compile_blocks
        if compile_blocks:
            raise_recompile_limit()
            self.block = torch.compile(block_forward, dynamic=False, fullgraph=True)
        else:
            self.block = block_forward
        # Up to fused.MAX_ROWS tokens take the fused Triton layers where they apply (CUDA, bf16, no q/k
        # norm); longer inputs and other models take the (compiled) block. `why_not_fused` says why not.
        self.why_not_fused = fused.supported(model) if fused_layers else "fused layers turned off"
        self.fused = self.why_not_fused is None
        self.cache_len = 0
        self._cache_id = None  # bumped whenever the cache tensors change (graphs over the old ones are dropped)
        self._cache_store = lambda: None  # a weak reference: the old store is freed before the new one comes
        self.graphs: dict = {}
        # With a feature head drafting (dfvg.feature_head): a one-sequence pass also writes its rows' final-norm
        # outputs at their positions, inside the captured graphs too (static buffer, static pos).
        self.features: Tensor | None = None
        self.keeps_features = False
        self.writes_features = True  # off while a draft that reads none decodes (`dfvg.engine.Engine.decode`)

    def ensure_cache(self, max_seq_len: int, rows: int = 1) -> None:
        """Allocate (or keep) a cache of `rows` rows of max_seq_len + SCRATCH slots; new buffers invalidate
        the graphs. One sequence uses row 0, so a batch's cache serves single sequences too."""
        self.model.setup_cache(rows, max_seq_len + SCRATCH)
        store = self.model.kv_store
        if store is not self._cache_store():  # the tensor itself: a freed id can come back for a new one
            self._cache_store, self._cache_id, self.graphs = weakref.ref(store), (self._cache_id or 0) + 1, {}
            self.cache_len = self.model.max_seq_len
            self._allocate_features()

    def keep_features(self) -> None:
        """From now on, write features (graphs captured without the write are dropped, to be recaptured)."""
        if not self.keeps_features:
            self.keeps_features, self.graphs = True, {}
            self._allocate_features()

    def _allocate_features(self) -> None:
        if self.keeps_features and self.cache_len:
            weight = self.model.norm.weight
            self.features = torch.zeros(self.cache_len, weight.shape[0], dtype=weight.dtype, device=self.device)

    @property
    def writing(self) -> bool:
        return self.features is not None and self.writes_features

    def graph_key(self, key: tuple) -> tuple:
        """A graph's cache key: with or without the feature write, so a baseline decoded beside a feature head
        (one `dfvg run`) replays graphs without it."""
        return key, self.writing

    def _write_features(self, x: Tensor, pos: Tensor) -> None:
        """x [T, D] (the last layer's rows), pos [T]: their final-norm values into `features`, by position."""
        if self.writing:
            self.features.index_copy_(0, pos, self.model.norm(x))

    @property
    def scratch_pos(self) -> int:
        return self.cache_len - SCRATCH

    def forward(self, ids: Tensor, pos: Tensor, last_only: bool = False, tree: TreeRows | None = None) -> Tensor:
        """ids [1, T] long, pos [T] long -> float32 logits [T, V] ([1, V] with last_only). No host sync. tree:
        token-tree rows (`dfvg.gpu.tree_rows`); any number take the fused layers (in chunks), so every node row
        is bit for bit the row plain decoding computes."""
        if self.fused and (ids.shape[1] <= fused.MAX_ROWS or tree is not None):
            return self._fused_forward(ids, pos, last_only, tree)
        return self._block_forward(ids, pos[None], last_only, tree)[0]

    def forward_rows(self, ids: Tensor, pos: Tensor, last_only: bool = False) -> Tensor:
        """ids, pos [B, T] long -> logits [B, T, V]: row b at its own positions, in cache row b."""
        if ids.shape[0] == 1:
            return self.forward(ids, pos[0], last_only)[None]
        return self._block_forward(ids, pos, last_only)

    def _block_forward(self, ids: Tensor, pos: Tensor, last_only: bool, tree: TreeRows | None = None) -> Tensor:
        x = self._block_layers(self.model.embed(ids), pos, tree)  # [B, T, D]
        if tree is None and x.shape[0] == 1:
            self._write_features(x[0], pos[0])
        if last_only:
            x = x[:, -1:]
        return self.model.logits(x)

    def _block_layers(self, x: Tensor, pos: Tensor, tree: TreeRows | None = None) -> Tensor:
        """The (compiled) block of every layer on input rows x [B, T, D] at positions pos [B, T] -> the last
        layer's rows [B, T, D], before the final norm."""
        m = self.model
        cos = m.rope_cos[pos].to(x.dtype)[:, :, None]  # [B, T, 1, hd]
        sin = m.rope_sin[pos].to(x.dtype)[:, :, None]
        if tree is None:
            mask, slots = torch.arange(self.cache_len, device=pos.device) <= pos[..., None], pos  # [B, T, S]
        else:  # one sequence: its tree rows' own slots and ancestor mask
            mask, slots = tree.mask(self.cache_len)[None], tree.slots[None]
        for layer, w in zip(m.layers, self.weights, strict=True):
            cache = layer.attention.kv_cache
            x = self.block(x, cos, sin, slots, mask, cache.k, cache.v, w, self.dims)
        return x

    @torch.inference_mode()
    def prefill(self, tokens: list[int]) -> None:
        """Feed a prompt from position 0: `graph_prefill` chunks with fused layers, else one eager feed (a
        compiled-block graph would not pay for its compilation). From `LONG_PROMPT` tokens the fused path too
        runs one eager pass (cuBLAS over all rows, causal attention over its own slots): each 64-row chunk
        re-streams the weights. K/V do not depend on the cache size; plain and speculative share the prefill."""
        if self.fused and len(tokens) < LONG_PROMPT:
            graph_prefill(self, tokens)
        elif self.fused or self.writing:  # one eager pass, its rows' features written as every pass writes them
            pos = torch.arange(len(tokens), device=self.device)
            x = self.model.embed(torch.tensor([tokens], device=self.device))
            self._write_features(self.model.run_layers(x, pos[None], causal_prefix=self.fused)[0], pos)
        else:
            self.model.feed(tokens, 0, last_only=True)

    def _fused_forward(self, ids: Tensor, pos: Tensor, last_only: bool, tree: TreeRows | None) -> Tensor:
        """Fused layers over chunks of `fused.MAX_ROWS` rows, chunk after chunk within each layer: a tree's rows
        come parents first, so a chunk's ancestors wrote their K/V in this layer before it attends."""
        return self._fused_pass(self.model.embed(ids)[0], pos, tree, last_only, write_features=tree is None)[0]

    def _fused_pass(self, x: Tensor, pos: Tensor, tree: TreeRows | None, last_only: bool,
                    write_features: bool) -> tuple[Tensor, Tensor]:
        """The fused layers and head on input rows x [T, D] -> (logits, the last layer's rows), the last row's alone
        with last_only; with write_features, every row's features first (`_write_features`)."""
        counters = fused.new_counters(x.device)  # one zeroed split-K/row-tile scratch for every launch of the pass
        hidden, scaled = stack_forward(self.model, self.weights, self.dims, x, pos, counters, tree)
        if write_features:
            self._write_features(hidden, pos)
        if last_only:
            hidden, scaled = last_rows(hidden, scaled)
        return stack_logits(self.model, hidden, counters, scaled), hidden

    def forward_inputs(self, x: Tensor, pos: Tensor, tree: TreeRows | None = None,
                       last_only: bool = True) -> tuple[Tensor, Tensor]:
        """Input rows x [T, D] (a feature head's fused inputs, or token embeddings) at positions pos [T] ->
        (float32 logits [T, V], the last layer's rows [T, D] before the final norm), the last row's alone with
        last_only. Same layers as `forward` (fused where they apply, token-tree rows too); graph-safe, no host
        sync, no feature writes (a tree's rows are not at their sequence positions yet)."""
        if self.fused and (x.shape[0] <= fused.MAX_ROWS or tree is not None):
            return self._fused_pass(x, pos, tree, last_only, write_features=False)
        hidden = self._block_layers(x[None], pos[None], tree)[0]
        hidden = hidden[-1:] if last_only else hidden
        return self.model.logits(hidden), hidden

    def capture(self, key, body: Callable[[], Tensor], warmup: int = 2,
                before: Callable[[], None] | None = None) -> tuple[torch.cuda.CUDAGraph | EagerReplay, Tensor]:
        """Warm up body() on a side stream (compiles), then capture it; body must only touch static buffers.
        `before` runs ahead of each warm-up, to reset state that body() advances (positions, tokens). On a
        CPU there are no graphs: the same body runs at every replay (the path CPU tests exercise)."""
        if self.device.type != "cuda":
            graph = EagerReplay(body)
            self.graphs[self.graph_key(key)] = (graph, None)
            return graph, None
        graph, out = capture_graph(body, self.device, warmup, before)
        self.graphs[self.graph_key(key)] = (graph, out)
        return graph, out


def capture_graph(body: Callable[[], Tensor], device: torch.device, warmup: int = 2,
                  before: Callable[[], None] | None = None) -> tuple[torch.cuda.CUDAGraph, Tensor]:
    """Warm up body() on a side stream (Triton/Inductor compile there, outside capture), then capture one
    call of it into a CUDA graph; returns the graph and body's output buffers."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream), torch.inference_mode():
        for _ in range(warmup):
            if before is not None:
                before()
            body()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.inference_mode():
        out = body()
    torch.cuda.synchronize(device)
    return graph, out


class EagerReplay:
    """Stand-in for a CUDA graph on a CPU: replay() runs the body; its output lands in the same buffers."""

    def __init__(self, body: Callable[[], Tensor]):
        self.body = body
        self.out: Tensor | None = None

    def replay(self) -> None:
        with torch.inference_mode():
            self.out = self.body()


class _TokenGraph:
    """Static ids/pos buffers of length T and the graph of `GraphModel.forward` over them."""

    def __init__(self, gm: GraphModel, t: int, last_only: bool):
        self.ids = torch.zeros(1, t, dtype=torch.long, device=gm.device)
        self.pos = torch.arange(gm.scratch_pos, gm.scratch_pos + t, device=gm.device)
        self.graph, self.out = gm.capture(("tokens", t, last_only),
                                          lambda: gm.forward(self.ids, self.pos, last_only))

    def run(self, tokens: list[int], start_pos: int) -> Tensor:
        t = self.ids.shape[1]
        padded = tokens + [tokens[-1]] * (t - len(tokens))  # padding rows are causal-after: never read
        self.ids.copy_(torch.tensor([padded], dtype=torch.long), non_blocking=False)
        self.pos.copy_(torch.arange(start_pos, start_pos + t), non_blocking=False)
        self.graph.replay()
        return self.out if self.out is not None else self.graph.out


def token_graph(gm: GraphModel, tokens: list[int], start_pos: int, last_only: bool) -> _TokenGraph | None:
    """The captured graph for len(tokens) (capturing it on first use), or None where eager must run."""
    t = len(tokens)
    if start_pos + t > gm.scratch_pos or t > SCRATCH:
        return None
    key = gm.graph_key(("runner", t, last_only))
    runner = gm.graphs.get(key)
    if runner is None:
        runner = gm.graphs[key] = _TokenGraph(gm, t, last_only)
    return runner


PREFILL_CHUNK = fused.MAX_ROWS  # prompt tokens per graph replay in `graph_prefill`
LONG_PROMPT = 512  # prompts this long prefill in one eager pass (`GraphModel.prefill`; estimated, not measured)


def graph_prefill(gm: GraphModel, tokens: list[int], start_pos: int = 0) -> None:
    """Feed tokens into gm's cache `PREFILL_CHUNK` (64) at a time through one captured graph (eager where none
    fits).

    Why: eager prefill of a ~150-token prompt launches every kernel from Python (~60 ms for the 1.5B
    target on the H200, a quarter of a 128-token request); three replays of the fused T = 64 graph do the
    same work. The last chunk is padded with its last token: the padded rows write cache slots after the
    prompt, which later tokens overwrite before anything attends to them. A padded chunk that would run into
    the scratch slots goes through `gm.forward` unpadded: the same fused rows, bit for bit, so the prompt's K/V
    do not depend on the cache size (plain and speculative runs size it differently)."""
    for i in range(0, len(tokens), PREFILL_CHUNK):
        chunk = tokens[i : i + PREFILL_CHUNK]
        runner = token_graph(gm, chunk + [chunk[-1]] * (PREFILL_CHUNK - len(chunk)), start_pos + i, True)
        if runner is None:
            with torch.inference_mode():
                gm.forward(torch.tensor([chunk], device=gm.device),
                           torch.arange(start_pos + i, start_pos + i + len(chunk), device=gm.device), True)
        else:
            runner.run(chunk, start_pos + i)


class GraphVerifier:
    """Target model with graph-replayed scoring (CUDA; plain replays on CPU); the `TorchVerifier` interface."""

    def __init__(self, model: Transformer, compile_blocks: bool = True, cache_len: int = 1024,
                 fused_layers: bool = True):
        self.gm = GraphModel(model, compile_blocks, fused_layers)
        self.model = model
        self.device = self.gm.device
        self.vocab_size = model.config.vocab_size
        self.min_cache_len = cache_len
        self._features_end = 0

    @property
    def features_end(self) -> int:
        """With keep_features: one past the last position whose features were written (0 while none are)."""
        return self._features_end if self.gm.writes_features else 0

    @features_end.setter
    def features_end(self, end: int) -> None:
        self._features_end = end

    @property
    def keep_features(self) -> bool:
        """As `TorchVerifier.keep_features`: set by a feature head; then `features` [cache slots, D] by position."""
        return self.gm.keeps_features

    @keep_features.setter
    def keep_features(self, on: bool) -> None:
        if on:
            self.gm.keep_features()

    features = property(lambda self: self.gm.features)

    def prefill(self, prompt_ids: list[int], max_seq_len: int) -> None:
        """Cache of at least `cache_len` slots (graphs survive across prompts); then prompt[:-1]."""
        self.gm.ensure_cache(max(max_seq_len, self.min_cache_len))
        if len(prompt_ids) > 1:
            self.gm.prefill(prompt_ids[:-1])
        self.features_end = len(prompt_ids) - 1

    @torch.inference_mode()
    def score(self, tokens: list[int], start_pos: int) -> Tensor:
        """Logits [len(tokens), V] of the token after each of `tokens` (the graph's output buffer)."""
        self.features_end = start_pos + len(tokens)
        runner = token_graph(self.gm, tokens, start_pos, last_only=False)
        if runner is None:
            ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
            return self.gm.forward(ids, torch.arange(start_pos, start_pos + len(tokens), device=self.device))
        return runner.run(tokens, start_pos)[: len(tokens)]

    def verify(self, seq: list[int], block: DraftBlock, sampling: SamplingParams,
               rng: torch.Generator) -> tuple[int, int]:
        """Greedy one-hot drafts: the captured verify + acceptance (two ints back); else logits to the host."""
        if sampling.greedy and block.probs is None:
            outcome = verify_greedy(self, seq, block.tokens)
            if outcome is not None:
                self.features_end = len(seq) + len(block.tokens)
                return outcome
        return verify_on_host(self, seq, block, sampling, rng)

    def prepare(self, max_rows: int) -> None:
        """Capture the verify-and-accept graphs for 1..max_rows rows now (a warm-up, not a prompt's time)."""
        for rows in range(1, min(max_rows, VERIFY_ROWS) + 1):
            verify_greedy(self, [0], [0] * (rows - 1))


class _VerifyGraph:
    """Static [last, *drafts] ids and positions of T = k+1 rows, and the graph of verify + greedy acceptance."""

    def __init__(self, gm: GraphModel, rows: int):
        self.ids = torch.zeros(1, rows, dtype=torch.long, device=gm.device)
        self.pos = torch.arange(gm.scratch_pos, gm.scratch_pos + rows, device=gm.device)
        body = lambda: greedy_accept(gm.forward(self.ids, self.pos), self.ids[0, 1:])  # noqa: E731
        self.graph, self.out = gm.capture(("verify-accept", rows), body)


def verify_greedy(verifier: GraphVerifier, seq: list[int], drafts: list[int]) -> tuple[int, int] | None:
    """(accepted, next token) from the captured verify + acceptance of drafts made anywhere; None: no graph."""
    gm, rows, start = verifier.gm, len(drafts) + 1, len(seq) - 1
    if rows > VERIFY_ROWS or start + rows > gm.scratch_pos:
        return None
    key = gm.graph_key(("verify-accept-runner", rows))
    runner = gm.graphs.get(key)
    if runner is None:
        runner = gm.graphs[key] = _VerifyGraph(gm, rows)
    runner.ids.copy_(torch.tensor([[seq[-1], *drafts]], dtype=torch.long))
    runner.pos.copy_(torch.arange(start, start + rows))
    runner.graph.replay()
    out = runner.out if runner.out is not None else runner.graph.out
    return tuple(out[:2].tolist())  # (accepted, next token): the one device-to-host copy
