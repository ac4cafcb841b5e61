"""Which implementation runs under the engine's one loop, chosen once from the devices; warm-up apart.

`dfvg generate`, `dfvg run` and the benchmarks load their models here and decode through `Engine.decode`,
which always ends in `dfvg.generate.decode` with one of its steps:
- on CUDA, unless `fast=False` (`--eager`): the target is a `GraphVerifier` (CUDA graphs, fused Triton
  layers) and a GPU draft a `GraphDrafter`; a greedy sync run with such a pair (or no draft) is one
  `DeviceStep` replay per step, and any other drafter (FPGA datapath, board, CPU) feeds its drafts to the
  same captured verify-and-accept (`GraphVerifier.verify`);
- otherwise the eager `TorchVerifier` / `TorchDrafter` under the `HostStep`;
- the overlap schedule and the adaptive draft length are `dfvg.host.pipeline`'s steps, on either verifier;
- under `--tensor-parallel N` (torchrun), every rank runs this same loop on its `TensorParallelVerifier` shard,
  eagerly; the draft runs on rank 0 only and the other ranks receive its blocks (`dfvg.parallel`).

Every step drafts through `Engine.guard(drafter)`, a `dfvg.fallback.GuardedDrafter` over the drafter and
the engine's fallback drafters: a draft device that raises or hangs costs its block and the watchdog's
deadline, then drafting continues on the next device or the target decodes alone, with the output of plain
decoding. The guards share one health record per drafter (a device that failed for one variant failed for
all) and the fault injection of the tests (`DFVG_FAIL_DRAFT_AFTER`, `DFVG_HANG_DRAFT_AFTER`), which warm-up
calls do not count.

Graph capture and compilation happen once per process, in `warm_up`, which returns its seconds so reports
show them as `warmup_s` and never inside a prompt's tokens per second.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch

from dfvg.block_draft import BlockDrafter
from dfvg.checkpoint import is_feature_head, load_model
from dfvg.devices import resolve_device, synchronize
from dfvg.drafter import Drafter, TorchDrafter
from dfvg.errors import UserError
from dfvg.fallback import FaultInjection, FaultPolicy, GuardedDrafter, Slot
from dfvg.feature_head import BlockFeatureDrafter, FeatureDrafter, feature_drafter
from dfvg.fpga.datapath.drafter import FpgaDrafter
from dfvg.fpga.datapath.feature_drafter import FpgaFeatureDrafter
from dfvg.generate import GenerationResult, HostStep, check_lengths, decode, max_seq_len
from dfvg.gpu.fast import ONE_SEQUENCE, DeviceRows, DeviceStep, fits_device_step
from dfvg.gpu.graph_drafter import GraphBlockDrafter, GraphDrafter, graph_drafter
from dfvg.gpu.graph_head import GraphBlockFeatureDrafter, GraphFeatureDrafter
from dfvg.gpu.graphs import GraphVerifier
from dfvg.gpu.tree_device import DeviceTreeStep, device_tree_prompt_len, fits_device_tree, tree_room, tree_shape
from dfvg.host.adaptive import AdaptiveDraftLength
from dfvg.host.batch import run_batch
from dfvg.host.pipeline import run_pipeline
from dfvg.host.timeline import Timeline
from dfvg.parallel.drafts import ReceivedDrafts, share_drafts
from dfvg.parallel.group import TensorParallel, current
from dfvg.parallel.verifier import TensorParallelVerifier
from dfvg.sampling import SamplingParams
from dfvg.tree import TreeSpec
from dfvg.tree_step import TreeStep, tree_step
from dfvg.verifier import TorchVerifier, Verifier

DEFAULT_CACHE_LEN = 1024  # graph caches hold at least this many positions, so graphs survive across prompts
GRAPH_HOLDERS = (GraphVerifier, GraphDrafter, GraphFeatureDrafter)  # what holds graphs over a cache it sizes
FEATURE_DRAFTERS = (FeatureDrafter, FpgaFeatureDrafter)  # drafters that read the features the last verify wrote


def uses_graphs(device: torch.device, fast: bool) -> bool:
    return fast and device.type == "cuda"


def load_verifier(target_dir: str | Path, device: torch.device, dtype: torch.dtype, fast: bool = True,
                  tensor_parallel: TensorParallel | None = None) -> Verifier:
    """The target on `device`: CUDA graphs + fused layers on CUDA (unless fast=False), else eager; this rank's
    eager shard under tensor parallelism (`dfvg.parallel.group.start`)."""
    if tensor_parallel is not None:
        return TensorParallelVerifier.load(target_dir, tensor_parallel, dtype)
    model = load_model(target_dir, dtype=dtype, device=device)
    if uses_graphs(device, fast):
        return GraphVerifier(model, cache_len=DEFAULT_CACHE_LEN)
    return TorchVerifier(model)


def make_drafter(draft_dir: str | Path, device: str, dtype: torch.dtype, target_vocab_size: int,
                 fast: bool = True, verifier: Verifier | None = None, **fpga_options) -> Drafter:
    """The drafter for a device name: `fpga` (bit-exact integer datapath, or a board) or a torch device.
    A feature head's folder (dfvg.feature_head) gives a `FeatureDrafter` reading `verifier`'s features.

    Under tensor parallelism the ranks other than 0 load nothing and receive rank 0's drafts, and rank 0's draft
    runs eagerly: a graph capture on rank 0 alone would put its warm-up out of step with the other ranks."""
    tp, head = current(), is_feature_head(draft_dir)
    if tp is not None and head:  # every rank refuses alike (none waits on a broadcast)
        raise UserError(f"{draft_dir} is a feature head, which does not run under tensor parallelism yet; "
                        "drop --tensor-parallel or use a standalone draft")
    if tp is not None and not tp.leads:
        return ReceivedDrafts(tp)
    fast = fast and tp is None
    if head and device == "fpga":
        return FpgaFeatureDrafter.from_checkpoint(draft_dir, verifier, target_checkpoint(verifier),
                                                  target_vocab_size=target_vocab_size, **fpga_options)
    if head:
        drafter = feature_drafter(draft_dir, device, dtype, verifier)
        if uses_graphs(drafter.device, fast):
            kind = GraphBlockFeatureDrafter if isinstance(drafter, BlockFeatureDrafter) else GraphFeatureDrafter
            return kind(drafter.head, verifier, target_vocab_size, cache_len=DEFAULT_CACHE_LEN)
        return drafter
    if device == "fpga":
        return FpgaDrafter.from_checkpoint(draft_dir, target_vocab_size=target_vocab_size, **fpga_options)
    torch_device = resolve_device(device)
    model = load_model(draft_dir, dtype=dtype, device=torch_device)
    if uses_graphs(torch_device, fast):
        return graph_drafter(model, target_vocab_size, cache_len=DEFAULT_CACHE_LEN)
    return BlockDrafter(model, target_vocab_size) if model.config.block_size else TorchDrafter(model, target_vocab_size)


def target_checkpoint(verifier: Verifier | None) -> Path:
    """The folder the verifier's target was loaded from (an FPGA head's scales are calibrated on it)."""
    if verifier is None:
        raise UserError("a feature head needs the target it reads features from; give the target too")
    directory = getattr(getattr(verifier, "model", None), "checkpoint_dir", None)
    if directory is None:
        raise UserError("a feature head on the FPGA datapath calibrates on its target's features; load the "
                        "target from a checkpoint folder on one process (no --tensor-parallel)")
    return directory


class Engine:
    """One loaded target and the steps built on it; reused for every prompt, variant and repetition."""

    def __init__(self, verifier: Verifier, faults: FaultPolicy | None = None, fallbacks: Sequence[Drafter] = ()):
        self.verifier = verifier
        self.device_steps: dict[tuple, DeviceStep | DeviceTreeStep] = {}  # (drafter id, k[, tree]) -> its step
        self.device_rows: dict[tuple, DeviceRows] = {}  # (drafter id, k, rows) -> a batch's captured step
        self.drafters: list[Drafter] = list(fallbacks)  # every drafter decoded with, to size their caches too
        self.faults, self.fallbacks = faults or FaultPolicy(), list(fallbacks)
        self.injection = FaultInjection.from_env()
        self.slots: dict[int, Slot] = {}  # drafter id -> its health, shared by every guard
        self.guards: dict[tuple, GuardedDrafter] = {}  # (drafter id, with fallbacks) -> its guard

    @property
    def captures(self) -> bool:
        """Whether anything here captures graphs or compiles (else a warm-up has nothing to do)."""
        return any(isinstance(m, GRAPH_HOLDERS) for m in (self.verifier, *self.drafters))

    @property
    def context_limit(self) -> int:
        return self.verifier.model.config.max_position_embeddings

    def reserve(self, positions: int, batch: int = 1, drafters: Sequence[Drafter | None] = ()) -> None:
        """Size graph caches for generations of `positions` (a `max_seq_len`; the graph model adds its scratch
        slots) and the target's for `batch` rows, up front: no prompt of the run then reallocates a cache,
        which would drop and recapture every graph over it. `drafters`: the run's, remembered first."""
        for drafter in drafters:
            self._remember(drafter)
        for holder in (self.verifier, *self.drafters):
            if isinstance(holder, GRAPH_HOLDERS):
                holder.min_cache_len = max(holder.min_cache_len, positions)
        for holder in (self.verifier, *self.drafters):
            if isinstance(holder, (GraphVerifier, GraphDrafter)) and batch > 1:
                holder.gm.ensure_cache(holder.min_cache_len, batch)

    def guard(self, drafter: Drafter, fallbacks: bool = True) -> GuardedDrafter:
        """The guarded drafter every step drafts through: `drafter`, then (with `fallbacks`) the engine's
        fallback drafters. Batch rows take none: a fallback model keeps one sequence's cache."""
        if isinstance(drafter, GuardedDrafter):
            return drafter
        key = (id(drafter), fallbacks)
        if key not in self.guards:
            chain = [drafter] + [d for d in self.fallbacks if d is not drafter and fallbacks]
            slots = [self.slots.setdefault(id(d), Slot(d)) for d in chain]
            self.guards[key] = GuardedDrafter(slots, self.faults, self.injection)
        return self.guards[key]

    @contextmanager
    def warming(self) -> Iterator[None]:
        """Warm-up calls: the fault injection does not count them (the N-th proposal is a timed one)."""
        if self.injection is None:
            yield
            return
        self.injection.paused = True
        try:
            yield
        finally:
            self.injection.paused = False

    def decode(self, drafter: Drafter | None, prompt_ids: list[int], max_new_tokens: int, *, k: int,
               eos_ids: tuple[int, ...] | list[int] = (), sampling: SamplingParams | None = None, seed: int = 0,
               mode: str = "sync", timeline: Timeline | None = None,
               adaptive: AdaptiveDraftLength | None = None, tree: TreeSpec | None = None) -> GenerationResult:
        """One generation: the device step where it applies, else the host step, a pipeline schedule, or
        token-tree speculation (`tree`, dfvg.tree_step)."""
        sampling = sampling or SamplingParams()
        k = k if drafter is not None else 0
        self._write_features(self._reads_features(drafter))
        if isinstance(drafter, FEATURE_DRAFTERS) and (mode != "sync" or adaptive is not None):
            raise UserError("a feature head drafts in the sync schedule only (it needs the features of the "
                            "block just verified); drop the overlap schedule or the adaptive length")
        self._remember(drafter)
        shared = share_drafts(self.verifier, drafter)
        if shared is not drafter or isinstance(drafter, ReceivedDrafts):  # tensor parallel: rank 0 broadcasts
            # its blocks and every rank takes the same steps, so no rank may fall back on its own
            step = HostStep(self.verifier, shared, sampling, torch.Generator().manual_seed(seed), timeline)
            return decode(step, prompt_ids, max_new_tokens, k=k, eos_ids=eos_ids, context_limit=self.context_limit)
        if drafter is not None and tree is not None:  # a tree drafts on the torch drafter itself (no fallback yet)
            lead = device_tree_prompt_len(drafter, tree, k) - len(prompt_ids)
            if lead > 0 and fits_device_tree(self.verifier, drafter, tree, sampling.greedy, len(prompt_ids) + lead, k):
                return self._plain_lead_then_tree(drafter, prompt_ids, lead, max_new_tokens, k=k, eos_ids=eos_ids,
                                                  sampling=sampling, seed=seed, tree=tree)
            step = self._tree_step(drafter, tree, sampling, seed, k, len(prompt_ids))
            return decode(step, prompt_ids, max_new_tokens, k=step.depth, eos_ids=eos_ids,
                          context_limit=self.context_limit)
        guard = self.guard(drafter) if drafter is not None else None
        if guard is not None and (mode != "sync" or adaptive is not None):
            return run_pipeline(self.verifier, guard, prompt_ids, max_new_tokens, eos_ids=eos_ids,
                                sampling=sampling, seed=seed, draft_length=k, mode=mode, adaptive=adaptive,
                                timeline=timeline)
        live = guard.select() if guard is not None else None  # the drafter that drafts now (None: target only)
        on_device = guard is None or isinstance(live, (GraphDrafter, GraphFeatureDrafter))
        if sampling.greedy and on_device and fits_device_step(self.verifier, live, len(prompt_ids), k):
            step = self._device_step(live, k, guard)
        else:
            step = HostStep(self.verifier, guard, sampling, torch.Generator().manual_seed(seed), timeline)
        return decode(step, prompt_ids, max_new_tokens, k=k, eos_ids=eos_ids, context_limit=self.context_limit)

    def _reads_features(self, drafter: Drafter | None) -> bool:
        """Whether a decode with this drafter may read the target's features: it is a feature head, or a head is
        among the fallbacks that can take over from it."""
        return drafter is not None and any(isinstance(d, FEATURE_DRAFTERS) for d in (drafter, *self.fallbacks))

    def _write_features(self, on: bool) -> None:
        """The graph verifier writes the target's features only while a drafter that reads them decodes: a
        baseline or standalone draft beside a feature head then replays graphs without the write. (A later head
        decode prefills its whole context again, so nothing it reads is missing.)"""
        if isinstance(self.verifier, GraphVerifier):
            self.verifier.gm.writes_features = on

    def _plain_lead_then_tree(self, drafter: Drafter, prompt_ids: list[int], lead: int, max_new_tokens: int, *,
                              k: int, eos_ids: tuple[int, ...] | list[int], sampling: SamplingParams, seed: int,
                              tree: TreeSpec) -> GenerationResult:
        """A greedy device tree whose prompt is `lead` tokens too short for it: those tokens as plain decoding
        makes them, then the device tree from the longer context.

        Why: the other way, the eager tree, is lossless in exact arithmetic, but its bf16 verify rounds
        differently from plain decoding: on the H200 a 4-token ShareGPT prompt's output differed from plain's
        (benchmarks/RESULTS.md, 2026-12-05, 11:26 lease). The device steps' rows are bit-identical to plain's."""
        check_lengths(prompt_ids, max_new_tokens, k, self.context_limit)  # the user's numbers, before any decoding
        first = self.decode(None, prompt_ids, min(lead, max_new_tokens), k=0, eos_ids=eos_ids)
        if first.stopped_by != "max_new_tokens" or len(first.tokens) >= max_new_tokens:
            return first
        rest = self.decode(drafter, prompt_ids + first.tokens, max_new_tokens - len(first.tokens), k=k,
                           eos_ids=eos_ids, sampling=sampling, seed=seed, tree=tree)
        return first.then(rest)

    def batch_drafters(self, make: Callable[[], Drafter] | None, rows: int,
                       sampling: SamplingParams) -> list[Drafter | None]:
        """Drafters for a batch of `rows`: none (plain), one graph drafter drafting every row inside the
        device step (greedy on graph models), or one drafter per row (each keeps its own cache)."""
        if make is None:
            return [None] * rows
        first = make()
        if isinstance(first, GraphDrafter) and not isinstance(first, GraphBlockDrafter) and sampling.greedy:
            self._remember(first)
            return [first] * rows
        return [first] + [make() for _ in range(rows - 1)]

    def decode_batch(self, drafters: list[Drafter | None], prompts: list[list[int]], max_new_tokens: int, *,
                     k: int, eos_ids: tuple[int, ...] | list[int] = (), sampling: SamplingParams | None = None,
                     seed: int = 0, timeline: Timeline | None = None) -> list[GenerationResult]:
        """A batch (one target pass per step for all rows): the device step where it applies, else the host's."""
        sampling = sampling or SamplingParams()
        if any(isinstance(d, FEATURE_DRAFTERS) for d in drafters):
            raise UserError("a feature head drafts one sequence at a time for now; run it with batch_size 1")
        self._write_features(False)
        shared = drafters[0] if all(d is drafters[0] for d in drafters) else None
        if len(prompts) > 1 and isinstance(shared, ONE_SEQUENCE):
            raise UserError("a block drafter on CUDA drafts one sequence at a time: give each prompt its own "
                            "(Engine.batch_drafters) or run with batch_size 1")
        fits = sampling.greedy and all(fits_device_step(self.verifier, shared, len(p), k) for p in prompts)
        rows = self._device_rows(shared, k, len(prompts)) if fits and (shared is not None or drafters[0] is None) \
            else None
        if rows is None:  # host rows draft through guards of their own (a fallback model keeps one sequence)
            drafters = [self.guard(d, fallbacks=False) if d is not None else None for d in drafters]
        guard = self.guard(shared, fallbacks=False) if rows is not None and shared is not None else None
        return run_batch(self.verifier, drafters, prompts, max_new_tokens, eos_ids=eos_ids, sampling=sampling,
                         seed=seed, draft_length=k, timeline=timeline, device_rows=rows, guard=guard)

    def _device_rows(self, drafter: GraphDrafter | None, k: int, rows: int) -> DeviceRows:
        key = (id(drafter), k, rows)
        if key not in self.device_rows:
            self.device_rows[key] = DeviceRows(self.verifier, drafter, k, rows)
        return self.device_rows[key]

    def _tree_step(self, drafter: Drafter, tree: TreeSpec, sampling: SamplingParams, seed: int, k: int,
                   prompt_len: int) -> DeviceTreeStep | TreeStep:
        """Greedy trees on graph models replay one captured step (kept, like the chain's); others run eagerly."""
        if not fits_device_tree(self.verifier, drafter, tree, sampling.greedy, prompt_len, k):
            return tree_step(self.verifier, drafter, tree, sampling, seed, k)
        key = ("tree", id(drafter), tree_shape(tree, k))  # a static tree's shape does not depend on k
        if key not in self.device_steps:
            self.device_steps[key] = DeviceTreeStep(self.verifier, drafter, tree, k)
        return self.device_steps[key]

    def _remember(self, drafter: Drafter | None) -> None:
        if drafter is not None and all(d is not drafter for d in self.drafters):
            self.drafters.append(drafter)

    def _device_step(self, drafter: GraphDrafter | GraphFeatureDrafter | None, k: int,
                     guard: GuardedDrafter | None) -> DeviceStep:
        key = (id(drafter), k)
        if key not in self.device_steps:
            self.device_steps[key] = DeviceStep(self.verifier, drafter, k, guard)
        self.device_steps[key].guard = guard  # a caller may bring its own guard over the same drafter
        return self.device_steps[key]

    def warm_up(self, drafters: list[Drafter | None], prompt_ids: list[int], k_values: list[int],
                max_new_tokens: int, batch: int = 1, tree: TreeSpec | None = None, confidence: bool = False) -> float:
        """Capture and compile every graph the run will replay, on the run's own shapes; returns seconds.

        A short generation per drafter and draft length captures the prefill chunk, the device step and
        the draft graphs; `prepare` captures the verify-and-accept graph of every block length a host
        step can send (the last steps of a generation draft fewer than k), and with `confidence` (an adaptive
        threshold) the draft graphs that also write their drafts' top probabilities."""
        for drafter in drafters:
            self._remember(drafter)
        k_max = max(k_values, default=0)
        room = tree_room(tree, k_max) if tree is not None else 0
        self.reserve(max_seq_len(len(prompt_ids), max_new_tokens, k_max) + room, batch)
        start = time.perf_counter()
        depth = tree_shape(tree, k_max).depth if tree is not None else 0  # the device tree needs depth + 1 tokens
        warm_prompt = prompt_ids[: max(2, min(len(prompt_ids), max(24, depth + 2)))]
        with self.warming():
            for drafter in drafters:
                for k in k_values if drafter is not None else [0]:
                    on_tree = tree if drafter is not None else None  # a prompt short for the tree: its plain lead too
                    lead = max(0, device_tree_prompt_len(drafter, tree, k) - len(warm_prompt)) if on_tree else 0
                    self.decode(drafter, warm_prompt, min(max_new_tokens, k + 2 + lead), k=k, tree=on_tree)
            if tree is not None and any(d is not None for d in drafters):  # a later prompt may be short for the
                self.decode(None, warm_prompt[:2], 2, k=0)  # tree: its plain lead's graphs now, once
        if isinstance(self.verifier, GraphVerifier):  # the verify graphs with and without the feature write (a
            # tree's plain lead writes none: a one-token prompt's lead verifies on the host step)
            for on in sorted({self._reads_features(d) for d in drafters} | ({False} if tree is not None else set())):
                self._write_features(on)
                self.verifier.prepare(k_max + 1)
        for drafter in self.drafters:
            if isinstance(drafter, GraphDrafter):
                drafter.prepare(k_max + 1, confidence)  # overlap drafts k + 1 (the bonus guess first)
            elif isinstance(drafter, GraphFeatureDrafter):
                drafter.prepare(k_max)  # sync schedule only
        synchronize(self.verifier.device)
        return time.perf_counter() - start
