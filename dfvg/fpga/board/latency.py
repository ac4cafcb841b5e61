"""Analytical latency/energy model of one k-token draft block on an FPGA board.

Owns: the draft workload's byte and MAC counts (`DraftWorkload`), the accelerator's design knobs
(`DesignParams`), the on-chip residency decision, and `model_block`, which turns them into a
`BlockEstimate` whose every number is a `Metric` labelled `modeled` or `assumed`. Nothing here is
measured: no board exists in this project. The model is calibrated against published U280 designs
(FlightLLM, DFX; see tests/test_fpga_latency.py and docs/fpga_model.md).

Does not own: the board facts (`boards.py`), the bit-exact datapath (`dfvg/fpga/datapath/`), the
resource estimate (`resources.py`) or the cycle figures of the simulated RTL (`rtl_cycles.py`: the MAC
efficiency of t_compute and the per-layer fixed cycles, `simulated` where a report gives them).

The model, per forward pass that feeds n tokens at a cache of c positions:
    t_mem     = (off-chip weight bytes + off-chip KV bytes read/written) / (peak BW x efficiency)
    t_compute = (n x layer MACs(c) + head MACs) / (DSPs x MACs per DSP per cycle x efficiency x clock)
(the LM head runs once per pass: only the last fed token's logits are needed, as in integer_model.py)
    t_pass    = max(t_mem, t_compute) + layers x per-layer fixed cycles / clock
The max() is the overlap assumption: weight tiles are double-buffered, so streaming tile i+1 hides
under computing tile i; the per-layer fixed cycles (pipeline fill, reductions for norms and softmax,
the layer boundary where the next layer needs the whole activation vector) do not overlap anything.
A block of k tokens = one kernel launch + token ids over PCIe in + one pass of `new_tokens` tokens
+ (k - 1) one-token passes + k ids over PCIe out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dfvg.errors import UserError
from dfvg.fpga.board.boards import Board
from dfvg.fpga.board.rtl_cycles import compute_efficiency, layer_overhead
from dfvg.stats import Metric

RESIDENCY_POLICIES = ("auto", "none", "all")
# PCIe 4.0 x16 per direction: 16 GT/s x 16 lanes x 128b/130b encoding / 8 bits = 31.5 GB/s (PCI-SIG PCI Express
# Base Specification 4.0). A U280's host link is Gen3 x16 or 2 x Gen4 x8 (DS963), half of that; for the few
# bytes of token ids a block moves, the per-transfer latency dominates either way.
PCIE_GEN4_X16_GBPS = 16 * 16 * 128 / 130 / 8
@dataclass(frozen=True)
class DraftWorkload:
    """What one draft forward pass touches. Norm weights and biases are left out (< 0.1% of bytes).

    `weight_bits` may be fractional to include quantization scales (int4 with an fp16 scale per 128
    weights = 4.125). `weight_bytes` overrides the bytes streamed per token (calibration against a
    published design). `bytes_resident_on_chip` overrides the residency policy. A feature head
    (`feature_size` H > 0) also runs its projections every token (`feature_params`) and receives each
    committed position's target feature over PCIe (`feature_bits`: bf16, 2 H bytes, or int8, H bytes).
    """

    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    weight_bits: float = 8.0
    activation_bits: int = 8
    kv_bits: int = 8
    tie_word_embeddings: bool = False
    gated_ffn: bool = True  # SwiGLU (Llama/Qwen: 3 matrices); False for GPT-2's 2-matrix MLP
    weight_bytes: int | None = None
    bytes_resident_on_chip: int | None = None
    residency: str = "auto"
    feature_size: int = 0  # a feature head (dfvg.feature_head): the target's hidden size it reads; 0 = none
    feature_bits: int = 16  # how each feature crosses PCIe: bf16, or int8 (the integer head's input format)

    def __post_init__(self) -> None:
        dims = ("num_layers", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim",
                "vocab_size")
        for name in dims:
            if getattr(self, name) <= 0:
                raise UserError(f"DraftWorkload.{name} must be > 0, got {getattr(self, name)}")
        if not 1 <= self.weight_bits <= 32 or not 1 <= self.kv_bits <= 32:
            raise UserError(f"weight_bits/kv_bits must be in [1, 32], got {self.weight_bits}/{self.kv_bits}")
        if self.residency not in RESIDENCY_POLICIES:
            raise UserError(f"residency must be one of {RESIDENCY_POLICIES}, got {self.residency!r}")
        if self.weight_bytes is not None and self.weight_bytes <= 0:
            raise UserError(f"weight_bytes must be > 0, got {self.weight_bytes}")

    @classmethod
    def from_model_config(cls, cfg: object, weight_bits: float = 8.0, **overrides: object) -> DraftWorkload:
        """Build from a `ModelConfig`-like object (duck-typed: the fields of docs/ARCHITECTURE.md)."""
        fields = dict(
            num_layers=cfg.num_layers, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
            num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
            vocab_size=cfg.vocab_size, tie_word_embeddings=bool(cfg.tie_word_embeddings),
            weight_bits=weight_bits,
        )
        fields.update(overrides)
        return cls(**fields)

    def layer_params(self) -> int:
        """Weights of one decoder layer: wqkv [(H+2KV)*hd, D], wo [D, H*hd], FFN [2 or 3 x D*I]."""
        d, hd = self.hidden_size, self.head_dim
        attn = d * (self.num_heads + 2 * self.num_kv_heads) * hd + self.num_heads * hd * d
        return attn + (3 if self.gated_ffn else 2) * d * self.intermediate_size

    def feature_params(self) -> int:
        """A feature head's projections: fuse [D, H + D] and predict [H, D] (0 for a plain draft)."""
        h, d = self.feature_size, self.hidden_size
        return (h + d) * d + d * h if h else 0

    def head_params(self) -> int:
        """The LM head [V, D]: read whole every token, tied or not."""
        return self.vocab_size * self.hidden_size

    def streamed_weight_bytes(self) -> int:
        """Weight bytes one token's forward pass reads (layers + head; the embedding is a 1-row lookup)."""
        if self.weight_bytes is not None:
            return self.weight_bytes
        params = self.num_layers * self.layer_params() + self.head_params() + self.feature_params()
        return int(params * self.weight_bits / 8)

    def stored_weight_bytes(self) -> int:
        """Bytes the board must hold: streamed weights + a separate embedding table when untied."""
        embed = 0 if self.tie_word_embeddings else int(self.head_params() * self.weight_bits / 8)
        return self.streamed_weight_bytes() + embed

    def kv_bytes_per_position(self) -> int:
        """K and V of every layer for one position: 2 x L x KV x hd x kv_bits / 8."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_bits // 8

    def macs_per_token(self, context: int) -> int:
        """GEMV MACs plus attention's QK^T and PV over `context` cached positions."""
        attention = 2 * self.num_layers * self.num_heads * self.head_dim * context
        return self.num_layers * self.layer_params() + self.head_params() + self.feature_params() + attention


