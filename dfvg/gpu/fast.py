"""Greedy steps on the device: one graph replay and one small copy per step.

Why: the host step (`dfvg.generate.HostStep`) crosses to the host several times per step (draft tokens out,
logits through acceptance). Here those crossings become graph replays whose only output is a few integers:
- `DeviceStep` runs the whole step as one CUDA graph: k draft steps of a GPU draft (catch-up on the last
  two committed tokens, then k-1 single tokens), the (k+1)-token verify, fused greedy acceptance
  (`dfvg.gpu.kernels.greedy_accept`) and the update of the device-resident state
  [prev_token, last_token, last_pos]. The host copies k+2 integers back - the one sync acceptance needs.
  Plain decoding is its k = 0 case (one target step per replay).
- `dfvg.gpu.graphs.verify_greedy` is the verify-and-accept half alone, for drafts made elsewhere (the FPGA datapath, an
  XRT board, a CPU draft): the drafts go into the same captured verify + acceptance that `DeviceStep` runs,
  so every greedy GPU verification costs the same, whoever drafted.

Both are steps of the engine's one loop (`dfvg.generate.decode`). `DeviceStep` always drafts k: the graph
has one shape, and tokens committed past max_new_tokens are cut by the loop. Its replay is a proposal of
the guarded drafter (`dfvg.fallback`): when it raises or misses the watchdog's deadline, that step and the
rest of the generation run on the host step over the same guard, which drafts with the next drafter of its
chain or none (the target's cache is position-indexed: the host step's verify overwrites what the failed
replay wrote). Greedy output equals the host
step's up to bf16 rounding on a GPU (a near-tie may flip); on a CPU (tests) the same bodies run eagerly.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from dfvg.drafter import DraftBlock
from dfvg.fallback import GuardedDrafter, take_faults
from dfvg.generate import GREEDY, HostStep, Outcome
from dfvg.gpu.graphs import VERIFY_ROWS, GraphDrafter, GraphModel, GraphVerifier, draft_body
from dfvg.gpu.kernels import greedy_accept


def step_body(target: GraphModel, drafter: GraphModel | None, state: Tensor, drafts: Tensor,
              record: Tensor, vocab: int) -> Tensor:
    """One greedy step on the device. state [3] long; drafts [k]; record [k+2] <- [n, next, drafts]."""
    k = drafts.shape[0]
    if k:
        draft_body(drafter, state, drafts, vocab)
    ids = torch.cat([state[1:2], drafts]).view(1, k + 1)
    pos = state[2] + torch.arange(k + 1, device=state.device)
    out = greedy_accept(target.forward(ids, pos), drafts)  # [k+3]: n, next, argmax rows
    num = out[0:1]
    prev = ids[0].gather(0, num)  # the token before the new last one: last_token (n=0) or draft n
    state.copy_(torch.cat([prev, out[1:2], state[2:3] + num + 1]))
    record.copy_(torch.cat([out[:2], drafts]))
    return record


class DeviceStep:
    """The engine's step for a graph verifier and a graph drafter (or none): one replay, k+2 ints back."""

    def __init__(self, verifier: GraphVerifier, drafter: GraphDrafter | None, k: int,
                 guard: GuardedDrafter | None = None):
        self.verifier, self.drafter, self.guard = verifier, drafter, guard  # guard: drafter is its live one
        self.device = verifier.device
        self.k = k if drafter is not None else 0
        self.graph = None
        self._cache_ids: tuple = ()
        self.host: HostStep | None = None  # after a fault: this generation's remaining steps

    def _capture(self) -> None:
        target = self.verifier.gm
        draft = self.drafter.gm if self.drafter is not None else None
        scratch = min(target.scratch_pos, draft.scratch_pos if draft else target.scratch_pos)
        self.state = torch.zeros(3, dtype=torch.long, device=self.device)
        self.drafts = torch.zeros(self.k, dtype=torch.long, device=self.device)
        self.record = torch.zeros(self.k + 2, dtype=torch.long, device=self.device)
        vocab = self.verifier.vocab_size

        def reset() -> None:
            self.state.copy_(torch.tensor([0, 0, scratch + 1]))

        self.graph, _ = target.capture(("fast", self.k, id(draft)),
                                       lambda: step_body(target, draft, self.state, self.drafts, self.record,
                                                         vocab), before=reset)
        self._cache_ids = self._cache_key()

    def _cache_key(self) -> tuple:
        gms = [self.verifier.gm] + ([self.drafter.gm] if self.drafter is not None else [])
        return tuple(gm._cache_id for gm in gms)

    def prefill(self, prompt_ids: list[int], max_seq_len: int) -> None:
        """Both caches take the prompt; the graph is captured on first use (or after a cache reallocation)."""
        if len(prompt_ids) < 2 and self.k:
            raise ValueError("DeviceStep drafts from the token before the last one: use HostStep for 1-token prompts")
        self.verifier.prefill(prompt_ids, max_seq_len)
        self.host = None
        if self.guard is not None:
            self.guard.prefill(prompt_ids, max_seq_len)
            if self.guard.live is not self.drafter:  # it failed to prefill: the host step drafts with the next
                self._to_host()
                return
        elif self.drafter is not None:
            self.drafter.prefill(prompt_ids, max_seq_len)
        if self.graph is None or self._cache_ids != self._cache_key():
            self._capture()
        self.state.copy_(torch.tensor([prompt_ids[max(len(prompt_ids) - 2, 0)], prompt_ids[-1], len(prompt_ids) - 1]))

    def __call__(self, seq: list[int], k: int) -> Outcome:
        if self.host is None:
            start = time.perf_counter()
            ok, record = self.guard.run(self._replay) if self.guard is not None else (True, self._replay())
            if ok:
                num, nxt, *drafts = record
                return Outcome(DraftBlock(drafts, None, 0.0), num, nxt, time.perf_counter() - start,
                               take_faults(self.guard))
            self._to_host()
        return self.host(seq, k)

    def _replay(self) -> list[int]:
        self.graph.replay()
        return self.record.tolist()  # the step's one device-to-host copy

    def _to_host(self) -> None:
        """Continue this generation on the host step: both caches are filled, the guard knows the fault."""
        self.host = HostStep(self.verifier, self.guard, GREEDY, torch.Generator())


def fits_device_step(verifier: object, drafter: object, prompt_len: int, k: int) -> bool:
    """Whether `DeviceStep` can run this generation: graph models only, a token before the last one, and at
    most the acceptance kernel's rows."""
    graph_drafter = drafter is None or isinstance(drafter, GraphDrafter)
    return isinstance(verifier, GraphVerifier) and graph_drafter and prompt_len >= 2 and k + 1 <= VERIFY_ROWS
