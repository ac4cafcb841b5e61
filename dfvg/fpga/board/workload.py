"""The one workload of a draft on the board: what its FPGA artifact holds and streams, from its shape alone.

What this module owns: the byte count of the quantized artifact (`dfvg/fpga/datapath/quantize.py`'s
layout: decoder matrices at int8, or int4 with uint8 group scales, each output row with an int32 multiplier
and an int32 shift, Qwen2's int32 q/k/v biases; the LM head at int8 over its real rows) and
`draft_workload`, the `DraftWorkload` the latency model (`latency.model_block`) turns into time and energy.
The drafter, the distillation sizing, the experiment reports and the benchmarks all call `draft_workload`,
so two parts of the project cannot model one block differently. tests/test_fpga_workload.py checks the
count against the bytes of a real quantized artifact.

Left out, as `DraftWorkload` documents: norm gammas (qk-norm's included), SiLU tables and the few integer
constants per layer (< 0.1 % of the bytes), and the embedding table, of which a token reads one row.
Does not own: the time model (`latency.py`) or the board facts (`boards.py`).
"""

from __future__ import annotations

from dataclasses import replace

from dfvg.fpga.board.latency import DraftWorkload
from dfvg.model import ModelConfig

ROW_PARAM_BYTES = 8  # int32 multiplier + int32 shift per output row (requantization)
BIAS_BYTES = 4  # int32 bias per q/k/v row


def head_rows(cfg: ModelConfig) -> int:
    """Rows of the LM head: a distilled draft's head covers `head_vocab_size` ids, not the whole vocabulary."""
    return cfg.head_vocab_size or cfg.vocab_size


def matrix_bytes(rows: int, cols: int, bits: int, group_size: int) -> int:
    """One quantized matrix [rows, cols]: weights (+ one uint8 scale per int4 group) + per-row multiplier/shift."""
    weights = rows * cols if bits == 8 else rows * cols // 2 + rows * -(-cols // group_size)
    return weights + rows * ROW_PARAM_BYTES


def layer_bytes(cfg: ModelConfig, bits: int, group_size: int = 128) -> int:
    """Artifact bytes of all decoder layers: wqkv, wo, w13, w2, and the q/k/v biases when the model has them."""
    d, inter = cfg.hidden_size, cfg.intermediate_size
    shapes = [(cfg.qkv_size, d), (d, cfg.num_heads * cfg.head_dim), (2 * inter, d), (d, inter)]  # (rows, cols)
    per_layer = sum(matrix_bytes(rows, cols, bits, group_size) for rows, cols in shapes)
    per_layer += cfg.qkv_size * BIAS_BYTES if cfg.attention_bias else 0
    return cfg.num_layers * per_layer


def head_bytes(cfg: ModelConfig) -> int:
    """The LM head: int8 whatever the layers' width (quantize.py keeps it int8), over its real rows."""
    return matrix_bytes(head_rows(cfg), cfg.hidden_size, 8, 0)


def streamed_bytes(cfg: ModelConfig, bits: int, group_size: int = 128) -> int:
    """Bytes one token's forward pass reads: every decoder layer and the LM head."""
    return layer_bytes(cfg, bits, group_size) + head_bytes(cfg)


def embedding_bytes(cfg: ModelConfig) -> int:
    """The int8 embedding table with its per-row multipliers (kept off chip: one row per token)."""
    return cfg.embed_vocab_size * (cfg.hidden_size + ROW_PARAM_BYTES)


def draft_workload(cfg: ModelConfig, bits: int = 8, group_size: int = 128, feature_size: int = 0,
                   feature_bits: int = 16) -> DraftWorkload:
    """The latency model's workload of `cfg` quantized at `bits` (8 or 4): exact artifact bytes, real head rows.
    `feature_size` > 0: a feature head's body, plus its projections (int8 with either body width, as
    dfvg/fpga/datapath/head_quantize.py keeps them) and its features over PCIe (`feature_bits` each)."""
    workload = DraftWorkload.from_model_config(cfg, weight_bits=float(bits), vocab_size=head_rows(cfg),
                                               feature_size=feature_size, feature_bits=feature_bits)
    return replace(workload, weight_bytes=streamed_bytes(cfg, bits, group_size) + projection_bytes(cfg, feature_size))


def projection_bytes(cfg: ModelConfig, feature_size: int) -> int:
    """A feature head's fuse [d, H + d] and predict [H, d] at int8 with their per-row multipliers (0 without)."""
    d = cfg.hidden_size
    return matrix_bytes(d, feature_size + d, 8, 0) + matrix_bytes(feature_size, d, 8, 0) if feature_size else 0