@dataclass(frozen=True)
class DesignParams:
    """The accelerator's knobs. Every default is an assumption (cited in `assumptions()`), swept in docs."""

    clock_mhz: float = 250.0
    dsps_used: int = 4096
    macs_per_dsp: int = 1  # 2 only with WP486 hand packing of two int8 MACs sharing an operand
    bandwidth_efficiency: float = 0.30  # achieved / peak off-chip bandwidth; published 0.10-0.43
    launch_overhead_us: float = 30.0  # XRT kernel launch: 16-100 us per call
    pcie_latency_us: float = 5.0  # per host<->card transfer (one bo sync), each direction
    pcie_gbps: float = PCIE_GEN4_X16_GBPS
    dsp_efficiency: float | None = None  # achieved / peak MACs per DSP-cycle; None: simulated (rtl_cycles.py)
    layer_overhead_cycles: float | None = None  # None: from kernel_cycles.json, else assumed 1000
    kv_on_chip: bool | None = None  # None: on chip when max_context positions fit
    max_context: int = 2048  # KV positions the design reserves
    softmax_lanes: int = 16  # logits a cycle through softmax_row.v (a dynamic tree's node scores), as simulated
    topk_lanes: int = 1  # logits a cycle through topk_stream.v (a tree node's children), as simulated
    on_chip_usable_fraction: float = 0.85  # of BRAM+URAM after the shell: activation buffers, packing
    cycles_file: Path | None = field(default=None, compare=False)  # kernel_cycles.json (make -C fpga sim)
    rtl_run_file: Path | None = field(default=None, compare=False)  # draft_cycles.json (dfvg.fpga.rtl_run)

    def __post_init__(self) -> None:
        positive = ("clock_mhz", "dsps_used", "pcie_gbps", "max_context", "softmax_lanes", "topk_lanes")
        for name in positive:
            if not getattr(self, name) > 0:
                raise UserError(f"DesignParams.{name} must be > 0, got {getattr(self, name)}")
        for name in ("launch_overhead_us", "pcie_latency_us"):
            if getattr(self, name) < 0:
                raise UserError(f"DesignParams.{name} must be >= 0, got {getattr(self, name)}")
        if self.macs_per_dsp not in (1, 2):
            raise UserError(f"macs_per_dsp must be 1 or 2 (WP486 packing), got {self.macs_per_dsp}")
        for name in ("bandwidth_efficiency", "on_chip_usable_fraction", "dsp_efficiency"):
            if getattr(self, name) is not None and not 0 < getattr(self, name) <= 1:
                raise UserError(f"DesignParams.{name} must be in (0, 1], got {getattr(self, name)}")
        if self.layer_overhead_cycles is not None and self.layer_overhead_cycles < 0:
            raise UserError(f"layer_overhead_cycles must be >= 0, got {self.layer_overhead_cycles}")


