"""Does a draft fit a board's on-chip memory, and how long would one draft block take there? (modeled)

What this module owns: the residency question (the artifact's weights, counted by
`dfvg.fpga.board.workload.draft_workload` as every other caller counts them, + the KV cache inside the
board's usable BRAM/URAM) and the modeled block time from `dfvg.fpga.board.latency.model_block`, compared
with a given verify time. Nothing here is measured: every number
is a `Metric` labelled `modeled` (or carries the latency model's own provenance).

Why the embedding is left off chip: a token reads one embedding row (D bytes), so keeping the
151,936-row table in HBM costs one short burst per token, while the LM head is read whole every token and
must be on chip to avoid streaming it. The head is the tensor `--vocab-top` shrinks.
"""

from __future__ import annotations

from dataclasses import dataclass

from dfvg.errors import UserError
from dfvg.fpga.board.boards import get_board
from dfvg.fpga.board.latency import DesignParams, model_block, place
from dfvg.fpga.board.workload import draft_workload, embedding_bytes
from dfvg.model import ModelConfig
from dfvg.stats import Metric


@dataclass(frozen=True)
class DraftSizing:
    """The on-chip fit and modeled block time of one draft at one weight width on one board."""

    board: str
    bits: int
    on_chip_weight_bytes: Metric  # layers + LM head: read every token, so they should be resident
    kv_bytes: Metric  # the draft KV cache for the design's max_context positions
    usable_on_chip_bytes: Metric
    embedding_hbm_bytes: Metric
    fits_on_chip: bool  # weights AND KV cache resident
    block_time: Metric
    verify_time: Metric | None
    hides_behind_verify: bool | None

    def lines(self) -> list[str]:
        mib = lambda m: f"{m.value / 2**20:.1f} MiB"  # noqa: E731
        verdict = "fits" if self.fits_on_chip else "does NOT fit"
        out = [f"{self.board} int{self.bits} [modeled]: weights {mib(self.on_chip_weight_bytes)} + KV "
               f"{mib(self.kv_bytes)} vs {mib(self.usable_on_chip_bytes)} usable on chip -> {verdict}; "
               f"embedding {mib(self.embedding_hbm_bytes)} in HBM",
               f"  draft block {self.block_time.value * 1e3:.3f} ms [{self.block_time.provenance}] "
               f"({self.block_time.source})"]
        if self.verify_time is not None:
            hides = "hides behind" if self.hides_behind_verify else "does NOT hide behind"
            out.append(f"  {hides} a verify of {self.verify_time.value * 1e3:.3f} ms [{self.verify_time.provenance}]")
        return out


def size_draft(cfg: ModelConfig, bits: int, board: str = "u280", k: int = 4, context_len: int = 256,
               verify: Metric | None = None, group_size: int = 128, feature_size: int = 0) -> DraftSizing:
    """Residency and modeled block time of `cfg` at `bits` (8 or 4) on `board`, drafting k at context_len.

    A feature head (`feature_size` = the target's hidden size) is sized with its projections, and its block
    after a fully accepted one: k + 1 new positions, each with its feature over PCIe (the worst case). A block
    drafter (`cfg.block_size`) drafts in one pass after the same worst case: k + 1 new positions (its masks'
    slots are rewritten) and k - 1 masks."""
    if bits not in (4, 8):
        raise UserError(f"FPGA weight bits must be 8 or 4, got {bits}")
    card = get_board(board)
    workload = draft_workload(cfg, bits, group_size, feature_size)
    streamed = workload.streamed_weight_bytes()
    design = DesignParams(max_context=max(DesignParams.max_context, context_len + k + 1))
    placement = place(workload, card, design)
    kv = workload.kv_bytes_per_position() * design.max_context
    fits = placement.kv_on_chip and placement.resident_weight_bytes == streamed
    catch_up = k + 1 if feature_size or cfg.block_size else 1  # a head's features, a block drafter's masks replaced
    estimate = model_block(workload, card, design, k, context_len, new_tokens=catch_up, one_pass=bool(cfg.block_size))
    hides = None if verify is None else estimate.block_time.value <= verify.value
    src = "dfvg.fpga.board.workload.draft_workload from the draft's shape"
    return DraftSizing(
        board=card.name, bits=bits,
        on_chip_weight_bytes=Metric(float(streamed), "B", "modeled", src + " (head int8, as the quantizer keeps it)"),
        kv_bytes=Metric(float(kv), "B", "modeled", f"int8 K/V x {design.max_context} positions"),
        usable_on_chip_bytes=Metric(float(placement.on_chip_budget_bytes), "B", "modeled",
                                    f"{design.on_chip_usable_fraction:.0%} of BRAM+URAM minus the shell"),
        embedding_hbm_bytes=Metric(float(embedding_bytes(cfg)), "B", "modeled",
                                   "int8 rows + per-row multipliers, one row read per token"),
        fits_on_chip=fits, block_time=estimate.block_time, verify_time=verify, hides_behind_verify=hides,
    )
