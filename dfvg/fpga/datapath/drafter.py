"""`FpgaDrafter`: the Drafter protocol on the FPGA draft engine, emulated bit-exactly or through XRT.

What this module owns: turning a draft checkpoint into a drafter (artifact reload or build, option checks),
the greedy drafting loop over the integer datapath, the cache bookkeeping of the rollback contract, the
modeled board time of every block (`dfvg.fpga.board.latency.model_block`), and the adapter that lets the
XRT driver's simulated device run the same datapath (`DatapathKernel`). What it does not own: the numbers
(`quantize.py`), the arithmetic (`integer_model.py`, `fixed_point.py`) or the host/board protocol
(`dfvg/fpga/xrt/driver.py`).

Drafting is greedy: `propose` returns `probs=None` (one-hot), which the acceptance rule handles exactly,
so generation stays lossless under sampling too (the target's distribution decides every token). The
drafter caches its first k - 1 drafts, like `TorchDrafter`; after `rollback(n)` it re-feeds
context[n:] on the next `propose` (always at least the last token).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dfvg.checkpoint import load_config
from dfvg.devices import resolve_device, synchronize
from dfvg.drafter import DraftBlock
from dfvg.errors import UserError
from dfvg.fpga.board.boards import get_board
from dfvg.fpga.board.latency import DesignParams, DraftWorkload, model_block
from dfvg.fpga.board.workload import draft_workload
from dfvg.fpga.datapath.artifact import load_or_build
from dfvg.fpga.datapath.integer_model import IntegerDraftModel
from dfvg.fpga.xrt.driver import XrtDraftEngine, load_pyxrt
from dfvg.model import ModelConfig
from dfvg.sampling import SamplingParams

MODES = ("emulate", "xrt")
BITS = (8, 4)


@dataclass(frozen=True)
class FpgaOptions:
    """The FPGA drafter's options: the one table behind the CLI's --fpga-* flags, a device config's `fpga:`
    section and `FpgaDrafter.from_checkpoint`; `check_options` says which values are allowed."""

    board: str = "u280"  # the board model: u280 | u55c | u250 | v80 (dfvg.fpga.board.boards)
    mode: str = "emulate"  # emulate: the bit-exact datapath here; xrt: a board through XRT
    xclbin: str | None = None  # the dfvg_draft bitstream, for mode xrt
    bits: int = 8  # weight bits of the decoder layers: 8 | 4
    emulate_device: str = "cpu"  # where mode emulate runs the datapath: cpu | cuda | cuda:N
    group_size: int = 128  # int4 columns per scale
XRT_MAX_K = 16


def check_options(bits: int, mode: str, board: str, xclbin: str | Path | None, xrt_backend: str,
                  group_size: int = 128) -> None:
    """Refuse bad FPGA options in one line each, before anything slow runs."""
    if bits not in BITS:
        raise UserError(f"--fpga-bits must be 8 or 4, got {bits}")
    if bits == 4 and (group_size < 2 or group_size % 2):
        raise UserError(f"--fpga-group-size must be an even integer >= 2 that divides the draft's matrix "
                        f"widths (e.g. 32, 64, 128), got {group_size}")
    if mode not in MODES:
        raise UserError(f"--fpga-mode must be one of {', '.join(MODES)}, got {mode!r}")
    get_board(board)
    if mode == "xrt":
        if xclbin is None:
            raise UserError("--fpga-mode xrt needs --xclbin PATH (the dfvg_draft bitstream built under fpga/)")
        if xrt_backend == "pyxrt":
            load_pyxrt()
        if not Path(xclbin).is_file():
            raise UserError(f"xclbin not found: {xclbin}")


def xrt_weights(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Artifact tensors in the dtypes the weight buffer carries (uint8 int4 nibbles travel as int8 bytes)."""
    return {n: t.view(torch.int8) if t.dtype == torch.uint8 else t for n, t in tensors.items()}


class DatapathKernel:
    """`kernel_fn(weights, context, k)` for `SimulatedXrt`: the device side of one block, on the datapath.

    Like the board, it keeps the K/V of the ids it has fed and feeds only the part of `context` beyond the
    longest prefix it already holds (at least one id).
    """

    def __init__(self, config: ModelConfig, bits: int, max_context: int, vocab_limit: int, device: str = "cpu"):
        self.config, self.bits, self.max_context, self.vocab_limit = config, bits, max_context, vocab_limit
        self.device, self.model, self.tokens, self.weights_id = device, None, [], None

    def __call__(self, weights: dict[str, torch.Tensor], context: list[int], k: int) -> list[int]:
        if self.weights_id != id(weights):
            self.model = IntegerDraftModel(weights, self.config, self.bits, self.device)
            self.model.setup_cache(self.max_context)
            self.weights_id, self.tokens = id(weights), []
        shared = next((i for i, (a, b) in enumerate(zip(self.tokens, context, strict=False)) if a != b),
                      min(len(self.tokens), len(context)))
        start = min(shared, len(context) - 1)
        drafts = draft_block(self.model, context[start:], start, k, self.vocab_limit)
        self.tokens = list(context) + drafts[:-1]
        return drafts


def draft_in_one_pass(model: IntegerDraftModel, new_ids: list[int], start: int, k: int, vocab_limit: int) -> list[int]:
    """A block drafter's block (dfvg.block_draft): new_ids at positions start.., then k - 1 mask ids, in one pass;
    the drafts are the greedy tokens of the last real row and of each mask row."""
    ids = torch.tensor(new_ids + model.config.mask_ids[: k - 1], dtype=torch.long, device=model.device)
    return model.tokens(model.last_logits(ids, start, k), vocab_limit).tolist()