@dataclass(frozen=True)
class Placement:
    """Which bytes live on chip. Any on-chip byte saves the same HBM time in this model, so the order
    (whole layers first, then LM-head rows, as the RTL would place them) does not change the estimate."""

    resident_weight_bytes: int
    kv_on_chip: bool
    on_chip_budget_bytes: int


def place(workload: DraftWorkload, board: Board, design: DesignParams) -> Placement:
    """Decide KV and weight residency; raise when a forced placement does not fit."""
    budget = int(board.on_chip_bytes * design.on_chip_usable_fraction) - board.shell_bytes
    kv_bytes = workload.kv_bytes_per_position() * design.max_context
    kv_on_chip = kv_bytes <= budget if design.kv_on_chip is None else design.kv_on_chip
    if kv_on_chip and kv_bytes > budget:
        raise UserError(f"KV cache for {design.max_context} positions ({kv_bytes} B) does not fit the "
                        f"{budget} B of usable on-chip RAM on {board.name}; set kv_on_chip=False")
    free = budget - (kv_bytes if kv_on_chip else 0)
    streamed = workload.streamed_weight_bytes()
    if workload.bytes_resident_on_chip is not None:
        resident = workload.bytes_resident_on_chip
        if not 0 <= resident <= min(streamed, free):
            raise UserError(f"bytes_resident_on_chip={resident} must be in [0, {min(streamed, free)}] "
                            f"(weights {streamed} B, free on-chip {free} B on {board.name})")
    elif workload.residency == "none":
        resident = 0
    elif workload.residency == "all":
        if streamed > free:
            raise UserError(f"residency='all' needs {streamed} B on chip; {board.name} has {free} B free")
        resident = streamed
    else:
        resident = max(0, min(streamed, free))
    return Placement(resident, kv_on_chip, budget)


