"""The draft's head vocabulary: the V token ids the target emits most often, and its file on disk.

What this module owns: counting the target's output tokens, choosing the head's ids (most frequent first,
EOS ids always in, ties broken by the lower id, then stored in ascending id order so that an argmax tie in
head space resolves to the same token as an argmax tie over the full vocabulary), and `draft_vocab.json`,
the human-readable record next to the weights. The ids the loader uses live in the checkpoint itself
(`lm_head.token_ids`, read by dfvg/checkpoint.py); `draft_vocab.json` records how they were chosen.

Why a subset head: with Qwen's 151,936-token vocabulary the LM head is the largest tensor of a small draft
(151,936 x 512 int8 = 78 MB, twice a U280's on-chip RAM). The target's continuations use far fewer distinct
ids; a token outside the head is simply never proposed, and the target still verifies the full vocabulary,
so decoding stays lossless (only acceptance can suffer).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from dfvg.checkpoint import checkpoint_dir, safetensors_files
from dfvg.errors import UserError

VOCAB_FILE = "draft_vocab.json"


def count_tokens(sequences: Iterable[list[int]]) -> Counter:
    """How often each id occurs in the given token sequences (the target's continuations)."""
    counts: Counter = Counter()
    for seq in sequences:
        counts.update(seq)
    return counts


def choose_head_vocab(counts: Counter, size: int, vocab_size: int, required: Iterable[int] = ()) -> Tensor:
    """The `size` head ids [size] (long, ascending): `required` ids (EOS), then the most frequent, then the
    lowest unseen ids as filler (a head never has fewer rows than asked, so the shape is the recipe's).

    Example: counts {7: 5, 3: 5, 9: 1}, size 3, required [1] -> 1, then 3 and 7 (tie on 5 -> lower id first)
    -> tensor([1, 3, 7]).
    """
    if not 0 < size <= vocab_size:
        raise UserError(f"--vocab-top must be in [1, {vocab_size}] (the target's vocabulary), got {size}")
    chosen = list(dict.fromkeys(i for i in required if 0 <= i < vocab_size))[:size]
    taken = set(chosen)
    ranked = sorted((i for i in counts if 0 <= i < vocab_size and i not in taken), key=lambda i: (-counts[i], i))
    chosen += ranked[: size - len(chosen)]
    taken = set(chosen)
    chosen += [i for i in range(vocab_size) if i not in taken][: size - len(chosen)]
    return torch.tensor(sorted(chosen), dtype=torch.long)


def head_ids_of(directory: str | Path) -> Tensor:
    """The head ids [V] a draft's (or a feature head's) checkpoint stores: `lm_head.token_ids` (--init-from
    keeps them, so a run that continues a draft on regenerated teacher data has that draft's head rows)."""
    for file in safetensors_files(checkpoint_dir(directory)):
        with safe_open(str(file), framework="pt") as handle:
            if "lm_head.token_ids" in handle.keys():
                return handle.get_tensor("lm_head.token_ids").long()
    raise UserError(f"{directory} has no subset head (lm_head.token_ids); start from a draft trained with "
                    "--vocab-top, or pass --vocab-top 0")


def coverage(counts: Counter, head_ids: Tensor) -> float:
    """Fraction of counted target tokens that the head can propose (an upper bound on acceptance)."""
    total = sum(counts.values())
    inside = set(head_ids.tolist())
    return sum(c for i, c in counts.items() if i in inside) / total if total else 0.0


def save_vocab(directory: str | Path, head_ids: Tensor, counts: Counter, source: str) -> None:
    """Write draft_vocab.json: the ids, each one's count in the teacher data, and the coverage."""
    record = {
        "head_vocab": int(head_ids.numel()),
        "token_ids": head_ids.tolist(),
        "counts": [int(counts.get(i, 0)) for i in head_ids.tolist()],
        "coverage_of_teacher_tokens": coverage(counts, head_ids),
        "source": source,
        "note": "lm_head.token_ids in model.safetensors is what DFVG loads; this file records the choice",
    }
    (Path(directory) / VOCAB_FILE).write_text(json.dumps(record))


@torch.no_grad()
def token_rows(target_embed: Tensor, head_ids: Tensor, device: torch.device | str = "cpu",
               chunk: int = 4096) -> Tensor:
    """Long [V]: the embedding row of every token id for a draft whose input embedding has the head's rows.

    A head token reads its own row; any other token reads the row of the head token nearest to it in the
    target's input-embedding space (cosine), so a rare prompt token still arrives as something similar,
    not as a shared "unknown" vector. Example: head ids [3, 7]; a token whose target embedding is closest
    to token 7's reads row 1."""
    head = torch.nn.functional.normalize(target_embed[head_ids].float().to(device), dim=-1)  # [Vh, Dt]
    rows = torch.empty(target_embed.shape[0], dtype=torch.long)
    for start in range(0, target_embed.shape[0], chunk):
        part = torch.nn.functional.normalize(target_embed[start : start + chunk].float().to(device), dim=-1)
        rows[start : start + chunk] = (part @ head.T).argmax(-1).cpu()
    rows[head_ids] = torch.arange(head_ids.numel())
    return rows


def head_rows(head_ids: Tensor | None, vocab_size: int, device: torch.device | str = "cpu") -> Tensor:
    """Long [vocab_size]: each id's row of the draft's head (`Transformer.head_logits`), -1 where the draft cannot
    propose it (every id is its own row for a full-vocabulary head)."""
    if head_ids is None:
        return torch.arange(vocab_size, device=device)
    rows = torch.full((vocab_size,), -1, dtype=torch.long, device=device)
    rows[head_ids.to(device)] = torch.arange(head_ids.numel(), device=device)
    return rows
