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
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from dfvg.gpu.graphs import capture_graph
from dfvg.model import Transformer
from dfvg.sampling import SamplingParams, processed_probs, sample_from

DONE_CHECK_STEPS = 16  # steps between the host's looks at whether every row ended (each look waits for the GPU)


@dataclass
class TeacherSequence:
    """One prompt, the target's continuation, and its top-k distribution before each continuation token."""

    prompt: list[int]
    continuation: list[int]
    topk_ids: Tensor  # [n, K] int32: the target's K most likely ids before continuation[i]
    topk_probs: Tensor  # [n, K] float32: their probabilities (temperature 1)


def _prefill(model: Transformer, prompts: list[list[int]], device: torch.device) -> None:
    """Feed each prompt but its last token at its own positions (right-padded with token 0).

    Every row starts at position 0, so attention reads only the first `width` slots, causally
    (`run_layers(causal_prefix=True)`: a fused kernel), not the whole cache under a mask; a pad never precedes
    a row's own token, so no row attends to one."""
    width = max(len(p) for p in prompts) - 1
    if width == 0:
        return
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    for b, prompt in enumerate(prompts):
        ids[b, : len(prompt) - 1] = torch.tensor(prompt[:-1])
    positions = torch.arange(width)[None].expand(len(prompts), width)
    model.run_layers(model.embed(ids.to(device)), positions.to(device), causal_prefix=True)


def _pick(logits: Tensor, sampling: SamplingParams, uniforms: Tensor | None) -> Tensor:
    """Next ids [B] from logits [B, V]: argmax at temperature 0, else a draw from the processed distribution."""
    if uniforms is None:
        return logits.argmax(dim=-1)
    return sample_from(processed_probs(logits, sampling), uniforms)


def _continuations(picked: Tensor, eos_ids: set[int]) -> list[list[int]]:
    """Rows of picked ids [B, steps], each cut after its first EOS (which is kept)."""
    rows = []
    for row in picked.tolist():
        ends = [i for i, token in enumerate(row) if token in eos_ids]
        rows.append(row[: ends[0] + 1] if ends else row)
    return rows


def _decode_step(model: Transformer, current: Tensor, positions: Tensor, graph: bool) -> Callable[[], Tensor]:
    """One batched decode step over the static buffers current, positions [B] -> float32 logits [B, V].

    With graph (on a GPU), the step is one CUDA graph: the eager forward launches ~1,100 kernels, one by one
    from Python: a batch of 128 rows x 128 steps took 1.36 s graphed against 3.3-5.4 s eager (H100,
    2026-12-05, benchmarks/teacher_speed.py). The graph runs the same operations; at the target's shapes it need not get
    the same GEMM kernels as eager calls (its outputs were not bit-identical there), and either is the target's
    own bf16 computation. Its warm-up runs the step on the buffers as they are, writing the K/V the first replay
    writes again. With a graph, the logits returned are its output buffer: the next call overwrites them."""
    if graph and current.device.type != "cuda":
        raise ValueError(f"a CUDA graph needs a CUDA model, this one is on {current.device}")

    def body() -> Tensor:
        return model(current[:, None], positions[:, None], last_only=True)[:, 0]

    if not graph:
        return body
    captured, logits = capture_graph(body, current.device)

    def replay() -> Tensor:
        captured.replay()
        return logits

    return replay


@torch.no_grad()  # not inference_mode: its cache tensors would break a later eager prefill
def generate_batch(model: Transformer, prompts: list[list[int]], max_new_tokens: int, eos_ids: set[int],
                   top_k: int, sampling: SamplingParams, generator: torch.Generator,
                   graph: bool | None = None) -> list[TeacherSequence]:
    """Continue every prompt (up to max_new_tokens, stopping a row at its first EOS, which is kept).

    Not a decoding path of DFVG: it makes training data, so it keeps the target's top-k distribution at
    every position (the distillation signal), which the engine's step never returns. The steps stay on the
    device: the host reads tokens only every DONE_CHECK_STEPS steps and at the end (a row past its EOS runs
    on and is cut). graph: each step one CUDA graph (`_decode_step`; default: on a GPU)."""
    device = model.tok_embeddings.weight.device
    batch = len(prompts)
    model.setup_cache(batch, max(len(p) for p in prompts) + max_new_tokens)
    _prefill(model, prompts, device)
    current = torch.tensor([p[-1] for p in prompts], dtype=torch.long, device=device)
    positions = torch.tensor([len(p) - 1 for p in prompts], dtype=torch.long, device=device)
    step_logits = _decode_step(model, current, positions, device.type == "cuda" if graph is None else graph)
    eos = torch.tensor(sorted(eos_ids), dtype=torch.long, device=device)
    uniforms = None if sampling.greedy else torch.rand(max_new_tokens, batch, generator=generator).to(device)
    picked, top_ids, top_probs = [], [], []
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    for step in range(max_new_tokens):
        logits = step_logits()  # [B, V]
        probs, ids = torch.softmax(logits, dim=-1).topk(top_k, dim=-1)  # [B, K]
        top_ids.append(ids.to(torch.int32))
        top_probs.append(probs)
        picked.append(_pick(logits, sampling, None if uniforms is None else uniforms[step]))
        current.copy_(picked[-1])
        positions += 1
        done |= torch.isin(current, eos)
        if (step + 1) % DONE_CHECK_STEPS == 0 and bool(done.all()):
            break
    tokens = _continuations(torch.stack(picked, dim=1).cpu(), eos_ids)
    ids_all, probs_all = torch.stack(top_ids, dim=1).cpu(), torch.stack(top_probs, dim=1).cpu()  # [B, steps, K]
    return [TeacherSequence(p, t, ids_all[b, : len(t)], probs_all[b, : len(t)])
            for b, (p, t) in enumerate(zip(prompts, tokens, strict=True))]


def generate_all(model: Transformer, prompts: list[list[int]], max_new_tokens: int, eos_ids: set[int],
                 top_k: int, sampling: SamplingParams, seed: int, batch_size: int,
                 log=print) -> list[TeacherSequence]:
    """All prompts in batches of similar length (less padding), returned in the prompts' order. Each batch's log
    line gives its tokens and seconds (a lease on 2026-12-05 spent 7.1 of its 30 min here, ~2k tokens/s at
    batch 128 on an H100, before the graphed step and the causal prefill)."""
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