@dataclass(frozen=True)
class BlockEstimate:
    """One draft block on one board. Every number is a Metric; `assumptions` lists what it rests on."""

    board: str
    k: int
    context_len: int
    bound: str  # "memory" or "compute": which term of max() dominated the one-token passes
    block_time: Metric
    time_per_token: Metric
    memory_time: Metric
    compute_time: Metric
    layer_overhead_time: Metric
    launch_time: Metric
    pcie_time: Metric
    offchip_bytes_per_token: Metric
    resident_weight_bytes: Metric
    kv_bytes_per_position: Metric
    energy_per_block: Metric
    energy_per_token: Metric
    board_power: Metric
    assumptions: tuple[str, ...]

    def metrics(self) -> dict[str, Metric]:
        """The Metric fields by name (for JSON reports)."""
        return {k: v for k, v in self.__dict__.items() if isinstance(v, Metric)}


def _pass_terms(w: DraftWorkload, board: Board, d: DesignParams, p: Placement, c: int, n: int, efficiency: float,
                head_rows: int = 1):
    """(memory s, compute s, off-chip bytes) of one pass feeding n tokens with c positions cached, the LM head
    on its last `head_rows` rows (a block drafter's pass reads k)."""
    kv_bytes = 0 if p.kv_on_chip else w.kv_bytes_per_position() * (c + 2 * n)  # read c+n, write n
    offchip = w.streamed_weight_bytes() - p.resident_weight_bytes + kv_bytes
    mem_s = offchip / (board.offchip_peak_gbps * 1e9 * d.bandwidth_efficiency)
    macs_per_s = d.dsps_used * d.macs_per_dsp * efficiency * d.clock_mhz * 1e6
    macs = n * (w.macs_per_token(c) - w.head_params()) + head_rows * w.head_params()
    return mem_s, macs / macs_per_s, offchip


def pcie_time_s(num_bytes: int, design: DesignParams) -> float:
    """One block's host<->card traffic: a transfer in and one out, each paying the latency, plus the bytes."""
    return 2 * design.pcie_latency_us * 1e-6 + num_bytes / (design.pcie_gbps * 1e9)


def _check(workload: DraftWorkload, board: Board, design: DesignParams, k: int, context_len: int,
           new_tokens: int, placement: Placement) -> None:
    if k < 1 or context_len < 0 or new_tokens < 1:
        raise UserError(f"need k >= 1, context_len >= 0, new_tokens >= 1; got {k}, {context_len}, {new_tokens}")
    if design.dsps_used > board.dsp:
        raise UserError(f"design uses {design.dsps_used} DSPs; {board.name} has {board.dsp}")
    if design.macs_per_dsp == 2 and (workload.weight_bits > 8 or workload.activation_bits > 8):
        raise UserError("macs_per_dsp=2 (WP486 packing) needs weights and activations of at most 8 bits")
    if workload.stored_weight_bytes() > board.offchip_bytes:
        raise UserError(f"weights ({workload.stored_weight_bytes()} B) exceed {board.name}'s "
                        f"{board.offchip_bytes} B of {board.offchip_type}")
    last = context_len + new_tokens + k - 1
    if placement.kv_on_chip and last > design.max_context:
        raise UserError(f"block reaches position {last} > max_context={design.max_context} of the on-chip "
                        "KV cache; raise max_context or set kv_on_chip=False")


