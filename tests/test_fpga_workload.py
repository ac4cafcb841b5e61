"""The one draft workload (dfvg/fpga/board/workload.py): its byte count against real quantized artifacts, its
block time against hand arithmetic, and every caller (drafter, sizing) getting the same block time from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dfvg.checkpoint import load_config, load_model
from dfvg.distill import sizing
from dfvg.fpga.board.boards import get_board
from dfvg.fpga.board.latency import DesignParams, model_block
from dfvg.fpga.board.workload import draft_workload, streamed_bytes
from dfvg.fpga.datapath.quantize import quantize_model
from tests.conftest import save_checkpoint

SHIPPED = Path(__file__).resolve().parents[1] / "drafts" / "qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768"
MATRIX_PARTS = (".weight", ".weight_packed", ".group_scales", ".multiplier", ".shift", ".bias")


def _artifact_streamed_bytes(tensors: dict) -> int:
    """What the board streams per token, summed over the artifact itself: every matrix tensor of the layers and
    the head (not the embedding, norms, tables or scalar constants)."""
    return sum(t.numel() * t.element_size() for name, t in tensors.items()
               if name.startswith(("layers.", "output.")) and name.endswith(MATRIX_PARTS))


@pytest.mark.parametrize("arch, bits", [("qwen2", 8), ("qwen2", 4), ("llama", 8), ("qwen3", 4)])
def test_byte_count_equals_the_quantized_artifact(tmp_path, arch, bits):
    save_checkpoint(tmp_path, arch, num_hidden_layers=1, hidden_size=32, intermediate_size=48)
    tensors, _ = quantize_model(load_model(tmp_path), bits=bits, group_size=16)
    assert streamed_bytes(load_config(tmp_path), bits, 16) == _artifact_streamed_bytes(tensors)


def test_shipped_draft_block_by_hand():
    """The shipped 4 x 512 draft (32,768 head rows, int8) on a U280 at the default design, k = 4 after 100
    cached positions: everything is on chip, so each pass costs MACs / (4096 DSPs x 250 MHz) + 4 layers x
    1000 assumed cycles, plus one 30 us launch and 2 x 5 us + 20 B of PCIe 4.0 x16."""
    cfg = load_config(SHIPPED)
    d, inter, heads, kv, hd, layers, rows = 512, 1536, 8, 2, 64, 4, 32768
    layer_bytes = ((heads + 2 * kv) * hd * (d + 8) + (heads + 2 * kv) * hd * 4  # wqkv + multipliers, int32 bias
                   + d * (heads * hd + 8) + 2 * inter * (d + 8) + d * (inter + 8))  # wo, w13, w2
    assert draft_workload(cfg, 8).streamed_weight_bytes() == layers * layer_bytes + rows * (d + 8)
    layer_macs = (heads + 2 * kv) * hd * d + heads * hd * d + 3 * d * inter  # 3,145,728
    macs = sum(layers * layer_macs + rows * d + 2 * layers * heads * hd * c for c in (100, 101, 102, 103))
    clock = 250e6
    by_hand = 30e-6 + 2 * 5e-6 + 20 / (31.5076923e9) + macs / (4096 * clock) + 4 * layers * 1000 / clock
    design = DesignParams(layer_overhead_cycles=1000.0, dsp_efficiency=1.0)  # by hand: efficiency 1
    modeled = model_block(draft_workload(cfg, 8), get_board("u280"), design, k=4, context_len=100)
    assert modeled.bound == "compute"
    assert modeled.block_time.value == pytest.approx(by_hand, rel=1e-6)  # 0.156 ms


def test_sizing_and_drafter_workloads_agree(tmp_path):
    """distill/sizing.py and the FpgaDrafter model one block through the same workload, so the same time."""
    from dfvg.fpga.datapath.drafter import FpgaDrafter

    save_checkpoint(tmp_path, "qwen2", num_hidden_layers=1, hidden_size=32, intermediate_size=48)
    drafter = FpgaDrafter.from_checkpoint(tmp_path, bits=4, group_size=16, artifact_dir=tmp_path / "art")
    drafter.design = DesignParams(max_context=2048)
    sized = sizing.size_draft(load_config(tmp_path), 4, k=4, context_len=100, group_size=16)
    assert drafter.modeled_block_s(4, 100, 1) == pytest.approx(sized.block_time.value, rel=1e-12)


def test_prompt_pass_runs_the_head_once():
    """A 50-token prompt pass of the shipped draft: 50 tokens through the layers, ONE head GEMV (only the last
    token's logits are used), one launch, the ids in and the draft out over PCIe."""
    cfg = load_config(SHIPPED)
    layer_macs = 4 * ((8 + 2 * 2) * 64 * 512 + 8 * 64 * 512 + 3 * 512 * 1536)
    clock = 250e6
    by_hand = (30e-6 + 2 * 5e-6 + 4 * 51 / 31.5076923e9 + (50 * layer_macs + 32768 * 512) / (4096 * clock)
               + 4 * 1000 / clock)
    design = DesignParams(layer_overhead_cycles=1000.0, dsp_efficiency=1.0)  # by hand: efficiency 1
    modeled = model_block(draft_workload(cfg, 8), get_board("u280"), design, k=1, context_len=0, new_tokens=50)
    assert modeled.block_time.value == pytest.approx(by_hand, rel=1e-6)
