"""Greedy steps on the device: one graph replay and one small copy per step, for one sequence or a batch.

Why: the host step (`dfvg.generate.HostStep`) crosses to the host several times per step (draft tokens out,
logits through acceptance). Here those crossings become graph replays whose only output is a few integers:
- `DeviceRows` runs the whole step of B sequences as one CUDA graph: k draft steps of a GPU draft for every
  row (catch-up on each row's last two committed tokens, then k-1 single tokens), the (k+1)-token verify of
  all rows in one target pass (row b reads and writes its own cache row at its own positions), fused greedy
  acceptance per row (`dfvg.gpu.kernels.greedy_accept`) and the update of the device-resident state
  [prev_token, last_token, last_pos] of every row that is still decoding. The host copies B x (k+2) integers
  back - the one sync acceptance needs. Plain decoding is its k = 0 case.
- `DeviceStep` is the engine's `Step` for one sequence: `DeviceRows` with B = 1 (fused Triton layers). With
  a feature head (`GraphFeatureDrafter`) the same replay drafts with the head (`feature_step_body`: its
  catch-up on the last k + 1 committed positions with the target's features, which the verify writes) and
  keeps the committed tokens on the device for that catch-up; so does a block drafter (`dfvg.block_draft`:
  `block_step_body`, one draft pass of the last k + 1 committed tokens and k - 1 mask tokens).
  Batches (`dfvg.host.batch.DeviceBatchStep`) use the same rows with B > 1 (compiled blocks).
- `dfvg.gpu.graphs.verify_greedy` is the verify-and-accept half alone, for drafts made elsewhere (the FPGA
  datapath, an XRT board, a CPU draft): the drafts go into the same captured verify + acceptance, so every
  greedy GPU verification costs the same, whoever drafted.

Why the catch-up is always two tokens, whatever a row accepted: after a step that accepted n of k drafts,
the draft cache holds the drafts fed at the step's positions; the first n are committed, so everything
before the new last two committed tokens is valid, and those two are fed again (n = k included: the k-th
draft was never fed). The graph has one shape and always drafts k; tokens committed past max_new_tokens are
cut by the loop. A single sequence's replay is a proposal of the guarded drafter (`dfvg.fallback`): when it
raises or misses the watchdog's deadline, that step and the rest of the generation run on the host step over
the same guard, which drafts with the next drafter of its chain or none (the target's cache is
position-indexed: the host step's verify overwrites what the failed replay wrote). Greedy output equals the
host step's up to bf16 rounding on a GPU (a near-tie may flip); on a CPU (tests) the same bodies run eagerly.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import Tensor

from dfvg.drafter import DraftBlock
from dfvg.fallback import GuardedDrafter, take_faults
from dfvg.generate import GREEDY, HostStep, Outcome
from dfvg.gpu.graph_drafter import GraphBlockDrafter, GraphDrafter, block_body, draft_body, mask_tokens
from dfvg.gpu.graph_head import GraphFeatureDrafter, feature_block, feature_block_pass
from dfvg.gpu.graphs import VERIFY_ROWS, GraphModel, GraphVerifier
from dfvg.gpu.kernels import greedy_accept

# The single-sequence step launches its next replay before the host reads this one's record (that replay's inputs
# are on the device already), so the GPU does not idle while the host commits tokens and runs the loop: plain
# decoding took 1.869 ms a token against a 1.801 ms graphed step (H100, RESULTS.md 2026-12-06 16:11 UTC). A
# generation that stops leaves one replay unread: it rewrote the last committed positions with the same values and
# wrote past them, and the next prefill and verify overwrite those before anything reads them. As a precaution it
# is launched only where its positions stay below the scratch slots. Same tokens (CPU and GPU tests; 20/20 prompts).
# Against off, the real pair, in one run each (H100, RESULTS.md 2026-12-06 18:27 UTC): plain 1.014x / 1.004x / 1.008x
# tok/s, the draft's k = 4 chain 1.054x / 1.084x / 1.080x, the feature head's 1.052x / 1.066x / 1.074x.
LOOKAHEAD = True
ONE_SEQUENCE = (GraphFeatureDrafter, GraphBlockDrafter)  # drafters whose step keeps the committed tokens on the device


def accept_rows(logits: Tensor, drafts: Tensor) -> tuple[Tensor, Tensor]:
    """Greedy acceptance of every row: logits [B, k+1, V], drafts [B, k] -> accepted, next token [B, 1].
    One fused acceptance per row (B small launches inside the graph), so a batch row is decided exactly as a
    single sequence is."""
    outs = [greedy_accept(logits[b], drafts[b]) for b in range(logits.shape[0])]
    return torch.stack([out[0:1] for out in outs]), torch.stack([out[1:2] for out in outs])


def step_body(target: GraphModel, drafter: GraphModel | None, state: Tensor, drafts: Tensor, record: Tensor,
              active: Tensor, vocab: int) -> Tensor:
    """One greedy step of B rows. state [B, 3]; drafts [B, k]; active [B, 1] (0: a finished row keeps its
    state, so it recomputes the same positions); record [B, k+2] <- [n, next, drafts] per row."""
    k = drafts.shape[1]
    if k:
        draft_body(drafter, state, drafts, vocab)
    ids = torch.cat([state[:, 1:2], drafts], dim=1)  # [B, k+1]
    pos = state[:, 2:3] + torch.arange(k + 1, device=state.device)
    num, nxt = accept_rows(target.forward_rows(ids, pos), drafts)
    prev = ids.gather(1, num)  # the token before the new last one: last_token (n=0) or draft n
    moved = torch.cat([prev, nxt, state[:, 2:3] + num + 1], dim=1)
    state.copy_(torch.where(active.bool(), moved, state))
    record.copy_(torch.cat([num, nxt, drafts], dim=1))
    return record


def feature_step_body(target: GraphModel, drafter: GraphFeatureDrafter, state: Tensor, history: Tensor,
                      drafts: Tensor, record: Tensor, vocab: int, masks: Tensor | None = None) -> Tensor:
    """One greedy step of one sequence drafted by a feature head. state [1, 3] as `step_body`'s; history [S]
    the committed tokens by position (this step writes its own).

    The head's catch-up is always the last k + 1 committed positions, fed with the target's features
    (target.features, written by every verify): the positions a previous block fed with the head's own f^
    are rewritten with the true ones, and the others with the same values they hold, so one shape serves
    every accepted count (the standalone draft's two-token catch-up, for a head). A block feature head's `masks`
    follow them in the same pass (`feature_block_pass`)."""
    k = drafts.shape[1]
    last_pos = state[0, 2]
    fed = last_pos - k + torch.arange(k + 1, device=state.device)  # positions L-1-k .. L-1
    if masks is not None:
        feature_block_pass(drafter.head, drafter.gm, history[fed], fed, target.features[fed - 1], masks, drafts, vocab)
    else:
        feature_block(drafter.head, drafter.gm, history[fed], fed, target.features[fed - 1], drafts, vocab)
    return verify_and_commit(target, state, history, drafts, record)


def block_step_body(target: GraphModel, drafter: GraphBlockDrafter, state: Tensor, history: Tensor, masks: Tensor,
                    drafts: Tensor, record: Tensor, vocab: int) -> Tensor:
    """One greedy step of one sequence drafted by a block drafter (dfvg.block_draft): the last k + 1 committed
    tokens (from history, as the feature head's catch-up) and k - 1 masks in one draft pass, then the verify."""
    k = drafts.shape[1]
    fed = state[0, 2] - k + torch.arange(k + 1, device=state.device)  # positions L-1-k .. L-1
    block_body(drafter.gm, history[fed][None], fed[None, :1], masks, drafts, vocab)
    return verify_and_commit(target, state, history, drafts, record)


def verify_and_commit(target: GraphModel, state: Tensor, history: Tensor, drafts: Tensor, record: Tensor) -> Tensor:
    """The verify half of a one-sequence step that keeps its committed tokens on the device (history [S])."""
    k, last_pos = drafts.shape[1], state[0, 2]
    ids = torch.cat([state[:, 1:2], drafts], dim=1)  # [1, k+1]
    pos = state[:, 2:3] + torch.arange(k + 1, device=state.device)
    num, nxt = accept_rows(target.forward_rows(ids, pos), drafts)
    history.index_copy_(0, pos[0, 1:], drafts[0])  # drafts past the accepted ones are overwritten later
    history.index_copy_(0, (last_pos + num[0] + 1), nxt[0])
    state.copy_(torch.cat([ids.gather(1, num), nxt, state[:, 2:3] + num + 1], dim=1))
    record.copy_(torch.cat([num, nxt, drafts], dim=1))
    return record


class DeviceRows:
    """The captured greedy step of `rows` sequences over a graph verifier and a graph drafter (or none)."""

    def __init__(self, verifier: GraphVerifier, drafter: GraphDrafter | GraphFeatureDrafter | None, k: int,
                 rows: int = 1):
        if isinstance(drafter, ONE_SEQUENCE) and rows != 1:
            raise ValueError("a feature head or a block drafter drafts one sequence at a time")
        self.verifier, self.drafter, self.rows = verifier, drafter, rows
        self.device = verifier.device
        self.k = k if drafter is not None else 0
        self.graph = None
        self._cache_ids: tuple = ()
        self._pinned: Tensor | None = None
        self._copied = None

    def holders(self) -> list[GraphVerifier | GraphDrafter]:
        """The graph models this step replays over, with their cache-size floors (`min_cache_len`)."""
        return [self.verifier] + ([self.drafter] if self.drafter is not None else [])

    def _capture(self) -> None:
        target = self.verifier.gm
        draft = self.drafter.gm if self.drafter is not None else None
        scratch = min(holder.gm.scratch_pos for holder in self.holders())
        self.state = torch.zeros(self.rows, 3, dtype=torch.long, device=self.device)
        self.drafts = torch.zeros(self.rows, self.k, dtype=torch.long, device=self.device)
        self.record = torch.zeros(self.rows, self.k + 2, dtype=torch.long, device=self.device)
        self.active = torch.ones(self.rows, 1, dtype=torch.long, device=self.device)
        vocab = self.verifier.vocab_size

        def reset() -> None:
            self.state.copy_(torch.tensor([[0, 0, scratch + 1]]).expand(self.rows, 3))

        body = lambda: step_body(target, draft, self.state, self.drafts, self.record, self.active, vocab)  # noqa: E731
        if isinstance(self.drafter, ONE_SEQUENCE):
            self.history = torch.zeros(target.cache_len, dtype=torch.long, device=self.device)
        if isinstance(self.drafter, GraphFeatureDrafter):
            self.masks = mask_tokens(draft, self.k) if self.drafter.block_size else None  # as a block drafter's
            body = lambda: feature_step_body(target, self.drafter, self.state, self.history, self.drafts,  # noqa: E731
                                             self.record, vocab, self.masks)
        elif isinstance(self.drafter, GraphBlockDrafter):
            self.masks = mask_tokens(draft, self.k)  # held here: the captured graph reads this memory
            body = lambda: block_step_body(target, self.drafter, self.state, self.history, self.masks,  # noqa: E731
                                           self.drafts, self.record, vocab)
        self.graph, _ = target.capture(("fast", self.k, self.rows, id(draft)), body, before=reset)
        self._cache_ids = self._cache_key()

    def _cache_key(self) -> tuple:
        return tuple(holder.gm._cache_id for holder in self.holders())

    def start(self, prompts: list[list[int]]) -> None:
        """Rows take their prompts (already in every cache); the graph is captured on first use or after a
        cache reallocation."""
        if self.graph is None or self._cache_ids != self._cache_key():
            self._capture()
        self.state.copy_(torch.tensor([[p[max(len(p) - 2, 0)], p[-1], len(p) - 1] for p in prompts]))
        self.active.fill_(1)
        if isinstance(self.drafter, ONE_SEQUENCE):
            self.history[: len(prompts[0])].copy_(torch.tensor(prompts[0]))

    def retire(self, row: int) -> None:
        """Row `row` finished: it stops advancing (and so stays inside its cache)."""
        self.active[row] = 0

    def replay(self) -> list[list[int]]:
        """One step of every row: [n, next, *drafts] per row (the step's one device-to-host copy)."""
        self.graph.replay()
        return self.record.tolist()

    def record_copy(self) -> Callable[[], list[list[int]]]:
        """Start copying the last replay's record to the host; the call returned waits for that copy only, so a
        replay launched in between (`LOOKAHEAD`) runs on while the host reads it."""
        if self.device.type != "cuda":  # eager replays: nothing is in flight
            return self.record.clone().tolist
        with torch.cuda.device(self.device):  # the event on this device's stream (a watchdog thread's current
            # device is cuda:0 whatever the caller's)
            if self._pinned is None:
                self._pinned, self._copied = torch.empty(self.record.shape, dtype=self.record.dtype,
                                                         pin_memory=True), torch.cuda.Event()
            self._pinned.copy_(self.record, non_blocking=True)
            self._copied.record()
        return lambda: (self._copied.synchronize(), self._pinned.tolist())[1]


class DeviceStep:
    """The engine's step for one sequence on a graph verifier and a graph drafter (or none): one replay."""

    def __init__(self, verifier: GraphVerifier, drafter: GraphDrafter | GraphFeatureDrafter | None, k: int,
                 guard: GuardedDrafter | None = None):
        self.rows = DeviceRows(verifier, drafter, k, 1)
        self.verifier, self.drafter, self.device = verifier, drafter, verifier.device
        self.guard = guard  # drafter is the guard's live drafter
        self.host: HostStep | None = None  # after a fault: this generation's remaining steps
        self.ahead = False  # a replay launched past the last record read (`LOOKAHEAD`)

    def prefill(self, prompt_ids: list[int], max_seq_len: int) -> None:
        """Both caches take the prompt; then the captured step starts from its last two tokens."""
        if len(prompt_ids) < 2 and self.rows.k:
            raise ValueError("DeviceStep drafts from the token before the last one: use HostStep for 1-token prompts")
        self.verifier.prefill(prompt_ids, max_seq_len)
        self.host, self.ahead = None, False  # (an unread replay of the last generation ran before this prefill)
        if self.guard is not None:
            self.guard.prefill(prompt_ids, max_seq_len)
            if self.guard.live is not self.drafter:  # it failed to prefill: the host step drafts with the next
                self._to_host()
                return
        elif self.drafter is not None:
            self.drafter.prefill(prompt_ids, max_seq_len)
        self.rows.start([prompt_ids])

    def __call__(self, seq: list[int], k: int) -> Outcome:
        if self.host is None:
            start = time.perf_counter()
            replay = lambda: self._replay(len(seq))  # noqa: E731
            ok, replayed = self.guard.run(replay) if self.guard is not None else (True, replay())
            if ok:  # (set here, not by a watchdog thread whose call was abandoned)
                record, self.ahead = replayed
                num, nxt, *drafts = record
                self.verifier.features_end = len(seq) + self.rows.k  # the verify rows' features (a head's host
                # step reads them should a later replay fail)
                return Outcome(DraftBlock(drafts, None, 0.0), num, nxt, time.perf_counter() - start,
                               take_faults(self.guard))
            self._to_host()
        return self.host(seq, k)

    def _replay(self, committed: int) -> tuple[list[int], bool]:
        """This step's record, and whether the next step is already replaying (`LOOKAHEAD`, where its positions
        stay below every cache's scratch slots; `committed`: the tokens before this step)."""
        if not LOOKAHEAD:
            return self.rows.replay()[0], False
        if not self.ahead:
            self.rows.graph.replay()
        read = self.rows.record_copy()
        ahead = self._room_for_next(committed)
        if ahead:
            self.rows.graph.replay()
        return read()[0], ahead

    def _room_for_next(self, committed: int) -> bool:
        """Whether the step after this one stays below the scratch slots: this step moves the last position
        (committed - 1) by at most k + 1, the next writes k + 1 positions from there and a head's history one more.
        A precaution: past them it would write scratch slots, which nothing reads between captures."""
        k = self.rows.k
        return committed + 2 * k + 2 <= min(holder.gm.scratch_pos for holder in self.rows.holders())

    def _to_host(self) -> None:
        """Continue this generation on the host step: both caches are filled, the guard knows the fault."""
        self.host, self.ahead = HostStep(self.verifier, self.guard, GREEDY, torch.Generator()), False


def fits_device_step(verifier: object, drafter: object, prompt_len: int, k: int) -> bool:
    """Whether the device step can run this generation: graph models only, a token before the last one (a
    feature head: the k + 1 positions of its catch-up, each after a position with a feature), and at most the
    acceptance kernel's rows."""
    head = isinstance(drafter, GraphFeatureDrafter)
    graph_drafter = drafter is None or isinstance(drafter, GraphDrafter) or head
    shortest = k + 2 if head else k + 1 if isinstance(drafter, GraphBlockDrafter) else 2
    size = getattr(drafter, "block_size", None)  # a block drafter or block feature head: one pass of k <= size
    within = not size or 1 <= k <= size
    return (isinstance(verifier, GraphVerifier) and graph_drafter and within and prompt_len >= shortest
            and k + 1 <= VERIFY_ROWS)
