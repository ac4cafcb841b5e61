"""`FpgaFeatureDrafter`: a feature head (dfvg.feature_head) drafting on the FPGA datapath, emulated bit-exactly.

What this module owns: turning a head's folder into a drafter on the integer head (artifact reload or build,
`artifact.load_or_build_head`), the drafting loop (the cache contract is `FeatureCatchUp`'s), and the modeled
board time of each block. What it does not own: the numbers (`head_quantize.py`), the arithmetic
(`head_model.py`) or which features a verifier writes (`dfvg.feature_head.committed_features`).

Per block, as a board would run it: the committed positions not yet fed with the target's features arrive
as int8 (`quantize_features`, computed where the verifier keeps them, e.g. on the GPU: H bytes a position
over PCIe) and are fed; then k greedy drafts, each after the first reading the head's own int8 prediction,
which never leaves the board. Drafting is greedy (`probs=None`, one-hot), so generation stays lossless
under sampling too. The XRT kernel drafts standalone chains only: a head runs emulated (mode emulate).
Greedy token trees, static or dynamic: `dfvg.fpga.datapath.tree_drafter.DatapathFeatureTreeDrafter`.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import torch
from torch import Tensor

from dfvg.checkpoint import load_config
from dfvg.devices import resolve_device, synchronize
from dfvg.drafter import DraftBlock
from dfvg.errors import UserError
from dfvg.feature_head import FeatureCatchUp, committed_features, with_mask_rows
from dfvg.fpga.board.boards import get_board
from dfvg.fpga.board.latency import DesignParams, model_block
from dfvg.fpga.board.workload import draft_workload
from dfvg.fpga.datapath.artifact import load_or_build_head
from dfvg.fpga.datapath.drafter import check_options
from dfvg.fpga.datapath.head_model import IntegerFeatureHead
from dfvg.fpga.datapath.head_quantize import quantize_features
from dfvg.sampling import SamplingParams


class FpgaFeatureDrafter(FeatureCatchUp):
    """A quantized feature head drafting from its verifier's features, on the emulated datapath."""

    def __init__(self, model: IntegerFeatureHead, meta: dict, verifier, target_vocab_size: int | None = None,
                 board: str = "u280", group_size: int = 128):
        self._read_features_of(verifier)
        self.model, self.meta = model, meta
        self.device = model.device
        self.feature_scales = torch.tensor(meta["feature_head"]["feature_scales"], dtype=torch.float64)
        self.scales_on: dict[torch.device, Tensor] = {}  # the scales where the verifier keeps its features
        self.vocab_limit = min(target_vocab_size or model.config.vocab_size, model.config.vocab_size)
        self.board, self.design = get_board(board), DesignParams()
        self.workload = draft_workload(model.config, model.bits, group_size, feature_size=self.feature_scales.numel(),
                                       feature_bits=8)
        self.cached_len = self.true_len = 0
        self.engine = None  # no XRT path: the board kernel drafts standalone chains
        self.block_size = model.config.block_size  # a block feature head: one pass of at most this many drafts

    def reading(self, verifier) -> FpgaFeatureDrafter:
        """This drafter (same integer head) reading another verifier's features: a tree step verifies on the
        eager form of a CUDA-graph target."""
        twin = copy.copy(self)
        twin._read_features_of(verifier)
        return twin

    @classmethod
    def from_checkpoint(cls, head_dir: str | Path, verifier, target_dir: str | Path,
                        target_vocab_size: int | None = None, bits: int = 8, group_size: int = 128,
                        board: str = "u280", mode: str = "emulate", xclbin: str | Path | None = None,
                        emulate_device: str = "cpu", artifact_dir: str | Path | None = None,
                        xrt_backend: str = "pyxrt", predict_bits: int = 16) -> FpgaFeatureDrafter:
        """Reload (or build once) the head's quantized artifact for this target and wrap it in a drafter."""
        if mode != "emulate":
            raise UserError(f"{head_dir} is a feature head: the XRT kernel (dfvg_draft) drafts standalone chains "
                            "only; run the head with --fpga-mode emulate")
        check_options(bits, mode, board, xclbin, xrt_backend, group_size)
        if verifier is None:
            raise UserError(f"{head_dir} is a feature head: it needs the target it reads features from")
        tensors, meta = load_or_build_head(head_dir, target_dir, bits, group_size, predict_bits, artifact_dir)
        model = IntegerFeatureHead(tensors, load_config(head_dir), bits, resolve_device(emulate_device))
        return cls(model, meta, verifier, target_vocab_size, board, group_size)

    def _setup_cache(self, max_seq_len: int) -> None:
        self.design = DesignParams(max_context=max(DesignParams.max_context, max_seq_len))
        self.model.setup_cache(max_seq_len)

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> DraftBlock:
        """Feed the committed positions the head has not read with the target's features, then k greedy
        drafts (probs None = one-hot), with wall-clock and modeled board time."""
        start = time.perf_counter()
        if self.block_size:
            return self._one_pass(context, min(k, self.block_size), start)
        fed_from = min(self.true_len, len(context) - 1)  # always feed at least the last token
        logits, predicted = self._feed(context[fed_from:], fed_from, self._true_features(fed_from, len(context)))
        self.cached_len = self.true_len = len(context)
        tokens = [int(self.model.tokens(logits, self.vocab_limit)[0])]
        while len(tokens) < k:
            logits, predicted = self._feed(tokens[-1:], self.cached_len, predicted)
            self.cached_len += 1
            tokens.append(int(self.model.tokens(logits, self.vocab_limit)[0]))
        synchronize(self.device)
        elapsed = time.perf_counter() - start
        return DraftBlock(tokens, None, elapsed, self.modeled_block_s(k, fed_from, len(context) - fed_from))

    def _one_pass(self, context: list[int], k: int, start: float) -> DraftBlock:
        """A block feature head's block: the committed positions not yet read with the target's int8 features,
        then k - 1 mask ids reading zeros, in one integer pass; the drafts are the last real row's and each mask
        row's. The masks' slots lie past the committed tokens (`true_len`), so the next pass overwrites them."""
        if k < 1:
            return DraftBlock([], None, time.perf_counter() - start, 0.0)
        fed_from = min(self.true_len, len(context) - 1)
        true = self._true_features(fed_from, len(context))
        ids = torch.tensor(context[fed_from:] + self.model.config.mask_ids[: k - 1], dtype=torch.long,
                           device=self.device)
        rows = torch.arange(ids.shape[0] - k, ids.shape[0], device=self.device)
        logits, _ = self.model.step(ids, with_mask_rows(true, k), fed_from, rows=rows)
        self.cached_len = self.true_len = len(context)
        tokens = self.model.tokens(logits, self.vocab_limit).tolist()
        synchronize(self.device)
        return DraftBlock(tokens, None, time.perf_counter() - start,
                          self.modeled_block_s(k, fed_from, len(context) - fed_from))

    def modeled_block_s(self, k: int, context_len: int, new_tokens: int, feature_tokens: int | None = None) -> float:
        """Modeled board time of one block, the int8 features of `feature_tokens` positions (default: every new
        one) over PCIe included; a tree level's nodes read predictions already on the board (0). A block feature
        head's block is one pass of the new positions and k - 1 masks."""
        return model_block(self.workload, self.board, self.design, k, context_len, new_tokens, feature_tokens,
                           one_pass=bool(self.block_size)).block_time.value

    def _true_features(self, start: int, end: int) -> Tensor:
        """The target's features of positions start..end-1 as the board receives them: int8, quantized where
        the verifier keeps them, then copied."""
        features = committed_features(self.verifier, start, end)
        if features.device not in self.scales_on:
            self.scales_on[features.device] = self.feature_scales.to(features.device)
        return quantize_features(features, self.scales_on[features.device]).to(self.device)

    def _feed(self, tokens: list[int], start_pos: int, features: Tensor) -> tuple[Tensor, Tensor]:
        """Feed tokens at start_pos.. with int8 features [T, H]: (logits [1, Vh], prediction [1, H]) of the last."""
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        last = torch.tensor([len(tokens) - 1], device=self.device)
        return self.model.step(ids, features, start_pos, rows=last)
