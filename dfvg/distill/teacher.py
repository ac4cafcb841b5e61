"""The teacher's side of distillation: the target's own continuations and its top-k distribution at each.

What this module owns: batched generation with DFVG's `Transformer` and its position-indexed cache, and the
per-position record of the target's top-k next-token probabilities (softmax at temperature 1, whatever
sampling picked the token). Those probabilities are exactly what a teacher-forced pass over the finished
continuation would give (same model, same prefix), so no second pass is needed. What it does not own:
which prompts (data.py), the cache file (data.py), the loss (train.py).

Batching without padding tricks: row b's prompt of L_b tokens is fed at its own absolute positions
0..L_b-2 (right-padded to the longest row; a pad's K/V lands at a slot >= L_b - 1, which the row overwrites
before it ever attends to it, because a query at position p only sees slots <= p and writes its own first).
Then every step feeds one token per row at that row's next position, so all rows advance in lockstep.
Example: prompts [5, 6, 7] and [8, 9]: prefill feeds [[5, 6], [8, pad]] at [[0, 1], [0, 1]]; step 1 feeds
[7, 9] at positions [2, 1]; the pad written at slot 1 of row 2 is overwritten by token 9 at slot 1.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from dfvg.model import Transformer
from dfvg.sampling import SamplingParams, processed_probs, sample_from


@dataclass
class TeacherSequence:
    """One prompt, the target's continuation, and its top-k distribution before each continuation token."""

    prompt: list[int]
    continuation: list[int]
    topk_ids: Tensor  # [n, K] int32: the target's K most likely ids before continuation[i]
    topk_probs: Tensor  # [n, K] float32: their probabilities (temperature 1)


def _prefill(model: Transformer, prompts: list[list[int]], device: torch.device) -> None:
    """Feed each prompt but its last token at its own positions (right-padded with token 0)."""
    width = max(len(p) for p in prompts) - 1
    if width == 0:
        return
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    for b, prompt in enumerate(prompts):
        ids[b, : len(prompt) - 1] = torch.tensor(prompt[:-1])
    positions = torch.arange(width)[None].expand(len(prompts), width)
    model(ids.to(device), positions.to(device), last_only=True)


def _pick(logits: Tensor, sampling: SamplingParams, generator: torch.Generator) -> Tensor:
    """Next ids [B] from logits [B, V]: argmax at temperature 0, else a draw from the processed distribution."""
    probs = processed_probs(logits, sampling)
    uniforms = torch.zeros(logits.shape[0]) if sampling.greedy else torch.rand(logits.shape[0], generator=generator)
    return sample_from(probs, uniforms)


@torch.no_grad()  # not inference_mode: its cache tensors would break a later eager prefill
def generate_batch(model: Transformer, prompts: list[list[int]], max_new_tokens: int, eos_ids: set[int],
                   top_k: int, sampling: SamplingParams, generator: torch.Generator) -> list[TeacherSequence]:
    """Continue every prompt (up to max_new_tokens, stopping a row at its first EOS, which is kept).

    Not a decoding path of DFVG: it makes training data, so it keeps the target's top-k distribution at
    every position (the distillation signal), which the engine's step never returns."""
    device = model.tok_embeddings.weight.device
    batch = len(prompts)
    model.setup_cache(batch, max(len(p) for p in prompts) + max_new_tokens)
    _prefill(model, prompts, device)
    current = torch.tensor([p[-1] for p in prompts], dtype=torch.long, device=device)
    positions = torch.tensor([len(p) - 1 for p in prompts], dtype=torch.long, device=device)
    tokens: list[list[int]] = [[] for _ in prompts]
    top_ids, top_probs = [], []
    done = [False] * batch
    for _ in range(max_new_tokens):
        logits = model(current[:, None], positions[:, None], last_only=True)[:, 0]  # [B, V]
        probs, ids = torch.softmax(logits, dim=-1).topk(top_k, dim=-1)  # [B, K]
        top_ids.append(ids.to(torch.int32).cpu())
        top_probs.append(probs.cpu())
        current = _pick(logits, sampling, generator).to(device)
        for b, token in enumerate(current.tolist()):
            if not done[b]:
                tokens[b].append(token)
                done[b] = token in eos_ids
        positions = positions + 1
        if all(done):
            break
    ids_all, probs_all = torch.stack(top_ids, dim=1), torch.stack(top_probs, dim=1)  # [B, steps, K]
    return [TeacherSequence(p, t, ids_all[b, : len(t)], probs_all[b, : len(t)])
            for b, (p, t) in enumerate(zip(prompts, tokens, strict=True))]


def generate_all(model: Transformer, prompts: list[list[int]], max_new_tokens: int, eos_ids: set[int],
                 top_k: int, sampling: SamplingParams, seed: int, batch_size: int,
                 log=print) -> list[TeacherSequence]:
    """All prompts in batches of similar length (less padding), returned in the prompts' order. Each batch's log
    line gives its tokens and seconds: on a device lease the teacher data took a quarter of the time, at a rate
    (~2k tokens/s at batch 128 on an H100) that the next lease should explain."""
    generator = torch.Generator().manual_seed(seed)
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    out: list[TeacherSequence | None] = [None] * len(prompts)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        began = time.perf_counter()
        batch = generate_batch(model, [prompts[i] for i in chunk], max_new_tokens, eos_ids, top_k, sampling,
                               generator)
        for i, seq in zip(chunk, batch, strict=True):
            out[i] = seq
        tokens = sum(len(seq.continuation) for seq in batch)
        log(f"teacher: {min(start + batch_size, len(order))}/{len(order)} prompts continued "
            f"({tokens} tokens, {max(len(prompts[i]) for i in chunk)}-token longest prompt, "
            f"{time.perf_counter() - began:.1f} s)")
    return out
