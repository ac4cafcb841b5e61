"""A feature-level draft head (EAGLE-style, FPGA-sized): it drafts from the target's own last hidden states.

Why: a standalone small draft guesses the target's next token from tokens alone. The target's final hidden
state at a position already holds its next-token distribution, so a head that reads it needs far less
capacity for the same acceptance (EAGLE, Li et al. 2024). DFVG keeps the head at FPGA size: a small qwen2
body of `d` wide layers with its own LM head over a token subset (the distilled draft's recipe,
docs/distill.md), plus two projections to and from the target's width H.

The feature f_p is the target's final-norm output at position p: what its LM head reads to predict token
p + 1. At position p the head reads [f_{p-1}, embed(token_p)] (f_{-1} = 0), fuses them to d wide
(`fuse`, H + d -> d), runs its decoder layers to h_p, and gives logits for token p + 1 (its norm and
head) and f^_p = `predict`(h_p), its guess of f_p. Inside a block the target has not seen the drafts
yet, so from the second draft on the head reads its own f^ in place of f.

Folder: the body is an ordinary draft checkpoint (config.json, model.safetensors, tokenizer files); the
head adds `feature_head.json` ({"format": 1, "target_hidden_size": H}) and `feature_head.safetensors`
(`fuse.weight` [d, H + d], `predict.weight` [H, d]). `dfvg.checkpoint.is_feature_head` tells the two
kinds apart.

`FeatureDrafter` is its `Drafter`: it reads the features of every committed position from the verifier
(`TorchVerifier.keep_features`), which writes them by position on every pass.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from dfvg.block_draft import block_of_rows
from dfvg.checkpoint import FEATURE_HEAD_FILE, checkpoint_dir, load_model, read_json
from dfvg.devices import resolve_device, synchronize
from dfvg.drafter import DraftBlock, fit_vocab, sample_block
from dfvg.errors import UserError
from dfvg.model import Transformer
from dfvg.sampling import SamplingParams

WEIGHTS_FILE, FORMAT = "feature_head.safetensors", 1


class FeatureHead(nn.Module):
    """The body (a draft `Transformer`) plus `fuse` and `predict`; see the module docstring for the shapes."""

    def __init__(self, body: Transformer, target_hidden_size: int):
        super().__init__()
        d = body.config.hidden_size
        self.body, self.target_hidden_size = body, target_hidden_size
        self.fuse = nn.Linear(target_hidden_size + d, d, bias=False)
        self.predict = nn.Linear(d, target_hidden_size, bias=False)

    def forward(self, ids: Tensor, positions: Tensor, features: Tensor, slots: Tensor | None = None,
                mask: Tensor | None = None, rows: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """ids, positions [B, T], features [B, T, H] (f_{p-1} for each position p) -> float32 logits [B, T, V]
        and the predicted features f^ [B, T, H]. `slots` / `mask`: cache slots and attention mask other than
        causal by position (`Transformer.forward`'s; dfvg.distill.feature drafts every block at once so);
        `rows`: the outputs of these rows only (all rows still write the cache)."""
        hidden = self.states(ids, positions, features, slots, mask)
        if rows is not None:
            hidden = hidden[:, rows]
        return self.body.logits(hidden), self.predict(hidden)

    def states(self, ids: Tensor, positions: Tensor, features: Tensor, slots: Tensor | None = None,
               mask: Tensor | None = None) -> Tensor:
        """The body's final hidden states [B, T, D] (`forward`'s arguments): training takes the head-vocabulary
        logits of the loss positions only (`Transformer.head_logits`), not forward's full-vocabulary ones."""
        x = self.fuse(torch.cat([features.to(self.fuse.weight.dtype), self.body.embed(ids)], dim=-1))
        return self.body.run_layers(x, positions, slots, mask)


def load_feature_head(path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                      target_hidden_size: int | None = None) -> FeatureHead:
    """A ready-to-run head from its folder, in eval mode; `target_hidden_size` (the target's) is checked."""
    directory = checkpoint_dir(path)
    meta = read_json(directory / FEATURE_HEAD_FILE, FEATURE_HEAD_FILE)
    if meta.get("format") != FORMAT or not isinstance(meta.get("target_hidden_size"), int):
        raise UserError(f"{directory / FEATURE_HEAD_FILE} is not a DFVG feature head of format {FORMAT} "
                        f"(it needs \"format\": {FORMAT} and an integer \"target_hidden_size\"); export it again")
    if target_hidden_size is not None and meta["target_hidden_size"] != target_hidden_size:
        raise UserError(f"the feature head {directory} reads features {meta['target_hidden_size']} wide, but the "
                        f"target's hidden size is {target_hidden_size}; pair it with the target it was trained on")
    head = FeatureHead(load_model(directory, dtype=dtype, feature_head_body=True), meta["target_hidden_size"])
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise UserError(f"{weights} is missing; copy the feature head's folder again in full")
    with safe_open(str(weights), framework="pt") as handle:
        state = {name: handle.get_tensor(name).to(dtype) for name in handle.keys()}
    for name, module in (("fuse.weight", head.fuse), ("predict.weight", head.predict)):
        if name not in state or state[name].shape != module.weight.shape:
            found = tuple(state[name].shape) if name in state else "nothing"
            raise UserError(f"{weights}: {name} should be {tuple(module.weight.shape)}, found {found}; "
                            "export the feature head again")
        module.weight = nn.Parameter(state[name], requires_grad=False)
    return head.to(device).eval().requires_grad_(False)