def model_block(workload: DraftWorkload, board: Board, design: DesignParams, k: int, context_len: int,
                new_tokens: int = 1, feature_tokens: int | None = None, one_pass: bool = False) -> BlockEstimate:
    """Model one draft block: ONE kernel launch that feeds `new_tokens` ids and drafts k tokens.

    `context_len` is how many positions the draft KV cache already holds when the block starts; the
    first pass feeds the `new_tokens` committed-but-uncached ids (usually 1: the bonus/correction token)
    and yields draft 1, then k - 1 one-token passes yield drafts 2..k.
    Example: k=4, context_len=100, new_tokens=1 -> passes at (c=100, n=1), (101, 1), (102, 1), (103, 1).
    `one_pass`: a block drafter (dfvg.block_draft): one pass of the new ids and k - 1 mask tokens, the LM head
    on its last k rows. Example: k=4, new_tokens=5 -> one pass at (c=100, n=8).
    """
    placement = place(workload, board, design)
    _check(workload, board, design, k, context_len, new_tokens, placement)
    cycles, cycles_prov, cycles_src = layer_overhead(design)
    efficiency = compute_efficiency(design)
    overhead_s = workload.num_layers * cycles / (design.clock_mhz * 1e6)
    passes = [(context_len, new_tokens)] + [(context_len + new_tokens + i, 1) for i in range(k - 1)]
    if one_pass:
        passes = [(context_len, new_tokens + k - 1)]
    head_rows = k if one_pass else 1
    terms = [_pass_terms(workload, board, design, placement, c, n, efficiency[0], head_rows) for c, n in passes]
    mem_s = sum(t[0] for t in terms)
    compute_s = sum(t[1] for t in terms)
    passes_s = sum(max(t[0], t[1]) for t in terms) + overhead_s * len(passes)
    launch_s = design.launch_overhead_us * 1e-6
    carried = new_tokens if feature_tokens is None else feature_tokens  # a head: the target's features in
    feature_bytes = workload.feature_bits // 8 * workload.feature_size * carried
    pcie_bytes = 4 * (new_tokens + k) + feature_bytes  # + int32 ids in and out
    pcie_s = pcie_time_s(pcie_bytes, design)
    block_s = launch_s + pcie_s + passes_s
    bound = "memory" if terms[-1][0] >= terms[-1][1] else "compute"
    mdl = "modeled"
    power = Metric(board.power_w, "W", board.power_provenance, board.power_source)
    return BlockEstimate(
        board=board.name, k=k, context_len=context_len, bound=bound,
        block_time=Metric(block_s, "s", mdl, "launch + PCIe + sum over passes of max(mem, compute) + overhead"),
        time_per_token=Metric(block_s / k, "s", mdl, f"block time / k (k={k})"),
        memory_time=Metric(mem_s, "s", mdl, "off-chip bytes / (peak BW x efficiency), summed over passes"),
        compute_time=Metric(compute_s, "s", mdl, f"MACs / (DSPs x MACs/DSP x efficiency x clock), over passes; "
                            f"efficiency {efficiency[0]:.4f} {efficiency[1]}"),
        layer_overhead_time=Metric(overhead_s * len(passes), "s", mdl,
                                   f"{cycles:.0f} cycles/layer ({cycles_prov}: {cycles_src})"),
        launch_time=Metric(launch_s, "s", "assumed", "one XRT kernel launch per block"),
        pcie_time=Metric(pcie_s, "s", mdl, f"2 transfers x {design.pcie_latency_us} us + {pcie_bytes} B"
                         + (f" ({feature_bytes} B of target features)" if feature_bytes else "")),
        offchip_bytes_per_token=Metric(float(terms[-1][2]), "B", mdl, "weights not on chip + off-chip KV"),
        resident_weight_bytes=Metric(float(placement.resident_weight_bytes), "B", mdl,
                                     f"residency={workload.residency!r} in {placement.on_chip_budget_bytes} B"),
        kv_bytes_per_position=Metric(float(workload.kv_bytes_per_position()), "B", mdl,
                                     "on chip" if placement.kv_on_chip else "off chip"),
        energy_per_block=Metric(board.power_w * block_s, "J", mdl, "board power x block time"),
        energy_per_token=Metric(board.power_w * block_s / k, "J", mdl, "board power x time per token"),
        board_power=power,
        assumptions=assumptions(board, design, (cycles_prov, cycles_src), efficiency),
    )


