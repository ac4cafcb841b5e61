"""Greedy decoding with the whole step on the device: one graph replay and one small copy per step.

Why: `dfvg.generate` is the reference loop — readable, any sampling, any drafter — but each step crosses
to the host several times (draft tokens out, logits through `accept`). Here a speculative step is one CUDA
graph: k draft steps (catch-up on the last two committed tokens, then k-1 single tokens), the (k+1)-token
verify, fused greedy acceptance (`dfvg.gpu.kernels.greedy_accept`) and the update of the device-resident
state [prev_token, last_token, last_pos]. The host then copies k+2 integers back — the one sync
acceptance needs — commits them, and checks EOS and the length. Plain decoding is the k = 0 case (one
target step per replay).

Greedy output equals the reference loop's up to bf16 rounding: the graph's kernels (compiled blocks,
float32 attention) round differently than eager SDPA, so a near-tie may flip; the benchmark reports the
token-match rate. Stats differ in one place: every step drafts k (the reference drafts fewer in the last
step), and committed tokens past max_new_tokens are dropped.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from dfvg.devices import synchronize
from dfvg.generate import GenerationResult, check_lengths, generate
from dfvg.gpu.graphs import GraphDrafter, GraphModel, GraphVerifier, draft_body
from dfvg.gpu.kernels import greedy_accept
from dfvg.stats import StepRecord


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


class FastGreedy:
    """Captured greedy step for one (verifier, drafter, k); reused across prompts."""

    def __init__(self, verifier: GraphVerifier, drafter: GraphDrafter | None, k: int):
        self.verifier, self.drafter = verifier, drafter
        self.k = k if drafter is not None else 0
        self.graph = None

    def _capture(self) -> None:
        target = self.verifier.gm
        draft = self.drafter.gm if self.drafter is not None else None
        device = target.device
        scratch = min(target.scratch_pos, draft.scratch_pos if draft else target.scratch_pos)
        self.state = torch.zeros(3, dtype=torch.long, device=device)
        self.drafts = torch.zeros(self.k, dtype=torch.long, device=device)
        self.record = torch.zeros(self.k + 2, dtype=torch.long, device=device)
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

    def prefill(self, prompt_ids: list[int], max_new_tokens: int) -> None:
        max_seq_len = len(prompt_ids) + max_new_tokens + self.k + 1
        self.verifier.prefill(prompt_ids, max_seq_len)
        if self.drafter is not None:
            self.drafter.prefill(prompt_ids, max_seq_len)
        if self.graph is None or self._cache_ids != self._cache_key():
            self._capture()
        length = len(prompt_ids)
        self.state.copy_(torch.tensor([prompt_ids[-2], prompt_ids[-1], length - 1]))

    def generate(self, prompt_ids: list[int], max_new_tokens: int, eos_ids=()) -> GenerationResult:
        """Greedy generation; EOS kept and stops, as `dfvg.generate.generate` does."""
        check_lengths(prompt_ids, max_new_tokens, self.k, self.verifier.model.config.max_position_embeddings)
        if len(prompt_ids) < 2:  # the device step needs a token before the last one
            return generate(self.verifier, prompt_ids, max_new_tokens, eos_ids=eos_ids, drafter=self.drafter,
                            draft_length=self.k)
        start = time.perf_counter()
        self.prefill(prompt_ids, max_new_tokens)
        synchronize(self.verifier.device)
        result = GenerationResult(tokens=[], prefill_s=time.perf_counter() - start)
        eos = set(eos_ids)
        decode_start = step_start = time.perf_counter()
        while len(result.tokens) < max_new_tokens:
            self.graph.replay()
            num, nxt, *drafts = self.record.tolist()  # the step's one device-to-host copy
            now = time.perf_counter()
            result.steps.append(StepRecord(self.k, num, 0.0, now - step_start, None))
            step_start = now
            committed = (drafts[:num] + [nxt])[: max_new_tokens - len(result.tokens)]
            result.commit(committed, eos)
            if result.hit_eos:
                break
        result.decode_s = time.perf_counter() - decode_start
        return result