def feature_drafter(path: str | Path, device: str, dtype: torch.dtype, verifier) -> FeatureDrafter:
    """The drafter of a feature head's folder on a torch device, reading `verifier`'s features (a block feature
    head's, whose body is a block drafter: `BlockFeatureDrafter`)."""
    if verifier is None:
        raise UserError(f"{path} is a feature head: it needs the target it reads features from")
    head = load_feature_head(path, dtype, resolve_device(device), verifier.model.config.hidden_size)
    kind = BlockFeatureDrafter if head.body.config.block_size else FeatureDrafter
    return kind(head, verifier, verifier.vocab_size)


def save_head_parts(head: FeatureHead, directory: Path, dtype: torch.dtype = torch.float32) -> None:
    """Write what a feature head adds to its body's folder (the body is saved as any draft is)."""
    tensors = {"fuse.weight": head.fuse.weight, "predict.weight": head.predict.weight}
    save_file({n: t.detach().to(dtype).cpu().contiguous() for n, t in tensors.items()}, str(directory / WEIGHTS_FILE),
              metadata={"format": "pt"})
    meta = {"format": FORMAT, "target_hidden_size": head.target_hidden_size}
    (directory / FEATURE_HEAD_FILE).write_text(json.dumps(meta))


def committed_features(verifier, start: int, end: int) -> Tensor:
    """The inputs of positions start..end-1: f_{start-1} .. f_{end-2} from the verifier (zeros for f_{-1}),
    on the verifier's device in its dtype."""
    written = verifier.features_end
    if end - 1 > written:
        raise RuntimeError(f"feature head: the verifier wrote features below position {written} only, but "
                           f"feeding position {end - 1} needs f_{end - 2}")
    rows = verifier.features[max(start - 1, 0): end - 1]
    return torch.cat([rows.new_zeros(1, rows.shape[1]), rows]) if start == 0 else rows


def with_mask_rows(features: Tensor, k: int) -> Tensor:
    """A block feature head's pass inputs: the committed rows' features [c, H], then zeros for its k - 1 mask rows
    (they read no feature, as training teacher-forces them: dfvg.distill.block). Every path drafts with these."""
    return torch.cat([features, features.new_zeros(k - 1, features.shape[1])])


class FeatureCatchUp:
    """The cache contract of every drafter of a feature head (`FeatureDrafter`, the FPGA datapath's
    `FpgaFeatureDrafter`): positions below `true_len` were fed with the target's features, those a block fed
    with the head's own predictions are dropped at `rollback`. Subclasses give `_setup_cache`, `_feed` and
    `_true_features`."""

    cached_len: int = 0
    true_len: int = 0

    def _read_features_of(self, verifier) -> None:
        """Read `verifier`'s features from now on (it writes them once asked), or refuse one that has none."""
        if not hasattr(verifier, "keep_features"):
            raise UserError(f"a feature head reads the target's hidden states, which {type(verifier).__name__} "
                            "does not give; run the target on one process")
        self.verifier, verifier.keep_features = verifier, True

    def prefill(self, prompt_ids: list[int], max_seq_len: int) -> None:
        """Reset on a prompt (after the verifier's prefill): feed all its tokens but the last."""
        self._setup_cache(max_seq_len)
        self.cached_len = self.true_len = 0
        if len(prompt_ids) > 1:
            with torch.inference_mode():
                self._fill(prompt_ids[:-1], 0, self._true_features(0, len(prompt_ids) - 1))
            self.cached_len = self.true_len = len(prompt_ids) - 1

    def _fill(self, tokens: list[int], start_pos: int, features: Tensor) -> None:
        """Feed tokens whose outputs nothing reads (a prompt): `_feed`, unless a subclass has a cheaper way."""
        self._feed(tokens, start_pos, features)

    def rollback(self, num_valid: int) -> None:
        """Positions >= num_valid are invalid, and so are those fed with predicted features (>= true_len)."""
        self.cached_len = self.true_len = min(self.true_len, num_valid)


