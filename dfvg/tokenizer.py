"""Tokenizer loading, prompt encoding (raw or through the chat template), EOS ids and the draft/target
compatibility check.

The engine works on token ids only; this module is the one place that turns text into ids and back. A draft
can only propose tokens the target understands, so a draft whose vocabulary differs from the target's
(same strings mapped to different ids) is refused before anything runs.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tokenizers import Tokenizer

from dfvg.chat import find_chat_template, render_chat
from dfvg.checkpoint import checkpoint_dir, read_json
from dfvg.errors import UserError


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The `tokenizers` tokenizer of a checkpoint directory (tokenizer.json)."""
    file = checkpoint_dir(path) / "tokenizer.json"
    if not file.is_file():
        raise UserError(f"tokenizer.json not found in {file.parent} (DFVG needs the fast tokenizer file)")
    try:
        return Tokenizer.from_file(str(file))
    except Exception as err:  # the Rust side raises a bare Exception with its parse error
        raise UserError(f"cannot read {file} ({err}); copy tokenizer.json again from the model's source") from None


def eos_token_ids(path: str | Path) -> list[int]:
    """EOS ids from generation_config.json (preferred, as HF generate does) or config.json."""
    directory = checkpoint_dir(path)
    for name in ("generation_config.json", "config.json"):
        file = directory / name
        if file.is_file():
            value = read_json(file, name).get("eos_token_id")
            if value is not None:
                return sorted({value} if isinstance(value, int) else set(value))
    return []


def vocabulary_fingerprint(tokenizer: Tokenizer) -> str:
    """A hash of the token-string -> id map (added tokens included)."""
    vocab = sorted(tokenizer.get_vocab(with_added_tokens=True).items())
    return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()


def check_compatible(target: Tokenizer, draft: Tokenizer, draft_dir: str | Path) -> None:
    """Refuse a draft whose vocabulary is not the target's: its ids would mean other strings."""
    if vocabulary_fingerprint(target) != vocabulary_fingerprint(draft):
        target_size, draft_size = target.get_vocab_size(), draft.get_vocab_size()
        raise UserError(
            f"the draft's tokenizer ({draft_dir}) differs from the target's "
            f"(vocab {draft_size} vs {target_size} entries or different ids); pick a draft of the same family"
        )


def encode(tokenizer: Tokenizer, text: str, add_special_tokens: bool = True) -> list[int]:
    """Token ids of `text`; `add_special_tokens` lets the tokenizer's post-processor add e.g. Llama's BOS."""
    ids = tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
    if not ids:
        raise UserError("the prompt encodes to zero tokens; give a non-empty prompt")
    return ids


def encode_prompt(tokenizer: Tokenizer, checkpoint: str | Path, prompt: str,
                  chat: bool = True) -> tuple[list[int], bool]:
    """(prompt ids, whether the chat template was applied). With `chat` and a checkpoint that has a chat
    template, `prompt` becomes the one user message of a rendered conversation; otherwise it is raw text.

    The rendered text already holds every special token the template wants (BOS included), so it is encoded
    without the post-processor's additions, as HF's `apply_chat_template` does.
    """
    template = find_chat_template(checkpoint) if chat else None
    if template is None:
        return encode(tokenizer, prompt), False
    return encode(tokenizer, render_chat(template, prompt), add_special_tokens=False), True


def check_fits(prompts: list[dict], max_new_tokens: int, context: int, source: str) -> None:
    """Refuse, before anything runs, prompts (`{"id", "ids"}`) that leave no room for max_new_tokens."""
    too_long = [p for p in prompts if len(p["ids"]) + max_new_tokens > context]
    if too_long:
        worst = max(too_long, key=lambda p: len(p["ids"]))
        raise UserError(f"{source}: prompt {worst['id']!r} has {len(worst['ids'])} tokens, which with max_new_tokens "
                        f"{max_new_tokens} exceeds the target's context of {context} positions ({len(too_long)} "
                        "prompt(s) too long); lower max_new_tokens or drop the long prompts")


def decode(tokenizer: Tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)