def softmax_time_s(workload: DraftWorkload, design: DesignParams, rows: int) -> float:
    """Modeled time of scoring the children of `rows` expanded nodes of a dynamic tree: softmax_row.v streams
    each row's logits (`vocab_size`, the head's real rows) `design.softmax_lanes` a cycle at the design clock,
    not overlapped with the passes (it reads their logits). 4 rows of 32,768 at 16 lanes and 250 MHz: 33 us."""
    return rows * -(-workload.vocab_size // design.softmax_lanes) / (design.clock_mhz * 1e6)


def topk_time_s(workload: DraftWorkload, design: DesignParams, rows: int) -> float:
    """Modeled time of choosing the children of `rows` expanded tree nodes: topk_stream.v takes
    `design.topk_lanes` logits a cycle (1, as simulated), not overlapped with the passes. One row of 32,768
    at 250 MHz: 131 us, which a wider kernel (lanes of top-k units and a merge) would cut; a chain's argmax
    is not this: argmax_stream rides on the LM head's output inside the pass."""
    return rows * -(-workload.vocab_size // design.topk_lanes) / (design.clock_mhz * 1e6)


def assumptions(board: Board, design: DesignParams, overhead: tuple[str, str],
                efficiency: tuple[float, str, str]) -> tuple[str, ...]:
    """The list of things the estimate rests on, each with its provenance."""
    bw = board.offchip_peak_gbps * design.bandwidth_efficiency
    cycles_prov, cycles_src = overhead
    return (
        f"assumed: clock {design.clock_mhz} MHz (published U280 LLM designs close 200-285 MHz)",
        f"assumed: {design.dsps_used} DSPs x {design.macs_per_dsp} MAC/cycle "
        f"({'WP486 hand packing' if design.macs_per_dsp == 2 else 'no DSP packing'})",
        f"{efficiency[1]}: MAC-array efficiency {efficiency[0]:.4f} ({efficiency[2]})",
        f"assumed: off-chip efficiency {design.bandwidth_efficiency} of {board.offchip_peak_gbps} GB/s peak "
        f"= {bw:.1f} GB/s (published designs: 0.10-0.43)",
        "assumed: weight streaming overlaps compute (double buffering): per pass max(memory, compute)",
        f"{cycles_prov}: per-layer fixed overhead, not overlapped ({cycles_src})",
        f"assumed: one XRT launch per block, {design.launch_overhead_us} us (published 16-100 us)",
        f"assumed: PCIe {design.pcie_latency_us} us per transfer (one XRT bo sync), {design.pcie_gbps:.1f} GB/s "
        "(PCIe 4.0 x16, PCI-SIG base specification 4.0)",
        f"assumed: {design.on_chip_usable_fraction:.0%} of BRAM+URAM usable, minus the shell's "
        f"{board.shell_bram36} BRAM36 ({board.shell_provenance})",
        f"{board.power_provenance}: board power {board.power_w} W ({board.power_source})",
    )


def describe(estimate: BlockEstimate) -> list[str]:
    """Render an estimate as text lines: each metric with unit and provenance, then the assumptions."""
    lines = [f"FPGA draft block on {estimate.board}: k={estimate.k}, context={estimate.context_len}, "
             f"{estimate.bound}-bound"]
    for name, m in estimate.metrics().items():
        lines.append(f"  {name:<24} {_fmt(m.value, m.unit):>14}  [{m.provenance}] {m.source}")
    lines.append("  assumptions:")
    lines.extend(f"    - {a}" for a in estimate.assumptions)
    return lines


def _fmt(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value * 1e3:.4f} ms" if value < 1 else f"{value:.3f} s"
    if unit == "J":
        return f"{value * 1e3:.3f} mJ"
    if unit == "B":
        return f"{value / 1e6:.3f} MB"
    return f"{value:g} {unit}"