class FeatureDrafter(FeatureCatchUp):
    """A `FeatureHead` drafting on a torch device from the features its verifier writes by position.

    The verifier's `features` hold f_p for every committed position p but the last (a verify pass writes
    its rows; rejected rows are overwritten by the next pass, as in the KV cache), so drafting after n
    committed tokens reads f_0 .. f_{n-2}. The head's cache positions below `true_len` were fed with those
    features; the positions a block feeds with its own f^ are dropped at `rollback` and fed again with the
    target's features on the next `propose`. Nothing else is carried between calls, so a drafter that takes
    over in the middle of a generation (a fallback, a retry) catches up from the verifier alone."""

    def __init__(self, head: FeatureHead, verifier, target_vocab_size: int | None = None):
        self._read_features_of(verifier)
        self.head = head
        self.device = head.fuse.weight.device
        self.vocab_size = target_vocab_size or head.body.config.vocab_size
        self.cached_len = 0
        self.true_len = 0

    def _setup_cache(self, max_seq_len: int) -> None:
        self.head.body.setup_cache(1, max_seq_len)

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> DraftBlock:
        """Feed the committed positions not yet fed with the target's features, then draft k tokens, the
        second on reading the head's own f^."""
        start = time.perf_counter()
        fed_from = min(self.true_len, len(context) - 1)  # always feed at least the last token
        logits, predicted = self._feed(context[fed_from:], fed_from, self._true_features(fed_from, len(context)))
        self.cached_len = self.true_len = len(context)

        def feed_next(token: int) -> Tensor:
            nonlocal predicted  # f^ of the last position fed: the next draft reads it
            next_logits, predicted = self._feed([token], self.cached_len, predicted[None])
            self.cached_len += 1
            return next_logits

        tokens, block_probs = sample_block(logits, k, sampling, generator, feed_next)
        synchronize(self.device)
        return DraftBlock(tokens, block_probs, time.perf_counter() - start)

    def _true_features(self, start: int, end: int) -> Tensor:
        return committed_features(self.verifier, start, end).to(self.device, self.head.fuse.weight.dtype)

    def _feed(self, tokens: list[int], start_pos: int, features: Tensor) -> tuple[Tensor, Tensor]:
        """Feed tokens at start_pos.. with their features [T, H]: (logits [V] after the last, its f^ [H]).
        Only the last row's outputs are computed: a prompt's full-vocabulary logits for every row were a
        [T, 151,936] float32 tensor that nothing reads (a 149-row pass on a CPU: 239 against 29 ms,
        benchmarks/head_prefill_cpu.py)."""
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        positions = torch.arange(start_pos, start_pos + len(tokens), device=self.device)[None]
        last = torch.tensor([len(tokens) - 1], device=self.device)
        logits, predicted = self.head(ids, positions, features[None], rows=last)
        return fit_vocab(logits[0, -1], self.vocab_size), predicted[0, -1]


class BlockFeatureDrafter(FeatureDrafter):
    """A block feature head (its body a block drafter, dfvg.block_draft) on a torch device: one pass per block.

    The committed positions not yet fed read the target's features, then min(k, block_size) - 1 mask tokens read
    zeros (no predicted features): every row of the pass is what training computed teacher forced
    (dfvg.distill.block), and the drafts are the last real row's and each mask row's. The masks' cache slots lie
    past the committed tokens (`true_len` counts committed tokens only), so the next pass overwrites them."""

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> DraftBlock:
        """min(k, block_size) drafts from one pass; sampled, each from its own row's distribution (which the
        acceptance rule is given), as `BlockDrafter` samples."""
        start = time.perf_counter()
        body = self.head.body.config
        k = min(k, body.block_size)
        if k < 1:
            return DraftBlock([], None, time.perf_counter() - start)
        fed_from = min(self.true_len, len(context) - 1)  # always feed at least the last token
        true = self._true_features(fed_from, len(context))
        logits = self._last_rows(context[fed_from:] + body.mask_ids[: k - 1], fed_from, with_mask_rows(true, k), k)
        self.cached_len = self.true_len = len(context)
        return block_of_rows(logits, sampling, generator, self.device, start)

    def _last_rows(self, tokens: list[int], start_pos: int, features: Tensor, count: int) -> Tensor:
        """Feed tokens at start_pos.. with their features [T, H]: logits [count, V] of the last count rows."""
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        positions = torch.arange(start_pos, start_pos + len(tokens), device=self.device)[None]
        rows = torch.arange(len(tokens) - count, len(tokens), device=self.device)
        logits, _ = self.head(ids, positions, features[None], rows=rows)
        return fit_vocab(logits[0], self.vocab_size)