def draft_block(model: IntegerDraftModel, new_ids: list[int], start: int, k: int, vocab_limit: int) -> list[int]:
    """Feed new_ids at positions start.., then draft k greedy tokens, feeding the first k - 1 of them."""
    ids = torch.tensor(new_ids, dtype=torch.long, device=model.device)
    tokens = [model.next_token(ids, start, vocab_limit)]
    pos = start + len(new_ids)
    for _ in range(k - 1):
        step = torch.tensor([tokens[-1]], dtype=torch.long, device=model.device)
        tokens.append(model.next_token(step, pos, vocab_limit))
        pos += 1
    return tokens


class FpgaDrafter:
    """Greedy drafter on the integer datapath (emulated on cpu/cuda) or on a board through XRT."""

    def __init__(self, model: IntegerDraftModel, meta: dict, workload: DraftWorkload,
                 target_vocab_size: int | None = None, board: str = "u280", engine: XrtDraftEngine | None = None):
        self.model, self.meta, self.workload, self.engine = model, meta, workload, engine
        self.device = model.device
        self.vocab_limit = min(target_vocab_size or model.config.vocab_size, model.config.vocab_size)
        self.board = get_board(board)
        self.design = DesignParams()
        self.cached_len = 0
        self.block_size = model.config.block_size  # a block drafter drafts up to this many tokens in one pass

    @classmethod
    def from_checkpoint(cls, draft_dir: str | Path, target_vocab_size: int | None = None, bits: int = 8,
                        group_size: int = 128, board: str = "u280", mode: str = "emulate",
                        xclbin: str | Path | None = None, emulate_device: str = "cpu",
                        artifact_dir: str | Path | None = None, xrt_backend: str = "pyxrt") -> FpgaDrafter:
        """Reload (or build once) the quantized artifact of draft_dir and wrap it in a drafter.

        mode="emulate": the datapath runs here on `emulate_device` (cpu, cuda, cuda:N), identical tokens.
        mode="xrt": the board runs it; `xrt_backend="simulated"` runs the same host code on SimulatedXrt
        with this datapath as the device (the tests do that; no board exists in this project).
        """
        config = load_config(draft_dir)
        if config.block_size and mode == "xrt":  # before the XRT options' own checks: no fix of those would do
            raise UserError(f"{draft_dir} is a block drafter (dfvg_block_size): it runs on the emulated FPGA datapath "
                            "(--fpga-mode emulate); the dfvg_draft board kernel drafts chains")
        check_options(bits, mode, board, xclbin, xrt_backend, group_size)
        tensors, meta = load_or_build(draft_dir, bits, group_size, artifact_dir)
        device = resolve_device(emulate_device)
        model = IntegerDraftModel(tensors, config, bits, device)
        vocab_limit = min(target_vocab_size or config.vocab_size, config.vocab_size)
        engine = None
        if mode == "xrt":
            max_context = min(config.max_position_embeddings, 32768)
            kernel = DatapathKernel(config, bits, max_context, vocab_limit, device)
            engine = XrtDraftEngine(xrt_backend, kernel_fn=kernel if xrt_backend == "simulated" else None,
                                    max_context=max_context, max_k=XRT_MAX_K)
            engine.load(xclbin)
            engine.upload_weights(xrt_weights(tensors))
        return cls(model, meta, draft_workload(config, bits, group_size), target_vocab_size, board, engine)

    def prefill(self, prompt_ids: list[int], max_seq_len: int) -> None:
        """Reset, size the cache, and feed prompt_ids[:-1] (on a board, the first block feeds the prompt)."""
        self.design = DesignParams(max_context=max(DesignParams.max_context, max_seq_len))
        self.cached_len = 0
        if self.engine is not None:
            self.engine.rollback(0)
            return
        self.model.setup_cache(max_seq_len)
        if len(prompt_ids) > 1:
            ids = torch.tensor(prompt_ids[:-1], dtype=torch.long, device=self.device)
            self.model.forward(ids, 0)
            self.cached_len = len(prompt_ids) - 1

    def rollback(self, num_valid: int) -> None:
        self.cached_len = min(self.cached_len, num_valid)
        if self.engine is not None:
            self.engine.rollback(num_valid)

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> DraftBlock:
        """k greedy drafts after context[-1] (probs None = one-hot), with wall-clock and modeled board time. A block
        drafter drafts min(k, block_size) in one pass; its mask rows' cache slots lie past the committed tokens,
        so the next block's pass overwrites them (`cached_len` counts committed tokens only)."""
        start = time.perf_counter()
        if k < 1:  # nothing fed, nothing drafted: the cache is as it was
            return DraftBlock([], None, time.perf_counter() - start, 0.0)
        fed_from = min(self.cached_len, len(context) - 1)  # always feed at least the last token
        if self.block_size:
            k = min(k, self.block_size)
            tokens = draft_in_one_pass(self.model, context[fed_from:], fed_from, k, self.vocab_limit)
        elif self.engine is not None:
            tokens = self.engine.run_block(context, k)
        else:
            tokens = draft_block(self.model, context[fed_from:], fed_from, k, self.vocab_limit)
        self.cached_len = len(context) + (0 if self.block_size else k - 1)  # a chain caches its first k - 1 drafts
        synchronize(self.device)
        elapsed = time.perf_counter() - start
        return DraftBlock(tokens, None, elapsed, self.modeled_block_s(k, fed_from, len(context) - fed_from))

    def modeled_block_s(self, k: int, context_len: int, new_tokens: int) -> float:
        """Modeled board time of one block (latency.model_block on this drafter's board and workload; a block
        drafter's is one pass of the new ids and k - 1 masks)."""
        return model_block(self.workload, self.board, self.design, k, context_len, new_tokens,
                           one_pass=bool(self.block_size)).block_time.value
